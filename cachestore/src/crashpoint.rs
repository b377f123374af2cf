//! Named points on the write paths where a crash test may kill the process.
//!
//! Test machinery: `tests/crash.rs` installs a hook in a child process that SIGKILLs itself at the n-th
//! point it passes, so every window between two durable steps (temp written, renamed, directory synced,
//! index written, entry removed, ...) is hit deterministically, not only by lucky timing. Without a hook
//! each point costs one atomic load.

use std::sync::OnceLock;

static HOOK: OnceLock<fn(&'static str)> = OnceLock::new();

/// Installs the process-wide hook called at every crash point (once; false if one was already set).
#[doc(hidden)]
pub fn install_crash_hook(hook: fn(&'static str)) -> bool {
    HOOK.set(hook).is_ok()
}

/// Marks a crash point.
#[inline]
pub(crate) fn point(name: &'static str) {
    if let Some(h) = HOOK.get() {
        h(name);
    }
}
