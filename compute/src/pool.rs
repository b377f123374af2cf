//! A persistent pool of worker threads, and a reusable [`Barrier`].
//!
//! The pool is created once with `n` threads (the caller's thread counts as thread 0, so `n - 1`
//! OS threads are spawned). [`Pool::run`] hands every thread the same job and returns when all of
//! them have finished it; [`Pool::run_joinable`] waits only for the workers that picked the job up
//! while the caller was still running it (the graph executor claims work dynamically, so a worker
//! the OS left descheduled is not waited for). Waiting (for a new job or at a [`Barrier`]) spins
//! briefly, yields, and then parks on a condition variable, so idle workers do not burn CPU
//! between graphs.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Spin iterations before a waiter starts yielding.
const SPIN_LIMIT: u32 = 1 << 12;
/// Yields (giving the core to a descheduled peer on a busy machine) before a waiter parks.
const YIELD_LIMIT: u32 = 32;

/// Locks a mutex, ignoring poisoning (the guarded data is `()` or plain values).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A reusable barrier for a fixed number of threads: spin, then park.
pub struct Barrier {
    n: usize,
    count: AtomicUsize,
    generation: AtomicU64,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Barrier {
    /// A barrier for `n` threads.
    pub fn new(n: usize) -> Barrier {
        Barrier {
            n: n.max(1),
            count: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// Blocks until all `n` threads have called `wait` for this round.
    pub fn wait(&self) {
        self.wait_then(|| {});
    }

    /// As [`Barrier::wait`]; the last thread to arrive runs `last` before releasing the others
    /// (used to reset shared state for the next round).
    pub fn wait_then(&self, last: impl FnOnce()) {
        if self.n == 1 {
            last();
            return;
        }
        let gen = self.generation.load(Ordering::SeqCst);
        if self.count.fetch_add(1, Ordering::SeqCst) + 1 == self.n {
            last();
            self.count.store(0, Ordering::SeqCst);
            self.generation.fetch_add(1, Ordering::SeqCst);
            if self.sleepers.load(Ordering::SeqCst) > 0 {
                let _g = lock(&self.lock);
                self.cv.notify_all();
            }
            return;
        }
        for i in 0..SPIN_LIMIT + YIELD_LIMIT {
            if self.generation.load(Ordering::SeqCst) != gen {
                return;
            }
            if i < SPIN_LIMIT {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let mut g = lock(&self.lock);
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        while self.generation.load(Ordering::SeqCst) == gen {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The job every thread runs: called with the thread index.
type Job = dyn Fn(usize) + Sync;

/// A lifetime-erased pointer to the current job.
#[derive(Clone, Copy)]
struct JobPtr(*const Job);

// SAFETY: the pointer is only dereferenced while `Pool::run` keeps the job alive and blocks until
// every worker is done with it; the job itself is `Sync`.
unsafe impl Send for JobPtr {}

struct State {
    job: Option<JobPtr>,
    shutdown: bool,
    /// No more workers may join the current job.
    closed: bool,
    /// Workers that joined the current job.
    entered: usize,
}

struct Shared {
    generation: AtomicU64,
    /// Workers that finished the current job.
    finished: AtomicUsize,
    shutdown: AtomicBool,
    state: Mutex<State>,
    cv: Condvar,
    done_lock: Mutex<()>,
    done_cv: Condvar,
}

/// A fixed set of threads that run jobs in lockstep.
pub struct Pool {
    n_threads: usize,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool of `n_threads` (at least one; the caller of [`Pool::run`] is thread 0), placed as
    /// `--numa` asked ([`crate::numa::placement`]).
    pub fn new(n_threads: usize) -> Pool {
        Pool::with_placement(n_threads, crate::numa::placement())
    }

    /// A pool of `n_threads` whose threads are pinned by `placement` (thread `i` to the CPUs of
    /// its node; the calling thread, thread 0, here), or left to the scheduler (`None`).
    pub fn with_placement(n_threads: usize, placement: Option<Arc<crate::numa::Placement>>) -> Pool {
        let n_threads = n_threads.max(1);
        if let Some(p) = &placement {
            p.pin_current(0);
        }
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            finished: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            state: Mutex::new(State { job: None, shutdown: false, closed: false, entered: 0 }),
            cv: Condvar::new(),
            done_lock: Mutex::new(()),
            done_cv: Condvar::new(),
        });
        let mut workers = Vec::with_capacity(n_threads - 1);
        for ith in 1..n_threads {
            let s = Arc::clone(&shared);
            let place = placement.clone();
            let spawned = std::thread::Builder::new().name(format!("compute-{ith}")).spawn(move || {
                if let Some(p) = place {
                    p.pin_current(ith);
                }
                worker(&s, ith)
            });
            match spawned {
                Ok(h) => workers.push(h),
                Err(e) => {
                    tracing::warn!("could not spawn compute thread {ith}: {e}");
                    break;
                }
            }
        }
        let n_threads = workers.len() + 1;
        Pool { n_threads, shared, workers }
    }

    /// Number of threads, the caller's included.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `job(ith)` on every thread (`ith` in `0..n_threads`, 0 on the caller) and returns
    /// when all have returned. `job` must not panic (callers catch panics inside it).
    pub fn run(&self, job: &(dyn Fn(usize) + Sync)) {
        self.run_impl(job, true);
    }

    /// Runs `job(ith)` on the caller (`ith` 0) and on the workers that pick it up before the
    /// caller's own call returns; returns when those have finished. For jobs whose work is
    /// claimed dynamically, so a worker that is late (descheduled) is simply not waited for.
    pub fn run_joinable(&self, job: &(dyn Fn(usize) + Sync)) {
        self.run_impl(job, false);
    }

    fn run_impl(&self, job: &(dyn Fn(usize) + Sync), wait_all: bool) {
        if self.n_threads == 1 {
            job(0);
            return;
        }
        // SAFETY: only the lifetime is erased; this function does not return before every worker
        // that took the job has finished calling it, and no worker can take it afterwards (the job
        // is closed and cleared under the state lock first).
        let ptr: *const Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Job>(job) };
        {
            let mut st = lock(&self.shared.state);
            st.job = Some(JobPtr(ptr));
            st.closed = false;
            st.entered = 0;
            self.shared.finished.store(0, Ordering::SeqCst);
            self.shared.generation.fetch_add(1, Ordering::SeqCst);
            self.shared.cv.notify_all();
        }
        job(0);
        let target = if wait_all {
            self.n_threads - 1
        } else {
            let mut st = lock(&self.shared.state);
            st.closed = true;
            st.entered
        };
        let mut spins = 0u32;
        while self.shared.finished.load(Ordering::SeqCst) < target {
            if spins < SPIN_LIMIT + YIELD_LIMIT {
                spins += 1;
                if spins < SPIN_LIMIT {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
            let g = lock(&self.shared.done_lock);
            if self.shared.finished.load(Ordering::SeqCst) < target {
                let _g = self
                    .shared
                    .done_cv
                    .wait_timeout(g, std::time::Duration::from_millis(1))
                    .unwrap_or_else(|e| e.into_inner());
            }
        }
        let mut st = lock(&self.shared.state);
        st.closed = true;
        st.job = None;
    }
}

fn worker(s: &Shared, ith: usize) {
    let mut seen = 0u64;
    loop {
        // Wait for a new generation: spin, then park.
        let mut spins = 0u32;
        loop {
            if s.shutdown.load(Ordering::SeqCst) {
                return;
            }
            if s.generation.load(Ordering::SeqCst) != seen {
                break;
            }
            if spins < SPIN_LIMIT + YIELD_LIMIT {
                spins += 1;
                if spins < SPIN_LIMIT {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
            let mut st = lock(&s.state);
            while !st.shutdown && s.generation.load(Ordering::SeqCst) == seen {
                st = s.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.shutdown {
                return;
            }
            break;
        }
        let job = {
            let mut st = lock(&s.state);
            seen = s.generation.load(Ordering::SeqCst);
            match st.job {
                Some(j) if !st.closed => {
                    st.entered += 1;
                    Some(j)
                }
                _ => None,
            }
        };
        if let Some(JobPtr(p)) = job {
            // SAFETY: the job was taken while open, so `Pool::run_impl` waits for this worker's
            // `finished` increment, which happens only after this call returns.
            let f = unsafe { &*p };
            f(ith);
            s.finished.fetch_add(1, Ordering::SeqCst);
            let _g = lock(&s.done_lock);
            s.done_cv.notify_all();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let mut st = lock(&self.shared.state);
            st.shutdown = true;
            self.shared.cv.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_each_job_and_barrier_orders_phases() {
        let pool = Pool::new(3);
        let n = pool.n_threads();
        let barrier = Barrier::new(n);
        let hits = AtomicUsize::new(0);
        for round in 0..50 {
            let phase_a = AtomicUsize::new(0);
            let bad = AtomicBool::new(false);
            pool.run(&|_ith| {
                phase_a.fetch_add(1, Ordering::SeqCst);
                barrier.wait();
                if phase_a.load(Ordering::SeqCst) != n {
                    bad.store(true, Ordering::SeqCst);
                }
                barrier.wait();
                hits.fetch_add(1, Ordering::SeqCst);
            });
            assert!(!bad.load(Ordering::SeqCst), "round {round}");
            if round % 10 == 0 {
                // Let the workers park between jobs.
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        assert_eq!(hits.load(Ordering::SeqCst), 50 * n);
    }

    #[test]
    fn joinable_jobs_wait_for_every_worker_that_joined() {
        let pool = Pool::new(3);
        for round in 0..20 {
            let joined = AtomicUsize::new(0);
            let finished = AtomicUsize::new(0);
            pool.run_joinable(&|ith| {
                joined.fetch_add(1, Ordering::SeqCst);
                if ith == 0 && round % 2 == 0 {
                    // Give the workers time to join: at least one must get in.
                    let t = std::time::Instant::now();
                    while joined.load(Ordering::SeqCst) < 2 && t.elapsed() < std::time::Duration::from_secs(5)
                    {
                        std::thread::yield_now();
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
                finished.fetch_add(1, Ordering::SeqCst);
            });
            let j = joined.load(Ordering::SeqCst);
            // Everyone who joined has finished when run_joinable returns, and nobody joins later.
            assert_eq!(finished.load(Ordering::SeqCst), j);
            if round % 2 == 0 {
                assert!(j >= 2, "round {round}: no worker joined");
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
            assert_eq!(joined.load(Ordering::SeqCst), j, "a worker joined a finished job");
        }
    }
}
