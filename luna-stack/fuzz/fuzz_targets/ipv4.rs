//! Ipv4Repr::parse: never panics; payload stays within Total Length; what parses (checksum
//! offloaded) re-emits with a valid software checksum and parses back equal.
#![no_main]
use libfuzzer_sys::fuzz_target;
use luna_stack::wire::{ChecksumCaps, Ipv4Packet, Ipv4Repr};

fuzz_target!(|data: &[u8]| {
    let Ok(packet) = Ipv4Packet::new_checked(data) else {
        return;
    };
    let payload = packet.payload();
    assert!(packet.header_len() + payload.len() <= data.len());
    let _ = packet.options();
    let sw = Ipv4Repr::parse(&packet, &ChecksumCaps::software());
    let Ok(repr) = Ipv4Repr::parse(&packet, &ChecksumCaps::offloaded()) else {
        assert!(sw.is_err());
        return;
    };
    if let Ok(s) = sw {
        assert_eq!(s, repr);
    }
    assert_eq!(repr.payload_len, payload.len());
    assert_eq!(repr.is_fragment(), packet.is_fragment());
    let mut out = vec![0u8; repr.buffer_len()];
    {
        let mut p = Ipv4Packet::new_unchecked(&mut out[..]);
        repr.emit(&mut p, &ChecksumCaps::software());
        p.payload_mut().copy_from_slice(payload);
    }
    let p = Ipv4Packet::new_checked(&out[..]).unwrap();
    assert_eq!(Ipv4Repr::parse(&p, &ChecksumCaps::software()), Ok(repr));
    assert_eq!(p.payload(), payload);
    // The quoted-header parser must accept whatever the full parser does.
    assert_eq!(Ipv4Repr::parse_quoted(data).map(|(r, _)| r), Ok(repr));
});
