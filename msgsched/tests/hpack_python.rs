//! HPACK interop with Python's `hpack` package (python-hyper; Debian python3-hpack,
//! pulled in by python3-h2): header blocks our encoder writes (Huffman on and off,
//! dynamic table in use, a table size change mid-connection) decode in Python to the
//! same fields, and blocks Python's encoder writes with Huffman decode in ours.
//! Skipped, with the reason printed, only when `/usr/bin/python3` cannot import `hpack`.

use msgsched::proto::h2::hpack::{Decoder, Encoder, Field, HpackLimits};
use std::io::Write;
use std::process::{Command, Stdio};

const PYTHON: &str = "/usr/bin/python3";

/// Reads lines from stdin: `D <hex block>` decodes one block with one connection's
/// decoder and prints the fields as `name_hex:value_hex` separated by spaces (a line
/// per block); `T <size>` sets the encoder's table size; `E <name_hex:value_hex ...>`
/// encodes a list with Huffman and prints the block's hex, then the same list's block
/// from a second encoder that never uses Huffman (same table history).
const SCRIPT: &str = r#"
import sys, hpack
dec = hpack.Decoder()
dec.max_header_list_size = 1 << 30
enc = hpack.Encoder()
raw = hpack.Encoder()
for line in sys.stdin:
    op, _, arg = line.rstrip("\n").partition(" ")
    if op == "D":
        fields = dec.decode(bytes.fromhex(arg), raw=True)
        print(" ".join(n.hex() + ":" + v.hex() for n, v in fields))
    elif op == "T":
        enc.header_table_size = int(arg)
        raw.header_table_size = int(arg)
    elif op == "E":
        pairs = [p.split(":") for p in arg.split(" ") if p]
        hs = [(bytes.fromhex(n), bytes.fromhex(v)) for n, v in pairs]
        print(enc.encode(hs, huffman=True).hex(), raw.encode(hs, huffman=False).hex())
    sys.stdout.flush()
"#;

fn python_hpack() -> Option<()> {
    let ok = Command::new(PYTHON)
        .args(["-c", "import hpack"])
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        Some(())
    } else {
        println!("SKIPPED: {PYTHON} cannot import hpack (install python3-hpack / python3-h2)");
        None
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex from python"))
        .collect()
}

fn run_python(input: &str) -> Vec<String> {
    let mut child = Command::new(PYTHON)
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn python3");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write to python");
    let out = child.wait_with_output().expect("python output");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(str::to_owned)
        .collect()
}

fn parse_fields(line: &str) -> Vec<Field> {
    line.split(' ')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (n, v) = p.split_once(':').expect("name:value");
            (unhex(n), unhex(v))
        })
        .collect()
}

/// A deterministic mix of header lists: realistic responses and requests (so the
/// static and dynamic tables are hit), repeats, and fields of arbitrary octets.
fn lists() -> Vec<Vec<Field>> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let f = |n: &str, v: &str| (n.as_bytes().to_vec(), v.as_bytes().to_vec());
    let mut out = Vec::new();
    for i in 0..120 {
        let mut l = vec![
            f(":status", ["200", "404", "503"][i % 3]),
            f("content-type", "application/grpc"),
            f(
                "date",
                &format!("Wed, 02 Dec 2026 13:{:02}:{:02} GMT", i / 60, i % 60),
            ),
            f("content-length", &(next() % 100_000).to_string()),
        ];
        if i % 4 == 0 {
            l.push(f("authorization", "Bearer abc.def"));
        }
        if i % 5 == 0 {
            let n: Vec<u8> = (0..1 + next() % 12)
                .map(|_| b'a' + (next() % 26) as u8)
                .collect();
            let v: Vec<u8> = (0..next() % 60).map(|_| next() as u8).collect();
            l.push((n, v));
        }
        if i % 17 == 0 {
            l.push((b"x-big".to_vec(), vec![b'q'; 3500]));
        }
        out.push(l);
    }
    out
}

#[test]
fn our_blocks_decode_in_python() {
    if python_hpack().is_none() {
        return;
    }
    for huffman in [true, false] {
        let mut e = Encoder::with_huffman(huffman);
        let lists = lists();
        let mut input = String::new();
        for (i, l) in lists.iter().enumerate() {
            if i == 60 {
                e.set_peer_table_size(256); // a size update in the next block
            }
            let mut b = Vec::new();
            e.encode(l.iter().map(|(n, v)| (&n[..], &v[..])), &mut b);
            input.push_str(&format!("D {}\n", hex(&b)));
        }
        let got = run_python(&input);
        assert_eq!(got.len(), lists.len(), "one line per block");
        for (i, (line, want)) in got.iter().zip(&lists).enumerate() {
            assert_eq!(&parse_fields(line), want, "block {i}, huffman {huffman}");
        }
    }
}

#[test]
fn python_huffman_blocks_decode_in_ours() {
    if python_hpack().is_none() {
        return;
    }
    let lists = lists();
    let mut input = String::new();
    for (i, l) in lists.iter().enumerate() {
        if i == 60 {
            input.push_str("T 256\n");
        }
        let arg: Vec<String> = l
            .iter()
            .map(|(n, v)| format!("{}:{}", hex(n), hex(v)))
            .collect();
        input.push_str(&format!("E {}\n", arg.join(" ")));
    }
    let lines = run_python(&input);
    assert_eq!(lines.len(), lists.len());
    let mut d = Decoder::new(HpackLimits::default());
    let mut d_raw = Decoder::new(HpackLimits::default());
    let (mut huff_bytes, mut raw_bytes) = (0, 0);
    for (i, (line, want)) in lines.iter().zip(&lists).enumerate() {
        let (h, r) = line.split_once(' ').expect("two blocks");
        let (h, r) = (unhex(h), unhex(r));
        huff_bytes += h.len();
        raw_bytes += r.len();
        assert_eq!(&d.decode(&h).unwrap(), want, "Huffman block {i}");
        assert_eq!(&d_raw.decode(&r).unwrap(), want, "raw block {i}");
    }
    // Python really used Huffman: its coded blocks are smaller than its raw ones.
    assert!(huff_bytes < raw_bytes, "{huff_bytes} vs {raw_bytes}");
}
