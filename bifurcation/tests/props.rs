//! Property tests: the rule compiler steers every luna port to exactly one queue and
//! nothing of the kernel's; the classifier survives arbitrary bytes and agrees with the
//! rules.

use bifurcation::classify::{classify, LunaTarget, Verdict};
use bifurcation::model::{KernelPorts, PortOwner, TrafficConfig, TrafficModel, L4};
use bifurcation::ports::PortRange;
use bifurcation::rules::{compile, counts, mask_cover, Target};
use proptest::prelude::*;

fn model_from(threads: &[u16], listen: &[u16], balance: f64) -> TrafficModel {
    let apps: Vec<String> = threads
        .iter()
        .enumerate()
        .map(|(i, t)| format!("{{ name = \"a{i}\", threads = {t} }}"))
        .collect();
    let listen: Vec<String> = listen.iter().map(|p| p.to_string()).collect();
    let text = format!(
        "apps = [{}]\nlisten_tcp = [{}]\nlisten_udp = [{}]\nbalance = {balance}",
        apps.join(", "),
        listen.join(", "),
        listen.join(", ")
    );
    TrafficConfig::from_toml(&text)
        .unwrap()
        .validate(&KernelPorts::linux_default())
        .unwrap()
}

fn arb_model() -> impl Strategy<Value = (TrafficModel, f64)> {
    (
        prop::collection::vec(1u16..=24, 1..4),
        prop::collection::btree_set(1024u16..32768, 0..4),
        prop_oneof![Just(0.0), Just(0.0625), Just(0.125), 0.0f64..0.5],
    )
        .prop_map(|(t, l, b)| (model_from(&t, &l.into_iter().collect::<Vec<_>>(), b), b))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn mask_cover_is_exact_and_disjoint(a in 1u16..=65535, len in 0u16..=4096) {
        let b = a.saturating_add(len);
        let r = PortRange::new(a, b).unwrap();
        let c = mask_cover(r);
        prop_assert!(c.len() <= 32);
        let mut next = u32::from(a);
        for m in &c {
            prop_assert_eq!(m.value & !m.mask, 0);
            prop_assert_eq!(u32::from(m.value), next, "blocks are in order and adjacent");
            next += m.len();
        }
        prop_assert_eq!(next, u32::from(b) + 1);
    }

    #[test]
    fn every_luna_port_to_exactly_one_queue_and_nothing_of_the_kernels((m, balance) in arb_model()) {
        let rules = compile(&m);
        let plan = m.plan();
        let all_queues: Vec<u16> = {
            let mut q: Vec<u16> = plan.apps().iter().flat_map(|a| a.threads.iter().map(|t| t.queue)).collect();
            q.sort_unstable();
            q
        };
        for proto in [L4::Tcp, L4::Udp] {
            for port in 1u16..=65535 {
                let hits: Vec<_> = rules.lookup(proto, port).collect();
                match m.owner(proto, port) {
                    PortOwner::Client { queue, .. } => {
                        prop_assert_eq!(hits.len(), 1, "{} {} must match one rule", proto, port);
                        prop_assert_eq!(&hits[0].target, &Target::Queue(queue));
                    }
                    PortOwner::Listener => {
                        prop_assert_eq!(hits.len(), 1, "{} {} must match one rule", proto, port);
                        prop_assert_eq!(&hits[0].target, &Target::Rss(all_queues.clone()));
                    }
                    PortOwner::Kernel => {
                        prop_assert!(hits.is_empty(), "{} {} is the kernel's but matches {:?}", proto, port, hits);
                    }
                }
            }
        }
        // The plan's thread shares stay within ±balance of even (+1 port for rounding).
        for (i, a) in plan.apps().iter().enumerate() {
            let mine: Vec<_> = plan.assignments().iter().filter(|b| b.app == i).collect();
            let total: u32 = mine.iter().map(|b| b.ports.len()).sum();
            let share = f64::from(total) / a.threads.len() as f64;
            for t in &a.threads {
                let n: u32 = mine.iter().filter(|b| b.slot.thread == t.thread).map(|b| b.ports.len()).sum();
                prop_assert!(n >= 1);
                prop_assert!((f64::from(n) - share).abs() <= share * balance + 1.0, "{} ports vs share {}", n, share);
            }
        }
        let c = counts(plan);
        prop_assert_eq!(c.per_port, 4096);
        prop_assert!(c.masked as usize + m.listen_tcp().len() + m.listen_udp().len() == rules.len());
    }

    #[test]
    fn classifier_survives_arbitrary_bytes(frame in prop::collection::vec(any::<u8>(), 0..200)) {
        let m = model_from(&[12, 6], &[7000], 0.0625);
        let _ = classify(&m, &frame);
    }

    /// An ICMP error quoting a packet luna's address sent from `sport` is luna's exactly
    /// when a compiled rule steers that port (as a destination: the flow's replies) to
    /// luna, and then to the same owner.
    #[test]
    fn icmp_errors_follow_the_quoted_flow(
        proto in prop_oneof![Just(6u8), Just(17u8)],
        sport in any::<u16>(),
        icmp_type in prop_oneof![Just(3u8), Just(4u8), Just(11u8), Just(12u8)],
        opt_words in 0u8..=10,
    ) {
        let m = model_from(&[12, 6], &[7000], 0.0625);
        let rules = compile(&m);
        let qihl = 20 + usize::from(opt_words) * 4;
        let mut quote = vec![0u8; qihl + 8];
        quote[0] = 0x40 | (5 + opt_words);
        quote[2..4].copy_from_slice(&1500u16.to_be_bytes());
        quote[9] = proto;
        quote[12..16].copy_from_slice(&[198, 18, 0, 1]);
        quote[16..20].copy_from_slice(&[198, 18, 0, 2]);
        quote[qihl..qihl + 2].copy_from_slice(&sport.to_be_bytes());
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12] = 0x08;
        f[14] = 0x45;
        f[14 + 9] = 1;
        f[14 + 16..14 + 20].copy_from_slice(&[198, 18, 0, 1]);
        f[14 + 20] = icmp_type;
        f.extend_from_slice(&quote);
        let total = (f.len() - 14) as u16;
        f[16..18].copy_from_slice(&total.to_be_bytes());
        let l4 = if proto == 6 { L4::Tcp } else { L4::Udp };
        let v = classify(&m, &f);
        let hits: Vec<_> = rules.lookup(l4, sport).collect();
        prop_assert_eq!(matches!(v, Verdict::Luna(_)), hits.len() == 1, "{:?}", v);
        match (v, m.owner(l4, sport)) {
            (Verdict::Luna(LunaTarget::Client { queue, .. }), PortOwner::Client { queue: q, .. }) => {
                prop_assert_eq!(queue, q);
                prop_assert_eq!(&hits[0].target, &Target::Queue(q));
            }
            (Verdict::Luna(LunaTarget::Listener { proto: p, port }), PortOwner::Listener) => {
                prop_assert_eq!((p, port), (l4, sport));
            }
            (Verdict::Kernel(_), PortOwner::Kernel) => {}
            (v, o) => prop_assert!(false, "{:?} for a port owned by {:?}", v, o),
        }
    }

    #[test]
    fn classifier_agrees_with_the_rules(
        proto in prop_oneof![Just(6u8), Just(17u8)],
        port in any::<u16>(),
        tail in prop::collection::vec(any::<u8>(), 0..64),
        cut in 0usize..80,
    ) {
        let m = model_from(&[12, 6], &[7000], 0.0625);
        let rules = compile(&m);
        let l4_len = if proto == 6 { 20 } else { 8 };
        let mut f = vec![0u8; 14 + 20 + l4_len];
        f[12] = 0x08;
        f[14] = 0x45;
        f[14 + 9] = proto;
        f[14 + 16..14 + 20].copy_from_slice(&[198, 18, 0, 1]);
        f[14 + 20 + 2..14 + 20 + 4].copy_from_slice(&port.to_be_bytes());
        if proto == 6 { f[14 + 20 + 12] = 0x50; }
        f.extend_from_slice(&tail);
        let total = (f.len() - 14) as u16;
        f[16..18].copy_from_slice(&total.to_be_bytes());
        let l4 = if proto == 6 { L4::Tcp } else { L4::Udp };
        let v = classify(&m, &f);
        let hits = rules.lookup(l4, port).count();
        prop_assert_eq!(matches!(v, Verdict::Luna(_)), hits == 1, "{:?}", v);
        // Any truncation of the frame is either dropped or still classified, never a panic,
        // and never turns a kernel frame into luna's.
        let short = &f[..f.len().saturating_sub(cut)];
        let vs = classify(&m, short);
        if matches!(vs, Verdict::Luna(_)) {
            prop_assert!(matches!(v, Verdict::Luna(_)));
        }
    }
}
