//! `Store`: the blocking object store that owns `<root>/llamad-v1`. Puts, gets, metadata and eviction live
//! here; `gc.rs` holds recovery, garbage collection, verification and index rebuilds.
//!
//! Concurrency: `Store` is `Send + Sync`. Reads run in parallel without the write lock; every change to the
//! object files or the index (put, remove, pin, evict, gc) holds `state`, except the bulk write of a new
//! object's temp file, which runs before the lock is taken.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::blob::{self, Blob, Checked, Place};
use crate::crashpoint;
use crate::digest::{Digest, WireHash};
use crate::error::{Error, Result};
use crate::evict;
use crate::index::mem::MemIndex;
use crate::index::redb::RedbIndex;
use crate::index::{Index, IndexOp, ObjectMeta};
use crate::layout::Layout;
use crate::query::{self, ListPage, ListQuery};
use crate::write;

/// Labels longer than this many bytes are truncated (at a character boundary).
pub const MAX_LABEL_LEN: usize = 1024;

/// Recomputes a wire hash from an object's bytes, for objects the store indexes without a caller
/// (hand-added files, orphans found by `gc`, `rebuild_index`). llamad passes llama.cpp's FNV-1a-64.
pub type WireHasher = Arc<dyn Fn(&[u8]) -> WireHash + Send + Sync>;

/// How a store behaves.
#[derive(Clone)]
pub struct Options {
    /// Upper bound on the total bytes of all objects; least recently used unpinned objects are evicted to
    /// stay under it. `None`: unlimited.
    pub max_size: Option<u64>,
    /// Re-hash every object on every `get` before serving it (default true). When off, only the size is checked.
    pub verify_on_read: bool,
    /// Computes wire hashes for objects indexed without a caller (see [`WireHasher`]).
    pub wire_hasher: Option<WireHasher>,
    /// Usage statistics (last used, hits) are written to the index after this many distinct objects were
    /// used (default 64) ...
    pub touch_batch: usize,
    /// ... or when this much time has passed since the first unwritten use (default 2 s).
    pub touch_interval: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            max_size: None,
            verify_on_read: true,
            wire_hasher: None,
            touch_batch: 64,
            touch_interval: Duration::from_secs(2),
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("max_size", &self.max_size)
            .field("verify_on_read", &self.verify_on_read)
            .field("wire_hasher", &self.wire_hasher.is_some())
            .field("touch_batch", &self.touch_batch)
            .field("touch_interval", &self.touch_interval)
            .finish()
    }
}

/// Counters since the store was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// `get`s that served an object.
    pub hits: u64,
    /// `get`s that found nothing (or nothing trustworthy).
    pub misses: u64,
    /// Bytes handed out by hits.
    pub bytes_served: u64,
    /// Objects removed to respect `max_size`.
    pub evictions: u64,
    /// Objects found corrupt, truncated or missing and dropped.
    pub corrupt_dropped: u64,
    /// `put`s that wrote a new object.
    pub puts_new: u64,
    /// `put`s of content already present.
    pub puts_dedup: u64,
    /// Bytes written by new puts.
    pub bytes_written: u64,
}

/// Size of the store.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    /// Number of objects.
    pub count: u64,
    /// Bytes of all objects.
    pub bytes: u64,
    /// Number of pinned objects.
    pub pinned_count: u64,
    /// Bytes of pinned objects.
    pub pinned_bytes: u64,
    /// `hits / (hits + misses)` since open; 0 when there were no lookups.
    pub hit_rate: f64,
    /// The configured limit.
    pub max_size: Option<u64>,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    bytes_served: AtomicU64,
    evictions: AtomicU64,
    corrupt_dropped: AtomicU64,
    puts_new: AtomicU64,
    puts_dedup: AtomicU64,
    bytes_written: AtomicU64,
}

/// In-memory sums over the index, kept under the write lock.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Sums {
    pub count: u64,
    pub bytes: u64,
    pub pinned_count: u64,
    pub pinned_bytes: u64,
}

impl Sums {
    pub(crate) fn of(entries: &[ObjectMeta]) -> Sums {
        let mut s = Sums::default();
        for m in entries {
            s.add(m);
        }
        s
    }

    pub(crate) fn add(&mut self, m: &ObjectMeta) {
        self.count += 1;
        self.bytes = self.bytes.saturating_add(m.size);
        if m.pinned {
            self.pinned_count += 1;
            self.pinned_bytes = self.pinned_bytes.saturating_add(m.size);
        }
    }

    pub(crate) fn sub(&mut self, m: &ObjectMeta) {
        self.count = self.count.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(m.size);
        if m.pinned {
            self.pinned_count = self.pinned_count.saturating_sub(1);
            self.pinned_bytes = self.pinned_bytes.saturating_sub(m.size);
        }
    }
}

/// State guarded by the write lock.
pub(crate) struct WriteState {
    pub sums: Sums,
    pub max_size: Option<u64>,
}

struct Touches {
    pending: HashMap<Digest, (u64, u64)>,
    since: Instant,
}

/// A content-addressed object store in `<root>/llamad-v1`.
pub struct Store {
    pub(crate) layout: Layout,
    pub(crate) opts: Options,
    pub(crate) index: Box<dyn Index>,
    pub(crate) state: Mutex<WriteState>,
    pub(crate) live_temps: Mutex<HashSet<PathBuf>>,
    touches: Mutex<Touches>,
    counters: Counters,
    clock: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its data consistent before anything that can panic, so a poisoned
    // lock is still safe to use.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn truncate_label(label: Option<&str>) -> Option<String> {
    let l = label?;
    if l.is_empty() {
        return None;
    }
    let mut end = l.len().min(MAX_LABEL_LEN);
    while !l.is_char_boundary(end) {
        end -= 1;
    }
    Some(l[..end].to_string())
}

impl Store {
    /// Opens (creating if needed) the store under `root` with a redb index, then recovers from any crash:
    /// temp files are removed, index entries without objects dropped, objects without entries re-indexed,
    /// and the size limit enforced. An unreadable index file is moved aside and rebuilt from the objects.
    pub fn open(root: &Path, opts: Options) -> Result<Store> {
        let layout = Layout::new(root);
        layout.create()?;
        let (index, rebuilt) = match RedbIndex::open(&layout.index) {
            Ok(i) => (i, false),
            Err(Error::Redb { source, .. }) => {
                let aside = layout.base.join(format!("index.redb.broken-{}", now_us_wall()));
                tracing::warn!(error = %source, aside = %aside.display(), "cache index unreadable; rebuilding from objects");
                std::fs::rename(&layout.index, &aside).map_err(|e| Error::io("rename", &layout.index, e))?;
                (RedbIndex::open(&layout.index)?, true)
            }
            Err(e) => return Err(e),
        };
        let store = Store::with_index(layout, opts, Box::new(index))?;
        if rebuilt {
            store.rebuild_index()?;
        }
        Ok(store)
    }

    /// Opens the store under `root` with an in-memory index (nothing but the objects persists). Every object
    /// is re-hashed at open. Meant for tests; nothing locks the directory against a second store.
    pub fn open_in_memory(root: &Path, opts: Options) -> Result<Store> {
        let layout = Layout::new(root);
        layout.create()?;
        Store::with_index(layout, opts, Box::new(MemIndex::new()))
    }

    fn with_index(layout: Layout, opts: Options, index: Box<dyn Index>) -> Result<Store> {
        let entries = index.scan()?;
        let max_seen = entries.iter().map(|m| m.last_used_us.max(m.created_us)).max().unwrap_or(0);
        let store = Store {
            layout,
            state: Mutex::new(WriteState { sums: Sums::of(&entries), max_size: opts.max_size }),
            opts,
            index,
            live_temps: Mutex::new(HashSet::new()),
            touches: Mutex::new(Touches { pending: HashMap::new(), since: Instant::now() }),
            counters: Counters::default(),
            clock: AtomicU64::new(max_seen),
        };
        let report = store.gc()?;
        if report != crate::gc::GcReport::default() {
            tracing::info!(?report, root = %store.layout.base.display(), "cache recovered at open");
        }
        Ok(store)
    }

    /// The store's paths.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The options the store was opened with (`max_size` may have changed since, see [`Store::totals`]).
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// A strictly increasing timestamp in microseconds since the epoch (wall clock, bumped by 1 µs on ties)
    /// so that LRU order is total even for uses within the same microsecond.
    pub(crate) fn now_us(&self) -> u64 {
        let wall = now_us_wall();
        let mut cur = self.clock.load(Ordering::Relaxed);
        loop {
            let next = wall.max(cur.saturating_add(1));
            match self.clock.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return next,
                Err(c) => cur = c,
            }
        }
    }

    pub(crate) fn lock_state(&self) -> MutexGuard<'_, WriteState> {
        lock(&self.state)
    }

    /// Stores `bytes` and returns their digest. Storing content that is already present only updates its
    /// metadata (last used; the wire hash and label when given). The write is durable when this returns.
    pub fn put(&self, bytes: &[u8], wire_hash: Option<WireHash>, label: Option<&str>) -> Result<Digest> {
        let digest = Digest::of(bytes);
        let size = bytes.len() as u64;
        let label = truncate_label(label);
        if self.put_existing(&digest, size, wire_hash, label.as_deref())? {
            return Ok(digest);
        }
        self.check_fits(size)?;
        // Registered before it exists, so a concurrent `gc` never deletes it.
        let temp = write::temp_path(&self.layout);
        lock(&self.live_temps).insert(temp.clone());
        let result = write::write_temp(&temp, bytes)
            .and_then(|()| self.publish_new(&temp, digest, size, wire_hash, label));
        lock(&self.live_temps).remove(&temp);
        if result.is_err() || temp.exists() {
            let _ = std::fs::remove_file(&temp);
        }
        result.map(|()| digest)
    }

    /// Fails early when `size` can never fit under the limit with the current pins.
    fn check_fits(&self, size: u64) -> Result<()> {
        let st = self.lock_state();
        if let Some(max) = st.max_size {
            let available = max.saturating_sub(st.sums.pinned_bytes);
            if size > available {
                return Err(Error::NoSpace { size, available, max_size: max });
            }
        }
        Ok(())
    }

    /// Handles a put of content that may already be stored; true when nothing more is needed.
    fn put_existing(
        &self,
        digest: &Digest,
        size: u64,
        wire_hash: Option<WireHash>,
        label: Option<&str>,
    ) -> Result<bool> {
        let mut st = self.lock_state();
        let Some(mut meta) = self.index.get(digest)? else { return Ok(false) };
        let path = self.layout.object_path(digest);
        match blob::open_checked(&path, *digest, size, self.opts.verify_on_read) {
            Checked::Good(_) => {}
            Checked::Missing | Checked::Corrupt(_) => {
                // The stored copy is bad; replace it with the caller's good bytes.
                tracing::warn!(%digest, "cached object bad at re-put; rewriting it");
                self.drop_entry_locked(&mut st, &meta, true)?;
                return Ok(false);
            }
        }
        let now = self.now_us();
        let changes_meta = (wire_hash.is_some() && wire_hash != meta.wire_hash)
            || (label.is_some() && label != meta.label.as_deref());
        if changes_meta {
            if wire_hash.is_some() {
                meta.wire_hash = wire_hash;
            }
            if let Some(l) = label {
                meta.label = Some(l.to_string());
            }
            meta.last_used_us = meta.last_used_us.max(now);
            self.index.apply(&[IndexOp::Put(meta)], true)?;
        } else {
            drop(st);
            self.record_touch(*digest, now, 0);
        }
        self.counters.puts_dedup.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    fn publish_new(
        &self,
        temp: &Path,
        digest: Digest,
        size: u64,
        wire_hash: Option<WireHash>,
        label: Option<String>,
    ) -> Result<()> {
        let mut st = self.lock_state();
        // Another thread may have stored the same content while we were writing.
        if let Some(m) = self.index.get(&digest)? {
            if let Checked::Good(_) =
                blob::open_checked(&self.layout.object_path(&digest), digest, m.size, false)
            {
                drop(st);
                self.counters.puts_dedup.fetch_add(1, Ordering::Relaxed);
                self.record_touch(digest, self.now_us(), 0);
                return Ok(());
            }
        }
        self.make_room_locked(&mut st, size, Some(&digest))?;
        write::publish(&self.layout, temp, &digest)?;
        let now = self.now_us();
        let old = self.index.get(&digest)?;
        let meta = ObjectMeta {
            digest,
            size,
            created_us: now,
            last_used_us: now,
            hits: 0,
            pinned: old.as_ref().is_some_and(|o| o.pinned),
            wire_hash,
            label,
        };
        self.index.apply(&[IndexOp::Put(meta.clone())], true)?;
        crashpoint::point("indexed");
        if let Some(o) = &old {
            st.sums.sub(o);
        }
        st.sums.add(&meta);
        self.counters.puts_new.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_written.fetch_add(size, Ordering::Relaxed);
        Ok(())
    }

    /// Evicts LRU unpinned objects until `incoming` more bytes fit under the limit.
    pub(crate) fn make_room_locked(
        &self,
        st: &mut WriteState,
        incoming: u64,
        keep: Option<&Digest>,
    ) -> Result<()> {
        let Some(max) = st.max_size else { return Ok(()) };
        if st.sums.bytes.saturating_add(incoming) <= max {
            return Ok(());
        }
        self.flush_touches();
        let entries = self.index.scan()?;
        let Some(victims) = evict::plan(&entries, st.sums.bytes, incoming, max, keep) else {
            let available = max.saturating_sub(st.sums.pinned_bytes);
            return Err(Error::NoSpace { size: incoming, available, max_size: max });
        };
        let by_digest: HashMap<Digest, &ObjectMeta> = entries.iter().map(|m| (m.digest, m)).collect();
        let ops: Vec<IndexOp> = victims.iter().map(|d| IndexOp::Remove(*d)).collect();
        self.index.apply(&ops, true)?;
        crashpoint::point("evict-unindexed");
        for d in &victims {
            if let Some(m) = by_digest.get(d) {
                st.sums.sub(m);
            }
            self.unlink_object(d);
            tracing::debug!(digest = %d, "evicted (lru)");
        }
        self.counters.evictions.fetch_add(victims.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Removes an object file (index entry already gone). Errors are logged: `gc` retries.
    pub(crate) fn unlink_object(&self, d: &Digest) {
        let path = self.layout.object_path(d);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot remove cache object"),
        }
    }

    /// Drops an entry and its file (index first, so a crash never leaves an entry without its object).
    pub(crate) fn drop_entry_locked(
        &self,
        st: &mut WriteState,
        meta: &ObjectMeta,
        corrupt: bool,
    ) -> Result<()> {
        self.index.apply(&[IndexOp::Remove(meta.digest)], true)?;
        crashpoint::point("unindexed");
        st.sums.sub(meta);
        self.unlink_object(&meta.digest);
        if corrupt {
            self.counters.corrupt_dropped.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Serves an object, or `None` on a miss. A corrupt, truncated or missing object is dropped (file and
    /// entry) and reported as a miss, never served.
    pub fn get(&self, digest: &Digest) -> Result<Option<Blob>> {
        let Some(meta) = self.index.get(digest)? else {
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        };
        self.serve(meta)
    }

    fn serve(&self, meta: ObjectMeta) -> Result<Option<Blob>> {
        let path = self.layout.object_path(&meta.digest);
        match blob::open_checked(&path, meta.digest, meta.size, self.opts.verify_on_read) {
            Checked::Good(b) => Ok(Some(self.hit(b))),
            bad @ (Checked::Missing | Checked::Corrupt(_)) => {
                let reason = match bad {
                    Checked::Corrupt(r) => r,
                    _ => "file missing",
                };
                tracing::warn!(digest = %meta.digest, reason, "cached object unusable; dropped");
                let mut st = self.lock_state();
                // Re-check under the lock: a concurrent re-put may have replaced it with good bytes.
                if let Some(cur) = self.index.get(&meta.digest)? {
                    if let Checked::Good(b) = blob::open_checked(&path, cur.digest, cur.size, true) {
                        drop(st);
                        return Ok(Some(self.hit(b)));
                    }
                    self.drop_entry_locked(&mut st, &cur, true)?;
                }
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
        }
    }

    fn hit(&self, b: Blob) -> Blob {
        self.count_hit(b.digest(), b.len() as u64);
        b
    }

    fn count_hit(&self, digest: Digest, len: u64) {
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_served.fetch_add(len, Ordering::Relaxed);
        self.record_touch(digest, self.now_us(), 1);
    }

    /// As [`Store::serve`], reading into `dst` instead of mapping; true on a hit.
    fn serve_into(&self, meta: ObjectMeta, dst: &mut [u8]) -> Result<bool> {
        self.serve_with(meta, &mut |path, digest, size, verify| {
            blob::read_checked(path, digest, size, verify, dst)
        })
    }

    /// Serves `meta` through `fill` (which opens, puts in place and checks the object's bytes, verifying
    /// them when told to); true on a hit. A bad object is dropped, after one more try under the lock.
    fn serve_with(
        &self,
        meta: ObjectMeta,
        fill: &mut dyn FnMut(&Path, Digest, u64, bool) -> Checked<()>,
    ) -> Result<bool> {
        let path = self.layout.object_path(&meta.digest);
        let reason = match fill(&path, meta.digest, meta.size, self.opts.verify_on_read) {
            Checked::Good(()) => {
                self.count_hit(meta.digest, meta.size);
                return Ok(true);
            }
            Checked::Missing => "file missing",
            Checked::Corrupt(r) => r,
        };
        tracing::warn!(digest = %meta.digest, reason, "cached object unusable; dropped");
        let mut st = self.lock_state();
        // Re-check under the lock: a concurrent re-put may have replaced it with good bytes.
        if let Some(cur) = self.index.get(&meta.digest)? {
            if let Checked::Good(()) = fill(&path, cur.digest, cur.size, true) {
                drop(st);
                self.count_hit(cur.digest, cur.size);
                return Ok(true);
            }
            self.drop_entry_locked(&mut st, &cur, true)?;
        }
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        Ok(false)
    }

    /// Entries carrying `hash`, optionally only those of `size` bytes (llama.cpp's hash is not collision
    /// resistant: the caller must still check the size against the target and may re-hash the bytes).
    pub fn find_by_wire_hash(&self, hash: WireHash, size: Option<u64>) -> Result<Vec<ObjectMeta>> {
        let mut out = Vec::new();
        for d in self.index.by_wire_hash(hash)? {
            if let Some(m) = self.index.get(&d)? {
                if size.is_none_or(|s| s == m.size) {
                    out.push(m);
                }
            }
        }
        Ok(out)
    }

    /// Serves the first good object with this wire hash and size (a miss if none verifies).
    pub fn get_by_wire_hash(&self, hash: WireHash, size: u64) -> Result<Option<Blob>> {
        for m in self.find_by_wire_hash(hash, Some(size))? {
            if let Some(b) = self.serve(m)? {
                return Ok(Some(b));
            }
        }
        Ok(None)
    }

    /// Reads the first good object with this wire hash and `dst.len()` bytes straight into `dst`, without
    /// mapping it, and returns its digest; `None` on a miss (then `dst` may hold garbage). As with
    /// [`Store::get`], the object is verified against its BLAKE3 digest first when
    /// [`Options::verify_on_read`] is on (hashed chunk by chunk as it is read, so the bytes are touched
    /// once), and a corrupt one is dropped and skipped.
    pub fn read_by_wire_hash(&self, hash: WireHash, dst: &mut [u8]) -> Result<Option<Digest>> {
        for m in self.find_by_wire_hash(hash, Some(dst.len() as u64))? {
            let digest = m.digest;
            if self.serve_into(m, dst)? {
                return Ok(Some(digest));
            }
        }
        Ok(None)
    }

    /// As [`Store::read_by_wire_hash`] for an object of `size` bytes, but `dst` puts its bytes where the
    /// caller wants them: it gets the open object file (a regular file of `size` bytes) and may map it
    /// rather than read it. The store then verifies the placed bytes when [`Options::verify_on_read`] is
    /// on; a corrupt object is dropped and skipped, and `dst` may be placed again from the next candidate.
    /// An error from [`Place::place`], or placed bytes of another length, count as a bad object.
    /// `None` on a miss (the placed bytes are then garbage).
    pub fn place_by_wire_hash(
        &self,
        hash: WireHash,
        size: u64,
        dst: &mut dyn Place,
    ) -> Result<Option<Digest>> {
        for m in self.find_by_wire_hash(hash, Some(size))? {
            let digest = m.digest;
            if self.serve_with(m, &mut |path, d, s, verify| blob::place_checked(path, d, s, verify, dst))? {
                return Ok(Some(digest));
            }
        }
        Ok(None)
    }

    /// The entry for `digest` (usage statistics include uses not yet written to the index).
    pub fn stat(&self, digest: &Digest) -> Result<Option<ObjectMeta>> {
        let Some(mut m) = self.index.get(digest)? else { return Ok(None) };
        if let Some(&(last, hits)) = lock(&self.touches).pending.get(digest) {
            m.last_used_us = m.last_used_us.max(last);
            m.hits = m.hits.saturating_add(hits);
        }
        Ok(Some(m))
    }

    /// Removes an object; false if it was not there.
    pub fn remove(&self, digest: &Digest) -> Result<bool> {
        let mut st = self.lock_state();
        let Some(meta) = self.index.get(digest)? else { return Ok(false) };
        self.drop_entry_locked(&mut st, &meta, false)?;
        Ok(true)
    }

    /// Pins an object: it is never evicted. Fails with [`Error::NotFound`] when absent.
    pub fn pin(&self, digest: &Digest) -> Result<()> {
        self.set_pinned(digest, true)
    }

    /// Unpins an object; the size limit is enforced again.
    pub fn unpin(&self, digest: &Digest) -> Result<()> {
        self.set_pinned(digest, false)?;
        let mut st = self.lock_state();
        self.enforce_limit_locked(&mut st)
    }

    fn set_pinned(&self, digest: &Digest, pinned: bool) -> Result<()> {
        let mut st = self.lock_state();
        let Some(mut m) = self.index.get(digest)? else { return Err(Error::NotFound { digest: *digest }) };
        if m.pinned == pinned {
            return Ok(());
        }
        st.sums.sub(&m);
        m.pinned = pinned;
        st.sums.add(&m);
        self.index.apply(&[IndexOp::Put(m)], true)
    }

    /// Changes the size limit and evicts down to it (as far as pins allow).
    pub fn set_max_size(&self, max_size: Option<u64>) -> Result<()> {
        let mut st = self.lock_state();
        st.max_size = max_size;
        self.enforce_limit_locked(&mut st)
    }

    /// Evicts until the store is under its limit, as far as pins allow (no error when pins exceed it).
    pub(crate) fn enforce_limit_locked(&self, st: &mut WriteState) -> Result<()> {
        let Some(max) = st.max_size else { return Ok(()) };
        if st.sums.bytes <= max {
            return Ok(());
        }
        // Evict what we can: aim for the limit, or for the pinned bytes if they alone exceed it.
        let target = max.max(st.sums.pinned_bytes);
        let saved = st.max_size;
        st.max_size = Some(target);
        let r = self.make_room_locked(st, 0, None);
        st.max_size = saved;
        r
    }

    /// A page of entries (see [`ListQuery`]).
    pub fn list(&self, q: &ListQuery) -> Result<ListPage> {
        self.flush_touches();
        Ok(query::run(self.index.scan()?, q))
    }

    /// Counters since open.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        Stats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            bytes_served: c.bytes_served.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            corrupt_dropped: c.corrupt_dropped.load(Ordering::Relaxed),
            puts_new: c.puts_new.load(Ordering::Relaxed),
            puts_dedup: c.puts_dedup.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
        }
    }

    /// Object count and bytes, pinned bytes, and the hit rate since open.
    pub fn totals(&self) -> Totals {
        let st = self.lock_state();
        let s = self.stats();
        let lookups = s.hits + s.misses;
        Totals {
            count: st.sums.count,
            bytes: st.sums.bytes,
            pinned_count: st.sums.pinned_count,
            pinned_bytes: st.sums.pinned_bytes,
            hit_rate: if lookups == 0 { 0.0 } else { s.hits as f64 / lookups as f64 },
            max_size: st.max_size,
        }
    }

    fn record_touch(&self, digest: Digest, now: u64, hits: u64) {
        let due = {
            let mut t = lock(&self.touches);
            if t.pending.is_empty() {
                t.since = Instant::now();
            }
            let e = t.pending.entry(digest).or_insert((0, 0));
            e.0 = e.0.max(now);
            e.1 = e.1.saturating_add(hits);
            t.pending.len() >= self.opts.touch_batch.max(1) || t.since.elapsed() >= self.opts.touch_interval
        };
        if due {
            self.flush_touches();
        }
    }

    /// Writes pending usage statistics to the index (also done on drop). Failures are logged, not returned:
    /// statistics are advisory.
    pub fn flush_touches(&self) {
        let pending = std::mem::take(&mut lock(&self.touches).pending);
        if pending.is_empty() {
            return;
        }
        let ops: Vec<IndexOp> = pending
            .into_iter()
            .map(|(digest, (last_used_us, hits))| IndexOp::Touch { digest, last_used_us, hits })
            .collect();
        if let Err(e) = self.index.apply(&ops, false) {
            tracing::warn!(error = %e, "cannot record cache usage statistics");
        }
    }

    /// Current time for records created outside a put (adopted files).
    pub(crate) fn wire_hash_of(&self, bytes: &[u8]) -> Option<WireHash> {
        self.opts.wire_hasher.as_ref().map(|h| h(bytes))
    }
}

// The daemon shares one store between threads.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Store>();
    assert_send_sync::<Blob>();
};

impl Drop for Store {
    fn drop(&mut self) {
        self.flush_touches();
    }
}

pub(crate) fn now_us_wall() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
