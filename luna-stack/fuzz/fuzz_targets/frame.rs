//! A whole received frame through every layer, as the RX path chains them: each layer's
//! payload is bounded by the layer below (Ethernet padding never reaches the transport).
#![no_main]
use libfuzzer_sys::fuzz_target;
use luna_stack::wire::{
    ArpPacket, ArpRepr, ChecksumCaps, EtherType, EthernetFrame, EthernetRepr, Icmpv4Packet,
    Icmpv4Repr, IpProtocol, Ipv4Packet, Ipv4Repr, TcpPacket, TcpRepr, UdpPacket, UdpRepr,
};

fuzz_target!(|data: &[u8]| {
    let caps = ChecksumCaps::offloaded();
    let Ok(frame) = EthernetFrame::new_checked(data) else {
        return;
    };
    let Ok(eth) = EthernetRepr::parse(&frame) else {
        return;
    };
    match eth.ethertype {
        EtherType::Arp => {
            if let Ok(p) = ArpPacket::new_checked(frame.payload()) {
                let _ = ArpRepr::parse(&p);
            }
        }
        EtherType::Ipv4 => {
            let Ok(ipp) = Ipv4Packet::new_checked(frame.payload()) else {
                return;
            };
            let Ok(ip) = Ipv4Repr::parse(&ipp, &caps) else {
                return;
            };
            if ip.is_fragment() {
                return;
            }
            let l4 = ipp.payload();
            assert_eq!(l4.len(), ip.payload_len);
            match ip.protocol {
                IpProtocol::Tcp => {
                    if let Ok(p) = TcpPacket::new_checked(l4) {
                        if TcpRepr::parse(&p, ip.src_addr, ip.dst_addr, &caps).is_ok() {
                            assert!(p.header_len() + p.payload().len() == l4.len());
                        }
                    }
                }
                IpProtocol::Udp => {
                    if let Ok(p) = UdpPacket::new_checked(l4) {
                        let _ = UdpRepr::parse(&p, ip.src_addr, ip.dst_addr, &caps);
                        assert!(8 + p.payload().len() <= l4.len());
                    }
                }
                IpProtocol::Icmp => {
                    if let Ok(p) = Icmpv4Packet::new_checked(l4) {
                        let _ = Icmpv4Repr::parse(&p, &caps);
                    }
                }
                IpProtocol::Unknown(_) => {}
            }
        }
        EtherType::Ipv6 | EtherType::Unknown(_) => {}
    }
});
