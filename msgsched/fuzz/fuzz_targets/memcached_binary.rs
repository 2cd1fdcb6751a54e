//! memcached binary framing and decoding (see common.rs for the invariants). The first
//! input bytes pick the segmentation; the stream always starts with the request magic.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let (cuts, stream) = data.split_at(data.len().min(4));
    let mut s = vec![0x80];
    s.extend_from_slice(stream.get(1..).unwrap_or(&[]));
    common::fuzz(&s, cuts);
});
