//! TcpRepr::parse: never panics, never loops; the first 8 input bytes are the source and
//! destination addresses. What parses (checksum offloaded) re-emits with a valid checksum,
//! a header of at most 60 bytes, and parses back equal (SACK blocks cut to what fits).
#![no_main]
use libfuzzer_sys::fuzz_target;
use luna_stack::wire::{ChecksumCaps, Ipv4Addr, TcpPacket, TcpRepr};

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let src = Ipv4Addr::new(data[0], data[1], data[2], data[3]);
    let dst = Ipv4Addr::new(data[4], data[5], data[6], data[7]);
    let seg = &data[8..];
    let Ok(packet) = TcpPacket::new_checked(seg) else {
        return;
    };
    // Every option step consumes at least one byte: the iterator is bounded.
    assert!(packet.option_iter().count() <= packet.options().len());
    let payload = packet.payload();
    let sw = TcpRepr::parse(&packet, src, dst, &ChecksumCaps::software());
    let Ok(repr) = TcpRepr::parse(&packet, src, dst, &ChecksumCaps::offloaded()) else {
        assert!(sw.is_err());
        return;
    };
    if let Ok(s) = sw {
        assert_eq!(s, repr);
    }
    assert!(repr.header_len() <= 60 && repr.header_len() % 4 == 0);
    let mut out = vec![0u8; repr.buffer_len(payload.len())];
    out[repr.header_len()..].copy_from_slice(payload);
    repr.emit(
        &mut TcpPacket::new_unchecked(&mut out[..]),
        src,
        dst,
        payload.len(),
        &ChecksumCaps::software(),
    );
    let p = TcpPacket::new_checked(&out[..]).unwrap();
    assert_eq!(
        TcpRepr::parse(&p, src, dst, &ChecksumCaps::software()),
        Ok(repr.emitted())
    );
    assert_eq!(p.payload(), payload);
});
