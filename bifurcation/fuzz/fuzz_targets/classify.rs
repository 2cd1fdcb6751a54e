//! Classifier: never panics on any bytes; drops a frame as `bad_ipv4` exactly when
//! luna-stack's IPv4 length/version checks refuse it; a luna verdict always names a port
//! the compiled rules steer (so software and hardware paths agree; for an ICMP error, the
//! quoted packet's source port).
#![no_main]
use bifurcation::classify::{Classifier, DropReason, LunaTarget, Verdict};
use bifurcation::model::{KernelPorts, TrafficConfig, L4};
use bifurcation::rules::compile;
use libfuzzer_sys::fuzz_target;
use luna_stack::wire::Ipv4Packet;
use std::sync::OnceLock;

fn setup() -> &'static (Classifier, bifurcation::RuleSet) {
    static S: OnceLock<(Classifier, bifurcation::RuleSet)> = OnceLock::new();
    S.get_or_init(|| {
        let m = TrafficConfig::from_toml(
            "listen_tcp = [7000]\nlisten_udp = [7001]\nip = \"198.18.0.1\"\n\
             apps = [{ name = \"a\", threads = 12 }, { name = \"b\", threads = 6 }]",
        )
        .unwrap()
        .validate(&KernelPorts::linux_default())
        .unwrap();
        let rules = compile(&m);
        (Classifier::new(m), rules)
    })
}

fuzz_target!(|data: &[u8]| {
    let (c, rules) = setup();
    let mut c = c.clone();
    let v = c.classify(data);
    let ipv4 = data.len() >= 14 && data[12..14] == [0x08, 0x00];
    if ipv4 {
        let ip = &data[14..];
        let stack_ok = Ipv4Packet::new_checked(ip).is_ok() && ip[0] >> 4 == 4;
        assert_eq!(
            v == Verdict::Drop(DropReason::BadIpv4),
            !stack_ok,
            "classifier and luna-stack disagree on {ip:02x?}"
        );
    }
    if let Verdict::Luna(t) = v {
        assert!(ipv4);
        let ihl = usize::from(data[14] & 0x0f) * 4;
        let (port, proto) = if data[14 + 9] == 1 {
            // An ICMP error: the quoted packet's source port is luna's (its flow).
            let q = &data[14 + ihl + 8..];
            let qihl = usize::from(q[0] & 0x0f) * 4;
            let proto = if q[9] == 6 { L4::Tcp } else { L4::Udp };
            (u16::from_be_bytes([q[qihl], q[qihl + 1]]), proto)
        } else {
            let port = u16::from_be_bytes([data[14 + ihl + 2], data[14 + ihl + 3]]);
            (port, if data[14 + 9] == 6 { L4::Tcp } else { L4::Udp })
        };
        assert_eq!(rules.lookup(proto, port).count(), 1, "{t:?}");
        if let LunaTarget::Listener { port: p, proto: q } = t {
            assert_eq!((p, q), (port, proto));
        }
    }
    let n = c.counters();
    assert_eq!(n.luna_total() + n.kernel_total() + n.drop_total(), 1);
});
