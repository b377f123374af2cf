//! Device buffers: aligned, zeroed host allocations under a process-wide memory budget, each with a
//! synthetic base address that the peer does its placement arithmetic on.
//!
//! ref: ggml-rpc-protocol.md §4.2. Bases are not real pointers: they come from a process-wide counter,
//! are aligned to 4 KiB, never overlap and never wrap. A peer `data` value maps back to
//! (buffer, offset) by `data - base`.

use std::alloc::Layout as AllocLayout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use compute::Layout;

use super::weight_copy::WeightCopy;

/// Alignment advertised by GET_ALIGNMENT (the CPU backend's value).
pub const ADVERTISED_ALIGNMENT: u64 = 32;
/// Alignment of the real allocations (a cache line; ≥ the advertised one).
const REAL_ALIGNMENT: usize = 64;
/// Buffers of at least this many bytes are anonymous mappings rather than heap allocations: the
/// kernel hands out zeroed pages as they are first touched, where the allocator's aligned zeroed
/// allocation would write zeros over the whole buffer at once (a 96 MiB weight buffer took longer to
/// zero than to fill from the tensor cache).
const MAP_MIN: usize = 1 << 20;
/// Regions of at least this many bytes are faulted in with one call before they are filled
/// ([`Region::prefault_for_write`]); below it, the call costs about what it saves.
pub const PREFAULT_MIN: usize = 64 << 10;
/// Granule of the synthetic address space.
const ADDRESS_GRANULE: u64 = 4096;
/// First synthetic base address.
const FIRST_BASE: u64 = 0x0000_1000_0000_0000;

/// Memory accounting shared by every connection.
#[derive(Debug)]
pub struct MemoryAccount {
    budget: Option<u64>,
    allocated: AtomicU64,
    /// Bytes of `allocated` held by interleaved weight copies.
    interleaved: AtomicU64,
    next_base: AtomicU64,
    next_handle: AtomicU64,
    /// Whether buffers ask for transparent huge pages (`server.huge_pages`).
    huge_pages: bool,
}

/// Free and total memory as GET_DEVICE_MEMORY reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryReport {
    /// Bytes still available to buffers.
    pub free: u64,
    /// Bytes in all.
    pub total: u64,
}

impl MemoryAccount {
    /// An account with an explicit budget (`--mem`) or, with `None`, the machine's available memory.
    pub fn new(budget: Option<u64>) -> MemoryAccount {
        MemoryAccount {
            budget,
            allocated: AtomicU64::new(0),
            interleaved: AtomicU64::new(0),
            next_base: AtomicU64::new(FIRST_BASE),
            next_handle: AtomicU64::new(1),
            huge_pages: false,
        }
    }

    /// The same account, with buffers of [`MAP_MIN`] bytes and more on transparent huge pages where
    /// the system allows them on request (`madvise`). Off by default: see `server.huge_pages` in
    /// `packaging/llamad.toml` for what it costs and saves.
    pub fn with_huge_pages(mut self, on: bool) -> MemoryAccount {
        self.huge_pages = on;
        self
    }

    /// Bytes held by live buffers of all connections.
    pub fn allocated(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Bytes of [`MemoryAccount::allocated`] held by interleaved weight copies.
    pub fn interleaved(&self) -> u64 {
        self.interleaved.load(Ordering::Relaxed)
    }

    /// Counts `size` bytes of copies made (`true`) or freed.
    pub(super) fn count_interleaved(&self, size: u64, made: bool) {
        if made {
            self.interleaved.fetch_add(size, Ordering::AcqRel);
        } else {
            self.interleaved.fetch_sub(size, Ordering::AcqRel);
        }
    }

    /// Largest single buffer (GET_MAX_SIZE): the budget, or the machine's total memory.
    pub fn max_size(&self) -> u64 {
        self.budget.unwrap_or_else(|| meminfo().map(|m| m.total).unwrap_or(u64::MAX >> 1)).max(1)
    }

    /// Free and total memory: budget minus allocations, or /proc/meminfo's MemAvailable (capped by
    /// MemTotal minus allocations) and MemTotal.
    pub fn report(&self) -> MemoryReport {
        match self.budget {
            Some(b) => MemoryReport { free: b.saturating_sub(self.allocated()), total: b },
            None => match meminfo() {
                // Untouched zeroed pages do not show in MemAvailable yet, so also count what buffers hold.
                Some(m) => MemoryReport {
                    free: m.free.min(m.total.saturating_sub(self.allocated())),
                    total: m.total,
                },
                None => MemoryReport { free: 0, total: 0 },
            },
        }
    }

    fn reserve(&self, size: u64) -> bool {
        match self.budget {
            Some(b) => self
                .allocated
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                    cur.checked_add(size).filter(|&n| n <= b)
                })
                .is_ok(),
            None => {
                // No explicit budget: a buffer must fit in what is available now, and all buffers together
                // in physical memory (allocations are lazy, so MemAvailable alone would over-commit).
                let Some(m) = meminfo() else { return false };
                if size > m.free {
                    return false;
                }
                self.allocated
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                        cur.checked_add(size).filter(|&n| n <= m.total)
                    })
                    .is_ok()
            }
        }
    }

    fn release(&self, size: u64) {
        self.allocated.fetch_sub(size, Ordering::AcqRel);
    }

    /// A fresh range of `size` bytes in the synthetic address space, `None` when it is exhausted.
    fn take_base(&self, size: u64) -> Option<u64> {
        let span = size.checked_add(ADDRESS_GRANULE)?.checked_next_multiple_of(ADDRESS_GRANULE)?;
        let mut base = 0;
        self.next_base
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                base = cur;
                cur.checked_add(span)
            })
            .ok()?;
        Some(base)
    }
}

/// MemAvailable and MemTotal from /proc/meminfo.
fn meminfo() -> Option<MemoryReport> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
        kib.checked_mul(1024)
    };
    Some(MemoryReport { free: field("MemAvailable:")?, total: field("MemTotal:")? })
}

/// Where a buffer's bytes live.
#[derive(Debug)]
enum Memory {
    /// No bytes (`ptr` is dangling).
    Empty,
    /// A small buffer from the global allocator, zeroed there; freed with this layout.
    Heap(AllocLayout),
    /// A large buffer: a private anonymous mapping (page-aligned, zero-filled on first touch),
    /// unmapped on drop.
    Map(memmap2::MmapMut),
}

/// One live buffer. Memory is zeroed at allocation and freed (and returned to the budget) on drop.
#[derive(Debug)]
pub struct Buffer {
    handle: u64,
    base: u64,
    size: u64,
    ptr: NonNull<u8>,
    memory: Memory,
    account: Arc<MemoryAccount>,
    /// Interleaved copies of weight matrices in this buffer (see [`super::weight_copy`]).
    copies: Mutex<Vec<Arc<WeightCopy>>>,
    /// Whether `copies` is non-empty (writes skip the lock when it is not).
    has_copies: AtomicBool,
    /// Whether pages of a file are mapped into the buffer ([`Buffer::map_file`]).
    file_backed: AtomicBool,
}

// SAFETY: the buffer owns its allocation; all access to the bytes goes through raw regions whose
// exclusive use is guaranteed by the session (one command at a time, compute awaited).
unsafe impl Send for Buffer {}
// SAFETY: as above; shared references only hand out addresses, never references to the bytes.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// Allocates `size` zeroed bytes, `None` when the budget, the address space or the allocator says no.
    pub fn alloc(account: &Arc<MemoryAccount>, size: u64) -> Option<Buffer> {
        if size > account.max_size() {
            return None;
        }
        let len = usize::try_from(size).ok()?;
        if !account.reserve(size) {
            return None;
        }
        let Some((ptr, memory)) = allocate(len, account.huge_pages) else {
            account.release(size);
            return None;
        };
        let Some(base) = account.take_base(size) else {
            Memory::free(ptr, memory);
            account.release(size);
            return None;
        };
        let handle =
            account.next_handle.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        Some(Buffer {
            handle,
            base,
            size,
            ptr,
            memory,
            account: account.clone(),
            copies: Mutex::new(Vec::new()),
            has_copies: AtomicBool::new(false),
            file_backed: AtomicBool::new(false),
        })
    }

    /// The interleaved copy of the matrix `layout` at `off`, made now (on up to `threads` threads,
    /// as later refreshes are) if there is none; `None` when
    /// the matrix is not eligible, the budget says no, or the copies would outgrow the buffer.
    ///
    /// # Safety
    /// The caller holds the buffer exclusively: no graph of the connection is running and no other
    /// command touches it (a new copy reads the matrix's bytes).
    pub unsafe fn weight_copy(&self, off: u64, layout: Layout, threads: usize) -> Option<Arc<WeightCopy>> {
        if !compute::quant::interleave::eligible(&layout) {
            return None;
        }
        let mut list = self.copies.lock().ok()?;
        if let Some(c) = list.iter().find(|c| c.matches(off, &layout)) {
            return Some(c.clone());
        }
        let held: u64 = list.iter().map(|c| c.size()).sum();
        if held.checked_add(layout.nbytes()?)? > self.size {
            return None;
        }
        // SAFETY: forwarded contract.
        let c = Arc::new(unsafe { WeightCopy::make(self, &self.account, off, layout, threads)? });
        list.push(c.clone());
        self.has_copies.store(true, Ordering::Release);
        Some(c)
    }

    /// Marks the copies that overlap `[off, off + len)` stale: a write is changing those bytes.
    pub fn invalidate(&self, off: u64, len: u64) {
        if !self.has_copies.load(Ordering::Acquire) {
            return;
        }
        let list = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        for c in list.iter().filter(|c| c.overlaps(off, len)) {
            c.mark_stale();
        }
    }

    /// [`Buffer::invalidate`] for a region of this buffer (a region of another buffer is ignored).
    pub fn invalidate_region(&self, r: &Region) {
        if let Some(off) = (r.ptr as usize).checked_sub(self.ptr.as_ptr() as usize) {
            self.invalidate(off as u64, r.len as u64);
        }
    }

    /// The opaque non-zero handle.
    pub fn handle(&self) -> u64 {
        self.handle
    }

    /// The synthetic base address.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Offset of `[data, data + len)` inside the buffer, `None` if any part lies outside (checked math).
    pub fn offset_of(&self, data: u64, len: u64) -> Option<u64> {
        let off = data.checked_sub(self.base)?;
        (off.checked_add(len)? <= self.size).then_some(off)
    }

    /// The real address of byte `off` for the compute graph; `None` past the end.
    pub fn addr(&self, off: u64) -> Option<*mut u8> {
        (off <= self.size).then(|| self.ptr.as_ptr().wrapping_add(off as usize))
    }

    /// Zeroes the whole buffer when it is a mapping and `r` covers all of it: pages in memory are
    /// written with zeros and kept, the others are handed back to the kernel, so a buffer never
    /// written costs nothing to clear. False (nothing done) otherwise; the caller then writes zeros.
    /// The caller must hold `r` exclusively, as for [`Region::as_mut_slice`].
    ///
    /// Pages in use are not handed back because a master clears its KV cache before every request
    /// (and `llamactl bench` before every repetition): each page handed back would cost a fault when
    /// the next request writes it, and on a host that reclaims the memory a guest frees (this VM) such
    /// a fault is often several times the cost of writing the page. Handing them back made a prompt
    /// fault in its whole KV cache every time (2 600 faults per 512-token ubatch on each 1-thread
    /// worker); ggml's CPU backend clears a buffer by writing zeros, too.
    pub fn zero_whole(&self, r: Region) -> bool {
        let Memory::Map(map) = &self.memory else { return false };
        if r.ptr != self.ptr.as_ptr() || r.len as u64 != self.size {
            return false;
        }
        #[cfg(target_os = "linux")]
        {
            if self.file_backed.load(Ordering::Acquire) {
                // Discarded file pages would read as the file again: map fresh anonymous memory instead.
                // SAFETY: as below; the new mapping replaces exactly the buffer's own range.
                let ok = unsafe {
                    file_map::anonymous_over(self.ptr.as_ptr(), map.len(), self.account.huge_pages)
                }
                .is_ok();
                if ok {
                    self.file_backed.store(false, Ordering::Release);
                }
                return ok;
            }
            // SAFETY: the buffer's mapping is private and anonymous (not file-backed, checked above),
            // starts at `self.ptr` and is `map.len()` long; the caller holds the whole range
            // exclusively, so no slice of it is alive to see the change.
            unsafe { file_map::zero_anonymous(self.ptr.as_ptr(), map.len()) }.is_ok()
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = map;
            false
        }
    }

    /// Whether [`Buffer::map_file`] can map pages over `r`: the buffer is a mapping and `r` starts on a
    /// page boundary and holds at least one whole page.
    pub fn can_map(&self, r: &Region) -> bool {
        cfg!(target_os = "linux")
            && matches!(self.memory, Memory::Map(_))
            && file_map::page_size().is_some_and(|p| (r.ptr as usize).is_multiple_of(p) && r.len >= p)
    }

    /// Maps the whole pages at the start of `file` over `r` and returns how many bytes that covers (the
    /// largest multiple of the page size ≤ `r.len()`); the caller fills the rest. The mapping is private:
    /// the buffer reads the file's page-cache pages without copying them (no fresh memory is touched),
    /// and a later write to a page copies it, so the file never changes. Freed with the buffer.
    ///
    /// # Safety
    /// `r` lies inside this buffer (as every [`Region`] it hands out does), [`Buffer::can_map`] holds for
    /// it, and the caller holds it exclusively, as for [`Region::as_mut_slice`]. `file` holds at least
    /// `r.len()` bytes and is never truncated or written while the buffer lives: a truncation would turn
    /// reads of the buffer into SIGBUS, and a write would change bytes the buffer has not copied yet
    /// (the tensor cache's objects are immutable: written once, mode 0444, replaced only by rename).
    pub unsafe fn map_file(&self, r: Region, file: &std::fs::File) -> std::io::Result<usize> {
        let page = file_map::page_size().ok_or_else(|| std::io::Error::other("no page size"))?;
        let len = r.len / page * page;
        // SAFETY: forwarded contract: `r.ptr` is page-aligned, `[r.ptr, r.ptr + len)` lies inside this
        // buffer's own mapping and nothing else uses it; the file outlives nothing it must not.
        unsafe { file_map::file_over(r.ptr, len, file)? };
        self.file_backed.store(true, Ordering::Release);
        Ok(len)
    }

    /// The bytes `[off, off + len)` as a raw region, `None` if outside the buffer.
    pub fn region(&self, off: u64, len: u64) -> Option<Region> {
        let end = off.checked_add(len)?;
        if end > self.size {
            return None;
        }
        Some(Region { ptr: self.ptr.as_ptr().wrapping_add(off as usize), len: len as usize })
    }
}

pub use file_map::page_size;

/// Raw mappings over a buffer's own range: file pages for cache hits, fresh anonymous memory to clear,
/// and zeroing that keeps the pages in use.
mod file_map {
    use std::io;

    /// The system's page size: the granule of [`super::Buffer::map_file`] (`None` if the system does
    /// not say).
    pub fn page_size() -> Option<usize> {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(p).ok().filter(|p| p.is_power_of_two())
    }

    /// Maps `len` bytes of `file` from offset 0, private and writable, at `ptr`, replacing what was
    /// there, and asks the kernel to map the file's resident pages now (one call instead of a fault per
    /// few pages; only advice).
    ///
    /// # Safety
    /// `ptr` is page-aligned and `[ptr, ptr + len)` is a range of a private mapping this process owns,
    /// that no live reference points into; `file` holds at least `len` bytes and is not truncated while
    /// mapped.
    #[cfg(target_os = "linux")]
    pub unsafe fn file_over(ptr: *mut u8, len: usize, file: &std::fs::File) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        if len == 0 {
            return Ok(());
        }
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_PRIVATE | libc::MAP_FIXED;
        // SAFETY: the caller guarantees the range is ours to replace; MAP_FIXED replaces exactly it.
        let got = unsafe { libc::mmap(ptr.cast(), len, prot, flags, file.as_raw_fd(), 0) };
        if got == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        if got.cast::<u8>() != ptr {
            return Err(io::Error::other("mmap moved a fixed mapping"));
        }
        // SAFETY: advice on a range just mapped; MADV_POPULATE_READ maps page-cache pages read-only
        // without copying them. Refused (older kernels), the pages fault in as they are read.
        let _ = unsafe { libc::madvise(ptr.cast(), len, libc::MADV_POPULATE_READ) };
        Ok(())
    }

    /// See the Linux version; elsewhere nothing can be mapped.
    ///
    /// # Safety
    /// None needed: it does nothing.
    #[cfg(not(target_os = "linux"))]
    pub unsafe fn file_over(_ptr: *mut u8, _len: usize, _file: &std::fs::File) -> io::Result<()> {
        Err(io::Error::other("file mappings need Linux"))
    }

    /// Zeroes `[ptr, ptr + len)` of a private anonymous mapping: the pages in memory (`mincore`) are
    /// written with zeros and kept, the others are handed back (`MADV_DONTNEED`: they read as zeros
    /// again, and a swapped-out page's contents are dropped).
    ///
    /// # Safety
    /// `ptr` is page-aligned and `[ptr, ptr + len)` is a range of a private anonymous mapping this
    /// process owns, that no live reference points into.
    #[cfg(target_os = "linux")]
    pub unsafe fn zero_anonymous(ptr: *mut u8, len: usize) -> io::Result<()> {
        let page = page_size().ok_or_else(|| io::Error::other("the system gives no page size"))?;
        let n = len.div_ceil(page);
        let mut state = vec![0u8; n];
        // SAFETY: the range is mapped (caller); `state` holds one byte per page of it.
        if unsafe { libc::mincore(ptr.cast(), len, state.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut i = 0;
        while i < n {
            let resident = state[i] & 1;
            let j = (i..n).find(|&j| state[j] & 1 != resident).unwrap_or(n);
            let (from, to) = (i * page, (j * page).min(len));
            if resident == 1 {
                // SAFETY: `[from, to)` lies inside the caller's range, which nothing else references.
                unsafe { ptr.add(from).write_bytes(0, to - from) };
            } else {
                // SAFETY: as above; MADV_DONTNEED on a private anonymous range makes it read as zeros.
                if unsafe { libc::madvise(ptr.add(from).cast(), to - from, libc::MADV_DONTNEED) } != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            i = j;
        }
        Ok(())
    }

    /// Replaces `[ptr, ptr + len)` with fresh private anonymous memory (zeros), on transparent huge
    /// pages where allowed if `huge_pages`, as a new buffer gets.
    ///
    /// # Safety
    /// As for [`file_over`], without the file.
    #[cfg(target_os = "linux")]
    pub unsafe fn anonymous_over(ptr: *mut u8, len: usize, huge_pages: bool) -> io::Result<()> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
        // SAFETY: the caller guarantees the range is ours to replace.
        let got = unsafe { libc::mmap(ptr.cast(), len, prot, flags, -1, 0) };
        if got == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        if huge_pages {
            // SAFETY: advice on the range just mapped; refused, the buffer uses small pages.
            let _ = unsafe { libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE) };
        }
        Ok(())
    }
}

/// `len` zeroed bytes aligned to [`REAL_ALIGNMENT`], mappings on transparent huge pages if
/// `huge_pages`: `None` when the system says no.
fn allocate(len: usize, huge_pages: bool) -> Option<(NonNull<u8>, Memory)> {
    if len == 0 {
        return Some((NonNull::dangling(), Memory::Empty));
    }
    if len >= MAP_MIN {
        let mut map = memmap2::MmapMut::map_anon(len).ok()?;
        // Transparent huge pages, if configured and where the system allows them on request: 2 MiB
        // pages save page faults of the fill and TLB misses afterwards, but on a VM whose host backs
        // guest memory as it is first touched a fresh huge page can take several times longer to
        // fault in than the small pages it replaces. Only advice: refused, small pages.
        #[cfg(target_os = "linux")]
        if huge_pages {
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        // Pages are page-aligned, which is more than REAL_ALIGNMENT.
        let ptr = NonNull::new(map.as_mut_ptr())?;
        return Some((ptr, Memory::Map(map)));
    }
    let l = AllocLayout::from_size_align(len, REAL_ALIGNMENT).ok()?;
    // SAFETY: `l` has a non-zero size (checked above).
    let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(l) })?;
    Some((ptr, Memory::Heap(l)))
}

impl Memory {
    /// Frees the memory `ptr` points to (allocated by [`allocate`] together with `self`).
    fn free(ptr: NonNull<u8>, memory: Memory) {
        match memory {
            Memory::Empty => {}
            // SAFETY: `ptr` was allocated by `allocate` with exactly this layout and is freed once
            // (the memory is consumed).
            Memory::Heap(l) => unsafe { std::alloc::dealloc(ptr.as_ptr(), l) },
            Memory::Map(map) => drop(map),
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        Memory::free(self.ptr, std::mem::replace(&mut self.memory, Memory::Empty));
        self.account.release(self.size);
    }
}

/// A bounds-checked byte range inside a live buffer.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a region is an address range inside a buffer; the session serialises every access to it
// (one command at a time, compute awaited), so moving the address between threads is sound.
unsafe impl Send for Region {}

impl Region {
    /// The first byte's real address.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the two regions share a byte (regions of different buffers never do).
    pub fn overlaps(&self, other: &Region) -> bool {
        let (a, b) = (self.ptr as usize, other.ptr as usize);
        !self.is_empty()
            && !other.is_empty()
            && a < b.saturating_add(other.len)
            && b < a.saturating_add(self.len)
    }

    /// The bytes, for reading.
    ///
    /// # Safety
    /// The buffer must outlive `'a`, and nothing may write the range during `'a`.
    pub unsafe fn as_slice<'a>(self) -> &'a [u8] {
        // SAFETY: the range lies inside the allocation (checked by `Buffer::region`); the caller
        // guarantees lifetime and the absence of writers. Empty regions may use a dangling pointer.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Asks the kernel to back the region's whole pages with memory now, in one call, instead of a
    /// page fault per page as the bytes arrive (a SET_TENSOR's data, a cache hit read into a tensor).
    /// Regions under [`PREFAULT_MIN`] are left to fault. Only advice: refused (kernels before 5.14),
    /// the pages fault in as they are written.
    pub fn prefault_for_write(&self) {
        #[cfg(target_os = "linux")]
        if self.len >= PREFAULT_MIN {
            let Some(page) = file_map::page_size() else { return };
            let start = (self.ptr as usize).next_multiple_of(page);
            let end = (self.ptr as usize + self.len) / page * page;
            if end > start {
                // SAFETY: advice on whole pages inside the region, which lies inside a live buffer
                // of this process; MADV_POPULATE_WRITE only faults them in writable, it changes no
                // byte.
                let _ = unsafe {
                    libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_POPULATE_WRITE)
                };
            }
        }
    }

    /// The bytes, for writing.
    ///
    /// # Safety
    /// The buffer must outlive `'a`, and nothing else may access the range during `'a`.
    pub unsafe fn as_mut_slice<'a>(self) -> &'a mut [u8] {
        // SAFETY: as in `as_slice`, plus exclusivity guaranteed by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_enforced_and_returned() {
        let acc = Arc::new(MemoryAccount::new(Some(1000)));
        let a = Buffer::alloc(&acc, 600).unwrap();
        assert!(Buffer::alloc(&acc, 600).is_none());
        assert_eq!(acc.report(), MemoryReport { free: 400, total: 1000 });
        drop(a);
        assert_eq!(acc.allocated(), 0);
        assert!(Buffer::alloc(&acc, 1000).is_some());
        assert!(Buffer::alloc(&acc, 1001).is_none());
    }

    #[test]
    fn bases_are_aligned_and_disjoint() {
        let acc = Arc::new(MemoryAccount::new(Some(1 << 20)));
        let a = Buffer::alloc(&acc, 100).unwrap();
        let b = Buffer::alloc(&acc, 5000).unwrap();
        let z = Buffer::alloc(&acc, 0).unwrap();
        for x in [&a, &b, &z] {
            assert_ne!(x.base(), 0);
            assert_eq!(x.base() % ADVERTISED_ALIGNMENT, 0);
            assert_ne!(x.handle(), 0);
        }
        assert!(a.base() + a.size() <= b.base());
        assert!(b.base() + b.size() <= z.base());
        assert_ne!(a.handle(), b.handle());
        assert_eq!(a.offset_of(a.base() + 10, 90), Some(10));
        assert_eq!(a.offset_of(a.base() + 10, 91), None);
        assert_eq!(a.offset_of(a.base() - 1, 1), None);
        assert_eq!(a.offset_of(u64::MAX, 2), None);
        assert_eq!(z.offset_of(z.base(), 0), Some(0));
        assert_eq!(z.offset_of(z.base(), 1), None);
        assert!(a.region(50, 51).is_none());
        let (r1, r2, r3) = (a.region(0, 10).unwrap(), a.region(9, 5).unwrap(), a.region(10, 5).unwrap());
        assert!(r1.overlaps(&r2) && r2.overlaps(&r1) && r2.overlaps(&r3));
        assert!(!r1.overlaps(&r3) && !r3.overlaps(&r1), "neighbours do not overlap");
        assert!(!a.region(5, 0).unwrap().overlaps(&r1), "an empty region overlaps nothing");
        assert!(!r1.overlaps(&b.region(0, 5000).unwrap()));
        // SAFETY: the buffer outlives the slice and nothing else touches it.
        let s = unsafe { a.region(0, 100).unwrap().as_slice() };
        assert!(s.iter().all(|&x| x == 0));
        assert_eq!(a.addr(0).unwrap() as usize % REAL_ALIGNMENT, 0);
    }

    #[test]
    fn small_and_mapped_buffers_are_zeroed_aligned_and_writable() {
        let acc = Arc::new(MemoryAccount::new(Some(64 << 20)));
        for size in [MAP_MIN as u64 - 1, MAP_MIN as u64, 3 * MAP_MIN as u64 + 5] {
            let b = Buffer::alloc(&acc, size).unwrap();
            assert_eq!(b.addr(0).unwrap() as usize % REAL_ALIGNMENT, 0, "size {size}");
            let r = b.region(0, size).unwrap();
            // SAFETY: the buffer outlives the slices and nothing else touches it.
            let w = unsafe { r.as_mut_slice() };
            assert!(w.iter().all(|&x| x == 0), "size {size}: not zeroed");
            w[size as usize - 1] = 7;
            w[0] = 9;
            // SAFETY: as above; the mutable slice is no longer used.
            let s = unsafe { r.as_slice() };
            assert_eq!((s[0], s[size as usize - 1]), (9, 7));
            // Clearing: a mapped buffer zeroes itself, a heap one is left to the caller.
            let whole = b.region(0, size).unwrap();
            assert_eq!(b.zero_whole(whole), size as usize >= MAP_MIN, "size {size}");
            assert!(!b.zero_whole(b.region(0, size - 1).unwrap()), "a part is left to the caller");
            if size as usize >= MAP_MIN {
                // SAFETY: as above.
                let s = unsafe { whole.as_slice() };
                assert!(s.iter().all(|&x| x == 0), "size {size}: not zero after clearing");
            }
            drop(b);
            assert_eq!(acc.allocated(), 0);
        }
    }

    /// The `VmFlags` of the mapping holding `addr`, from /proc/self/smaps.
    #[cfg(target_os = "linux")]
    fn vm_flags(addr: usize) -> Vec<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = first.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                    inside = a <= addr && addr < b;
                    continue;
                }
            }
            if inside {
                if let Some(f) = line.strip_prefix("VmFlags:") {
                    return f.split_whitespace().map(String::from).collect();
                }
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn huge_pages_are_asked_for_only_when_configured() {
        for on in [false, true] {
            let acc = Arc::new(MemoryAccount::new(Some(64 << 20)).with_huge_pages(on));
            let b = Buffer::alloc(&acc, 4 * MAP_MIN as u64).unwrap();
            let addr = b.addr(0).unwrap() as usize;
            // `hg`: the mapping was advised MADV_HUGEPAGE.
            assert_eq!(vm_flags(addr).iter().any(|f| f == "hg"), on, "huge_pages = {on}");
        }
    }

    /// `mincore`'s answer for the pages of `[from, to)`, a page-aligned range of a live mapping.
    #[cfg(target_os = "linux")]
    fn resident(from: usize, to: usize) -> Vec<u8> {
        let page = page_size().unwrap();
        let mut v = vec![0u8; (to - from) / page];
        // SAFETY: `[from, to)` is a page-aligned range of a mapping the caller holds; `v` has one
        // byte per page.
        let rc = unsafe { libc::mincore(from as *mut libc::c_void, to - from, v.as_mut_ptr()) };
        assert_eq!(rc, 0);
        v
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn zeroing_a_whole_buffer_keeps_the_pages_in_use_and_hands_back_the_rest() {
        let page = page_size().unwrap();
        let acc = Arc::new(MemoryAccount::new(Some(64 << 20)));
        let size = 4 * MAP_MIN as u64;
        let b = Buffer::alloc(&acc, size).unwrap();
        let base = b.addr(0).unwrap() as usize;
        let half = size as usize / 2;
        let whole = b.region(0, size).unwrap();
        // SAFETY: the buffer outlives the slice and nothing else touches it.
        let w = unsafe { whole.as_mut_slice() };
        // The first half in use (a KV cache's used cells), a few bytes per page; the rest untouched.
        for p in (0..half).step_by(page) {
            w[p] = 0xA5;
            w[p + page - 1] = 0x5A;
        }
        assert!(resident(base, base + half).iter().all(|&p| p & 1 == 1));
        assert!(b.zero_whole(whole));
        assert!(resident(base, base + half).iter().all(|&p| p & 1 == 1), "pages in use were handed back");
        assert!(
            resident(base + half, base + size as usize).iter().all(|&p| p & 1 == 0),
            "untouched pages were faulted in"
        );
        // (Reading maps the untouched pages, so this comes last.)
        // SAFETY: as above.
        assert!(unsafe { whole.as_slice() }.iter().all(|&x| x == 0), "not zero");
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn prefaulting_maps_the_whole_pages_and_changes_no_byte() {
        let page = page_size().unwrap();
        let acc = Arc::new(MemoryAccount::new(Some(64 << 20)));
        let size = 4 * MAP_MIN as u64;
        let b = Buffer::alloc(&acc, size).unwrap();
        let base = b.addr(0).unwrap() as usize;
        // A fresh mapping has no pages yet; a region that starts and ends inside pages gets the whole
        // pages between.
        let (off, len) = (page as u64 / 2, 2 * MAP_MIN as u64);
        let r = b.region(off, len).unwrap();
        // SAFETY: the buffer outlives the slice and nothing else touches it.
        let w = unsafe { r.as_mut_slice() };
        w[..3].copy_from_slice(&[1u8, 2, 3]);
        let first_whole = base + page;
        let last_whole = (base + (off + len) as usize) / page * page;
        r.prefault_for_write();
        assert!(resident(first_whole, last_whole).iter().all(|&p| p & 1 == 1), "whole pages mapped");
        // SAFETY: as above.
        let s = unsafe { b.region(0, size).unwrap().as_slice() };
        assert_eq!(&s[off as usize..off as usize + 3], &[1, 2, 3], "written bytes kept");
        assert!(s[off as usize + 3..].iter().all(|&x| x == 0), "the rest still zero");
        // Regions under the threshold, empty and heap regions are left alone, and still correct.
        b.region(size - 10, 10).unwrap().prefault_for_write();
        b.region(5, 0).unwrap().prefault_for_write();
        let h = Buffer::alloc(&acc, MAP_MIN as u64 - 1).unwrap();
        h.region(1, MAP_MIN as u64 - 2).unwrap().prefault_for_write();
        // SAFETY: as above.
        assert!(unsafe { h.region(0, MAP_MIN as u64 - 1).unwrap().as_slice() }.iter().all(|&x| x == 0));
    }
}
