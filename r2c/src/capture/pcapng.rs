//! A minimal pcapng writer (and the reader its tests use): one Section Header Block, one
//! Interface Description Block per interface (link type Ethernet, nanosecond
//! timestamps), Enhanced Packet Blocks with the original length and the direction.
//!
//! Written here rather than taken from a crate: the format needs three block types and
//! about a hundred lines, the crates on crates.io (`pcap-file`) want an owned packet per
//! write and pull in more than this; the layout follows the pcapng draft
//! (draft-ietf-opsawg-pcapng, §4.1 SHB, §4.2 IDB, §4.3 EPB), little-endian.

use std::io::{self, Write};

/// LINKTYPE_ETHERNET.
pub const LINKTYPE_ETHERNET: u16 = 1;
const SHB: u32 = 0x0A0D_0D0A;
const IDB: u32 = 1;
const EPB: u32 = 6;
const BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;
const OPT_END: u16 = 0;
const OPT_COMMENT: u16 = 1;
const IF_NAME: u16 = 2;
const IF_TSRESOL: u16 = 9;
const EPB_FLAGS: u16 = 2;

/// Which way a frame went (the EPB `epb_flags` direction bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Received.
    Inbound,
    /// Sent.
    Outbound,
}

fn pad4(n: usize) -> usize {
    (4 - n % 4) % 4
}

fn option(buf: &mut Vec<u8>, code: u16, value: &[u8]) {
    buf.extend_from_slice(&code.to_le_bytes());
    buf.extend_from_slice(&(value.len() as u16).to_le_bytes());
    buf.extend_from_slice(value);
    buf.extend(std::iter::repeat_n(0u8, pad4(value.len())));
}

/// Frames `body` as a block of type `kind` (lengths before and after).
fn block(out: &mut impl Write, kind: u32, body: &[u8]) -> io::Result<()> {
    let total = (12 + body.len()) as u32;
    out.write_all(&kind.to_le_bytes())?;
    out.write_all(&total.to_le_bytes())?;
    out.write_all(body)?;
    out.write_all(&total.to_le_bytes())
}

/// Writes the Section Header Block (`comment` becomes `opt_comment`).
pub fn write_section_header(out: &mut impl Write, comment: &str) -> io::Result<()> {
    let mut b = Vec::with_capacity(32 + comment.len());
    b.extend_from_slice(&BYTE_ORDER_MAGIC.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    // Section length not given.
    b.extend_from_slice(&(-1i64).to_le_bytes());
    if !comment.is_empty() {
        option(&mut b, OPT_COMMENT, comment.as_bytes());
    }
    option(&mut b, OPT_END, &[]);
    block(out, SHB, &b)
}

/// Writes an Interface Description Block: Ethernet, `snaplen`, `if_name`, and
/// `if_tsresol` = 9 (timestamps in nanoseconds).
pub fn write_interface(out: &mut impl Write, name: &str, snaplen: u32) -> io::Result<()> {
    let mut b = Vec::with_capacity(32 + name.len());
    b.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&snaplen.to_le_bytes());
    option(&mut b, IF_NAME, name.as_bytes());
    option(&mut b, IF_TSRESOL, &[9]);
    option(&mut b, OPT_END, &[]);
    block(out, IDB, &b)
}

/// Writes an Enhanced Packet Block for interface 0..: `data` is what was captured (at most
/// the snap length), `orig_len` the frame's length on the wire, `ts_ns` nanoseconds since
/// the Unix epoch.
pub fn write_packet(
    out: &mut impl Write,
    interface: u32,
    ts_ns: u64,
    data: &[u8],
    orig_len: u32,
    dir: Direction,
) -> io::Result<()> {
    let mut b = Vec::with_capacity(40 + data.len());
    b.extend_from_slice(&interface.to_le_bytes());
    b.extend_from_slice(&((ts_ns >> 32) as u32).to_le_bytes());
    b.extend_from_slice(&(ts_ns as u32).to_le_bytes());
    b.extend_from_slice(&(data.len() as u32).to_le_bytes());
    b.extend_from_slice(&orig_len.to_le_bytes());
    b.extend_from_slice(data);
    b.extend(std::iter::repeat_n(0u8, pad4(data.len())));
    let flags: u32 = match dir {
        Direction::Inbound => 1,
        Direction::Outbound => 2,
    };
    option(&mut b, EPB_FLAGS, &flags.to_le_bytes());
    option(&mut b, OPT_END, &[]);
    block(out, EPB, &b)
}

/// One packet read back by [`read_packets`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Interface id.
    pub interface: u32,
    /// Timestamp in nanoseconds (the file's `if_tsresol` must be 9).
    pub ts_ns: u64,
    /// Captured bytes.
    pub data: Vec<u8>,
    /// Length on the wire.
    pub orig_len: u32,
    /// Direction from `epb_flags`, if present.
    pub dir: Option<Direction>,
}

/// Why a file is not the pcapng this module writes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pcapng: {0}")]
pub struct ParseError(String);

fn u16_at(b: &[u8], at: usize) -> Result<u16, ParseError> {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or_else(|| ParseError(format!("truncated at byte {at}")))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, ParseError> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| ParseError(format!("truncated at byte {at}")))
}

/// Options of a block body from `at`: `(code, value)` pairs until `opt_endofopt`.
fn options(b: &[u8], mut at: usize) -> Result<Vec<(u16, Vec<u8>)>, ParseError> {
    let mut out = Vec::new();
    while at < b.len() {
        let code = u16_at(b, at)?;
        let len = u16_at(b, at + 2)? as usize;
        if code == OPT_END {
            break;
        }
        let v = b
            .get(at + 4..at + 4 + len)
            .ok_or_else(|| ParseError(format!("option {code} overruns its block")))?;
        out.push((code, v.to_vec()));
        at += 4 + len + pad4(len);
    }
    Ok(out)
}

/// Reads a little-endian pcapng file with one section: its packets, checking block
/// framing, the byte-order magic, and that every interface is Ethernet with nanosecond
/// timestamps (a reader for tests and tools; tshark reads the same files).
pub fn read_packets(file: &[u8]) -> Result<Vec<Packet>, ParseError> {
    let mut at = 0;
    let mut packets = Vec::new();
    let mut interfaces = 0u32;
    let mut seen_shb = false;
    while at < file.len() {
        let kind = u32_at(file, at)?;
        let total = u32_at(file, at + 4)? as usize;
        if total < 12 || total % 4 != 0 || at + total > file.len() {
            return Err(ParseError(format!("bad block length {total} at byte {at}")));
        }
        if u32_at(file, at + total - 4)? as usize != total {
            return Err(ParseError(format!("trailing length differs at byte {at}")));
        }
        let body = &file[at + 8..at + total - 4];
        match kind {
            SHB => {
                if u32_at(body, 0)? != BYTE_ORDER_MAGIC {
                    return Err(ParseError("not little-endian pcapng".into()));
                }
                seen_shb = true;
            }
            _ if !seen_shb => return Err(ParseError("no section header first".into())),
            IDB => {
                if u16_at(body, 0)? != LINKTYPE_ETHERNET {
                    return Err(ParseError("interface is not Ethernet".into()));
                }
                let res = options(body, 8)?
                    .into_iter()
                    .find(|(c, _)| *c == IF_TSRESOL)
                    .map(|(_, v)| v);
                if res.as_deref() != Some(&[9]) {
                    return Err(ParseError("interface without if_tsresol = 9".into()));
                }
                interfaces += 1;
            }
            EPB => {
                let interface = u32_at(body, 0)?;
                if interface >= interfaces {
                    return Err(ParseError(format!(
                        "packet on undeclared interface {interface}"
                    )));
                }
                let ts = (u64::from(u32_at(body, 4)?) << 32) | u64::from(u32_at(body, 8)?);
                let cap = u32_at(body, 12)? as usize;
                let orig_len = u32_at(body, 16)?;
                let data = body
                    .get(20..20 + cap)
                    .ok_or_else(|| ParseError("packet data overruns its block".into()))?
                    .to_vec();
                let dir = options(body, 20 + cap + pad4(cap))?
                    .into_iter()
                    .find(|(c, _)| *c == EPB_FLAGS)
                    .and_then(|(_, v)| match v.first().map(|f| f & 3) {
                        Some(1) => Some(Direction::Inbound),
                        Some(2) => Some(Direction::Outbound),
                        _ => None,
                    });
                packets.push(Packet {
                    interface,
                    ts_ns: ts,
                    data,
                    orig_len,
                    dir,
                });
            }
            _ => {}
        }
        at += total;
    }
    Ok(packets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_round_trip_with_padding_lengths_and_direction() {
        let mut f = Vec::new();
        write_section_header(&mut f, "luna test").unwrap();
        write_interface(&mut f, "port0", 96).unwrap();
        let frames: Vec<Vec<u8>> = (0..6)
            .map(|n| (0..60 + n).map(|b| b as u8).collect())
            .collect();
        for (i, fr) in frames.iter().enumerate() {
            let dir = if i % 2 == 0 {
                Direction::Inbound
            } else {
                Direction::Outbound
            };
            write_packet(
                &mut f,
                0,
                1_700_000_000_000_000_000 + i as u64,
                fr,
                1514,
                dir,
            )
            .unwrap();
        }
        assert_eq!(f.len() % 4, 0);
        let got = read_packets(&f).unwrap();
        assert_eq!(got.len(), frames.len());
        for (i, (p, fr)) in got.iter().zip(&frames).enumerate() {
            assert_eq!(&p.data, fr);
            assert_eq!(p.orig_len, 1514);
            assert_eq!(p.ts_ns, 1_700_000_000_000_000_000 + i as u64);
            let want = if i % 2 == 0 {
                Direction::Inbound
            } else {
                Direction::Outbound
            };
            assert_eq!(p.dir, Some(want));
        }
    }

    #[test]
    fn reader_rejects_broken_files() {
        let mut f = Vec::new();
        write_section_header(&mut f, "").unwrap();
        write_interface(&mut f, "p", 64).unwrap();
        write_packet(&mut f, 0, 1, &[1, 2, 3], 3, Direction::Inbound).unwrap();
        let n = f.len();
        assert!(read_packets(&f[..n - 1]).is_err(), "truncated");
        let mut bad = f.clone();
        bad[n - 1] ^= 0x40;
        assert!(read_packets(&bad).is_err(), "trailing length");
        let mut epb_only = Vec::new();
        write_packet(&mut epb_only, 0, 1, &[1], 1, Direction::Inbound).unwrap();
        assert!(read_packets(&epb_only).is_err(), "no SHB");
        let mut undeclared = Vec::new();
        write_section_header(&mut undeclared, "").unwrap();
        write_packet(&mut undeclared, 0, 1, &[1], 1, Direction::Inbound).unwrap();
        assert!(read_packets(&undeclared).is_err(), "no IDB");
    }

    /// tshark (installed by testbed/setup.sh) reads a file the writer made: one frame,
    /// Ethernet/IPv4/TCP, with its length and timestamp.
    #[test]
    fn tshark_reads_the_writer_output() {
        if std::process::Command::new("tshark")
            .arg("-v")
            .output()
            .is_err()
        {
            eprintln!("tshark not installed; skipped (testbed/setup.sh installs it)");
            return;
        }
        // Ethernet + IPv4 + TCP SYN, checksums zero (tshark does not verify by default).
        let mut fr = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00];
        fr.extend_from_slice(&[
            0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0, 198, 18, 0, 2, 198, 18, 0, 1,
        ]);
        fr.extend_from_slice(&[
            0xf0, 0x00, 0x00, 0x07, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0,
        ]);
        let mut f = Vec::new();
        write_section_header(&mut f, "").unwrap();
        write_interface(&mut f, "port0", 65535).unwrap();
        write_packet(
            &mut f,
            0,
            1_000_000_123,
            &fr,
            fr.len() as u32,
            Direction::Inbound,
        )
        .unwrap();
        let path = std::env::temp_dir().join(format!("r2c-pcapng-{}.pcapng", std::process::id()));
        std::fs::write(&path, &f).unwrap();
        let out = std::process::Command::new("tshark")
            .args(["-r"])
            .arg(&path)
            .args([
                "-T",
                "fields",
                "-e",
                "frame.len",
                "-e",
                "tcp.dstport",
                "-e",
                "frame.time_epoch",
            ])
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let fields: Vec<&str> = text.trim().split('\t').collect();
        assert_eq!(fields[0], "54");
        assert_eq!(fields[1], "7");
        assert!(fields[2].starts_with("1.000000123"), "{text}");
    }
}
