//! The two `Index` adapters agree with each other and with a plain model on random operation sequences.

use std::collections::BTreeMap;

use cachestore::index::mem::MemIndex;
use cachestore::index::redb::RedbIndex;
use cachestore::index::{Index, IndexOp, ObjectMeta};
use cachestore::{Digest, WireHash};
use rand::Rng;

use crate::common::rng;

#[test]
fn redb_and_mem_indexes_agree_with_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let redb = RedbIndex::open(&dir.path().join("i.redb")).unwrap();
    let mem = MemIndex::new();
    let mut model: BTreeMap<Digest, ObjectMeta> = BTreeMap::new();
    let mut r = rng(21);
    let pool: Vec<Digest> = (0..12u8).map(|i| Digest::of(&[i])).collect();
    for round in 0..60 {
        let mut ops = Vec::new();
        for _ in 0..r.random_range(1..6) {
            let d = pool[r.random_range(0..pool.len())];
            let op = match r.random_range(0..3) {
                0 => IndexOp::Put(ObjectMeta {
                    digest: d,
                    size: r.random_range(0..1_000_000),
                    created_us: r.random_range(0..1000),
                    last_used_us: r.random_range(0..1000),
                    hits: r.random_range(0..10),
                    pinned: r.random_bool(0.3),
                    wire_hash: r.random_bool(0.7).then(|| WireHash(r.random_range(0..4))),
                    label: r.random_bool(0.5).then(|| format!("t{}", r.random_range(0..100))),
                }),
                1 => IndexOp::Remove(d),
                _ => IndexOp::Touch {
                    digest: d,
                    last_used_us: r.random_range(0..2000),
                    hits: r.random_range(0..3),
                },
            };
            match &op {
                IndexOp::Put(m) => {
                    model.insert(d, m.clone());
                }
                IndexOp::Remove(d) => {
                    model.remove(d);
                }
                IndexOp::Touch { digest, last_used_us, hits } => {
                    if let Some(m) = model.get_mut(digest) {
                        m.last_used_us = m.last_used_us.max(*last_used_us);
                        m.hits += hits;
                    }
                }
            }
            ops.push(op);
        }
        let durable = round % 2 == 0;
        redb.apply(&ops, durable).unwrap();
        mem.apply(&ops, durable).unwrap();
        let want: Vec<ObjectMeta> = model.values().cloned().collect();
        assert_eq!(redb.scan().unwrap(), want, "round {round}");
        assert_eq!(mem.scan().unwrap(), want, "round {round}");
        for w in 0..4 {
            let want_w: Vec<Digest> =
                model.values().filter(|m| m.wire_hash == Some(WireHash(w))).map(|m| m.digest).collect();
            assert_eq!(redb.by_wire_hash(WireHash(w)).unwrap(), want_w);
            assert_eq!(mem.by_wire_hash(WireHash(w)).unwrap(), want_w);
        }
        for d in &pool {
            assert_eq!(redb.get(d).unwrap().as_ref(), model.get(d));
        }
    }
    assert!(!model.is_empty());
    redb.clear().unwrap();
    mem.clear().unwrap();
    assert!(redb.scan().unwrap().is_empty() && mem.scan().unwrap().is_empty());
    assert!(redb.by_wire_hash(WireHash(0)).unwrap().is_empty());
}
