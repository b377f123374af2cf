//! The notify adapter: objects added or removed by hand are picked up without a restart (bounded waits).

use std::sync::Arc;
use std::time::Duration;

use cachestore::watch::Watcher;
use cachestore::{Digest, Options, Store};

use crate::common::{bytes, files_under, rng, wait_until};

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn hand_added_and_removed_objects_are_tracked() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), Options::default()).unwrap());
    let _w = Watcher::start(store.clone(), Duration::from_millis(100)).unwrap();
    let own = store.put(b"written through the store", None, None).unwrap();

    // Added by hand: written elsewhere, then moved into a fan-out directory that does not exist yet.
    let data = bytes(&mut rng(15), 50_000);
    let d = Digest::of(&data);
    let staging = dir.path().join("staging");
    std::fs::write(&staging, &data).unwrap();
    let dest = store.layout().object_path(&d);
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::rename(&staging, &dest).unwrap();
    assert!(wait_until(WAIT, || store.stat(&d).unwrap().is_some()), "hand-added object not indexed");
    assert_eq!(&store.get(&d).unwrap().unwrap()[..], &data[..]);

    // Dropped flat into objects/ with a plain copy: indexed and moved to its place.
    let data2 = bytes(&mut rng(16), 20_000);
    let d2 = Digest::of(&data2);
    std::fs::write(store.layout().objects.join(d2.to_string()), &data2).unwrap();
    assert!(wait_until(WAIT, || store.stat(&d2).unwrap().is_some()), "flat copy not indexed");
    assert!(wait_until(WAIT, || store.layout().object_path(&d2).exists()));

    // A file whose content does not match its name is quarantined, never indexed.
    let liar = Digest::of(b"the truth");
    std::fs::write(store.layout().objects.join(liar.to_string()), b"a lie").unwrap();
    assert!(
        wait_until(WAIT, || files_under(&store.layout().quarantine).len() == 1),
        "impostor not quarantined"
    );
    assert!(store.stat(&liar).unwrap().is_none());

    // Removed by hand: the entry goes.
    std::fs::remove_file(&dest).unwrap();
    assert!(wait_until(WAIT, || store.stat(&d).unwrap().is_none()), "removed object still indexed");

    // The store's own write was never disturbed by its own events.
    assert_eq!(&store.get(&own).unwrap().unwrap()[..], b"written through the store");
    assert_eq!(store.totals().count, 2);
}

#[test]
fn removing_a_fan_out_directory_drops_its_entries() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), Options::default()).unwrap());
    let _w = Watcher::start(store.clone(), Duration::from_millis(100)).unwrap();
    let mut r = rng(17);
    let ds: Vec<_> = (0..6).map(|_| store.put(&bytes(&mut r, 1000), None, None).unwrap()).collect();
    let victim = ds[0];
    let top = store.layout().objects.join(&victim.to_string()[0..2]);
    let gone: Vec<_> =
        ds.iter().filter(|d| d.to_string()[0..2] == victim.to_string()[0..2]).copied().collect();
    std::fs::remove_dir_all(&top).unwrap();
    assert!(
        wait_until(WAIT, || gone.iter().all(|d| store.stat(d).unwrap().is_none())),
        "entries of a removed directory still indexed"
    );
    assert_eq!(store.totals().count as usize, ds.len() - gone.len());
    for d in ds.iter().filter(|d| !gone.contains(d)) {
        assert!(store.get(d).unwrap().is_some());
    }
}
