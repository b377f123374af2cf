//! Measures put/get throughput on one large object.
//!
//! `cargo run -p cachestore --example throughput -- [DIR] [MB]` (default: a temp dir under `$TMPDIR`, 100 MB).
//! The directory should be on the disk you care about: on tmpfs, fsync costs nothing.

use std::time::Instant;

use cachestore::{Options, Store};
use rand::{Rng, SeedableRng};

fn mb_s(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / 1e6 / secs
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = match args.next() {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    let mb: usize = args.next().map_or(Ok(100), |s| s.parse())?;
    let n = mb * 1_000_000;
    let mut data = vec![0u8; n];
    rand::rngs::StdRng::seed_from_u64(1).fill(&mut data[..]);

    let t = Instant::now();
    let h = blake3::hash(&data);
    let hash_s = t.elapsed().as_secs_f64();
    println!("blake3 alone:           {:8.1} MB/s", mb_s(n, hash_s));
    let _ = h;
    for size in [2_216_448usize, 30 << 20, n] {
        let t = Instant::now();
        let mut k = 0;
        while t.elapsed().as_secs_f64() < 0.3 {
            std::hint::black_box(cachestore::Digest::of(&data[..size]));
            k += 1;
        }
        let par = t.elapsed().as_secs_f64() / k as f64;
        let t = Instant::now();
        let mut k = 0;
        while t.elapsed().as_secs_f64() < 0.3 {
            std::hint::black_box(blake3::hash(&data[..size]));
            k += 1;
        }
        let one = t.elapsed().as_secs_f64() / k as f64;
        println!(
            "blake3 {size:>10} B: one thread {:8.1} MB/s, split {:8.1} MB/s",
            mb_s(size, one),
            mb_s(size, par)
        );
    }

    let store = Store::open(dir.path(), Options::default())?;
    let t = Instant::now();
    let d = store.put(&data, None, None)?;
    let put_s = t.elapsed().as_secs_f64();
    println!("put (new, durable):     {:8.1} MB/s  ({put_s:.3} s)", mb_s(n, put_s));

    let t = Instant::now();
    store.put(&data, None, None)?;
    let s = t.elapsed().as_secs_f64();
    println!("put (dedup, verified):  {:8.1} MB/s  ({s:.3} s)", mb_s(n, s));

    let mut sum = 0u64;
    let t = Instant::now();
    let reps = 3;
    for _ in 0..reps {
        let b = store.get(&d)?.ok_or("miss")?;
        sum = sum.wrapping_add(b.iter().step_by(4096).map(|&x| u64::from(x)).sum::<u64>());
    }
    let s = t.elapsed().as_secs_f64() / f64::from(reps);
    println!("get (verify_on_read):   {:8.1} MB/s  ({s:.3} s)", mb_s(n, s));

    // What llamad does on a SET_TENSOR_HASH hit: read into the tensor, hashing as it goes (into a
    // buffer already touched, so that page faults of a fresh one are not counted).
    store.put(&data, Some(cachestore::WireHash(7)), None)?;
    let mut dst = vec![1u8; n];
    let t = Instant::now();
    for _ in 0..reps {
        store.read_by_wire_hash(cachestore::WireHash(7), &mut dst)?.ok_or("miss")?;
        sum = sum.wrapping_add(u64::from(dst[n / 2]));
    }
    let s = t.elapsed().as_secs_f64() / f64::from(reps);
    println!("read into (verified):   {:8.1} MB/s  ({s:.3} s)", mb_s(n, s));
    drop(store);

    let store = Store::open(dir.path(), Options { verify_on_read: false, ..Options::default() })?;
    let t = Instant::now();
    for _ in 0..reps {
        let b = store.get(&d)?.ok_or("miss")?;
        sum = sum.wrapping_add(b.iter().step_by(4096).map(|&x| u64::from(x)).sum::<u64>());
    }
    let s = t.elapsed().as_secs_f64() / f64::from(reps);
    println!("get (no verify, map):   {:8.3} ms per get", s * 1e3);
    println!("(checksum {sum})");

    // Many small objects: the per-put cost of fsyncs and the index commit dominates.
    let small = 1 << 20;
    let count: u32 = 50;
    let t = Instant::now();
    for i in 0..count {
        data[..8].copy_from_slice(&u64::from(i).to_le_bytes());
        store.put(&data[..small], None, None)?;
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "put 1 MiB objects:      {:8.1} puts/s ({:.1} MB/s)",
        f64::from(count) / s,
        mb_s(small * count as usize, s)
    );
    Ok(())
}
