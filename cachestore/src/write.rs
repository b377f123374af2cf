//! Atomic object writes: temp file → write → fsync → mode 0444 → rename into place → fsync of the directory.
//! The index is updated by the caller only after `publish` returns, so a crash at any point leaves either
//! nothing, a temp file (collected by `gc`), or a complete object without an index entry (re-indexed by `gc`).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::crashpoint;
use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::layout::Layout;

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// A fresh temp file name in `tmp/` (unique within the process; the index lock excludes other processes).
pub(crate) fn temp_path(layout: &Layout) -> PathBuf {
    let seq = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
    layout.tmp.join(format!("{}-{}.tmp", std::process::id(), seq))
}

/// Writes `bytes` to the new temp file `path`, made read-only and fsynced.
pub(crate) fn write_temp(path: &Path, bytes: &[u8]) -> Result<()> {
    let path = path.to_path_buf();
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| Error::io("create", &path, e))?;
        let (head, tail) = bytes.split_at(bytes.len() / 2);
        f.write_all(head).map_err(|e| Error::io("write", &path, e))?;
        crashpoint::point("temp-partial");
        f.write_all(tail).map_err(|e| Error::io("write", &path, e))?;
        set_read_only(&f, &path)?;
        f.sync_all().map_err(|e| Error::io("fsync", &path, e))?;
        crashpoint::point("temp-synced");
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&path);
    }
    result
}

/// Sets mode 0444 (read-only for everyone who may read the cache).
pub(crate) fn set_read_only(f: &File, path: &Path) -> Result<()> {
    let mut perm = f.metadata().map_err(|e| Error::io("stat", path, e))?.permissions();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        perm.set_mode(0o444);
    }
    #[cfg(not(unix))]
    perm.set_readonly(true);
    f.set_permissions(perm).map_err(|e| Error::io("chmod", path, e))
}

/// fsyncs a directory so that a rename or unlink inside it is durable.
pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let d = File::open(dir).map_err(|e| Error::io("open dir", dir, e))?;
        d.sync_all().map_err(|e| Error::io("fsync dir", dir, e))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Creates `objects/ab/cd` if needed (fsyncing each parent whose entries changed) and returns it.
pub(crate) fn ensure_object_dir(layout: &Layout, digest: &Digest) -> Result<PathBuf> {
    let dir = layout.object_dir(digest);
    if dir.is_dir() {
        return Ok(dir);
    }
    let Some(mid) = dir.parent() else { return Ok(dir) };
    let mid_existed = mid.is_dir();
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("create dir", &dir, e))?;
    fsync_dir(mid)?;
    if !mid_existed {
        fsync_dir(&layout.objects)?;
    }
    Ok(dir)
}

/// Renames a finished temp file to the object's place and makes the rename durable.
pub(crate) fn publish(layout: &Layout, temp: &Path, digest: &Digest) -> Result<PathBuf> {
    let dir = ensure_object_dir(layout, digest)?;
    let dest = layout.object_path(digest);
    std::fs::rename(temp, &dest).map_err(|e| Error::io("rename", temp, e))?;
    crashpoint::point("renamed");
    fsync_dir(&dir)?;
    crashpoint::point("published");
    Ok(dest)
}
