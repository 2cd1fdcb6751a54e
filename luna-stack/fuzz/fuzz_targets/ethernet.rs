//! EthernetRepr::parse: never panics; emit reproduces the header bytes exactly.
#![no_main]
use libfuzzer_sys::fuzz_target;
use luna_stack::wire::{EthernetFrame, EthernetRepr};

fuzz_target!(|data: &[u8]| {
    let Ok(frame) = EthernetFrame::new_checked(data) else {
        assert!(data.len() < 14);
        return;
    };
    let Ok(repr) = EthernetRepr::parse(&frame) else {
        return;
    };
    assert_eq!(frame.payload().len(), data.len() - 14);
    let mut out = vec![0u8; repr.buffer_len()];
    repr.emit(&mut EthernetFrame::new_unchecked(&mut out[..]));
    assert_eq!(&out[..], &data[..14]);
    let back = EthernetRepr::parse(&EthernetFrame::new_checked(&out[..]).unwrap());
    assert_eq!(back, Ok(repr));
});
