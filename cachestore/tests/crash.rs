//! Crash consistency: a child process (this test binary re-executed with `CACHESTORE_CRASH_CHILD` set)
//! writes, removes, reads and pins objects in a loop and dies by SIGKILL, either from the parent at a
//! seeded random moment, or from itself at the n-th crash point of the library (seeded n), so that every
//! window between two durable steps is hit. After each death the store is reopened and must hold: no temp
//! files, nothing quarantined, every index entry backed by an object whose hash matches, every object file
//! indexed, and every put the child completed present.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cachestore::{Digest, ListQuery, Options, Store, WireHash};
use rand::Rng;

use crate::common::{bytes, files_under, fnv1a64, rng};

const CHILD_ENV: &str = "CACHESTORE_CRASH_CHILD";
const TEST_NAME: &str = "crash::crash_consistency_under_sigkill";
const CRASH_AT_ENV: &str = "CACHESTORE_CRASH_AT";

static COUNTDOWN: AtomicU64 = AtomicU64::new(0);
static POINT_FILE: OnceLock<std::path::PathBuf> = OnceLock::new();
static TARGET: OnceLock<String> = OnceLock::new();

/// The library's crash points on the put and remove paths (see `src/crashpoint.rs` callers).
const POINTS: [&str; 6] = ["temp-partial", "temp-synced", "renamed", "published", "indexed", "unindexed"];

/// The child's crash hook: at the n-th crash point, record its name and SIGKILL the process.
fn crash_hook(name: &'static str) {
    if TARGET.get().is_some_and(|t| t != name) {
        return;
    }
    if COUNTDOWN.fetch_sub(1, Ordering::SeqCst) == 1 {
        if let Some(p) = POINT_FILE.get() {
            let _ = std::fs::write(p, name);
        }
        // SAFETY: kill(2) on our own pid with a valid signal number has no memory-safety preconditions.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

/// The child's loop: never returns (until killed). Completed operations are logged with one `write`.
fn child(root: &Path, seed: u64) -> ! {
    if let Ok(spec) = std::env::var(CRASH_AT_ENV) {
        let (name, n) = spec.split_once(':').unwrap();
        TARGET.set(name.to_string()).unwrap();
        COUNTDOWN.store(n.parse().unwrap(), Ordering::SeqCst);
        POINT_FILE.set(root.join("crash.point")).unwrap();
        assert!(cachestore::install_crash_hook(crash_hook));
    }
    let store = Store::open(root, Options::default()).unwrap();
    let mut log = std::fs::OpenOptions::new().append(true).create(true).open(root.join("crash.log")).unwrap();
    let mut r = rng(seed);
    let mut mine: Vec<Digest> = Vec::new();
    loop {
        let op = r.random_range(0..100);
        if op < 70 || mine.is_empty() {
            let n = if r.random_range(0..10) == 0 {
                r.random_range(0..400_000)
            } else {
                r.random_range(0..40_000)
            };
            let data = bytes(&mut r, n);
            let d = store.put(&data, Some(WireHash(fnv1a64(&data))), Some("crash")).unwrap();
            log.write_all(format!("put {d}\n").as_bytes()).unwrap();
            mine.push(d);
        } else if op < 80 {
            let d = mine.swap_remove(r.random_range(0..mine.len()));
            // Logged before: the parent must accept it either way.
            log.write_all(format!("rm {d}\n").as_bytes()).unwrap();
            store.remove(&d).unwrap();
        } else if op < 90 {
            let d = mine[r.random_range(0..mine.len())];
            assert!(store.get(&d).unwrap().is_some());
        } else {
            let d = mine[r.random_range(0..mine.len())];
            if op < 95 {
                store.pin(&d).unwrap();
            } else {
                store.unpin(&d).unwrap();
            }
        }
    }
}

fn check_invariants(root: &Path) -> (usize, usize) {
    let store = Store::open(root, Options::default()).unwrap();
    let layout = store.layout().clone();
    assert!(files_under(&layout.tmp).is_empty(), "temp files survived recovery");
    assert!(files_under(&layout.quarantine).is_empty(), "a complete object was quarantined");

    let entries = store.list(&ListQuery::default()).unwrap().items;
    let mut indexed = HashSet::new();
    for m in &entries {
        let path = layout.object_path(&m.digest);
        let data =
            std::fs::read(&path).unwrap_or_else(|e| panic!("index entry {} without object: {e}", m.digest));
        assert_eq!(data.len() as u64, m.size);
        assert_eq!(blake3::hash(&data).as_bytes(), &m.digest.0, "object content does not match its name");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o444);
        // Either the wire hash the child supplied or none (re-indexed orphan without a hasher).
        assert!(m.wire_hash.is_none_or(|w| w.0 == fnv1a64(&data)));
        indexed.insert(m.digest);
    }
    let files = files_under(&layout.objects);
    for f in &files {
        let d: Digest = f.file_name().unwrap().to_str().unwrap().parse().unwrap();
        assert!(indexed.contains(&d), "object {d} not indexed after recovery");
    }
    assert_eq!(files.len(), entries.len());
    let t = store.totals();
    assert_eq!(t.count as usize, entries.len());
    assert_eq!(t.bytes, entries.iter().map(|m| m.size).sum::<u64>());

    let log = std::fs::read_to_string(root.join("crash.log")).unwrap_or_default();
    let mut expected = HashSet::new();
    for line in log.lines() {
        if let Some(h) = line.strip_prefix("put ") {
            expected.insert(h.parse::<Digest>().unwrap());
        } else if let Some(h) = line.strip_prefix("rm ") {
            expected.remove(&h.parse::<Digest>().unwrap());
        }
    }
    for d in &expected {
        let b = store.get(d).unwrap().unwrap_or_else(|| panic!("completed put {d} lost"));
        assert_eq!(Digest::of(&b), *d);
    }
    (entries.len(), expected.len())
}

fn spawn_child(exe: &Path, root: &Path, seed: u64, crash_at: Option<String>) -> std::process::Child {
    let mut c = Command::new(exe);
    c.args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, root)
        .env("CACHESTORE_CRASH_SEED", seed.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(spec) = crash_at {
        c.env(CRASH_AT_ENV, spec);
    }
    c.spawn().unwrap()
}

#[test]
fn crash_consistency_under_sigkill() {
    if let Some(root) = std::env::var_os(CHILD_ENV) {
        let seed = std::env::var("CACHESTORE_CRASH_SEED").unwrap().parse().unwrap();
        child(Path::new(&root), seed);
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let exe = std::env::current_exe().unwrap();
    let mut r = rng(0xC4A5);
    let started = Instant::now();
    // LLAMAD_SLOW_TESTS=1 soaks longer.
    let slow = std::env::var("LLAMAD_SLOW_TESTS").is_ok_and(|v| v == "1");
    let iterations: u64 = if slow { 150 } else { 30 };
    let mut max_objects = 0;
    let mut killed_mid_write = 0;
    let mut completed = 0;

    // Phase 1: the parent kills the child at random moments.
    for i in 0..iterations {
        let mut c = spawn_child(&exe, root, 1000 + i, None);
        std::thread::sleep(Duration::from_millis(r.random_range(5..250)));
        if let Some(status) = c.try_wait().unwrap() {
            panic!("child exited by itself ({status}) in iteration {i}");
        }
        c.kill().unwrap(); // SIGKILL
        c.wait().unwrap();
        if !files_under(&root.join("llamad-v1/tmp")).is_empty() {
            killed_mid_write += 1;
        }
        let (n, c) = check_invariants(root);
        max_objects = max_objects.max(n);
        completed = c;
    }

    // Phase 2: the child kills itself at the n-th passage of a chosen crash point (each point in turn).
    let mut points: BTreeMap<String, u32> = BTreeMap::new();
    for i in 0..iterations {
        let _ = std::fs::remove_file(root.join("crash.point"));
        let spec = format!("{}:{}", POINTS[i as usize % POINTS.len()], r.random_range(1..12));
        let mut c = spawn_child(&exe, root, 2000 + i, Some(spec));
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = c.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "child did not reach its crash point");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(status.signal(), Some(libc::SIGKILL), "child died otherwise: {status}");
        let point = std::fs::read_to_string(root.join("crash.point")).unwrap();
        *points.entry(point).or_default() += 1;
        let (n, c) = check_invariants(root);
        max_objects = max_objects.max(n);
        completed = c;
    }
    eprintln!(
        "crash test: {iterations} timed kills ({killed_mid_write} left a temp file) + {iterations} kills at crash \
         points {points:?}; {completed} completed puts survive; {:?}",
        started.elapsed()
    );
    // The children must actually have stored things, and hit several windows, or the test proves little.
    assert!(max_objects > 10, "children stored only {max_objects} objects");
    assert_eq!(points.len(), POINTS.len(), "crash points hit: {points:?}");
    let budget = Duration::from_secs(if slow { 1500 } else { 300 });
    assert!(started.elapsed() < budget, "crash test too slow");
}
