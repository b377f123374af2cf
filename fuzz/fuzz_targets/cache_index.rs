//! The cache index: a sequence of transactions interpreted from the input is applied to the redb
//! index and to the in-memory twin; after every transaction both must answer every query alike
//! (entry by digest, digests by wire hash, full scan), including after a reopen of the redb file.
#![no_main]

use std::sync::{Mutex, OnceLock};

use cachestore::index::mem::MemIndex;
use cachestore::index::redb::RedbIndex;
use cachestore::index::{Index, IndexOp};
use cachestore::{Digest, ObjectMeta, WireHash};
use libfuzzer_sys::fuzz_target;

struct Db {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    index: Option<RedbIndex>,
}

fn db() -> &'static Mutex<Db> {
    static D: OnceLock<Mutex<Db>> = OnceLock::new();
    D.get_or_init(|| {
        let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
        let dir = tempfile::tempdir_in(base).expect("tempdir");
        let path = dir.path().join("index.redb");
        let index = Some(RedbIndex::open(&path).expect("open index"));
        Mutex::new(Db { _dir: dir, path, index })
    })
}

/// A little cursor over the input.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u64(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for _ in 0..8 {
            v = v << 8 | u64::from(self.u8()?);
        }
        Some(v)
    }
}

/// Eight digests and four wire hashes, so that operations collide often.
fn digest(b: u8) -> Digest {
    Digest::of(&[b % 8])
}

fn op(b: &mut Bytes<'_>) -> Option<IndexOp> {
    let kind = b.u8()?;
    let d = digest(b.u8()?);
    Some(match kind % 3 {
        0 => {
            let flags = b.u8()?;
            let label_len = usize::from(b.u8()? % 12);
            let mut label = Vec::new();
            for _ in 0..label_len {
                label.push(b.u8()?);
            }
            IndexOp::Put(ObjectMeta {
                digest: d,
                size: b.u64()?,
                created_us: b.u64()?,
                last_used_us: b.u64()?,
                hits: b.u64()?,
                pinned: flags & 1 != 0,
                wire_hash: (flags & 2 != 0).then(|| WireHash(u64::from(flags >> 2) % 4)),
                label: (label_len > 0).then(|| String::from_utf8_lossy(&label).into_owned()),
            })
        }
        1 => IndexOp::Remove(d),
        _ => IndexOp::Touch { digest: d, last_used_us: b.u64()?, hits: u64::from(b.u8()?) },
    })
}

fn same(a: &dyn Index, b: &dyn Index) {
    for i in 0..8 {
        let d = digest(i);
        assert_eq!(a.get(&d).expect("get"), b.get(&d).expect("get"), "entry {i}");
    }
    for h in 0..4 {
        assert_eq!(
            a.by_wire_hash(WireHash(h)).expect("by_wire_hash"),
            b.by_wire_hash(WireHash(h)).expect("by_wire_hash"),
            "wire hash {h}"
        );
    }
    assert_eq!(a.scan().expect("scan"), b.scan().expect("scan"));
}

fuzz_target!(|data: &[u8]| {
    let mut db = db().lock().unwrap_or_else(|p| p.into_inner());
    let mem = MemIndex::new();
    db.index.as_ref().expect("index").clear().expect("clear");
    let mut b = Bytes(data);
    while let Some(ctl) = b.u8() {
        let n = usize::from(ctl % 4) + 1;
        let ops: Vec<IndexOp> = (0..n).map_while(|_| op(&mut b)).collect();
        if ops.is_empty() {
            break;
        }
        // Hits may overflow u64 when added; both must agree on what happens.
        let durable = ctl & 0x80 != 0;
        let r1 = db.index.as_ref().expect("index").apply(&ops, durable);
        let r2 = mem.apply(&ops, durable);
        assert_eq!(r1.is_ok(), r2.is_ok(), "apply: redb {r1:?}, memory {r2:?}");
        if ctl & 0x40 != 0 {
            // Reopen: committed state must survive.
            db.index = None;
            db.index = Some(RedbIndex::open(&db.path).expect("reopen"));
        }
        same(db.index.as_ref().expect("index"), &mem);
    }
});
