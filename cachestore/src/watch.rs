//! The filesystem watcher: an adapter that keeps the index in step with objects added or removed by hand in
//! `objects/` while the store runs. The store itself never watches; llamad starts a [`Watcher`] next to it.
//!
//! Events are debounced: a path is examined once it has been quiet for `settle` (so a file still being
//! copied is not hashed half-way). An added file whose name matches its BLAKE3 is indexed (moved to its
//! `ab/cd/` place if needed, made read-only); any other file is moved to `quarantine/`. A removed object
//! file drops its index entry. The store's own writes and evictions are seen too and change nothing, because
//! they update the index under the same lock before the watcher looks.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use notify::{RecursiveMode, Watcher as _};

use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::gc::Adopt;
use crate::index::IndexOp;
use crate::layout::Layout;
use crate::store::Store;

/// What reconciling one path did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconciled {
    /// A new object was indexed.
    Indexed(Digest),
    /// The object's file is gone; its entry was dropped.
    Dropped(Digest),
    /// The file did not match its name (or had no object name) and was moved to `quarantine/`.
    Quarantined,
    /// A second copy of a stored object was removed.
    DuplicateRemoved,
    /// Nothing to do.
    Unchanged,
}

impl Store {
    /// Brings the index in line with one path under `objects/` (used by the watcher; callers may use it
    /// after placing a file themselves). Paths outside `objects/` are ignored.
    pub fn reconcile_path(&self, path: &Path) -> Result<Reconciled> {
        if !self.layout.is_under_objects(path) {
            return Ok(Reconciled::Unchanged);
        }
        let mut st = self.lock_state();
        let claimed = path.file_name().and_then(Layout::parse_object_name);
        let exists = std::fs::symlink_metadata(path).ok();
        let Some(md) = exists else {
            // Removed: drop the entry if this was the object's canonical file and it is really gone.
            if let Some(d) = claimed {
                if path == self.layout.object_path(&d) {
                    if let Some(m) = self.index.get(&d)? {
                        self.index.apply(&[IndexOp::Remove(d)], true)?;
                        st.sums.sub(&m);
                        tracing::info!(digest = %d, "cache object removed by hand; index entry dropped");
                        return Ok(Reconciled::Dropped(d));
                    }
                }
            }
            return Ok(Reconciled::Unchanged);
        };
        if md.is_dir() {
            return Ok(Reconciled::Unchanged);
        }
        let mut known = HashSet::new();
        if let Some(d) = claimed {
            if let Some(m) = self.index.get(&d)? {
                if path == self.layout.object_path(&d) && md.len() != m.size {
                    // The indexed file was replaced by hand with other bytes: forget it, then judge the new file.
                    self.index.apply(&[IndexOp::Remove(d)], true)?;
                    st.sums.sub(&m);
                } else {
                    known.insert(d);
                }
            }
        }
        Ok(match self.adopt_locked(&mut st, path, None, &known)? {
            Adopt::Index(m) => {
                let d = m.digest;
                self.index.apply(&[IndexOp::Put(m.clone())], true)?;
                st.sums.add(&m);
                tracing::info!(digest = %d, "cache object added by hand; indexed");
                self.enforce_limit_locked(&mut st)?;
                Reconciled::Indexed(d)
            }
            Adopt::Quarantined => Reconciled::Quarantined,
            Adopt::Duplicate => Reconciled::DuplicateRemoved,
            Adopt::Known | Adopt::Skipped => Reconciled::Unchanged,
        })
    }
}

enum Msg {
    Event(notify::Result<notify::Event>),
    Stop,
}

/// Watches a store's `objects/` directory until dropped.
pub struct Watcher {
    // Dropped first: no more events are sent once it is gone.
    notify: Option<notify::RecommendedWatcher>,
    tx: Sender<Msg>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Starts watching `store`'s objects directory; a path is examined once it has been quiet for `settle`
    /// (for example 300 ms).
    pub fn start(store: Arc<Store>, settle: Duration) -> Result<Watcher> {
        let (tx, rx) = mpsc::channel::<Msg>();
        let objects = store.layout.objects.clone();
        let ev_tx = tx.clone();
        let mut w = notify::recommended_watcher(move |ev| {
            let _ = ev_tx.send(Msg::Event(ev));
        })
        .map_err(|source| Error::Watch { path: objects.clone(), source })?;
        w.watch(&objects, RecursiveMode::Recursive)
            .map_err(|source| Error::Watch { path: objects.clone(), source })?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("cachestore-watch".into())
            .spawn(move || run(&store, &rx, settle, &thread_stop))
            .map_err(|e| Error::io("spawn watcher thread", &objects, e))?;
        Ok(Watcher { notify: Some(w), tx, stop, thread: Some(thread) })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.notify.take();
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn queue_dir(dir: &Path, due: Instant, pending: &mut HashMap<PathBuf, Instant>, depth: u32) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            if depth > 0 {
                queue_dir(&p, due, pending, depth - 1);
            }
        } else {
            pending.insert(p, due);
        }
    }
}

/// An open, a read or a close after reading: nothing in the tree changed.
fn is_read(ev: &notify::Event) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind};
    !ev.need_rescan()
        && matches!(ev.kind, EventKind::Access(a) if !matches!(a, AccessKind::Close(AccessMode::Write)))
}

fn run(store: &Store, rx: &mpsc::Receiver<Msg>, settle: Duration, stop: &AtomicBool) {
    let mut pending: HashMap<PathBuf, Instant> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let wait =
            pending.values().min().map_or(Duration::from_secs(3600), |d| d.saturating_duration_since(now));
        match rx.recv_timeout(wait) {
            Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            // Reads are not changes, and reconciling a path reads it: without this, every
            // reconcile's own open/close queued the path again and the thread never went idle
            // (a llamad with -c and a populated cache burned a whole core doing nothing).
            Ok(Msg::Event(Ok(ev))) if is_read(&ev) => {}
            Ok(Msg::Event(Ok(ev))) => {
                if ev.need_rescan() {
                    // The kernel dropped events: reconcile everything.
                    if let Err(e) = store.gc() {
                        tracing::warn!(error = %e, "cache gc after watcher overflow failed");
                    }
                }
                let due = Instant::now() + settle;
                for p in ev.paths {
                    // A directory created by hand may already hold files whose events we missed.
                    if p.is_dir() {
                        queue_dir(&p, due, &mut pending, 4);
                    }
                    pending.insert(p, due);
                }
            }
            Ok(Msg::Event(Err(e))) => tracing::warn!(error = %e, "cache watcher error"),
            Err(RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        let ready: Vec<PathBuf> =
            pending.iter().filter(|(_, d)| **d <= now).map(|(p, _)| p.clone()).collect();
        for p in ready {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            pending.remove(&p);
            if p.is_dir() {
                // Scan a new directory again once it has settled: a file moved into it before the
                // watch on it was in place sends no event, and the scan at its creation event may
                // have run before the file arrived.
                queue_dir(&p, now, &mut pending, 4);
                continue;
            }
            match store.reconcile_path(&p) {
                Ok(r) => tracing::debug!(path = %p.display(), ?r, "cache watcher reconciled"),
                Err(e) => tracing::warn!(path = %p.display(), error = %e, "cache watcher cannot reconcile"),
            }
        }
    }
}
