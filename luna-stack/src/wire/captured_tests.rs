//! Whole-packet tests on bytes built by an independent implementation (scapy 2.5, with its
//! own checksum code), committed as bytes: parse through every layer, then emit the parsed
//! reprs and compare with the original bytes where the layout is ours too.

use super::*;
use crate::wire::SeqNum;

const A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

// Ether/IP(id=0x4242, DF, ttl 63, tos 0xb8)/TCP(80 -> 40000, seq 1000, ack 2000, A,
// win 502, <nop,nop,TS 11111 22222,nop,nop,sack 3000:4000 5000:6000>)/"payload!"
const TCP_SACK_FRAME: [u8; 94] = [
    0x52, 0x54, 0x00, 0xab, 0xcd, 0xef, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x45, 0xb8,
    0x00, 0x50, 0x42, 0x42, 0x40, 0x00, 0x3f, 0x06, 0x6c, 0x86, 0xc6, 0x12, 0x00, 0x01, 0xc6, 0x12,
    0x00, 0x02, 0x00, 0x50, 0x9c, 0x40, 0x00, 0x00, 0x03, 0xe8, 0x00, 0x00, 0x07, 0xd0, 0xd0, 0x10,
    0x01, 0xf6, 0x64, 0x51, 0x00, 0x00, 0x01, 0x01, 0x08, 0x0a, 0x00, 0x00, 0x2b, 0x67, 0x00, 0x00,
    0x56, 0xce, 0x01, 0x01, 0x05, 0x12, 0x00, 0x00, 0x0b, 0xb8, 0x00, 0x00, 0x0f, 0xa0, 0x00, 0x00,
    0x13, 0x88, 0x00, 0x00, 0x17, 0x70, 0x70, 0x61, 0x79, 0x6c, 0x6f, 0x61, 0x64, 0x21,
];

// IP(options=[record route 198.18.0.9])/UDP(1234 -> 4321)/"rr": IHL 7.
const IP_RR_UDP: [u8; 38] = [
    0x47, 0x00, 0x00, 0x26, 0x00, 0x01, 0x00, 0x00, 0x40, 0x11, 0xc5, 0xd1, 0xc6, 0x12, 0x00, 0x01,
    0xc6, 0x12, 0x00, 0x02, 0x07, 0x07, 0x04, 0xc6, 0x12, 0x00, 0x09, 0x00, 0x04, 0xd2, 0x10, 0xe1,
    0x00, 0x0a, 0xeb, 0x8c, 0x72, 0x72,
];

// IP(198.18.0.254 -> .2)/ICMP(type 3, code 4, nexthopmtu 1280) quoting the first 28 bytes of
// IP(.2 -> .1, DF)/TCP(40000 -> 80, seq 0xdeadbeef, PA)/1400 bytes.
const ICMP_FRAG_NEEDED: [u8; 56] = [
    0x45, 0x00, 0x00, 0x38, 0x00, 0x01, 0x00, 0x00, 0x40, 0x01, 0xed, 0x9f, 0xc6, 0x12, 0x00, 0xfe,
    0xc6, 0x12, 0x00, 0x02, 0x03, 0x04, 0xbd, 0xcd, 0x00, 0x00, 0x05, 0x00, 0x45, 0x00, 0x05, 0xa0,
    0x00, 0x01, 0x40, 0x00, 0x40, 0x06, 0xa9, 0x2f, 0xc6, 0x12, 0x00, 0x02, 0xc6, 0x12, 0x00, 0x01,
    0x9c, 0x40, 0x00, 0x50, 0xde, 0xad, 0xbe, 0xef,
];

#[test]
fn rfc2018_rfc7323_captured_sack_segment_parses_and_reemits_identically() {
    let caps = ChecksumCaps::software();
    let frame = EthernetFrame::new_checked(&TCP_SACK_FRAME[..]).unwrap();
    let eth = EthernetRepr::parse(&frame).unwrap();
    let ipp = Ipv4Packet::new_checked(frame.payload()).unwrap();
    let ip = Ipv4Repr::parse(&ipp, &caps).unwrap();
    assert_eq!((ip.dscp, ip.ecn, ip.ttl, ip.ident), (46, 0, 63, 0x4242));
    let tcpp = TcpPacket::new_checked(ipp.payload()).unwrap();
    let tcp = TcpRepr::parse(&tcpp, ip.src_addr, ip.dst_addr, &caps).unwrap();
    assert_eq!(tcp.seq, SeqNum(1000));
    assert_eq!(tcp.ack, SeqNum(2000));
    assert_eq!(
        tcp.options.timestamps,
        Some(Timestamps {
            tsval: 11111,
            tsecr: 22222
        })
    );
    assert_eq!(
        tcp.options.sack_blocks.as_slice(),
        &[(SeqNum(3000), SeqNum(4000)), (SeqNum(5000), SeqNum(6000))]
    );
    assert_eq!(tcpp.payload(), b"payload!");

    // Our emitter uses the same aligned layout, so every byte (checksums included) matches.
    let mut out = vec![0u8; TCP_SACK_FRAME.len()];
    let mut f = EthernetFrame::new_unchecked(&mut out[..]);
    eth.emit(&mut f);
    let mut ipo = Ipv4Packet::new_unchecked(f.payload_mut());
    ip.emit(&mut ipo, &caps);
    let seg = ipo.payload_mut();
    seg[tcp.header_len()..].copy_from_slice(b"payload!");
    tcp.emit(&mut TcpPacket::new_unchecked(seg), A, B, 8, &caps);
    assert_eq!(out, TCP_SACK_FRAME);
}

#[test]
fn rfc791_captured_ip_options_skipped_udp_parsed() {
    let caps = ChecksumCaps::software();
    let ipp = Ipv4Packet::new_checked(&IP_RR_UDP[..]).unwrap();
    let ip = Ipv4Repr::parse(&ipp, &caps).unwrap();
    assert_eq!(ipp.header_len(), 28);
    assert_eq!(ipp.options()[0], 7); // record route
    assert_eq!((ip.protocol, ip.payload_len), (IpProtocol::Udp, 10));
    let udpp = UdpPacket::new_checked(ipp.payload()).unwrap();
    let udp = UdpRepr::parse(&udpp, ip.src_addr, ip.dst_addr, &caps).unwrap();
    assert_eq!(
        udp,
        UdpRepr {
            src_port: 1234,
            dst_port: 4321
        }
    );
    assert_eq!(udpp.payload(), b"rr");
}

#[test]
fn rfc1191_rfc5927_captured_frag_needed() {
    let caps = ChecksumCaps::software();
    let ipp = Ipv4Packet::new_checked(&ICMP_FRAG_NEEDED[..]).unwrap();
    let ip = Ipv4Repr::parse(&ipp, &caps).unwrap();
    assert_eq!(ip.protocol, IpProtocol::Icmp);
    let icmpp = Icmpv4Packet::new_checked(ipp.payload()).unwrap();
    let icmp = Icmpv4Repr::parse(&icmpp, &caps).unwrap();
    let Icmpv4Repr::DstUnreachable {
        reason: Icmpv4DstUnreachable::FragRequired,
        next_hop_mtu: 1280,
        quote,
    } = icmp
    else {
        panic!("unexpected {icmp:?}");
    };
    assert_eq!((quote.header.src_addr, quote.header.dst_addr), (B, A));
    assert_eq!(quote.header.payload_len, 1420);
    assert_eq!(quote.ports(), Some((40000, 80)));
    assert_eq!(quote.tcp_seq(), Some(SeqNum(0xdead_beef)));
    // Re-emitting reproduces the message, quoted header checksum included.
    let mut out = vec![0u8; icmp.buffer_len()];
    icmp.emit(&mut Icmpv4Packet::new_unchecked(&mut out[..]), &caps);
    assert_eq!(&out[..], ipp.payload());
}
