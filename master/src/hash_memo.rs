//! A persistent memo of the FNV-1a-64 wire hashes of a model file's weight writes, so that a master
//! loading the same file again does not re-read and re-hash every byte (FNV-1a is byte-serial,
//! about 0.7 GB/s) just to ask the workers' caches for it.
//!
//! ref: ggml-rpc-protocol.md §9. A wrong hash would be harmful: a worker whose cache holds other bytes
//! under that key (and of the same length) would load them instead of the weights. So the memo only
//! answers for bytes it can tie to a file exactly as it was when the hashes were taken:
//!
//! * Entries are keyed by the file's identity (canonical path, device, inode, size, modification and
//!   status-change times to the nanosecond) and, within it, by the write's layout: its length and, for
//!   each piece of file data in it, the piece's offset in the write, its offset in the file and its
//!   length (the rest of the write is zero padding). Any write to the file changes its ctime, which
//!   cannot be set back; replacing it changes the inode.
//! * The identity is taken before the model is mapped and again after ([`HashMemo::open`]), and once
//!   more before the memo is saved; if it moved, the memo is not used or not saved.
//! * A file changed within [`MemoOptions::racy`] of the first look is not trusted (timestamps are only
//!   as fine as the kernel's clock tick, so a change in the same tick could leave them equal), the way
//!   git treats "racily clean" index entries.
//! * Only bytes inside the mapped file count (checked by address against the mapping, which the memo
//!   keeps alive); derived weights (row-split shards) are always hashed.
//! * The file is checksummed; an unreadable, truncated or foreign memo is ignored (everything is
//!   recomputed) and replaced on save, which writes a temp file and renames it.
//!
//! The memo lives in the user's cache directory (`llamactl` uses `$XDG_CACHE_HOME/llamad/hash-memo`), one
//! file per model path. It is advisory: deleting it costs one hashing pass.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use compute::gguf::Gguf;
use llamad_proto::hash::Fnv1a;
use llamad_proto::WireHash;

/// First bytes of a memo file.
const MAGIC: &[u8; 16] = b"llamad-fnv-memo\n";
/// Format version, after the magic.
const VERSION: u32 = 1;
/// A memo larger than this is not read (it cannot be one of ours).
const MAX_FILE: u64 = 64 << 20;
/// Entries kept per model file (more are not recorded).
const MAX_ENTRIES: usize = 1 << 16;
/// Data pieces per entry accepted when reading.
const MAX_PARTS: u32 = 1 << 16;

/// What identifies a file's content without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileIdentity {
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time: seconds and nanoseconds since the epoch.
    pub mtime: (i64, u32),
    /// Status-change time (any write or metadata change updates it; it cannot be set back).
    pub ctime: (i64, u32),
}

impl FileIdentity {
    /// The identity of the file at `path` (following symbolic links).
    #[cfg(unix)]
    pub fn of(path: &Path) -> std::io::Result<FileIdentity> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        let nsec = |n: i64| u32::try_from(n).unwrap_or(0);
        Ok(FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), nsec(m.mtime_nsec())),
            ctime: (m.ctime(), nsec(m.ctime_nsec())),
        })
    }

    /// Not available on this platform: the memo is never used.
    #[cfg(not(unix))]
    pub fn of(_path: &Path) -> std::io::Result<FileIdentity> {
        Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "file identity needs a unix platform"))
    }

    /// The later of the modification and status-change times.
    fn changed(&self) -> Duration {
        let secs = |(s, n): (i64, u32)| Duration::new(u64::try_from(s).unwrap_or(0), n);
        secs(self.mtime).max(secs(self.ctime))
    }

    fn encode(&self, out: &mut Vec<u8>) {
        for v in [self.dev, self.ino, self.size] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for (s, n) in [self.mtime, self.ctime] {
            out.extend_from_slice(&s.to_le_bytes());
            out.extend_from_slice(&n.to_le_bytes());
        }
    }

    fn decode(r: &mut Reader<'_>) -> Option<FileIdentity> {
        Some(FileIdentity {
            dev: r.u64()?,
            ino: r.u64()?,
            size: r.u64()?,
            mtime: (r.u64()? as i64, r.u32()?),
            ctime: (r.u64()? as i64, r.u32()?),
        })
    }
}

/// One piece of file data in a write: `(offset in the write, offset in the file, length)`.
pub type Piece = (u64, u64, u64);

/// The layout of one write of file bytes: its length and its data pieces in order (zeros elsewhere).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WriteKey {
    /// Bytes in the write.
    pub len: u64,
    /// Its pieces of file data.
    pub pieces: Vec<Piece>,
}

/// Tunables of [`HashMemo::open_with`].
#[derive(Clone, Copy, Debug)]
pub struct MemoOptions {
    /// A model changed less than this long before it is opened is not trusted (default 2 s).
    pub racy: Duration,
}

impl Default for MemoOptions {
    fn default() -> Self {
        MemoOptions { racy: Duration::from_secs(2) }
    }
}

/// The memo of one model file (see the module documentation).
pub struct HashMemo {
    /// The memo file.
    file: PathBuf,
    /// The model's canonical path.
    model: PathBuf,
    ident: FileIdentity,
    /// The mapped model; kept alive so that an address inside it always means this file.
    gguf: Arc<Gguf>,
    state: Mutex<MemoState>,
}

#[derive(Default)]
struct MemoState {
    entries: HashMap<WriteKey, WireHash>,
    /// Entries found in the memo file.
    loaded: usize,
    /// Lookups answered, and entries recorded, since open.
    hits: u64,
    added: u64,
}

impl std::fmt::Debug for HashMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HashMemo").field("file", &self.file).field("model", &self.model).finish()
    }
}

impl HashMemo {
    /// The memo for the model at `model`, kept in `dir`. `before` is the model's identity taken before
    /// `gguf` was mapped from it. `None` (with the reason logged) when the memo cannot be trusted for
    /// this run: the file changed around the mapping or too recently, or its identity is unavailable.
    pub fn open(dir: &Path, model: &Path, before: FileIdentity, gguf: Arc<Gguf>) -> Option<HashMemo> {
        HashMemo::open_with(dir, model, before, gguf, MemoOptions::default())
    }

    /// As [`HashMemo::open`], with explicit options.
    pub fn open_with(
        dir: &Path,
        model: &Path,
        before: FileIdentity,
        gguf: Arc<Gguf>,
        opts: MemoOptions,
    ) -> Option<HashMemo> {
        let skip = |why: &str| {
            tracing::info!(model = %model.display(), "hash memo not used: {why}");
            None
        };
        let canonical = match std::fs::canonicalize(model) {
            Ok(p) => p,
            Err(e) => return skip(&format!("cannot resolve the path ({e})")),
        };
        let after = match FileIdentity::of(&canonical) {
            Ok(i) => i,
            Err(e) => return skip(&format!("cannot stat the model ({e})")),
        };
        if after != before {
            return skip("the model file changed while it was opened");
        }
        if gguf.bytes().len() as u64 != after.size {
            return skip("the mapping and the file differ in size");
        }
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        if now < after.changed() + opts.racy {
            return skip("the model file changed too recently to trust its timestamps");
        }
        let file = dir.join(format!("{}.memo", WireHash::of(canonical.as_os_str().as_encoded_bytes())));
        let mut state = MemoState::default();
        match std::fs::metadata(&file) {
            Ok(m) if m.len() > MAX_FILE => {
                tracing::warn!(memo = %file.display(), "hash memo too large; ignored")
            }
            Ok(_) => match std::fs::read(&file) {
                Ok(bytes) => match decode(&bytes, &canonical, &after) {
                    Ok(entries) => state.entries = entries,
                    Err(why) => tracing::info!(memo = %file.display(), "hash memo ignored: {why}"),
                },
                Err(e) => tracing::warn!(memo = %file.display(), error = %e, "hash memo unreadable; ignored"),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(memo = %file.display(), error = %e, "hash memo unreadable; ignored"),
        }
        state.loaded = state.entries.len();
        tracing::debug!(memo = %file.display(), entries = state.loaded, "hash memo opened");
        Some(HashMemo { file, model: canonical, ident: after, gguf, state: Mutex::new(state) })
    }

    /// The memo file.
    pub fn path(&self) -> &Path {
        &self.file
    }

    /// Offset in the model file of `data`, when it is a slice of the mapped file.
    pub fn file_offset(&self, data: &[u8]) -> Option<u64> {
        let map = self.gguf.bytes();
        let (base, p) = (map.as_ptr() as usize, data.as_ptr() as usize);
        let off = p.checked_sub(base)?;
        (off.checked_add(data.len())? <= map.len()).then_some(off as u64)
    }

    /// The recorded hash of the write laid out as `key`.
    pub fn get(&self, key: &WriteKey) -> Option<WireHash> {
        let mut st = self.lock();
        let h = st.entries.get(key).copied();
        st.hits += u64::from(h.is_some());
        h
    }

    /// Records the hash of the write laid out as `key`. The caller computed it from the mapped bytes.
    pub fn insert(&self, key: WriteKey, hash: WireHash) {
        let mut st = self.lock();
        if st.entries.len() < MAX_ENTRIES && st.entries.insert(key, hash) != Some(hash) {
            st.added += 1;
        }
    }

    /// `(entries read from the file, lookups answered, entries added)` so far.
    pub fn counts(&self) -> (usize, u64, u64) {
        let st = self.lock();
        (st.loaded, st.hits, st.added)
    }

    /// Writes the memo back when entries were added, unless the model changed since it was opened
    /// (then nothing is written: the new hashes may be of other bytes). True when written.
    pub fn save(&self) -> std::io::Result<bool> {
        let bytes = {
            let st = self.lock();
            if st.added == 0 {
                return Ok(false);
            }
            encode(&self.model, &self.ident, &st.entries)
        };
        if FileIdentity::of(&self.model).ok() != Some(self.ident) {
            tracing::warn!(model = %self.model.display(), "the model file changed during the run; hash memo not saved");
            return Ok(false);
        }
        let dir = self.file.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().subsec_nanos();
        let tmp = dir.join(format!(".{}.{}-{nanos}.tmp", self.file_name(), std::process::id()));
        let r = std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, &self.file));
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        r.map(|()| true)
    }

    fn file_name(&self) -> String {
        self.file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoState> {
        // Every critical section leaves the map consistent, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn encode(model: &Path, ident: &FileIdentity, entries: &HashMap<WriteKey, WireHash>) -> Vec<u8> {
    let mut out = Vec::with_capacity(128 + entries.len() * 64);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    ident.encode(&mut out);
    let path = model.as_os_str().as_encoded_bytes();
    out.extend_from_slice(&(path.len() as u32).to_le_bytes());
    out.extend_from_slice(path);
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (k, h) in entries {
        out.extend_from_slice(&k.len.to_le_bytes());
        out.extend_from_slice(&h.0.to_le_bytes());
        out.extend_from_slice(&(k.pieces.len() as u32).to_le_bytes());
        for &(at, off, len) in &k.pieces {
            for v in [at, off, len] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    let sum = WireHash::of(&out);
    out.extend_from_slice(&sum.0.to_le_bytes());
    out
}

/// The entries of a memo file, if it is intact and about this very file.
fn decode(
    bytes: &[u8],
    model: &Path,
    ident: &FileIdentity,
) -> std::result::Result<HashMap<WriteKey, WireHash>, &'static str> {
    let Some(body_len) = bytes.len().checked_sub(8) else { return Err("truncated") };
    let (body, sum) = bytes.split_at(body_len);
    let mut h = Fnv1a::new();
    h.update(body);
    if sum != h.finish().0.to_le_bytes() {
        return Err("checksum mismatch");
    }
    let mut r = Reader(body);
    if r.take(MAGIC.len()) != Some(&MAGIC[..]) || r.u32() != Some(VERSION) {
        return Err("not a memo of this version");
    }
    if FileIdentity::decode(&mut r).as_ref() != Some(ident) {
        return Err("made for another version of the model file");
    }
    let n = r.u32().ok_or("truncated")? as usize;
    if r.take(n) != Some(model.as_os_str().as_encoded_bytes()) {
        return Err("made for another path");
    }
    let count = r.u32().ok_or("truncated")?;
    let mut entries = HashMap::new();
    for _ in 0..count {
        let len = r.u64().ok_or("truncated")?;
        let hash = WireHash(r.u64().ok_or("truncated")?);
        let parts = r.u32().ok_or("truncated")?;
        if parts > MAX_PARTS {
            return Err("implausible entry");
        }
        let mut pieces = Vec::with_capacity(parts as usize);
        for _ in 0..parts {
            pieces.push((
                r.u64().ok_or("truncated")?,
                r.u64().ok_or("truncated")?,
                r.u64().ok_or("truncated")?,
            ));
        }
        entries.insert(WriteKey { len, pieces }, hash);
    }
    if !r.0.is_empty() {
        return Err("trailing bytes");
    }
    Ok(entries)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_RACE: MemoOptions = MemoOptions { racy: Duration::ZERO };

    /// A GGUF file with one 4096-byte tensor of `fill`, written at `dir/m.gguf` (truncating the
    /// same inode when it exists), and mapped.
    fn model(dir: &Path, fill: u8) -> (PathBuf, Arc<Gguf>) {
        use compute::gguf::GgufWriter;
        let path = dir.join("m.gguf");
        let mut w = GgufWriter::new();
        w.add_tensor("t", compute::GgmlType::I8, &[4096], vec![fill; 4096]).unwrap();
        w.write_file(&path).unwrap();
        (path.clone(), map(&path))
    }

    fn map(path: &Path) -> Arc<Gguf> {
        // SAFETY: each test changes the file only after dropping every mapping of it.
        Arc::new(unsafe { Gguf::open(path) }.unwrap())
    }

    fn open(dir: &Path, path: &Path, g: &Arc<Gguf>) -> Option<HashMemo> {
        let id = FileIdentity::of(path).unwrap();
        HashMemo::open_with(&dir.join("memo"), path, id, g.clone(), NO_RACE)
    }

    fn key(g: &Gguf) -> WriteKey {
        let t = g.tensor("t").unwrap();
        let off = t.data.as_ptr() as u64 - g.bytes().as_ptr() as u64;
        WriteKey { len: 4096 + 32, pieces: vec![(32, off, 4096)] }
    }

    #[test]
    fn a_saved_memo_answers_the_next_run_of_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let (path, g) = model(dir.path(), 7);
        let m = open(dir.path(), &path, &g).unwrap();
        assert_eq!(m.file_offset(g.tensor("t").unwrap().data), Some(key(&g).pieces[0].1));
        assert_eq!(m.file_offset(&[0u8; 16]), None, "bytes outside the mapping have no offset");
        assert!(m.get(&key(&g)).is_none());
        m.insert(key(&g), WireHash(42));
        assert!(m.save().unwrap());
        drop(m);
        let m = open(dir.path(), &path, &g).unwrap();
        assert_eq!(m.get(&key(&g)), Some(WireHash(42)));
        assert_eq!(m.counts(), (1, 1, 0));
        assert!(!m.save().unwrap(), "nothing new: nothing written");
        // Another layout of the same bytes is another key.
        assert!(m.get(&WriteKey { len: 4096, ..key(&g) }).is_none());
    }

    #[test]
    fn a_changed_file_invalidates_the_memo() {
        let dir = tempfile::tempdir().unwrap();
        let (path, g) = model(dir.path(), 7);
        let m = open(dir.path(), &path, &g).unwrap();
        m.insert(key(&g), WireHash(42));
        assert!(m.save().unwrap());
        drop((m, g));
        // Same size, other content, and the modification time put back: the change time still moves.
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let (path, g) = model(dir.path(), 9);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(mtime).unwrap();
        let m = open(dir.path(), &path, &g).unwrap();
        assert!(m.get(&key(&g)).is_none(), "an entry of the old file answered for the new one");
        // A size change alone is enough as well.
        m.insert(key(&g), WireHash(43));
        assert!(m.save().unwrap());
        drop((m, g));
        std::fs::File::options().append(true).open(&path).unwrap().set_len(1 << 20).unwrap();
        let g = map(&path);
        let m = open(dir.path(), &path, &g).unwrap();
        assert!(m.get(&key(&g)).is_none());
    }

    #[test]
    fn a_file_changed_around_the_mapping_or_just_now_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let (path, g) = model(dir.path(), 7);
        let mut before = FileIdentity::of(&path).unwrap();
        before.ctime.1 ^= 1;
        assert!(HashMemo::open_with(dir.path(), &path, before, g.clone(), NO_RACE).is_none());
        // Just written: within the default racy window.
        let id = FileIdentity::of(&path).unwrap();
        assert!(HashMemo::open(dir.path(), &path, id, g.clone()).is_none());
    }

    #[test]
    fn a_memo_is_not_saved_when_the_file_changed_during_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let (path, g) = model(dir.path(), 7);
        let m = open(dir.path(), &path, &g).unwrap();
        m.insert(key(&g), WireHash(42));
        std::thread::sleep(Duration::from_millis(20));
        // Growing a mapped file is harmless (only truncation is not); the memo must notice it.
        std::fs::File::options().append(true).open(&path).unwrap().set_len(1 << 20).unwrap();
        assert!(!m.save().unwrap());
        assert!(!m.path().exists());
    }

    #[test]
    fn a_damaged_memo_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let (path, g) = model(dir.path(), 7);
        let m = open(dir.path(), &path, &g).unwrap();
        m.insert(key(&g), WireHash(42));
        m.insert(WriteKey { len: 5, pieces: vec![(0, 0, 5)] }, WireHash(5));
        assert!(m.save().unwrap());
        let file = m.path().to_path_buf();
        drop(m);
        let good = std::fs::read(&file).unwrap();
        // Every single-byte change and every truncation is caught (the checksum covers the whole file).
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x20;
            std::fs::write(&file, &bad).unwrap();
            let m = open(dir.path(), &path, &g).unwrap();
            assert_eq!(m.counts().0, 0, "byte {i} flipped, yet entries were read");
        }
        for n in [0, 7, good.len() / 2, good.len() - 1] {
            std::fs::write(&file, &good[..n]).unwrap();
            assert_eq!(open(dir.path(), &path, &g).unwrap().counts().0, 0, "truncated to {n}");
        }
        std::fs::write(&file, &good).unwrap();
        assert_eq!(open(dir.path(), &path, &g).unwrap().get(&key(&g)), Some(WireHash(42)));
    }
}
