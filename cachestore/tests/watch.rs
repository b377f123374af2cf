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

/// The watcher's threads (`cachestore-watc…`, the name truncated by the kernel) and their CPU ticks.
#[cfg(target_os = "linux")]
fn watcher_threads() -> std::collections::HashMap<String, u64> {
    let mut out = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let tid = e.file_name().to_string_lossy().into_owned();
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        if !head.contains("cachestore-watc") {
            continue;
        }
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of stat, i.e. 11 and 12 after the command.
        out.insert(tid, f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap());
    }
    out
}

#[cfg(target_os = "linux")]
#[test]
fn the_watcher_goes_idle_after_reconciling() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), Options::default()).unwrap());
    let before = watcher_threads();
    let _w = Watcher::start(store.clone(), Duration::from_millis(50)).unwrap();
    // The new thread names itself once it runs.
    let mut ours: Vec<String> = Vec::new();
    let found = wait_until(WAIT, || {
        ours = watcher_threads().into_keys().filter(|t| !before.contains_key(t)).collect();
        !ours.is_empty()
    });
    assert!(found, "no watcher thread found");
    for i in 0..20u64 {
        store.put(&bytes(&mut rng(100 + i), 10_000), None, None).unwrap();
    }
    // A hand-added object, so the watcher certainly reconciles (opens and reads) files.
    let data = bytes(&mut rng(99), 30_000);
    let d = Digest::of(&data);
    std::fs::write(store.layout().objects.join(d.to_string()), &data).unwrap();
    assert!(wait_until(WAIT, || store.stat(&d).unwrap().is_some()), "hand-added object not indexed");
    std::thread::sleep(Duration::from_millis(500));
    let ticks =
        |m: &std::collections::HashMap<String, u64>| ours.iter().filter_map(|t| m.get(t)).sum::<u64>();
    let t0 = ticks(&watcher_threads());
    std::thread::sleep(Duration::from_millis(1500));
    let used = ticks(&watcher_threads()) - t0;
    // Reading a file is not a change: the watcher must not re-queue the paths its own reconcile
    // opened (it used to, and spun at 100% of a core). 1.5 s of wall time: allow 0.2 s of CPU.
    assert!(used <= 20, "the idle watcher used {used} ticks of CPU in 1.5 s");
}
