//! gRPC length-prefixed messages cut from a body in arbitrary segments: no panic, and the
//! messages found tile the body exactly (5-byte prefix + data each).
#![no_main]

use libfuzzer_sys::fuzz_target;
use msgsched::proto::grpc::messages;
use zbuf::{IoVec, Zbuf};

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let cut = (cut as usize).min(rest.len());
    let body: IoVec = [&rest[..cut], &rest[cut..]]
        .iter()
        .map(|p| Zbuf::copy_from_slice(p))
        .collect();
    if let Ok(ms) = messages(&body, 1 << 16) {
        let total: usize = ms.iter().map(|m| 5 + m.data.len()).sum();
        assert_eq!(total, rest.len());
        let mut at = 5;
        for m in &ms {
            assert_eq!(m.data.to_vec(), rest[at..at + m.data.len()].to_vec());
            at += m.data.len() + 5;
        }
    }
});
