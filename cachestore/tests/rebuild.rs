//! The object files are the truth: the index can be deleted, corrupted or rebuilt.

use cachestore::{ListQuery, Options, Store, WireHash};

use crate::common::{bytes, files_under, fnv1a64, rng};

fn fnv_options() -> Options {
    Options { wire_hasher: Some(std::sync::Arc::new(|b: &[u8]| WireHash(fnv1a64(b)))), ..Options::default() }
}

#[test]
fn deleted_index_is_rebuilt_from_objects() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = rng(13);
    let data: Vec<Vec<u8>> = (0..10).map(|i| bytes(&mut r, 500 * (i + 1))).collect();
    let ds: Vec<_> = {
        let store = Store::open(dir.path(), Options::default()).unwrap();
        data.iter().map(|b| store.put(b, Some(WireHash(fnv1a64(b))), None).unwrap()).collect()
    };
    std::fs::remove_file(dir.path().join("llamad-v1/index.redb")).unwrap();

    let store = Store::open(dir.path(), fnv_options()).unwrap();
    assert_eq!(store.totals().count, 10);
    for (d, b) in ds.iter().zip(&data) {
        assert_eq!(&store.get(d).unwrap().unwrap()[..], &b[..]);
        // Wire hashes come back through the caller's hasher.
        assert_eq!(
            &store.get_by_wire_hash(WireHash(fnv1a64(b)), b.len() as u64).unwrap().unwrap()[..],
            &b[..]
        );
    }
    let report = store.rebuild_index().unwrap();
    assert_eq!((report.indexed, report.kept_metadata, report.quarantined), (10, 10, 0));
}

#[test]
fn rebuild_keeps_pins_and_quarantines_impostors() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let a = store.put(b"alpha", Some(WireHash(1)), Some("alpha")).unwrap();
    let b = store.put(b"beta", None, None).unwrap();
    store.pin(&a).unwrap();
    // An impostor: a file named after `b`'s neighbour digest whose content is something else.
    let fake = cachestore::Digest::of(b"gamma");
    let fake_path = store.layout().object_path(&fake);
    std::fs::create_dir_all(fake_path.parent().unwrap()).unwrap();
    std::fs::write(&fake_path, b"not gamma").unwrap();

    let r = store.rebuild_index().unwrap();
    assert_eq!((r.indexed, r.kept_metadata, r.quarantined), (2, 2, 1));
    let m = store.stat(&a).unwrap().unwrap();
    assert!(m.pinned);
    assert_eq!((m.wire_hash, m.label.as_deref()), (Some(WireHash(1)), Some("alpha")));
    assert!(store.stat(&b).unwrap().is_some());
    assert!(store.stat(&fake).unwrap().is_none());
    assert!(!fake_path.exists());
    assert_eq!(files_under(&store.layout().quarantine).len(), 1);
}

#[test]
fn garbage_index_file_is_moved_aside_and_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let d = {
        let store = Store::open(dir.path(), Options::default()).unwrap();
        store.put(&bytes(&mut rng(14), 777), None, None).unwrap()
    };
    let index = dir.path().join("llamad-v1/index.redb");
    std::fs::write(&index, vec![0x5au8; 8192]).unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    assert_eq!(store.stat(&d).unwrap().unwrap().size, 777);
    let aside: Vec<_> = std::fs::read_dir(dir.path().join("llamad-v1"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("index.redb.broken-"))
        .collect();
    assert_eq!(aside.len(), 1);
}

#[test]
fn gc_collects_temps_stale_entries_and_orphans() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_in_memory(dir.path(), Options::default()).unwrap();
    let a = store.put(b"kept", None, None).unwrap();
    let b = store.put(b"file deleted behind our back", None, None).unwrap();
    std::fs::remove_file(store.layout().object_path(&b)).unwrap();
    std::fs::write(store.layout().tmp.join("123-0.tmp"), b"half a write").unwrap();
    // A valid object dropped flat into objects/ (not in its fan-out dir): adopted and moved into place.
    let orphan = cachestore::Digest::of(b"orphan");
    std::fs::write(store.layout().objects.join(orphan.to_string()), b"orphan").unwrap();
    std::fs::write(store.layout().objects.join("README"), b"not an object").unwrap();

    let r = store.gc().unwrap();
    assert_eq!(
        r,
        cachestore::GcReport {
            temp_removed: 1,
            stale_entries: 1,
            orphans_indexed: 1,
            quarantined: 1,
            ..Default::default()
        }
    );
    assert!(store.stat(&a).unwrap().is_some() && store.stat(&b).unwrap().is_none());
    assert_eq!(&store.get(&orphan).unwrap().unwrap()[..], b"orphan");
    assert!(store.layout().object_path(&orphan).exists());
    assert_eq!(store.list(&ListQuery::default()).unwrap().total, 2);
    assert_eq!(store.gc().unwrap(), cachestore::GcReport::default());
}
