//! memcached text framing and decoding (see common.rs for the invariants). The first
//! input byte picks the segmentation; a stream that would start with 0x80 is text with
//! a leading space instead.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let (cuts, stream) = data.split_at(data.len().min(4));
    let mut s = stream.to_vec();
    if s.first() == Some(&0x80) {
        s[0] = b' ';
    }
    common::fuzz(&s, cuts);
});
