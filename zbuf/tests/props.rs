//! Property tests: `IoVec` and `Zbuf` against a `Vec<u8>` model.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use zbuf::{HugepageMode, IoVec, Slab, SlabConfig, Zbuf};

#[derive(Debug, Clone)]
enum Op {
    SplitTo(usize),
    SplitOff(usize),
    Advance(usize),
    Truncate(usize),
    Slice(usize, usize),
    Append(Vec<Vec<u8>>, bool),
    Push(Vec<u8>),
    Reassemble(usize),
}

fn segs() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..7)
}

fn op() -> impl Strategy<Value = Op> {
    let n = 0usize..160;
    prop_oneof![
        n.clone().prop_map(Op::SplitTo),
        n.clone().prop_map(Op::SplitOff),
        n.clone().prop_map(Op::Advance),
        n.clone().prop_map(Op::Truncate),
        (n.clone(), n.clone()).prop_map(|(a, b)| Op::Slice(a, b)),
        (segs(), any::<bool>()).prop_map(|(s, c)| Op::Append(s, c)),
        prop::collection::vec(any::<u8>(), 0..40).prop_map(Op::Push),
        n.prop_map(Op::Reassemble),
    ]
}

/// Builds an io-vector over `segs`; `contiguous` puts them all in one object split at
/// the boundaries (so pushes merge), otherwise one object per segment.
fn build(segs: &[Vec<u8>], contiguous: bool) -> IoVec {
    if contiguous {
        let mut all = Zbuf::from_vec(segs.concat());
        segs.iter().map(|s| all.split_to(s.len())).collect()
    } else {
        segs.iter().map(|s| Zbuf::from_vec(s.clone())).collect()
    }
}

fn bytes(v: &IoVec) -> Vec<u8> {
    v.chunks().flat_map(|c| c.iter().copied()).collect()
}

fn check(v: &IoVec, model: &[u8]) -> Result<(), TestCaseError> {
    prop_assert_eq!(v.len(), model.len());
    prop_assert_eq!(v.is_empty(), model.is_empty());
    prop_assert_eq!(bytes(v), model);
    prop_assert!(
        v.segments().iter().all(|z| !z.is_empty()),
        "no empty segments"
    );
    prop_assert_eq!(v.segments().iter().map(|z| z.len()).sum::<usize>(), v.len());
    Ok(())
}

fn apply(v: &mut IoVec, model: &mut Vec<u8>, op: Op) -> Result<(), TestCaseError> {
    let len = model.len();
    match op {
        Op::SplitTo(n) if n <= len => {
            let head = v.split_to(n);
            check(&head, &model[..n])?;
            model.drain(..n);
        }
        Op::SplitOff(n) if n <= len => {
            let tail = v.split_off(n);
            check(&tail, &model[n..])?;
            model.truncate(n);
        }
        Op::Advance(n) if n <= len => {
            v.advance(n);
            model.drain(..n);
        }
        Op::SplitTo(n) | Op::SplitOff(n) | Op::Advance(n) => {
            let before = v.clone();
            prop_assert!(v.try_split_to(n).is_err());
            prop_assert!(v.try_split_off(n).is_err());
            prop_assert!(v.try_advance(n).is_err());
            prop_assert_eq!(&*v, &before, "failed calls change nothing");
        }
        Op::Truncate(n) => {
            v.truncate(n);
            model.truncate(n);
        }
        Op::Slice(a, b) => match v.try_slice(a..b) {
            Ok(s) => {
                prop_assert!(a <= b && b <= len);
                check(&s, &model[a..b])?;
                let t = v.slice(a..);
                check(&t, &model[a..])?;
            }
            Err(e) => {
                prop_assert!(a > b || b > len);
                prop_assert_eq!((e.start, e.end, e.len), (a, b, len));
            }
        },
        Op::Append(segs, contiguous) => {
            v.append(build(&segs, contiguous));
            model.extend(segs.concat());
        }
        Op::Push(s) => {
            v.push(Zbuf::from_vec(s.clone()));
            model.extend(s);
        }
        Op::Reassemble(n) => {
            let at = n.min(len);
            let mut head = v.split_to(at);
            let tail = std::mem::take(v);
            head.append(tail);
            *v = head;
        }
    }
    check(v, model)
}

proptest! {
    #![proptest_config(Config { cases: 512, ..Config::default() })]

    #[test]
    fn iovec_matches_vec_model(init in segs(), contiguous in any::<bool>(), ops in prop::collection::vec(op(), 0..24)) {
        let mut v = build(&init, contiguous);
        let mut model = init.concat();
        check(&v, &model)?;
        for op in ops {
            apply(&mut v, &mut model, op)?;
        }
        let mut out = vec![0u8; model.len() + 3];
        prop_assert_eq!(v.copy_to_slice(&mut out), model.len());
        prop_assert_eq!(&out[..model.len()], &model[..]);
        prop_assert_eq!(v.to_vec(), model);
    }

    #[test]
    fn contiguous_pushes_merge_into_one_segment(data in prop::collection::vec(any::<u8>(), 1..200), cuts in prop::collection::vec(0usize..200, 0..8)) {
        let mut z = Zbuf::from_vec(data.clone());
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (data.len() + 1)).collect();
        cuts.sort_unstable();
        let mut v = IoVec::new();
        let mut pos = 0;
        for c in cuts {
            v.push(z.split_to(c - pos));
            pos = c;
        }
        v.push(z);
        prop_assert_eq!(v.num_segments(), 1);
        prop_assert_eq!(bytes(&v), data);
    }

    #[test]
    fn zbuf_slicing_matches_slices(data in prop::collection::vec(any::<u8>(), 0..100), ops in prop::collection::vec((0u8..5, 0usize..120, 0usize..120), 0..16)) {
        let root = Zbuf::from_vec(data.clone());
        let mut z = root.clone();
        let mut model = data.clone();
        let mut keep = Vec::new();
        for (kind, a, b) in ops {
            let len = model.len();
            match kind {
                0 => match z.try_slice(a..b) {
                    Ok(s) => { prop_assert_eq!(&s[..], &model[a..b]); keep.push(s); }
                    Err(_) => prop_assert!(a > b || b > len),
                },
                1 => match z.try_split_to(a) {
                    Ok(h) => { prop_assert_eq!(&h[..], &model[..a]); model.drain(..a); keep.push(h); }
                    Err(_) => prop_assert!(a > len),
                },
                2 => match z.try_split_off(a) {
                    Ok(t) => { prop_assert_eq!(&t[..], &model[a..]); model.truncate(a); keep.push(t); }
                    Err(_) => prop_assert!(a > len),
                },
                3 => match z.try_advance(a) {
                    Ok(()) => { model.drain(..a); }
                    Err(_) => prop_assert!(a > len),
                },
                _ => { z.truncate(a); model.truncate(a); }
            }
            prop_assert_eq!(&z[..], &model[..]);
            prop_assert_eq!(z.len(), model.len());
            prop_assert!(z.same_object(&root));
        }
        prop_assert_eq!(root.ref_count(), 2 + keep.len());
        drop(keep);
        drop(z);
        prop_assert_eq!(root.ref_count(), 1, "every view released its reference");
        prop_assert_eq!(&root[..], &data[..], "views never changed the bytes");
    }
}

/// The same model over slab-backed buffers (normal pages), one cache for all cases.
#[test]
fn iovec_over_slab_buffers_matches_vec_model() {
    let slab = Slab::new(
        SlabConfig::new()
            .hugepages(HugepageMode::Never)
            .max_memory(32 << 20),
    )
    .unwrap();
    let cache = slab.core_cache(0).unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 256,
        ..Config::default()
    });
    runner
        .run(
            &(segs(), prop::collection::vec(op(), 0..16)),
            |(init, ops)| {
                let mut v = IoVec::new();
                for s in &init {
                    let mut m = cache.alloc(s.len()).unwrap();
                    m.extend_from_slice(s).unwrap();
                    v.push(m.freeze());
                }
                let mut model = init.concat();
                for op in ops {
                    apply(&mut v, &mut model, op)?;
                }
                Ok(())
            },
        )
        .unwrap();
    drop(cache);
    assert!(slab.leak_report().is_clean(), "{}", slab.leak_report());
}
