//! The send queue: application buffers held by reference from the moment `send` accepts them
//! until the peer acknowledges them. Retransmissions slice the same buffers; nothing is copied.

use super::SeqNum;
use std::collections::VecDeque;
use zbuf::{IoVec, Zbuf};

/// Unacknowledged and unsent payload, in sequence order, starting at `head`.
#[derive(Debug)]
pub(crate) struct SendQueue {
    bufs: VecDeque<Zbuf>,
    /// Sequence number of the first queued byte.
    head: SeqNum,
    /// Total queued bytes.
    len: usize,
    /// Lookup cache for `slice`: (index into `bufs`, sequence number of that buffer's first
    /// byte). New data is sent in order, so this makes the common case O(1).
    cursor: (usize, SeqNum),
}

impl SendQueue {
    pub(crate) fn new(head: SeqNum) -> Self {
        SendQueue {
            bufs: VecDeque::new(),
            head,
            len: 0,
            cursor: (0, head),
        }
    }

    /// Sequence number just past the last queued byte.
    pub(crate) fn end(&self) -> SeqNum {
        self.head + self.len
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn push(&mut self, buf: Zbuf) {
        if buf.is_empty() {
            return;
        }
        self.len += buf.len();
        self.bufs.push_back(buf);
    }

    /// Release every byte before `ack` (cumulative acknowledgment). Returns bytes released.
    pub(crate) fn ack_to(&mut self, ack: SeqNum) -> usize {
        if ack.le(self.head) {
            return 0;
        }
        let d = ack - self.head;
        if d as usize >= self.len {
            // Everything queued is acknowledged (a request-response exchange's common
            // case): what `release_walk` ends with, without walking the buffers one by
            // one (they are non-empty and add up to `len`; test
            // `a_full_ack_ends_where_the_buffer_walk_ends`).
            let released = self.len;
            self.bufs.clear();
            self.head += released;
            self.len = 0;
            self.cursor = (0, self.head);
            return released;
        }
        self.release_walk(d as usize)
    }

    /// Releases the first `n` bytes (`n <= len`) buffer by buffer: `ack_to`'s general
    /// case, and what its whole-queue shortcut must end with.
    fn release_walk(&mut self, n: usize) -> usize {
        let released = n;
        let mut n = n;
        while n > 0 {
            let Some(front) = self.bufs.front_mut() else {
                break;
            };
            if front.len() <= n {
                n -= front.len();
                self.bufs.pop_front();
                // Keep the cursor pointing at the same buffer.
                self.cursor.0 = self.cursor.0.saturating_sub(1);
            } else {
                front.advance(n);
                n = 0;
            }
        }
        self.head += released;
        self.len -= released;
        if self.cursor.1.lt(self.head) || self.bufs.is_empty() {
            self.cursor = (0, self.head);
        }
        released
    }

    /// The bytes `[seq, seq + max)` clipped to the queue, as references into the queued buffers.
    /// Inlined: the sender's common case is a few tests and one reference; the rest is
    /// [`slice_spanning`](Self::slice_spanning).
    #[inline]
    pub(crate) fn slice(&mut self, seq: SeqNum, max: usize) -> IoVec {
        // Fast path, in-order sending: the bytes lie in the cursor's buffer (all `max` of
        // them, or the rest of the queue when it is the last buffer). The cursor is at or
        // after `head` (`ack_to` resets it otherwise), so `seq` is inside the queue; the
        // cursor already names this buffer, as the general path below would leave it.
        let (ci, cat) = self.cursor;
        if let Some(buf) = self.bufs.get(ci) {
            if cat.le(seq) && max > 0 {
                let off = (seq - cat) as usize;
                let len = buf.len();
                if off < len && (max <= len - off || ci + 1 == self.bufs.len()) {
                    let take = (len - off).min(max);
                    return IoVec::from(buf.slice(off..off + take));
                }
            }
        }
        self.slice_spanning(seq, max)
    }

    /// [`slice`](Self::slice) outside the cursor's buffer: bytes in several buffers, before
    /// the cursor, or out of range.
    #[inline(never)]
    fn slice_spanning(&mut self, seq: SeqNum, max: usize) -> IoVec {
        let mut out = IoVec::new();
        if seq.lt(self.head) || !seq.lt(self.end()) || max == 0 {
            return out;
        }
        // Start from the cursor when it is at or before `seq`, else from the front.
        let (mut idx, mut at) = if self.cursor.1.le(seq) && self.cursor.0 < self.bufs.len() {
            self.cursor
        } else {
            (0, self.head)
        };
        let mut remaining = max.min((self.end() - seq) as usize);
        while remaining > 0 && idx < self.bufs.len() {
            let buf = &self.bufs[idx];
            let buf_end = at + buf.len();
            if buf_end.le(seq) {
                at = buf_end;
                idx += 1;
                continue;
            }
            if out.is_empty() {
                self.cursor = (idx, at);
            }
            let off = if seq.gt(at) { (seq - at) as usize } else { 0 };
            let take = (buf.len() - off).min(remaining);
            out.push(buf.slice(off..off + take));
            remaining -= take;
            at = buf_end;
            idx += 1;
        }
        out
    }
}

#[cfg(test)]
impl SendQueue {
    /// The queue's state with buffer contents hashed (not their addresses): for the
    /// equivalence tests.
    pub(crate) fn digest(&self) -> String {
        let bytes: Vec<u8> = self.bufs.iter().flat_map(|b| b.iter().copied()).collect();
        format!(
            "sndq(head={:?} len={} n={} cursor={:?} fnv={:x})",
            self.head,
            self.len,
            self.bufs.len(),
            self.cursor,
            crate::wire::tcp::fnv1a(&bytes)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(range: std::ops::Range<u8>) -> Zbuf {
        Zbuf::copy_from_slice(&range.collect::<Vec<u8>>())
    }

    #[test]
    fn slices_span_buffers_and_ack_releases() {
        let mut q = SendQueue::new(SeqNum(1000));
        q.push(buf(0..10));
        q.push(buf(10..25));
        q.push(buf(25..30));
        assert_eq!(q.len(), 30);
        assert_eq!(
            q.slice(SeqNum(1005), 12).to_vec(),
            (5..17).collect::<Vec<u8>>()
        );
        assert_eq!(
            q.slice(SeqNum(1020), 100).to_vec(),
            (20..30).collect::<Vec<u8>>()
        );
        // Out of range: before head, at end.
        assert!(q.slice(SeqNum(999), 5).is_empty());
        assert!(q.slice(SeqNum(1030), 5).is_empty());
        assert_eq!(q.ack_to(SeqNum(1012)), 12);
        assert_eq!(q.end(), SeqNum(1030));
        assert_eq!(q.slice(SeqNum(1012), 3).to_vec(), vec![12, 13, 14]);
        // An old ACK releases nothing; an ACK beyond the queue releases only what is queued.
        assert_eq!(q.ack_to(SeqNum(1000)), 0);
        assert_eq!(q.ack_to(SeqNum(2000)), 18);
        assert_eq!(q.len(), 0);
        assert_eq!(q.end(), SeqNum(1030));
    }

    /// The general path alone, for comparison with `slice` (fast path included).
    fn slice_general(q: &SendQueue, seq: SeqNum, max: usize) -> Vec<u8> {
        let mut q2 = SendQueue::new(q.head);
        for b in &q.bufs {
            q2.push(b.clone());
        }
        // A cursor at the front never takes the fast path unless `seq` is in buffer 0.
        q2.cursor = (usize::MAX, q2.head);
        let v = q2.slice(seq, max).to_vec();
        assert!(q2.cursor.0 < q2.bufs.len() || v.is_empty());
        v
    }

    #[test]
    fn fast_path_slices_equal_the_general_path() {
        let mut q = SendQueue::new(SeqNum(u32::MAX - 40));
        for (i, n) in [7usize, 1, 30, 2, 64, 5].into_iter().enumerate() {
            q.push(Zbuf::copy_from_slice(&vec![i as u8 + 1; n]));
        }
        let total = q.len();
        let mut checked = 0;
        for start in 0..total + 2 {
            for max in [0usize, 1, 2, 5, 7, 29, 64, 200] {
                let seq = SeqNum((u32::MAX - 40).wrapping_add(start as u32));
                let want = slice_general(&q, seq, max);
                assert_eq!(q.slice(seq, max).to_vec(), want, "start {start} max {max}");
                checked += 1;
            }
            if start % 9 == 8 {
                q.ack_to(SeqNum((u32::MAX - 40).wrapping_add(start as u32 / 2)));
            }
        }
        assert!(checked > 800);
    }

    /// The general walk of `ack_to` alone (what it did before its full-ack shortcut).
    fn ack_walk(q: &mut SendQueue, ack: SeqNum) -> usize {
        if ack.le(q.head) {
            return 0;
        }
        q.release_walk((ack - q.head).min(q.len as u32) as usize)
    }

    #[test]
    fn a_full_ack_ends_where_the_buffer_walk_ends() {
        let sizes: [&[usize]; 4] = [&[], &[4096], &[1, 7, 30], &[1448, 1448, 1200, 9]];
        for (i, sizes) in sizes.into_iter().enumerate() {
            for start in [0u32, 1000, u32::MAX - 3000] {
                // Partly acknowledged and sliced before, so the front buffer is cut and
                // the cursor is somewhere.
                for (pre_ack, slice_at) in [(0u32, 0u32), (1, 3), (5, 40), (1500, 2900)] {
                    for extra in [0u32, 1, 1 << 20] {
                        let mut q = SendQueue::new(SeqNum(start));
                        for (j, &n) in sizes.iter().enumerate() {
                            q.push(Zbuf::copy_from_slice(&vec![(i * 16 + j) as u8; n]));
                        }
                        let total = q.len() as u32;
                        q.ack_to(SeqNum(start.wrapping_add(pre_ack.min(total))));
                        let _ = q.slice(SeqNum(start.wrapping_add(slice_at)), 100);
                        let mut w = SendQueue::new(q.head);
                        for b in &q.bufs {
                            w.push(b.clone());
                        }
                        w.cursor = q.cursor;
                        assert_eq!(q.digest(), w.digest());
                        let ack = SeqNum(start.wrapping_add(total).wrapping_add(extra));
                        let (a, b) = (q.ack_to(ack), ack_walk(&mut w, ack));
                        assert_eq!(a, b, "sizes {sizes:?} start {start} pre {pre_ack}");
                        assert_eq!(q.digest(), w.digest(), "sizes {sizes:?} start {start}");
                    }
                }
            }
        }
    }

    #[test]
    fn slice_wraps_sequence_space() {
        let mut q = SendQueue::new(SeqNum(u32::MAX - 4));
        q.push(buf(0..10));
        assert_eq!(q.slice(SeqNum(u32::MAX), 3).to_vec(), vec![4, 5, 6]);
        assert_eq!(q.slice(SeqNum(1), 10).to_vec(), vec![6, 7, 8, 9]);
    }

    #[test]
    fn cursor_survives_acks_and_random_access() {
        let mut q = SendQueue::new(SeqNum(0));
        for i in 0..20u8 {
            q.push(Zbuf::copy_from_slice(&[i; 7]));
        }
        let mut model: Vec<u8> = (0..20u8).flat_map(|i| [i; 7]).collect();
        let mut head = 0usize;
        for step in 0..60usize {
            let seq = head + (step * 13) % (model.len() - head).max(1);
            let got = q.slice(SeqNum(seq as u32), 9).to_vec();
            let end = (seq + 9).min(model.len());
            assert_eq!(got, model[seq..end].to_vec(), "step {step}");
            if step % 5 == 4 && head + 3 <= model.len() {
                head += 3;
                q.ack_to(SeqNum(head as u32));
            }
        }
        model.clear();
    }
}
