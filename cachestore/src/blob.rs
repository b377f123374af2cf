//! `Blob`: a read-only memory map of one object file, and the checks made before one is handed out.

use std::fs::File;
use std::ops::Deref;
use std::path::Path;

use memmap2::Mmap;

use crate::digest::Digest;

/// The bytes of one object, mapped read-only. Cheap to hold; the file stays readable while mapped even if
/// the store removes it (the mapping keeps the inode alive).
pub struct Blob {
    digest: Digest,
    // `None` for an empty object: mapping a zero-length file fails on Linux.
    map: Option<Mmap>,
}

impl Blob {
    /// Maps `file` read-only.
    ///
    /// # Safety
    ///
    /// The file must never be truncated or written while the mapping lives (a truncation turns reads
    /// into SIGBUS, a write changes bytes already verified). The store guarantees this for its objects: they
    /// are written once to a temp file, made read-only (0444) and renamed into place; removal only unlinks the
    /// name, which leaves the mapped inode intact. Only someone editing the files by hand can break it.
    pub(crate) unsafe fn map(file: &File, digest: Digest, len: u64) -> std::io::Result<Blob> {
        if len == 0 {
            return Ok(Blob { digest, map: None });
        }
        // SAFETY: the caller guarantees the file is immutable while mapped (see `# Safety` above).
        let map = unsafe { Mmap::map(file)? };
        Ok(Blob { digest, map: Some(map) })
    }

    /// The object's digest (already verified when `Options::verify_on_read` is on).
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// The object's bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

impl Deref for Blob {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for Blob {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::fmt::Debug for Blob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blob").field("digest", &self.digest).field("len", &self.as_slice().len()).finish()
    }
}

/// Outcome of opening (or reading) an object file for serving.
pub(crate) enum Checked<T = Blob> {
    /// Size (and hash, when asked) match.
    Good(T),
    /// No such file.
    Missing,
    /// Wrong size, wrong hash, not a regular file, or unreadable: never serve it.
    Corrupt(&'static str),
}

/// Opens `path`, checks it is a regular file of `size` bytes and, when `verify`, that its BLAKE3 is `digest`.
pub(crate) fn open_checked(path: &Path, digest: Digest, size: u64, verify: bool) -> Checked {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Checked::Missing,
        Err(_) => return Checked::Corrupt("cannot open"),
    };
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(_) => return Checked::Corrupt("cannot stat"),
    };
    if !meta.is_file() {
        return Checked::Corrupt("not a regular file");
    }
    if meta.len() != size {
        return Checked::Corrupt("size differs from the index");
    }
    // SAFETY: object files are immutable once renamed into place (written via temp + rename, mode 0444).
    let blob = match unsafe { Blob::map(&file, digest, size) } {
        Ok(b) => b,
        Err(_) => return Checked::Corrupt("cannot map"),
    };
    if verify && Digest::of(blob.as_slice()) != digest {
        return Checked::Corrupt("content hash differs from the name");
    }
    Checked::Good(blob)
}

/// Opens `path` and checks it is a regular file of `size` bytes.
fn open_sized(path: &Path, size: u64) -> Result<File, Checked<()>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Checked::Missing),
        Err(_) => return Err(Checked::Corrupt("cannot open")),
    };
    match file.metadata() {
        Ok(m) if !m.is_file() => Err(Checked::Corrupt("not a regular file")),
        Ok(m) if m.len() != size => Err(Checked::Corrupt("size differs from the index")),
        Ok(_) => Ok(file),
        Err(_) => Err(Checked::Corrupt("cannot stat")),
    }
}

/// Where a caller wants an object's bytes (see [`Store::place_by_wire_hash`]): it puts them there
/// from the open object file, and shows them as placed for verification.
///
/// [`Store::place_by_wire_hash`]: crate::Store::place_by_wire_hash
pub trait Place {
    /// Puts the bytes of `file` (a regular file of the expected size) in place; it may map the file
    /// rather than read it.
    fn place(&mut self, file: &File) -> std::io::Result<()>;
    /// The bytes as placed.
    fn placed(&self) -> &[u8];
}

/// As [`read_checked`], but `dst` puts the bytes in place (it may map the file rather than read it);
/// when `verify`, the placed bytes are then hashed. On anything but `Good`, they are garbage.
pub(crate) fn place_checked(
    path: &Path,
    digest: Digest,
    size: u64,
    verify: bool,
    dst: &mut dyn Place,
) -> Checked<()> {
    let file = match open_sized(path, size) {
        Ok(f) => f,
        Err(bad) => return bad,
    };
    if dst.place(&file).is_err() {
        return Checked::Corrupt("cannot place");
    }
    let placed = dst.placed();
    if placed.len() as u64 != size {
        return Checked::Corrupt("placed size differs from the index");
    }
    if verify && Digest::of(placed) != digest {
        return Checked::Corrupt("content hash differs from the name");
    }
    Checked::Good(())
}

/// Bytes read and hashed per step of [`read_checked`]: small enough that BLAKE3 reads them while they are
/// still in the CPU's cache, large enough that BLAKE3 keeps its SIMD lanes busy.
const READ_CHUNK: usize = 1 << 20;

/// As [`open_checked`], but reads the object into `dst` (which must be `size` bytes long) instead of
/// mapping it, hashing each chunk right after reading it. On anything but `Good`, `dst` holds garbage.
pub(crate) fn read_checked(
    path: &Path,
    digest: Digest,
    size: u64,
    verify: bool,
    dst: &mut [u8],
) -> Checked<()> {
    use std::io::Read;
    if dst.len() as u64 != size {
        return Checked::Corrupt("size differs from the index");
    }
    let mut file = match open_sized(path, size) {
        Ok(f) => f,
        Err(bad) => return bad,
    };
    let mut hasher = verify.then(blake3::Hasher::new);
    for chunk in dst.chunks_mut(READ_CHUNK) {
        if file.read_exact(chunk).is_err() {
            return Checked::Corrupt("short read");
        }
        if let Some(h) = hasher.as_mut() {
            h.update(chunk);
        }
    }
    match hasher {
        Some(h) if Digest(*h.finalize().as_bytes()) != digest => {
            Checked::Corrupt("content hash differs from the name")
        }
        _ => Checked::Good(()),
    }
}
