//! ArpRepr::parse: never panics; an accepted packet re-emits byte for byte.
#![no_main]
use libfuzzer_sys::fuzz_target;
use luna_stack::wire::{ArpPacket, ArpRepr};

fuzz_target!(|data: &[u8]| {
    let Ok(packet) = ArpPacket::new_checked(data) else {
        return;
    };
    // Variable-length address accessors must stay inside the buffer.
    let _ = (
        packet.sender_hardware_addr(),
        packet.sender_protocol_addr(),
        packet.target_hardware_addr(),
        packet.target_protocol_addr(),
    );
    let Ok(repr) = ArpRepr::parse(&packet) else {
        return;
    };
    let mut out = vec![0u8; repr.buffer_len()];
    repr.emit(&mut ArpPacket::new_unchecked(&mut out[..]));
    assert_eq!(&out[..], &data[..28]);
    assert_eq!(ArpRepr::parse(&ArpPacket::new_checked(&out[..]).unwrap()), Ok(repr));
});
