//! Icmpv4Repr::parse: never panics; what parses (checksum offloaded) re-emits with a valid
//! checksum and parses back equal.
#![no_main]
use libfuzzer_sys::fuzz_target;
use luna_stack::wire::{ChecksumCaps, Icmpv4Packet, Icmpv4Repr};

fuzz_target!(|data: &[u8]| {
    let Ok(packet) = Icmpv4Packet::new_checked(data) else {
        return;
    };
    let sw = Icmpv4Repr::parse(&packet, &ChecksumCaps::software());
    let Ok(repr) = Icmpv4Repr::parse(&packet, &ChecksumCaps::offloaded()) else {
        assert!(sw.is_err());
        return;
    };
    if let Ok(s) = sw {
        assert_eq!(s, repr);
    }
    if let Some(q) = repr.quote() {
        assert!(q.payload.len() >= 8);
        let _ = (q.ports(), q.tcp_seq());
    }
    let mut out = vec![0u8; repr.buffer_len()];
    repr.emit(&mut Icmpv4Packet::new_unchecked(&mut out[..]), &ChecksumCaps::software());
    let p = Icmpv4Packet::new_checked(&out[..]).unwrap();
    assert_eq!(Icmpv4Repr::parse(&p, &ChecksumCaps::software()), Ok(repr));
});
