//! Lookups by the caller's secondary key (llama.cpp's FNV-1a-64), including a simulated collision.

use cachestore::{Options, Store, WireHash};

use crate::common::{bytes, fnv1a64, rng};

#[test]
fn lookup_by_wire_hash_and_size() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let mut r = rng(10);
    let a = bytes(&mut r, 3000);
    let b = bytes(&mut r, 4000);
    let wa = WireHash(fnv1a64(&a));
    let da = store.put(&a, Some(wa), Some("a")).unwrap();
    // A second object planted under the same wire hash (FNV-1a is not collision resistant; ref: §14 item 20).
    let db = store.put(&b, Some(wa), Some("b")).unwrap();

    let mut all: Vec<_> = store.find_by_wire_hash(wa, None).unwrap().into_iter().map(|m| m.digest).collect();
    all.sort();
    let mut expect = vec![da, db];
    expect.sort();
    assert_eq!(all, expect);
    let sized = store.find_by_wire_hash(wa, Some(3000)).unwrap();
    assert_eq!(sized.len(), 1);
    assert_eq!(sized[0].digest, da);
    assert_eq!(&store.get_by_wire_hash(wa, 3000).unwrap().unwrap()[..], &a[..]);
    assert_eq!(&store.get_by_wire_hash(wa, 4000).unwrap().unwrap()[..], &b[..]);
    assert!(store.get_by_wire_hash(wa, 5000).unwrap().is_none());
    assert!(store.find_by_wire_hash(WireHash(fnv1a64(&b)), None).unwrap().is_empty());

    store.remove(&da).unwrap();
    assert!(store.get_by_wire_hash(wa, 3000).unwrap().is_none());
    assert_eq!(store.find_by_wire_hash(wa, None).unwrap().len(), 1);
}

#[test]
fn wire_hash_added_by_a_later_put() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let a = bytes(&mut rng(11), 2048);
    let d = store.put(&a, None, None).unwrap();
    let w = WireHash(fnv1a64(&a));
    assert!(store.find_by_wire_hash(w, None).unwrap().is_empty());
    assert_eq!(store.put(&a, Some(w), Some("tensor")).unwrap(), d);
    assert_eq!(store.find_by_wire_hash(w, Some(2048)).unwrap()[0].digest, d);
    assert_eq!(store.stat(&d).unwrap().unwrap().label.as_deref(), Some("tensor"));
    assert_eq!(store.totals().count, 1);
}

#[test]
fn wire_hash_of_corrupt_object_is_a_miss() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let a = bytes(&mut rng(12), 2048);
    let w = WireHash(fnv1a64(&a));
    let d = store.put(&a, Some(w), None).unwrap();
    crate::common::flip_byte(&store.layout().object_path(&d), 2047);
    assert!(store.get_by_wire_hash(w, 2048).unwrap().is_none());
    assert!(store.find_by_wire_hash(w, None).unwrap().is_empty());
}

#[test]
fn read_by_wire_hash_fills_the_caller_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let mut r = rng(13);
    // More than one read chunk (1 MiB), with a tail, so the chunked hashing is exercised.
    let a = bytes(&mut r, (5 << 20) / 2 + 17);
    let w = WireHash(fnv1a64(&a));
    let d = store.put(&a, Some(w), None).unwrap();
    let mut dst = vec![0u8; a.len()];
    assert_eq!(store.read_by_wire_hash(w, &mut dst).unwrap(), Some(d));
    assert!(dst == a);
    // Another length or another key is a miss.
    assert_eq!(store.read_by_wire_hash(w, &mut vec![0u8; a.len() - 1]).unwrap(), None);
    assert_eq!(store.read_by_wire_hash(WireHash(w.0 ^ 1), &mut dst).unwrap(), None);
    assert_eq!(store.stats().hits, 1);
}

#[test]
fn read_by_wire_hash_of_corrupt_object_is_a_miss_and_drops_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let a = bytes(&mut rng(14), 3 << 20);
    let w = WireHash(fnv1a64(&a));
    let d = store.put(&a, Some(w), None).unwrap();
    // A flip in the last chunk: only the final digest comparison can catch it.
    crate::common::flip_byte(&store.layout().object_path(&d), (3 << 20) - 5);
    let mut dst = vec![0u8; a.len()];
    assert_eq!(store.read_by_wire_hash(w, &mut dst).unwrap(), None);
    assert!(store.find_by_wire_hash(w, None).unwrap().is_empty());
    assert!(!store.layout().object_path(&d).exists());
    assert_eq!(store.stats().corrupt_dropped, 1);
    // A second object under the same key (a collision) is still found after the bad one.
    let b = bytes(&mut rng(15), 3 << 20);
    store.put(&a, Some(w), None).unwrap();
    let db = store.put(&b, Some(w), None).unwrap();
    crate::common::flip_byte(&store.layout().object_path(&d), 0);
    let mut dst = vec![0u8; b.len()];
    let got = store.read_by_wire_hash(w, &mut dst).unwrap();
    assert_eq!(got, Some(db));
    assert!(dst == b);
}

#[test]
fn read_by_wire_hash_checks_small_objects_too() {
    // At most two read chunks: read and hashed on the caller's thread.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let a = bytes(&mut rng(16), (1 << 20) + 3);
    let w = WireHash(fnv1a64(&a));
    let d = store.put(&a, Some(w), None).unwrap();
    let mut dst = vec![0u8; a.len()];
    assert_eq!(store.read_by_wire_hash(w, &mut dst).unwrap(), Some(d));
    assert!(dst == a);
    crate::common::flip_byte(&store.layout().object_path(&d), 7);
    assert_eq!(store.read_by_wire_hash(w, &mut dst).unwrap(), None);
    assert_eq!(store.stats().corrupt_dropped, 1);
}

/// Reads the object into a vector, then changes byte `flip` if asked, or keeps only `keep` bytes.
struct Copy {
    bytes: Vec<u8>,
    calls: usize,
    flip: Option<usize>,
    keep: Option<usize>,
}

impl cachestore::Place for Copy {
    fn place(&mut self, f: &std::fs::File) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.calls += 1;
        self.bytes = vec![0u8; f.metadata()?.len() as usize];
        f.read_exact_at(&mut self.bytes, 0)?;
        if let Some(i) = self.flip {
            self.bytes[i] ^= 1;
        }
        if let Some(n) = self.keep {
            self.bytes.truncate(n);
        }
        Ok(())
    }

    fn placed(&self) -> &[u8] {
        &self.bytes
    }
}

#[test]
fn place_by_wire_hash_verifies_what_the_caller_placed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let a = bytes(&mut rng(16), (3 << 20) + 11);
    let (n, w) = (a.len() as u64, WireHash(fnv1a64(&a)));
    let d = store.put(&a, Some(w), None).unwrap();
    // The caller reads the file itself (llamad maps it); the store checks the size before and the
    // digest after.
    let mut dst = Copy { bytes: Vec::new(), calls: 0, flip: None, keep: None };
    assert_eq!(store.place_by_wire_hash(w, n, &mut dst).unwrap(), Some(d));
    assert_eq!(dst.calls, 1);
    assert!(dst.bytes == a);
    assert_eq!(store.stats().hits, 1);
    // Another size or key is a miss without a call.
    assert_eq!(store.place_by_wire_hash(w, n - 1, &mut dst).unwrap(), None);
    assert_eq!(store.place_by_wire_hash(WireHash(w.0 ^ 1), n, &mut dst).unwrap(), None);
    assert_eq!(dst.calls, 1);

    // Bytes placed wrong (one changed) fail the digest: a miss, and the object is dropped, as a corrupt
    // one is. So are placed bytes of another length.
    let mut wrong = Copy { bytes: Vec::new(), calls: 0, flip: Some(a.len() - 1), keep: None };
    assert_eq!(store.place_by_wire_hash(w, n, &mut wrong).unwrap(), None);
    assert!(store.find_by_wire_hash(w, None).unwrap().is_empty());
    assert_eq!(store.stats().corrupt_dropped, 1);
    store.put(&a, Some(w), None).unwrap();
    let mut short = Copy { bytes: Vec::new(), calls: 0, flip: None, keep: Some(a.len() - 1) };
    assert_eq!(store.place_by_wire_hash(w, n, &mut short).unwrap(), None);
    assert!(store.find_by_wire_hash(w, None).unwrap().is_empty());
}
