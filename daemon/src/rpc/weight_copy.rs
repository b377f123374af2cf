//! Interleaved copies of weight matrices (`compute::quant::interleave`): when a graph multiplies by a
//! Q4_0, Q4_1, Q5_0 or Q8_0 matrix that lies in one of the connection's buffers, the buffer keeps a copy
//! of that matrix in groups of 16 rows, which generation steps read instead of the rows (the same
//! values bit for bit, a third of the instructions).
//!
//! The buffer's own bytes are never changed, so GET_TENSOR, COPY_TENSOR, the tensor cache and every
//! other op see exactly what the peer wrote. Every write into a buffer (SET_TENSOR, SET_TENSOR_HASH,
//! COPY_TENSOR, MEMSET_TENSOR, BUFFER_CLEAR, a graph's destinations, TP_RUN's input) marks the
//! copies it overlaps stale, and a graph refreshes its stale copies before it runs. A copy is memory
//! from the same budget as buffers (a hidden allocation of the account, counted in what llamad
//! reports as allocated); when the budget says no, the product reads the rows as before. The copies
//! of one buffer never exceed its size.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use compute::graph::Interleaved;
use compute::quant::interleave;
use compute::Layout;

use super::buffer::{Buffer, MemoryAccount};

/// An interleaved copy of the matrix `layout` at offset `off` of a buffer.
#[derive(Debug)]
pub struct WeightCopy {
    off: u64,
    layout: Layout,
    nbytes: u64,
    copy: Buffer,
    account: Arc<MemoryAccount>,
    /// Threads that interleave.
    threads: usize,
    stale: AtomicBool,
}

impl Drop for WeightCopy {
    fn drop(&mut self) {
        // The memory itself goes back with `copy`.
        self.account.count_interleaved(self.nbytes, false);
    }
}

impl WeightCopy {
    /// Interleaves the matrix at `off` of `src` into memory taken from `account`; `None` when the
    /// layout is not eligible, the matrix leaves `src`, or the budget says no.
    ///
    /// # Safety
    /// Nothing may write `src`'s bytes while this runs (the session runs one command at a time and
    /// no graph of the connection is running).
    pub(super) unsafe fn make(
        src: &Buffer,
        account: &Arc<MemoryAccount>,
        off: u64,
        layout: Layout,
        threads: usize,
    ) -> Option<Self> {
        if !interleave::eligible(&layout) {
            return None;
        }
        let nbytes = layout.nbytes()?;
        src.region(off, nbytes)?;
        let copy = Buffer::alloc(account, nbytes)?;
        account.count_interleaved(nbytes, true);
        let c = WeightCopy {
            off,
            layout,
            nbytes,
            copy,
            account: account.clone(),
            threads,
            stale: AtomicBool::new(true),
        };
        // SAFETY: forwarded contract; the copy is new and private.
        unsafe { c.refresh(src) };
        Some(c)
    }

    /// Whether this is the copy of the matrix `layout` at `off`.
    pub fn matches(&self, off: u64, layout: &Layout) -> bool {
        self.off == off && self.layout == *layout
    }

    /// Whether `[off, off + len)` of the buffer overlaps the matrix.
    pub fn overlaps(&self, off: u64, len: u64) -> bool {
        len > 0 && off < self.off.saturating_add(self.nbytes) && self.off < off.saturating_add(len)
    }

    /// Marks the copy out of date: a write is changing the matrix's bytes.
    pub fn mark_stale(&self) {
        self.stale.store(true, Ordering::Release);
    }

    /// Whether the copy is out of date.
    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Acquire)
    }

    /// Bytes of the copy.
    pub fn size(&self) -> u64 {
        self.nbytes
    }

    /// The copy as a graph takes it.
    pub fn interleaved(&self) -> Interleaved {
        Interleaved { data: self.copy.addr(0).unwrap_or(std::ptr::null_mut()), len: self.nbytes as usize }
    }

    /// Interleaves the matrix from `src` again if a write touched it since the last time.
    ///
    /// # Safety
    /// As [`WeightCopy::make`]; besides, no graph that reads this copy may be running.
    pub unsafe fn refresh(&self, src: &Buffer) {
        if !self.stale.swap(false, Ordering::AcqRel) {
            return;
        }
        let (Some(from), Some(to)) = (src.region(self.off, self.nbytes), self.copy.region(0, self.nbytes))
        else {
            // Checked when the copy was made; a buffer never shrinks.
            self.stale.store(true, Ordering::Release);
            return;
        };
        let (k, m) = (self.layout.ne[0] as usize, self.layout.ne[1] as usize);
        // SAFETY: both regions lie inside live buffers (`src` borrowed, the copy owned); the caller
        // guarantees nobody writes `src` or reads the copy meanwhile, and they do not overlap.
        unsafe {
            interleave::interleave_parallel(
                self.layout.dtype,
                k,
                m,
                from.as_slice(),
                to.as_mut_slice(),
                self.threads,
            )
        };
        tracing::debug!(off = self.off, bytes = self.nbytes, dtype = %self.layout.dtype, "weight matrix interleaved");
    }
}
