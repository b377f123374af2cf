//! The size limit: LRU eviction that never touches pinned objects.

use cachestore::{Error, Options, Store};

use crate::common::{bytes, rng};

const K: usize = 1000;

#[test]
fn lru_eviction_spares_pinned_objects() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        Store::open(dir.path(), Options { max_size: Some(5 * K as u64), ..Options::default() }).unwrap();
    let mut r = rng(6);
    let data: Vec<Vec<u8>> = (0..8).map(|_| bytes(&mut r, K)).collect();
    let d: Vec<_> = data[..5].iter().map(|b| store.put(b, None, None).unwrap()).collect();
    assert_eq!(store.totals().bytes, 5 * K as u64);
    // Pin the oldest; use d[1] so that d[2] becomes the least recently used unpinned object.
    store.pin(&d[0]).unwrap();
    store.get(&d[1]).unwrap().unwrap();

    let d5 = store.put(&data[5], None, None).unwrap();
    let present = |x| store.stat(x).unwrap().is_some();
    assert!(present(&d[0]), "pinned object evicted");
    assert!(!present(&d[2]), "least recently used unpinned object kept");
    assert!(present(&d[1]) && present(&d[3]) && present(&d[4]) && present(&d5));
    assert!(!store.layout().object_path(&d[2]).exists());

    // LRU order of the unpinned objects now: d[3] (put), d[4] (put), d[1] (read after all puts), d5 (put).
    let d6 = store.put(&data[6], None, None).unwrap();
    assert!(!present(&d[3]) && present(&d[4]) && present(&d[1]));
    let d7 = store.put(&data[7], None, None).unwrap();
    assert!(!present(&d[4]) && present(&d[1]));
    assert!(present(&d[0]) && present(&d5) && present(&d6) && present(&d7));
    let t = store.totals();
    assert_eq!((t.count, t.bytes, t.pinned_bytes), (5, 5 * K as u64, K as u64));
    assert_eq!(store.stats().evictions, 3);
}

#[test]
fn no_space_when_pins_fill_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        Store::open(dir.path(), Options { max_size: Some(3 * K as u64), ..Options::default() }).unwrap();
    let mut r = rng(8);
    let a = store.put(&bytes(&mut r, 2 * K), None, None).unwrap();
    store.pin(&a).unwrap();
    let b = store.put(&bytes(&mut r, K), None, None).unwrap();
    // 2K pinned: a 1.5K object cannot fit even after evicting b.
    match store.put(&bytes(&mut r, 3 * K / 2), None, None) {
        Err(Error::NoSpace { size, available, max_size }) => {
            assert_eq!((size, available, max_size), (1500, 1000, 3000));
        }
        other => panic!("expected NoSpace, got {other:?}"),
    }
    // Larger than the whole limit.
    assert!(matches!(store.put(&bytes(&mut r, 4 * K), None, None), Err(Error::NoSpace { .. })));
    assert!(store.stat(&b).unwrap().is_some(), "a refused put must not evict anything");
    assert!(cachestore_tmp_is_empty(&store));
    // Unpinning and shrinking the limit evicts down to it.
    store.unpin(&a).unwrap();
    store.set_max_size(Some(K as u64)).unwrap();
    assert!(store.stat(&a).unwrap().is_none());
    assert!(store.stat(&b).unwrap().is_some());
    assert_eq!(store.totals().bytes, K as u64);
}

#[test]
fn pinned_bytes_above_the_limit_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let mut r = rng(9);
    let a = store.put(&bytes(&mut r, 2 * K), None, None).unwrap();
    let b = store.put(&bytes(&mut r, 2 * K), None, None).unwrap();
    store.pin(&a).unwrap();
    store.pin(&b).unwrap();
    let c = store.put(&bytes(&mut r, K), None, None).unwrap();
    store.set_max_size(Some(3 * K as u64)).unwrap();
    assert!(store.stat(&a).unwrap().is_some() && store.stat(&b).unwrap().is_some());
    assert!(store.stat(&c).unwrap().is_none());
    // Reopening with the limit enforces it at open too (nothing more to evict).
    drop(store);
    let store = Store::open(dir.path(), Options { max_size: Some(K as u64), ..Options::default() }).unwrap();
    assert_eq!(store.totals().bytes, 4 * K as u64);
}

fn cachestore_tmp_is_empty(store: &Store) -> bool {
    crate::common::files_under(&store.layout().tmp).is_empty()
}
