//! Owned mbuf handles.
//!
//! An [`Mbuf`] owns one reference to a (possibly chained) packet mbuf and
//! frees it on drop. Read access is always allowed; anything that changes
//! the header (adj, trim, chain, offload flags) requires the handle to be the
//! only reference ([`Mbuf::is_exclusive`]), because [`Mbuf::share`] hands out
//! further references to the same memory. Writing the data (append, prepend,
//! data_mut, write, ...) additionally requires every segment to own its data
//! buffer ([`Mbuf::is_writable`]): an external buffer (`rte_pktmbuf_attach_extbuf`,
//! e.g. zbuf's transmit chains over the application's shared, read-only
//! buffers) or an indirect mbuf's buffer belongs to someone else, whatever the
//! mbuf's own reference count says.
//!
//! `Mbuf` is `Send + Sync`: the reference count is atomic, mbufs may be freed
//! to their pool from any thread, and shared handles only read.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};

use crate::ffi;

/// One owned reference to a packet mbuf (chain). Layout-compatible with
/// `*mut rte_mbuf` (`repr(transparent)`), so `&mut [Mbuf]` can be handed to
/// burst functions.
#[repr(transparent)]
pub struct Mbuf(NonNull<ffi::rte_mbuf>);

// SAFETY: see the module docs: refcount updates are atomic and freeing to a
// mempool is MT-safe, so ownership may move between threads.
unsafe impl Send for Mbuf {}
// SAFETY: &Mbuf only reads data and header fields; mutation needs &mut and
// exclusivity (refcnt == 1 on every segment), so no concurrent writer exists.
unsafe impl Sync for Mbuf {}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: we own one reference; rte_pktmbuf_free drops it on every
        // segment and returns segments reaching zero to their pool.
        unsafe { ffi::dpdk_sys_pktmbuf_free(self.0.as_ptr()) }
    }
}

impl std::fmt::Debug for Mbuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mbuf")
            .field("ptr", &self.0)
            .field("pkt_len", &self.pkt_len())
            .field("nb_segs", &self.nb_segs())
            .field("refcnt", &self.refcnt())
            .finish()
    }
}

impl Mbuf {
    /// Takes ownership of one reference to `m`; `None` if `m` is null.
    ///
    /// # Safety
    /// `m` must be null or point to a valid packet mbuf (chain) from a
    /// pktmbuf pool that outlives the returned handle, and the caller must
    /// own one reference to it, which is transferred to the handle.
    pub unsafe fn from_raw(m: *mut ffi::rte_mbuf) -> Option<Mbuf> {
        NonNull::new(m).map(Mbuf)
    }

    /// Gives up ownership without freeing; pair with [`Mbuf::from_raw`].
    pub fn into_raw(self) -> *mut ffi::rte_mbuf {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        p
    }

    /// The raw pointer, still owned by `self`.
    pub fn as_ptr(&self) -> *mut ffi::rte_mbuf {
        self.0.as_ptr()
    }

    fn segs(&self) -> impl Iterator<Item = NonNull<ffi::rte_mbuf>> + '_ {
        std::iter::successors(Some(self.0), |s| {
            // SAFETY: every `next` pointer of a valid chain is null or a
            // valid mbuf of the same chain.
            NonNull::new(unsafe { ffi::dpdk_sys_pktmbuf_next(s.as_ptr()) })
        })
    }

    /// Bytes in the first segment.
    pub fn data_len(&self) -> usize {
        // SAFETY: valid mbuf.
        unsafe { ffi::dpdk_sys_pktmbuf_data_len(self.as_ptr()) as usize }
    }

    /// Bytes in the whole chain.
    pub fn pkt_len(&self) -> usize {
        // SAFETY: valid mbuf.
        unsafe { ffi::dpdk_sys_pktmbuf_pkt_len(self.as_ptr()) as usize }
    }

    /// Segments in the chain.
    pub fn nb_segs(&self) -> u16 {
        // SAFETY: valid mbuf.
        unsafe { ffi::dpdk_sys_pktmbuf_nb_segs(self.as_ptr()) }
    }

    /// Free bytes before the data of the first segment.
    pub fn headroom(&self) -> usize {
        // SAFETY: valid mbuf.
        unsafe { ffi::dpdk_sys_pktmbuf_headroom(self.as_ptr()) as usize }
    }

    /// Free bytes after the data of the *last* segment (where append writes).
    pub fn tailroom(&self) -> usize {
        let last = self.segs().last().unwrap_or(self.0);
        // SAFETY: valid mbuf.
        unsafe { ffi::dpdk_sys_pktmbuf_tailroom(last.as_ptr()) as usize }
    }

    /// Reference count of the first segment.
    pub fn refcnt(&self) -> u16 {
        // SAFETY: valid mbuf.
        unsafe { ffi::dpdk_sys_mbuf_refcnt_read(self.as_ptr()) }
    }

    /// True if this handle is the only reference to every segment, i.e. it
    /// may be modified.
    pub fn is_exclusive(&self) -> bool {
        // SAFETY: valid segments of our chain.
        let all_one = self
            .segs()
            .all(|s| unsafe { ffi::dpdk_sys_mbuf_refcnt_read(s.as_ptr()) } == 1);
        // Pairs with the release in other holders' refcount decrement, so
        // their reads happen before our writes.
        fence(Ordering::Acquire);
        all_one
    }

    /// True if the data may be written through this handle: it is the only
    /// reference to every segment ([`Mbuf::is_exclusive`]) and every segment
    /// owns its data buffer: a direct mbuf, or a pinned external buffer (pools
    /// made by `rte_pktmbuf_pool_create_extbuf`) with no indirect mbuf attached.
    /// A segment attached to another mbuf's buffer (`RTE_MBUF_F_INDIRECT`) or to
    /// an external buffer someone else owns (`rte_pktmbuf_attach_extbuf`, e.g.
    /// zbuf's transmit chains over shared, read-only application buffers) is
    /// never writable, whatever its own reference count.
    pub fn is_writable(&self) -> bool {
        // SAFETY: valid segments of our chain.
        let owned = self
            .segs()
            .all(|s| unsafe { ffi::dpdk_sys_mbuf_owns_buf(s.as_ptr()) } != 0);
        owned && self.is_exclusive()
    }

    /// Another reference to the same chain (refcount + 1 on every segment),
    /// e.g. for a retransmission queue. Both handles become read-only until
    /// one is dropped. `None` if the count would overflow.
    pub fn share(&self) -> Option<Mbuf> {
        if self
            .segs()
            // SAFETY: valid segments of our chain.
            .any(|s| unsafe { ffi::dpdk_sys_mbuf_refcnt_read(s.as_ptr()) } == u16::MAX)
        {
            return None;
        }
        // SAFETY: we own a reference, so the chain is live; the update is
        // atomic on every segment, and the new reference is owned by the
        // returned handle.
        unsafe { ffi::dpdk_sys_pktmbuf_refcnt_update(self.as_ptr(), 1) };
        Some(Mbuf(self.0))
    }

    /// Data of the first segment.
    pub fn data(&self) -> &[u8] {
        seg_slice(self.0)
    }

    /// Data of the first segment, writable; `None` if not [`Mbuf::is_writable`].
    pub fn data_mut(&mut self) -> Option<&mut [u8]> {
        if !self.is_writable() {
            return None;
        }
        // SAFETY: exclusive access to the segment's buffer (refcnt 1, a direct
        // mbuf owning its buffer, &mut self).
        Some(unsafe { seg_slice_mut(self.0) })
    }

    /// Data of each segment in order.
    pub fn segments(&self) -> Segments<'_> {
        Segments {
            next: Some(self.0),
            _m: PhantomData,
        }
    }

    /// Writable data of each segment; `None` if not [`Mbuf::is_writable`].
    pub fn segments_mut(&mut self) -> Option<SegmentsMut<'_>> {
        if !self.is_writable() {
            return None;
        }
        Some(SegmentsMut {
            next: Some(self.0),
            _m: PhantomData,
        })
    }

    /// Copies chain bytes starting at `offset` into `dst`; returns bytes copied.
    pub fn read(&self, mut offset: usize, dst: &mut [u8]) -> usize {
        let mut done = 0;
        for seg in self.segments() {
            if done == dst.len() {
                break;
            }
            if offset >= seg.len() {
                offset -= seg.len();
                continue;
            }
            let n = (seg.len() - offset).min(dst.len() - done);
            dst[done..done + n].copy_from_slice(&seg[offset..offset + n]);
            done += n;
            offset = 0;
        }
        done
    }

    /// Copies `src` into the chain at `offset` (within existing data; use
    /// append first to grow). Returns bytes written, `None` if not
    /// [`Mbuf::is_writable`].
    pub fn write(&mut self, mut offset: usize, src: &[u8]) -> Option<usize> {
        let mut done = 0;
        for seg in self.segments_mut()? {
            if done == src.len() {
                break;
            }
            if offset >= seg.len() {
                offset -= seg.len();
                continue;
            }
            let n = (seg.len() - offset).min(src.len() - done);
            seg[offset..offset + n].copy_from_slice(&src[done..done + n]);
            done += n;
            offset = 0;
        }
        Some(done)
    }

    /// The whole chain copied into one vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.pkt_len());
        for s in self.segments() {
            v.extend_from_slice(s);
        }
        v
    }

    /// Grows the last segment by `len` bytes (`rte_pktmbuf_append`) and
    /// returns them. `None` if not [`Mbuf::is_writable`] or the tailroom is too
    /// small.
    pub fn append(&mut self, len: u16) -> Option<&mut [u8]> {
        if !self.is_writable() {
            return None;
        }
        // SAFETY: exclusive, valid chain whose segments own their buffers.
        let p = unsafe { ffi::dpdk_sys_pktmbuf_append(self.as_ptr(), len) };
        // SAFETY: on success p points to `len` bytes inside the last segment's buffer that we own exclusively.
        NonNull::new(p).map(|p| unsafe {
            std::slice::from_raw_parts_mut(p.as_ptr().cast::<u8>(), len as usize)
        })
    }

    /// Grows the first segment by `len` bytes at the front
    /// (`rte_pktmbuf_prepend`), e.g. to add a header. `None` if not
    /// [`Mbuf::is_writable`] or the headroom is too small.
    pub fn prepend(&mut self, len: u16) -> Option<&mut [u8]> {
        if !self.is_writable() {
            return None;
        }
        // SAFETY: exclusive, valid chain whose segments own their buffers.
        let p = unsafe { ffi::dpdk_sys_pktmbuf_prepend(self.as_ptr(), len) };
        // SAFETY: on success p points to `len` bytes at the start of the first segment's data.
        NonNull::new(p).map(|p| unsafe {
            std::slice::from_raw_parts_mut(p.as_ptr().cast::<u8>(), len as usize)
        })
    }

    /// Removes `len` bytes from the front of the first segment
    /// (`rte_pktmbuf_adj`). False if shared or `len` > first segment.
    pub fn adj(&mut self, len: u16) -> bool {
        // SAFETY: exclusive, valid chain.
        self.is_exclusive() && !unsafe { ffi::dpdk_sys_pktmbuf_adj(self.as_ptr(), len) }.is_null()
    }

    /// Removes `len` bytes from the end of the last segment
    /// (`rte_pktmbuf_trim`). False if shared or `len` > last segment.
    pub fn trim(&mut self, len: u16) -> bool {
        // SAFETY: exclusive, valid chain.
        self.is_exclusive() && unsafe { ffi::dpdk_sys_pktmbuf_trim(self.as_ptr(), len) } == 0
    }

    /// Appends `tail` (a chain) to this chain (`rte_pktmbuf_chain`). Gives
    /// `tail` back if either is shared or the segment count would overflow.
    pub fn chain(&mut self, tail: Mbuf) -> Result<(), Mbuf> {
        if !self.is_exclusive() || !tail.is_exclusive() {
            return Err(tail);
        }
        // SAFETY: both chains are valid and exclusively ours; on success the
        // head owns the tail's segments, so the tail handle must not free them.
        let ret = unsafe { ffi::dpdk_sys_pktmbuf_chain(self.as_ptr(), tail.as_ptr()) };
        if ret != 0 {
            return Err(tail);
        }
        std::mem::forget(tail);
        Ok(())
    }

    /// Offload flags (`ol_flags`).
    pub fn ol_flags(&self) -> u64 {
        // SAFETY: valid mbuf.
        unsafe { ffi::dpdk_sys_mbuf_ol_flags(self.as_ptr()) }
    }

    /// Sets offload flags; false (unchanged) if shared.
    pub fn set_ol_flags(&mut self, flags: u64) -> bool {
        if !self.is_exclusive() {
            return false;
        }
        // SAFETY: exclusive, valid mbuf.
        unsafe { ffi::dpdk_sys_mbuf_set_ol_flags(self.as_ptr(), flags) };
        true
    }

    /// Sets l2/l3/l4 header lengths and TSO segment size for tx offloads;
    /// false (unchanged) if shared.
    pub fn set_tx_offload(&mut self, l2: u8, l3: u16, l4: u8, tso_segsz: u16) -> bool {
        if !self.is_exclusive() {
            return false;
        }
        // SAFETY: exclusive, valid mbuf; values fit the bitfields (7/9/8/16 bits is enforced by C truncation of u8/u16 widths ≤ field widths except l3 > 511, masked here).
        unsafe {
            ffi::dpdk_sys_mbuf_set_tx_offload(
                self.as_ptr(),
                l2 as u64 & 0x7f,
                l3 as u64 & 0x1ff,
                l4 as u64,
                tso_segsz as u64,
            )
        };
        true
    }

    /// RSS hash reported by the NIC (valid if `ol_flags` has RX_RSS_HASH).
    pub fn rss_hash(&self) -> u32 {
        // SAFETY: valid mbuf.
        unsafe { ffi::dpdk_sys_mbuf_rss_hash(self.as_ptr()) }
    }

    /// Packet type reported by the PMD.
    pub fn packet_type(&self) -> u32 {
        // SAFETY: valid mbuf.
        unsafe { ffi::dpdk_sys_mbuf_packet_type(self.as_ptr()) }
    }

    /// The pool the first segment came from.
    pub fn pool_ptr(&self) -> *mut ffi::rte_mempool {
        // SAFETY: valid mbuf.
        unsafe { ffi::dpdk_sys_mbuf_pool(self.as_ptr()) }
    }

    /// Attaches an external buffer as this mbuf's data (`rte_pktmbuf_attach_extbuf`),
    /// for zero-copy from memory DPDK did not allocate.
    ///
    /// # Safety
    /// `self` must be a fresh, exclusive, single-segment mbuf with no data;
    /// `buf`..`buf+len` must be valid for DPDK to read and write until
    /// `shinfo`'s free callback runs; `iova` must be its IO address (or
    /// `RTE_BAD_IOVA` for vdevs that copy); `shinfo` must be initialised
    /// (e.g. by `rte_pktmbuf_ext_shinfo_init_helper`) and its refcount
    /// account for this attachment; no other handle may write the buffer
    /// while this mbuf lives.
    pub unsafe fn attach_extbuf(
        &mut self,
        buf: *mut u8,
        iova: u64,
        len: u16,
        shinfo: *mut ffi::rte_mbuf_ext_shared_info,
    ) {
        // SAFETY: forwarded to the caller's contract above.
        unsafe { ffi::dpdk_sys_pktmbuf_attach_extbuf(self.as_ptr(), buf.cast(), iova, len, shinfo) }
    }
}

fn seg_slice<'a>(s: NonNull<ffi::rte_mbuf>) -> &'a [u8] {
    // SAFETY: a valid segment's data pointer addresses data_len readable
    // bytes; the caller ties the lifetime to a borrow of the owning Mbuf.
    unsafe {
        let len = ffi::dpdk_sys_pktmbuf_data_len(s.as_ptr()) as usize;
        if len == 0 {
            return &[];
        }
        std::slice::from_raw_parts(ffi::dpdk_sys_pktmbuf_mtod(s.as_ptr()).cast::<u8>(), len)
    }
}

/// # Safety
/// The caller must have exclusive access to the segment's buffer for `'a`.
unsafe fn seg_slice_mut<'a>(s: NonNull<ffi::rte_mbuf>) -> &'a mut [u8] {
    // SAFETY: as seg_slice, plus exclusivity from the caller.
    unsafe {
        let len = ffi::dpdk_sys_pktmbuf_data_len(s.as_ptr()) as usize;
        if len == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(ffi::dpdk_sys_pktmbuf_mtod(s.as_ptr()).cast::<u8>(), len)
    }
}

/// Iterator over segment data, from [`Mbuf::segments`].
pub struct Segments<'a> {
    next: Option<NonNull<ffi::rte_mbuf>>,
    _m: PhantomData<&'a Mbuf>,
}

impl<'a> Iterator for Segments<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let s = self.next?;
        // SAFETY: s is a valid segment of the borrowed chain.
        self.next = NonNull::new(unsafe { ffi::dpdk_sys_pktmbuf_next(s.as_ptr()) });
        Some(seg_slice(s))
    }
}

/// Iterator over writable segment data, from [`Mbuf::segments_mut`].
pub struct SegmentsMut<'a> {
    next: Option<NonNull<ffi::rte_mbuf>>,
    _m: PhantomData<&'a mut Mbuf>,
}

impl<'a> Iterator for SegmentsMut<'a> {
    type Item = &'a mut [u8];
    fn next(&mut self) -> Option<&'a mut [u8]> {
        let s = self.next?;
        // SAFETY: s is a valid segment of the mutably borrowed, exclusive chain.
        self.next = NonNull::new(unsafe { ffi::dpdk_sys_pktmbuf_next(s.as_ptr()) });
        // SAFETY: segments of one chain are distinct mbufs with distinct
        // buffers, each yielded once, and the chain is exclusively borrowed.
        Some(unsafe { seg_slice_mut(s) })
    }
}
