//! Packet capture of the stack's own traffic, per port, on demand (`lunactl capture`).
//!
//! While a capture is on, each core polling the port copies every received frame and
//! every transmitted frame (header bytes, then the payload io-vector's segments in order)
//! up to the snap length into the port's [`CaptureRing`]; a writer thread drains the ring
//! into a pcapng file ([`pcapng`]). Off, the core pays one branch per burst (an
//! `Option` it owns, no atomic). The ring holds at most `ring_frames` frames: when the
//! writer falls behind, the oldest frame is replaced and counted (`dropped_oldest`), so
//! memory stays bounded at `ring_frames` × min(snaplen, frame length).
//!
//! A transmitted frame is captured once the device has accepted it: the core copies the
//! frames waiting for the device before `tx_burst`, commits the accepted prefix and keeps
//! the copies of refused frames for the retry (discarding them if the runtime drops them).

pub mod pcapng;

use crossbeam_queue::ArrayQueue;
use luna_stack::stack::Transmit;
use pcapng::Direction;
use std::collections::VecDeque;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use zbuf::Zbuf;

/// Largest snap length accepted.
pub const MAX_SNAPLEN: u32 = 65535;
/// Largest ring accepted, in frames.
pub const MAX_RING_FRAMES: usize = 1 << 20;

/// One captured frame.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// Length on the wire.
    pub orig_len: u32,
    /// Which way it went.
    pub dir: Direction,
    /// The first `snaplen` bytes.
    pub data: Vec<u8>,
}

/// Counters of one capture.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CaptureStats {
    /// Frames the cores copied into the ring.
    pub captured: u64,
    /// Frames replaced in a full ring before the writer got them (oldest first).
    pub dropped_oldest: u64,
    /// Frames written to the file.
    pub written: u64,
    /// Bytes written to the file (pcapng blocks included).
    pub file_bytes: u64,
}

/// The ring one port's cores push into and the writer drains (lock-free, bounded).
#[derive(Debug)]
pub struct CaptureRing {
    port: u16,
    snaplen: u32,
    frames: ArrayQueue<Frame>,
    captured: AtomicU64,
    dropped_oldest: AtomicU64,
}

impl CaptureRing {
    /// A ring of `ring_frames` frames for `port`, cutting frames at `snaplen` bytes.
    pub fn new(port: u16, snaplen: u32, ring_frames: usize) -> Self {
        CaptureRing {
            port,
            snaplen: snaplen.clamp(1, MAX_SNAPLEN),
            frames: ArrayQueue::new(ring_frames.clamp(1, MAX_RING_FRAMES)),
            captured: AtomicU64::new(0),
            dropped_oldest: AtomicU64::new(0),
        }
    }

    /// The port captured.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The snap length.
    pub fn snaplen(&self) -> u32 {
        self.snaplen
    }

    /// Adds a frame, replacing the oldest one when full (counted).
    pub fn push(&self, f: Frame) {
        self.captured.fetch_add(1, Ordering::Relaxed);
        if self.frames.force_push(f).is_some() {
            self.dropped_oldest.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The oldest frame, if any.
    pub fn pop(&self) -> Option<Frame> {
        self.frames.pop()
    }

    /// (captured, dropped_oldest) so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.captured.load(Ordering::Relaxed),
            self.dropped_oldest.load(Ordering::Relaxed),
        )
    }
}

/// A core's side of a capture: the ring and the copies of frames waiting for the device.
#[derive(Debug)]
pub(crate) struct CoreCapture {
    ring: Arc<CaptureRing>,
    /// Unix-epoch nanoseconds at the core clock's zero.
    epoch_offset_ns: u64,
    /// Copies of the first `staged.len()` frames of the core's transmit queue.
    staged: VecDeque<Frame>,
}

impl CoreCapture {
    /// `now_ns` is the core clock's current reading (its offset to the wall clock is taken
    /// once, here).
    pub(crate) fn new(ring: Arc<CaptureRing>, now_ns: u64) -> Self {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        CoreCapture {
            ring,
            epoch_offset_ns: wall.saturating_sub(now_ns),
            staged: VecDeque::new(),
        }
    }

    pub(crate) fn port(&self) -> u16 {
        self.ring.port
    }

    /// Copies received frames.
    pub(crate) fn on_rx(&mut self, now_ns: u64, frames: &[Zbuf]) {
        let ts = self.epoch_offset_ns + now_ns;
        let snap = self.ring.snaplen as usize;
        for f in frames {
            let n = f.len().min(snap);
            self.ring.push(Frame {
                ts_ns: ts,
                orig_len: f.len() as u32,
                dir: Direction::Inbound,
                data: f[..n].to_vec(),
            });
        }
    }

    /// Copies the frames of `tx` not copied yet (before `tx_burst`).
    pub(crate) fn stage_tx(&mut self, now_ns: u64, tx: &VecDeque<Transmit>) {
        let ts = self.epoch_offset_ns + now_ns;
        let snap = self.ring.snaplen as usize;
        for t in tx.iter().skip(self.staged.len()) {
            let mut data = Vec::with_capacity(t.len().min(snap));
            for part in std::iter::once(t.header()).chain(t.payload.chunks()) {
                let room = snap - data.len();
                data.extend_from_slice(&part[..part.len().min(room)]);
                if data.len() == snap {
                    break;
                }
            }
            self.staged.push_back(Frame {
                ts_ns: ts,
                orig_len: t.len() as u32,
                dir: Direction::Outbound,
                data,
            });
        }
    }

    /// The device accepted the first `n` frames of the transmit queue.
    pub(crate) fn commit_tx(&mut self, n: usize) {
        for f in self.staged.drain(..n.min(self.staged.len())) {
            self.ring.push(f);
        }
    }

    /// The runtime dropped the first `n` frames of its transmit queue: their copies go too.
    pub(crate) fn discard_tx_front(&mut self, n: usize) {
        self.staged.drain(..n.min(self.staged.len()));
    }
}

/// Why a capture could not start.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The file could not be created or written.
    #[error("cannot write capture file {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A bad parameter.
    #[error("{0}")]
    Invalid(String),
}

/// The writer thread of one capture: drains the ring into the file until stopped.
#[derive(Debug)]
pub struct CaptureWriter {
    ring: Arc<CaptureRing>,
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<std::io::Result<(u64, u64)>>>,
}

impl CaptureWriter {
    /// Creates `path` (truncating it), writes the section and interface headers and starts
    /// the writer thread.
    pub fn start(ring: Arc<CaptureRing>, path: PathBuf) -> Result<Self, CaptureError> {
        let file_err = |source| CaptureError::File {
            path: path.clone(),
            source,
        };
        let file = std::fs::File::create(&path).map_err(file_err)?;
        let mut out = BufWriter::new(file);
        let mut head = Vec::new();
        pcapng::write_section_header(&mut head, "luna (r2c) capture").map_err(file_err)?;
        pcapng::write_interface(&mut head, &format!("luna-port{}", ring.port), ring.snaplen)
            .map_err(file_err)?;
        out.write_all(&head).map_err(file_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (Arc::clone(&ring), Arc::clone(&stop));
        let head_len = head.len() as u64;
        let thread = std::thread::Builder::new()
            .name(format!("r2c-capture-{}", ring.port))
            .spawn(move || writer_loop(&r, &s, out, head_len))
            .map_err(file_err)?;
        Ok(CaptureWriter {
            ring,
            path,
            stop,
            thread: Some(thread),
        })
    }

    /// The ring the cores push into.
    pub fn ring(&self) -> &Arc<CaptureRing> {
        &self.ring
    }

    /// The file.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Writes what is left in the ring, flushes and closes the file. Call once no core
    /// pushes any more.
    pub fn finish(mut self) -> Result<CaptureStats, CaptureError> {
        self.stop.store(true, Ordering::Release);
        let res = match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("capture writer panicked"))),
            None => Ok((0, 0)),
        };
        let (written, file_bytes) = res.map_err(|source| CaptureError::File {
            path: self.path.clone(),
            source,
        })?;
        let (captured, dropped_oldest) = self.ring.counts();
        Ok(CaptureStats {
            captured,
            dropped_oldest,
            written,
            file_bytes,
        })
    }
}

impl Drop for CaptureWriter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn writer_loop(
    ring: &CaptureRing,
    stop: &AtomicBool,
    mut out: BufWriter<std::fs::File>,
    mut bytes: u64,
) -> std::io::Result<(u64, u64)> {
    let mut written = 0u64;
    let mut block = Vec::with_capacity(2048);
    loop {
        // Read the flag before draining: frames pushed before the stop are all written.
        let stopping = stop.load(Ordering::Acquire);
        let mut any = false;
        while let Some(f) = ring.pop() {
            any = true;
            block.clear();
            pcapng::write_packet(&mut block, 0, f.ts_ns, &f.data, f.orig_len, f.dir)?;
            out.write_all(&block)?;
            bytes += block.len() as u64;
            written += 1;
        }
        if stopping {
            break;
        }
        if !any {
            out.flush()?;
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    out.flush()?;
    out.get_ref().sync_all()?;
    Ok((written, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_ring_replaces_the_oldest_and_counts_it() {
        let ring = CaptureRing::new(0, 4, 3);
        for i in 0..5u8 {
            ring.push(Frame {
                ts_ns: u64::from(i),
                orig_len: 10,
                dir: Direction::Inbound,
                data: vec![i],
            });
        }
        assert_eq!(ring.counts(), (5, 2));
        let left: Vec<u8> = std::iter::from_fn(|| ring.pop())
            .map(|f| f.data[0])
            .collect();
        assert_eq!(left, vec![2, 3, 4]);
    }

    #[test]
    fn transmits_are_captured_once_accepted_header_then_payload_cut_at_snaplen() {
        use luna_stack::stack::{Stack, StackConfig};
        use luna_stack::wire::{EthernetAddress, Ipv4Cidr};
        // Real transmits from a stack: a connect's SYN (no payload) is enough for order;
        // the payload path is covered by the integration test (tshark byte counts).
        let cfg = StackConfig::new(
            EthernetAddress([2, 0, 0, 0, 0, 1]),
            Ipv4Cidr::new(core::net::Ipv4Addr::new(198, 18, 0, 1), 24).unwrap(),
        );
        let mut st = Stack::new(cfg, crate::rng::CoreRng::from_seed([1; 32])).unwrap();
        st.neighbours_mut()
            .insert_permanent(
                core::net::Ipv4Addr::new(198, 18, 0, 2),
                EthernetAddress([2, 0, 0, 0, 0, 2]),
            )
            .unwrap();
        let now = luna_stack::time::Instant::from_nanos(1_000);
        for p in [7, 8] {
            st.connect(
                now,
                core::net::SocketAddrV4::new([198, 18, 0, 2].into(), p),
                None,
            )
            .unwrap();
        }
        let mut tx: VecDeque<Transmit> = std::iter::from_fn(|| st.poll_transmit(now)).collect();
        assert_eq!(tx.len(), 2);
        let whole: Vec<Vec<u8>> = tx.iter().map(|t| t.to_vec()).collect();
        let ring = Arc::new(CaptureRing::new(0, 40, 16));
        let mut c = CoreCapture::new(Arc::clone(&ring), 0);
        c.stage_tx(5, &tx);
        // The device takes one: only it is captured; the other stays staged.
        tx.pop_front();
        c.commit_tx(1);
        assert_eq!(ring.counts().0, 1);
        c.stage_tx(6, &tx);
        c.commit_tx(1);
        let got: Vec<Frame> = std::iter::from_fn(|| ring.pop()).collect();
        assert_eq!(got.len(), 2, "each frame once");
        for (f, w) in got.iter().zip(&whole) {
            assert_eq!(f.orig_len as usize, w.len());
            assert_eq!(f.data, w[..40]);
            assert_eq!(f.dir, Direction::Outbound);
        }
        c.stage_tx(7, &tx);
        // The runtime drops the queue's head (a stuck device): its copy goes too, and a
        // later commit has nothing of it to push.
        c.discard_tx_front(1);
        c.commit_tx(1);
        assert_eq!(ring.counts().0, 2);
    }

    #[test]
    fn writer_writes_every_frame_pushed_before_finish() {
        let path =
            std::env::temp_dir().join(format!("r2c-capture-unit-{}.pcapng", std::process::id()));
        let ring = Arc::new(CaptureRing::new(3, 64, 1024));
        let w = CaptureWriter::start(Arc::clone(&ring), path.clone()).unwrap();
        for i in 0..100u32 {
            ring.push(Frame {
                ts_ns: u64::from(i),
                orig_len: 100,
                dir: Direction::Outbound,
                data: vec![i as u8; 60],
            });
        }
        let s = w.finish().unwrap();
        assert_eq!((s.captured, s.dropped_oldest, s.written), (100, 0, 100));
        let file = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(file.len() as u64, s.file_bytes);
        let pk = pcapng::read_packets(&file).unwrap();
        assert_eq!(pk.len(), 100);
        assert!(pk
            .iter()
            .enumerate()
            .all(|(i, p)| p.data == vec![i as u8; 60]));
    }

    #[test]
    fn an_unwritable_file_is_a_clear_error() {
        let ring = Arc::new(CaptureRing::new(0, 64, 8));
        let e = CaptureWriter::start(ring, "/nonexistent-dir/x.pcapng".into()).unwrap_err();
        assert!(e.to_string().contains("/nonexistent-dir/x.pcapng"), "{e}");
    }
}
