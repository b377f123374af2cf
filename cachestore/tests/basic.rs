//! Puts, gets, layout on disk, metadata, listing and persistence across reopen.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use cachestore::{Digest, Error, ListQuery, Options, SortKey, Store, WireHash};

use crate::common::{bytes, files_under, rng};

#[test]
fn put_get_round_trip_layout_and_dedup() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let data = bytes(&mut rng(1), 100_000);
    let d = store.put(&data, None, None).unwrap();
    // Independent oracle: the blake3 crate's reference hash of the same bytes.
    assert_eq!(d.0, *blake3::hash(&data).as_bytes());
    let hex = d.to_string();
    let path = dir.path().join("llamad-v1/objects").join(&hex[0..2]).join(&hex[2..4]).join(&hex);
    assert_eq!(std::fs::read(&path).unwrap(), data);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o444);
    assert_eq!(&store.get(&d).unwrap().unwrap()[..], &data[..]);

    // Same content again: same digest, no second file.
    assert_eq!(store.put(&data, None, None).unwrap(), d);
    let s = store.stats();
    assert_eq!((s.puts_new, s.puts_dedup, s.hits, s.misses, s.bytes_served), (1, 1, 1, 0, 100_000));
    assert_eq!(files_under(&dir.path().join("llamad-v1/objects")).len(), 1);
    assert!(files_under(&dir.path().join("llamad-v1/tmp")).is_empty());

    // Unknown digest: a miss.
    assert!(store.get(&Digest::of(b"absent")).unwrap().is_none());
    assert_eq!(store.stats().misses, 1);
    let t = store.totals();
    assert_eq!((t.count, t.bytes), (1, 100_000));
    assert!((t.hit_rate - 0.5).abs() < 1e-12);
}

#[test]
fn empty_object_is_stored_and_served() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let d = store.put(b"", None, None).unwrap();
    assert_eq!(d.to_string(), "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262");
    assert_eq!(store.get(&d).unwrap().unwrap().len(), 0);
    assert_eq!(store.verify(None).unwrap().corrupt, vec![]);
}

#[test]
fn default_root_follows_llama_cpp() {
    // This is the only test that touches these variables.
    // ref: ggml-rpc-protocol.md §9: $LLAMA_CACHE/rpc when set and non-empty, else the XDG cache dir.
    // SAFETY (edition 2021: not unsafe): std serialises environment access behind its own lock.
    std::env::set_var("LLAMA_CACHE", "/x");
    assert_eq!(cachestore::default_root(), PathBuf::from("/x/rpc"));
    std::env::set_var("LLAMA_CACHE", "");
    std::env::set_var("XDG_CACHE_HOME", "/tmp/xdg-test-cache");
    assert_eq!(cachestore::default_root(), PathBuf::from("/tmp/xdg-test-cache/llama.cpp/rpc"));
    std::env::remove_var("LLAMA_CACHE");
    std::env::remove_var("XDG_CACHE_HOME");
    if let Some(home) = std::env::var_os("HOME").map(PathBuf::from) {
        assert_eq!(cachestore::default_root(), home.join(".cache/llama.cpp/rpc"));
    }
}

#[test]
fn leaves_llama_cpp_cache_files_alone() {
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("9ebd4ca7a79e5ddd");
    std::fs::write(&theirs, b"llama.cpp's own cache entry").unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    store.put(b"ours", None, None).unwrap();
    store.gc().unwrap();
    store.rebuild_index().unwrap();
    store.verify(None).unwrap();
    assert_eq!(std::fs::read(&theirs).unwrap(), b"llama.cpp's own cache entry");
    let mut top: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    top.sort();
    assert_eq!(top, vec!["9ebd4ca7a79e5ddd", "llamad-v1"]);
}

#[test]
fn second_store_on_same_root_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _a = Store::open(dir.path(), Options::default()).unwrap();
    match Store::open(dir.path(), Options::default()) {
        Err(Error::Locked { .. }) => {}
        other => panic!("expected Locked, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn list_filters_sorts_and_pages() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let a = store.put(&[1u8; 100], None, Some("blk.0.attn_q.weight")).unwrap();
    let b = store.put(&[2u8; 300], None, Some("blk.0.ffn_up.weight")).unwrap();
    let c = store.put(&[3u8; 200], None, Some("blk.1.attn_q.weight")).unwrap();
    let d = store.put(&[4u8; 50], None, None).unwrap();
    store.pin(&b).unwrap();
    for _ in 0..3 {
        store.get(&c).unwrap().unwrap();
    }
    store.get(&a).unwrap().unwrap();

    let digests = |q: &ListQuery| store.list(q).unwrap().items.iter().map(|m| m.digest).collect::<Vec<_>>();
    assert_eq!(digests(&ListQuery { sort: SortKey::Size, ..Default::default() }), vec![b, c, a, d]);
    assert_eq!(
        digests(&ListQuery { sort: SortKey::Size, ascending: true, ..Default::default() }),
        vec![d, a, c, b]
    );
    assert_eq!(digests(&ListQuery { sort: SortKey::Hits, limit: Some(2), ..Default::default() }), vec![c, a]);
    assert_eq!(digests(&ListQuery { sort: SortKey::Created, ..Default::default() }), vec![d, c, b, a]);
    // Last used: a was read last, then c; b and d only at put time (d after b).
    assert_eq!(digests(&ListQuery { sort: SortKey::LastUsed, ..Default::default() }), vec![a, c, d, b]);
    let q = ListQuery { name_contains: Some("attn_q".into()), sort: SortKey::Size, ..Default::default() };
    let page = store.list(&q).unwrap();
    assert_eq!(page.total, 2);
    assert_eq!(page.items.iter().map(|m| m.digest).collect::<Vec<_>>(), vec![c, a]);
    assert_eq!(digests(&ListQuery { pinned: Some(true), ..Default::default() }), vec![b]);
    assert_eq!(
        digests(&ListQuery { min_size: Some(150), sort: SortKey::Size, offset: 1, ..Default::default() }),
        vec![c]
    );

    let t = store.totals();
    assert_eq!((t.count, t.bytes, t.pinned_count, t.pinned_bytes), (4, 650, 1, 300));
    assert!(store.remove(&d).unwrap());
    assert!(!store.remove(&d).unwrap());
    assert!(store.get(&d).unwrap().is_none());
    assert_eq!(store.totals().bytes, 600);
    assert!(matches!(store.pin(&d), Err(Error::NotFound { .. })));
}

#[test]
fn metadata_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(&mut rng(7), 4096);
    let d = {
        let store = Store::open(dir.path(), Options::default()).unwrap();
        let d = store.put(&data, Some(WireHash(0xabc)), Some("tok_embd.weight")).unwrap();
        store.pin(&d).unwrap();
        store.get(&d).unwrap().unwrap();
        store.get(&d).unwrap().unwrap();
        d
    };
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let m = store.stat(&d).unwrap().unwrap();
    assert_eq!(m.size, 4096);
    assert!(m.pinned);
    assert_eq!(m.hits, 2);
    assert_eq!(m.wire_hash, Some(WireHash(0xabc)));
    assert_eq!(m.label.as_deref(), Some("tok_embd.weight"));
    assert!(m.last_used_us > m.created_us);
    assert_eq!(&store.get(&d).unwrap().unwrap()[..], &data[..]);
    assert_eq!(store.totals().pinned_bytes, 4096);
}

#[test]
fn concurrent_puts_and_gets_from_threads() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(Store::open(dir.path(), Options::default()).unwrap());
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut r = rng(100 + t);
                let mut mine = Vec::new();
                for i in 0..20 {
                    // Thread-shared content (i % 5) collides across threads on purpose.
                    let data = if i % 4 == 0 { vec![(i % 5) as u8; 1000] } else { bytes(&mut r, 2000) };
                    let d = store.put(&data, None, None).unwrap();
                    mine.push((d, data));
                }
                for (d, data) in &mine {
                    assert_eq!(&store.get(d).unwrap().unwrap()[..], &data[..]);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let listed = store.list(&ListQuery::default()).unwrap().total as u64;
    assert_eq!(store.totals().count, listed);
    assert_eq!(files_under(&store.layout().objects).len() as u64, listed);
    assert!(files_under(&store.layout().tmp).is_empty());
}

#[test]
fn gc_during_concurrent_puts_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(Store::open(dir.path(), Options::default()).unwrap());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let gc = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut runs = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = store.gc().unwrap();
                // Nothing is ever garbage here: no temp file of a live put may be collected.
                assert_eq!(r, cachestore::GcReport::default());
                runs += 1;
            }
            runs
        })
    };
    let writers: Vec<_> = (0..2u64)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut r = rng(200 + t);
                (0..20)
                    .map(|_| {
                        let data = bytes(&mut r, 300_000);
                        (store.put(&data, None, None).unwrap(), data)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let written: Vec<_> = writers.into_iter().flat_map(|h| h.join().unwrap()).collect();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(gc.join().unwrap() > 0);
    for (d, data) in &written {
        assert_eq!(&store.get(d).unwrap().unwrap()[..], &data[..]);
    }
    assert_eq!(store.totals().count, 40);
}
