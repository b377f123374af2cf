//! Recovery and upkeep: `gc` (run at every open), `rebuild_index`, `verify`, and the adoption of object
//! files the index does not know (crash leftovers and files added by hand, also used by `watch.rs`).
//!
//! The object files are the truth. An index entry whose file is missing or has the wrong size is dropped;
//! a file whose name matches its BLAKE3 is (re-)indexed; any other file under `objects/` is moved to
//! `quarantine/` for an operator to look at, never served and never deleted silently.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::blob::{self, Blob, Checked};
use crate::crashpoint;
use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::index::{IndexOp, ObjectMeta};
use crate::layout::Layout;
use crate::store::{Store, Sums, WriteState};
use crate::write;

/// What `gc` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Leftover temp files removed from `tmp/`.
    pub temp_removed: u64,
    /// Index entries dropped because their object file was missing.
    pub stale_entries: u64,
    /// Index entries dropped (with their file) because the file had the wrong size.
    pub wrong_size: u64,
    /// Object files without an entry that were hashed and indexed.
    pub orphans_indexed: u64,
    /// Files under `objects/` moved to `quarantine/` (bad name, or content not matching the name).
    pub quarantined: u64,
    /// Misplaced copies of objects already stored, removed.
    pub duplicates_removed: u64,
}

/// What `rebuild_index` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RebuildReport {
    /// Objects indexed.
    pub indexed: u64,
    /// Of those, how many kept their previous metadata (pins, statistics, wire hash, label).
    pub kept_metadata: u64,
    /// Files moved to `quarantine/`.
    pub quarantined: u64,
    /// Misplaced duplicate copies removed.
    pub duplicates_removed: u64,
    /// Temp files removed.
    pub temp_removed: u64,
}

/// What `verify` found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Objects hashed.
    pub checked: u64,
    /// Objects found missing, truncated or with the wrong content (all were dropped).
    pub corrupt: Vec<Digest>,
}

/// The result of looking at one file under `objects/`.
pub(crate) enum Adopt {
    /// The file is a valid object now at its canonical place; insert this entry.
    Index(ObjectMeta),
    /// The file is already indexed at its canonical place.
    Known,
    /// It was a second copy of an indexed object, removed.
    Duplicate,
    /// It was moved to `quarantine/`.
    Quarantined,
    /// It vanished or is a directory; nothing done.
    Skipped,
}

/// Files under `dir` (not following symlinks), at most `depth` levels deep.
fn walk_files(dir: &Path, depth: u32, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let path = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => {
                if depth > 0 {
                    walk_files(&path, depth - 1, out);
                }
            }
            Ok(_) => out.push(path),
            Err(_) => {}
        }
    }
}

impl Store {
    /// Moves a file to `quarantine/<name>.<time>`.
    pub(crate) fn quarantine(&self, path: &Path) -> Result<()> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let dest = self.layout.quarantine.join(format!("{name}.{}", self.now_us()));
        tracing::warn!(path = %path.display(), to = %dest.display(), "file in cache objects does not match its name; quarantined");
        std::fs::rename(path, &dest).map_err(|e| Error::io("quarantine", path, e))
    }

    /// Examines one file under `objects/` and makes it a well-formed object, a known one, or quarantines it.
    /// `previous` supplies metadata to keep (from an index being rebuilt). Must run under the write lock.
    pub(crate) fn adopt_locked(
        &self,
        _st: &mut WriteState,
        path: &Path,
        previous: Option<&ObjectMeta>,
        known: &HashSet<Digest>,
    ) -> Result<Adopt> {
        let md = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Adopt::Skipped),
            Err(e) => return Err(Error::io("stat", path, e)),
        };
        if md.is_dir() {
            return Ok(Adopt::Skipped);
        }
        let claimed = path.file_name().and_then(Layout::parse_object_name);
        let Some(digest) = claimed.filter(|_| md.is_file()) else {
            self.quarantine(path)?;
            return Ok(Adopt::Quarantined);
        };
        let canonical = self.layout.object_path(&digest);
        if known.contains(&digest) {
            if path == canonical {
                return Ok(Adopt::Known);
            }
            std::fs::remove_file(path).map_err(|e| Error::io("remove", path, e))?;
            return Ok(Adopt::Duplicate);
        }
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Adopt::Skipped),
            Err(e) => return Err(Error::io("open", path, e)),
        };
        let len = md.len();
        // SAFETY: the file is only read here; a concurrent hand edit can at worst make the hash mismatch
        // (which quarantines it) or, if truncated, raise SIGBUS, which the README documents as unsupported.
        let bytes = unsafe { Blob::map(&file, digest, len) }.map_err(|e| Error::io("map", path, e))?;
        if Digest::of(&bytes) != digest {
            drop(bytes);
            self.quarantine(path)?;
            return Ok(Adopt::Quarantined);
        }
        write::set_read_only(&file, path)?;
        let wire_hash = previous.and_then(|p| p.wire_hash).or_else(|| self.wire_hash_of(&bytes));
        drop(bytes);
        if path != canonical {
            write::ensure_object_dir(&self.layout, &digest)?;
            std::fs::rename(path, &canonical).map_err(|e| Error::io("rename", path, e))?;
            crashpoint::point("adopt-moved");
            write::fsync_dir(&self.layout.object_dir(&digest))?;
        }
        let now = self.now_us();
        let meta = match previous {
            Some(p) if p.size == len => ObjectMeta { wire_hash, ..p.clone() },
            _ => ObjectMeta {
                digest,
                size: len,
                created_us: now,
                last_used_us: now,
                hits: 0,
                pinned: false,
                wire_hash,
                label: None,
            },
        };
        Ok(Adopt::Index(meta))
    }

    /// Removes temp files not belonging to a write in progress.
    fn clean_temps(&self) -> u64 {
        // List first, then read the live set: a put registers its temp name before creating the file, so
        // every in-progress temp file seen by the listing is in the set read after it.
        let mut files = Vec::new();
        walk_files(&self.layout.tmp, 0, &mut files);
        let live = self.live_temps.lock().map(|g| g.clone()).unwrap_or_else(|p| p.into_inner().clone());
        let mut n = 0;
        for f in files {
            if !live.contains(&f) && std::fs::remove_file(&f).is_ok() {
                n += 1;
            }
        }
        n
    }

    /// Collects garbage and repairs the index against the files: removes leftover temp files, drops entries
    /// whose object is missing or has the wrong size, indexes valid unindexed objects, quarantines the rest,
    /// and enforces the size limit. Runs at every open; safe to call at any time.
    pub fn gc(&self) -> Result<GcReport> {
        self.flush_touches();
        let mut st = self.lock_state();
        let mut r = GcReport { temp_removed: self.clean_temps(), ..GcReport::default() };

        let entries = self.index.scan()?;
        let mut drop_ops = Vec::new();
        let mut wrong_size_files = Vec::new();
        let mut known = HashSet::new();
        for m in &entries {
            let path = self.layout.object_path(&m.digest);
            match std::fs::symlink_metadata(&path) {
                Ok(md) if md.is_file() && md.len() == m.size => {
                    known.insert(m.digest);
                }
                Ok(_) => {
                    drop_ops.push(IndexOp::Remove(m.digest));
                    wrong_size_files.push(path);
                    r.wrong_size += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    drop_ops.push(IndexOp::Remove(m.digest));
                    r.stale_entries += 1;
                }
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot stat cache object"),
            }
        }
        self.index.apply(&drop_ops, true)?;
        for p in wrong_size_files {
            let _ = std::fs::remove_file(&p).or_else(|_| std::fs::remove_dir_all(&p));
        }

        let mut files = Vec::new();
        walk_files(&self.layout.objects, 4, &mut files);
        let mut add_ops = Vec::new();
        for f in files {
            match self.adopt_locked(&mut st, &f, None, &known)? {
                Adopt::Index(m) => {
                    known.insert(m.digest);
                    add_ops.push(IndexOp::Put(m));
                    r.orphans_indexed += 1;
                }
                Adopt::Quarantined => r.quarantined += 1,
                Adopt::Duplicate => r.duplicates_removed += 1,
                Adopt::Known | Adopt::Skipped => {}
            }
        }
        self.index.apply(&add_ops, true)?;
        st.sums = Sums::of(&self.index.scan()?);
        self.enforce_limit_locked(&mut st)?;
        Ok(r)
    }

    /// Rebuilds the index from the object files: every file is re-hashed; valid objects are indexed, keeping
    /// the metadata of the old index where it is readable (pins, statistics, wire hash, label), others get
    /// fresh metadata (wire hash from `Options::wire_hasher` if set). Files that do not match their name are
    /// quarantined.
    pub fn rebuild_index(&self) -> Result<RebuildReport> {
        self.flush_touches();
        let mut st = self.lock_state();
        let old: HashMap<Digest, ObjectMeta> = match self.index.scan() {
            Ok(v) => v.into_iter().map(|m| (m.digest, m)).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "old cache index unreadable; metadata is lost");
                HashMap::new()
            }
        };
        self.index.clear()?;
        let mut r = RebuildReport { temp_removed: self.clean_temps(), ..RebuildReport::default() };
        let mut files = Vec::new();
        walk_files(&self.layout.objects, 4, &mut files);
        // Canonical paths first, so a misplaced copy is the one treated as the duplicate.
        files.sort_by_key(|p| {
            let canonical =
                p.file_name().and_then(Layout::parse_object_name).map(|d| self.layout.object_path(&d));
            canonical.as_deref() != Some(p.as_path())
        });
        let mut known = HashSet::new();
        let mut batch = Vec::new();
        for f in files {
            let prev = f.file_name().and_then(Layout::parse_object_name).and_then(|d| old.get(&d));
            match self.adopt_locked(&mut st, &f, prev, &known)? {
                Adopt::Index(m) => {
                    if prev.is_some_and(|p| p.size == m.size) {
                        r.kept_metadata += 1;
                    }
                    known.insert(m.digest);
                    batch.push(IndexOp::Put(m));
                    r.indexed += 1;
                    if batch.len() >= 256 {
                        self.index.apply(&batch, true)?;
                        batch.clear();
                    }
                }
                Adopt::Quarantined => r.quarantined += 1,
                Adopt::Duplicate => r.duplicates_removed += 1,
                Adopt::Known | Adopt::Skipped => {}
            }
        }
        self.index.apply(&batch, true)?;
        st.sums = Sums::of(&self.index.scan()?);
        self.enforce_limit_locked(&mut st)?;
        tracing::info!(?r, "cache index rebuilt");
        Ok(r)
    }

    /// Re-hashes one object (or all) and drops every one that is missing, truncated or corrupt.
    /// Fails with [`Error::NotFound`] when a single digest is asked for and absent.
    pub fn verify(&self, digest: Option<&Digest>) -> Result<VerifyReport> {
        let entries = match digest {
            Some(d) => vec![self.index.get(d)?.ok_or(Error::NotFound { digest: *d })?],
            None => self.index.scan()?,
        };
        let mut r = VerifyReport::default();
        for m in entries {
            r.checked += 1;
            let path = self.layout.object_path(&m.digest);
            if let Checked::Good(_) = blob::open_checked(&path, m.digest, m.size, true) {
                continue;
            }
            let mut st = self.lock_state();
            // Re-check under the lock (a concurrent re-put may have repaired it).
            let Some(cur) = self.index.get(&m.digest)? else { continue };
            if let Checked::Good(_) = blob::open_checked(&path, cur.digest, cur.size, true) {
                continue;
            }
            tracing::warn!(digest = %m.digest, "cache object failed verification; dropped");
            self.drop_entry_locked(&mut st, &cur, true)?;
            r.corrupt.push(m.digest);
        }
        Ok(r)
    }
}
