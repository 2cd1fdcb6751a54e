//! Shared driver: the stream is pushed into a memcached framer in pieces whose sizes come
//! from the input, and every framed message is decoded. Invariants: no panic; the same
//! messages whatever the segmentation; every message within the cap; swallowed chunks
//! within SWALLOW_CHUNK; framed + buffered bytes = pushed bytes; decoded storage values
//! have the length their line says.

use msgsched::framer::{Framer, FramerConfig};
use msgsched::proto::memcached::{binary, kind, text, Limits, McParser, MsgKind, SWALLOW_CHUNK};
use zbuf::Zbuf;

/// Above `framer::SPILL_MIN`, so that messages copied out as they arrive are driven too.
const MAX: usize = 1 << 16;

fn run(stream: &[u8], cuts: &[u8]) -> (Vec<(MsgKind, Vec<u8>)>, Option<&'static str>) {
    let mut f = Framer::new(
        McParser::new(Limits {
            line_max: 512,
            multiget_max: 2048,
        }),
        FramerConfig {
            max_message: MAX,
            max_in_flight: 1 << 16,
            ..FramerConfig::default()
        },
    )
    .expect("config");
    let mut out = Vec::new();
    let (mut at, mut i, mut taken) = (0usize, 0usize, 0usize);
    let mut err = None;
    while at < stream.len() {
        let step = 1 + *cuts.get(i % cuts.len().max(1)).unwrap_or(&255) as usize * 4;
        i += 1;
        let end = (at + step).min(stream.len());
        f.push(Zbuf::copy_from_slice(&stream[at..end]));
        at = end;
        loop {
            match f.next_message() {
                Ok(Some(m)) => {
                    assert!(m.body.len() <= MAX);
                    let k = kind(m.stream);
                    if k == MsgKind::Swallow {
                        assert!(m.body.len() <= SWALLOW_CHUNK);
                    }
                    taken += m.body.len();
                    check(k, &m.body);
                    out.push((k, m.body.to_vec()));
                    f.reply_done();
                }
                Ok(None) => break,
                Err(e) => {
                    err = Some(match e.kind() {
                        msgsched::parser::ParseErrorKind::Malformed => "malformed",
                        msgsched::parser::ParseErrorKind::TooLarge => "too_large",
                        _ => "other",
                    });
                    break;
                }
            }
        }
        if err.is_some() {
            break;
        }
        assert_eq!(taken + f.buffered(), at);
    }
    (out, err)
}

fn check(k: MsgKind, body: &zbuf::IoVec) {
    match k {
        MsgKind::Text => {
            if let Ok(r) = text::Request::decode(body) {
                if let text::Command::Store { value, .. } = &r.cmd {
                    assert!(value.len() + 2 < body.len());
                }
                if let text::Command::Get { keys, touch, .. } = &r.cmd {
                    // `gat <exptime>` without a key is an empty answer (END), as in
                    // memcached; `get` needs a key.
                    assert!(!keys.is_empty() || touch.is_some());
                    assert!(keys.iter().all(|k| k.len() <= 250));
                }
            }
        }
        MsgKind::Binary => {
            let r = binary::Request::decode(body).expect("a framed binary message decodes");
            assert!(r.key.len() <= 250);
            let h = r.header;
            assert!(usize::from(h.keylen) + usize::from(h.extlen) <= h.bodylen as usize);
            if !r.truncated {
                assert_eq!(body.len(), binary::HDR_LEN + h.bodylen as usize);
            }
        }
        MsgKind::Swallow => {}
    }
}

/// Runs `stream` once whole-ish and once cut by `cuts`: same messages, same outcome.
pub fn fuzz(stream: &[u8], cuts: &[u8]) {
    let (a, ea) = run(stream, &[255]);
    let (b, eb) = run(stream, cuts);
    // An error ends the stream; before it, the messages agree.
    let n = a.len().min(b.len());
    assert_eq!(a[..n], b[..n]);
    if ea.is_none() && eb.is_none() {
        assert_eq!(a.len(), b.len());
    }
    // Whether a stream is broken does not depend on how it was cut, except that a
    // message-less tail may still be waiting for bytes in one run.
    if ea.is_some() && eb.is_some() {
        assert_eq!(ea, eb);
    }
}
