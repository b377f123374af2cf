//! Software prefetch hints: bring a cache line closer before a loop reaches it. A hint never faults
//! and never changes a result, whatever the address.

/// Asks the CPU to load the cache line holding `p` into L1 (a no-op where there is no hint).
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint (SSE, baseline on x86_64): it does not fault on any address and
    // has no architectural effect.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: PRFM is a hint: it does not fault on any address, reads and writes nothing.
    unsafe {
        core::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}
