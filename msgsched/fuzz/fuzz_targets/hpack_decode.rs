//! HPACK: a sequence of header blocks (split at 0xff 0xfe markers) decoded by one
//! connection's decoder under small bounds: no panic, results within the bounds, and a
//! decoded list re-encoded by our encoder decodes to the same list.
#![no_main]

use libfuzzer_sys::fuzz_target;
use msgsched::proto::h2::hpack::{Decoder, Encoder, HpackLimits};

fuzz_target!(|data: &[u8]| {
    let limits = HpackLimits {
        max_list_size: 2048,
        max_fields: 32,
        max_table_size: 4096,
    };
    let mut d = Decoder::new(limits);
    let mut enc = Encoder::new();
    let mut check = Decoder::new(HpackLimits {
        max_list_size: usize::MAX,
        max_fields: usize::MAX,
        max_table_size: 4096,
    });
    for block in data.split(|&b| b == 0xff).filter(|b| !b.is_empty()) {
        let Ok(list) = d.decode(block) else {
            // The connection would end here (COMPRESSION_ERROR or ENHANCE_YOUR_CALM).
            return;
        };
        assert!(list.len() <= limits.max_fields);
        let size: usize = list.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
        assert!(size <= limits.max_list_size);
        let mut out = Vec::new();
        enc.encode(list.iter().map(|(n, v)| (&n[..], &v[..])), &mut out);
        assert_eq!(check.decode(&out).expect("our encoding decodes"), list);
    }
});
