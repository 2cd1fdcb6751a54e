//! UdpRepr::parse: never panics; the first 8 input bytes are the addresses. What parses
//! re-emits with a valid non-zero checksum and parses back equal.
#![no_main]
use libfuzzer_sys::fuzz_target;
use luna_stack::wire::{ChecksumCaps, Ipv4Addr, UdpPacket, UdpRepr};

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let src = Ipv4Addr::new(data[0], data[1], data[2], data[3]);
    let dst = Ipv4Addr::new(data[4], data[5], data[6], data[7]);
    let Ok(packet) = UdpPacket::new_checked(&data[8..]) else {
        return;
    };
    let payload = packet.payload();
    let sw = UdpRepr::parse(&packet, src, dst, &ChecksumCaps::software());
    let Ok(repr) = UdpRepr::parse(&packet, src, dst, &ChecksumCaps::offloaded()) else {
        assert!(sw.is_err());
        return;
    };
    if let Ok(s) = sw {
        assert_eq!(s, repr);
    }
    let mut out = vec![0u8; repr.buffer_len(payload.len())];
    out[8..].copy_from_slice(payload);
    repr.emit(
        &mut UdpPacket::new_unchecked(&mut out[..]),
        src,
        dst,
        payload.len(),
        &ChecksumCaps::software(),
    );
    let p = UdpPacket::new_checked(&out[..]).unwrap();
    assert_ne!(p.checksum(), 0);
    assert_eq!(UdpRepr::parse(&p, src, dst, &ChecksumCaps::software()), Ok(repr));
    assert_eq!(p.payload(), payload);
});
