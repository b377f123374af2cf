//! A flipped byte or a truncated object is never served: the next get is a miss, the object is gone, and a
//! re-put restores it.

use std::os::unix::fs::PermissionsExt;

use cachestore::{Options, Store};

use crate::common::{bytes, flip_byte, rng};

#[test]
fn flipped_byte_is_a_miss_and_reput_works() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let data = bytes(&mut rng(2), 1 << 20);
    let d = store.put(&data, None, None).unwrap();
    let other = store.put(b"innocent bystander", None, None).unwrap();
    let path = store.layout().object_path(&d);
    flip_byte(&path, 123_456);

    assert!(store.get(&d).unwrap().is_none());
    assert!(!path.exists(), "corrupt object file must be removed");
    assert!(store.stat(&d).unwrap().is_none(), "corrupt object must leave the index");
    let s = store.stats();
    assert_eq!((s.hits, s.misses, s.corrupt_dropped), (0, 1, 1));
    assert_eq!(store.totals().count, 1);

    assert_eq!(store.put(&data, None, None).unwrap(), d);
    assert_eq!(&store.get(&d).unwrap().unwrap()[..], &data[..]);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o444);
    assert_eq!(&store.get(&other).unwrap().unwrap()[..], b"innocent bystander");
}

#[test]
fn truncated_object_is_a_miss_even_without_hash_verification() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options { verify_on_read: false, ..Options::default() };
    let store = Store::open(dir.path(), opts).unwrap();
    let data = bytes(&mut rng(3), 10_000);
    let d = store.put(&data, None, None).unwrap();
    let path = store.layout().object_path(&d);
    let mut p = std::fs::metadata(&path).unwrap().permissions();
    p.set_mode(0o644);
    std::fs::set_permissions(&path, p).unwrap();
    // Like llama.cpp's cache after a full disk: a prefix of the content under the full name.
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(4096).unwrap();
    assert!(store.get(&d).unwrap().is_none());
    assert!(!path.exists());
    assert_eq!(store.stats().corrupt_dropped, 1);
}

#[test]
fn reput_over_corrupt_copy_repairs_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let data = bytes(&mut rng(4), 5000);
    let d = store.put(&data, None, Some("x")).unwrap();
    flip_byte(&store.layout().object_path(&d), 0);
    // The put notices the bad copy and rewrites it instead of deduplicating against it.
    assert_eq!(store.put(&data, None, Some("x")).unwrap(), d);
    assert_eq!(&store.get(&d).unwrap().unwrap()[..], &data[..]);
    assert_eq!(store.stats().corrupt_dropped, 1);
}

#[test]
fn verify_reports_and_drops_corrupt_objects() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let mut r = rng(5);
    let ds: Vec<_> = (0..6).map(|i| store.put(&bytes(&mut r, 1000 + i), None, None).unwrap()).collect();
    flip_byte(&store.layout().object_path(&ds[1]), 999);
    flip_byte(&store.layout().object_path(&ds[4]), 10);
    std::fs::remove_file(store.layout().object_path(&ds[5])).unwrap();

    let one = store.verify(Some(&ds[0])).unwrap();
    assert_eq!((one.checked, one.corrupt.len()), (1, 0));
    let all = store.verify(None).unwrap();
    assert_eq!(all.checked, 6);
    let mut expect = vec![ds[1], ds[4], ds[5]];
    expect.sort();
    let mut got = all.corrupt.clone();
    got.sort();
    assert_eq!(got, expect);
    assert_eq!(store.totals().count, 3);
    assert!(matches!(store.verify(Some(&ds[1])), Err(cachestore::Error::NotFound { .. })));
    assert_eq!(store.verify(None).unwrap(), cachestore::VerifyReport { checked: 3, corrupt: vec![] });
}
