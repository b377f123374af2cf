//! The executor: a persistent thread pool running a graph's nodes in order.
//!
//! Every node runs in one or more phases; each phase is cut into units of work (row chunks,
//! blocks of weight rows, query rows), and phases of independent nodes share a step (see
//! `schedule`). Threads claim a step's units from an atomic counter and move on to the next step
//! once every unit of the current one is done (spin briefly, then park). There
//! is no all-threads barrier: a thread that is descheduled on a busy machine simply claims fewer
//! units, and catches up by skipping phases that are already finished. Scratch memory is owned by
//! the executor and grows only at the start of a `compute` (never per op), so recomputing a graph
//! allocates nothing.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use super::Graph;
use crate::error::{Error, Result};
use crate::ops::{self, Ctx, ErrorSink};
use crate::pool::Pool;

/// Spin iterations while waiting for a phase, before yielding.
const SPIN_LIMIT: u32 = 1 << 12;
/// Yields before parking.
const YIELD_LIMIT: u32 = 16;

/// Claim and completion counters of one phase, each on its own cache line: a thread spinning on
/// `done` must not steal the line a working thread claims from (false sharing cost more than the
/// work of a small phase with two threads).
#[derive(Default)]
struct PhaseSync {
    claimed: Padded,
    done: Padded,
}

/// An atomic counter alone on a 128-byte line (two 64-byte lines: adjacent-line prefetch).
#[derive(Default)]
#[repr(align(128))]
struct Padded(AtomicUsize);

impl std::ops::Deref for Padded {
    type Target = AtomicUsize;
    fn deref(&self) -> &AtomicUsize {
        &self.0
    }
}

/// Claims the next units of a phase: guided self-scheduling, each claim a `1 / (2·nth)` share of
/// what is left (at least one unit). A phase of many small units (a generation step's matmul has
/// one per 16 weight rows) then costs a few dozen contended atomics instead of two per unit, and
/// the last claims are small, so the threads' finish times even out (fixed grains of a quarter of
/// a thread's share left one thread waiting up to a grain at the end of every large product).
fn claim(claimed: &AtomicUsize, units: usize, nth: usize) -> Option<(usize, usize)> {
    let mut cur = claimed.load(Ordering::Relaxed);
    loop {
        if cur >= units {
            return None;
        }
        let g = if nth <= 1 { units - cur } else { ((units - cur) / (2 * nth)).max(1) };
        match claimed.compare_exchange_weak(cur, cur + g, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some((cur, cur + g)),
            Err(now) => cur = now,
        }
    }
}

/// Where threads park while the last units of a phase finish.
#[derive(Default)]
struct Parking {
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Parking {
    /// Waits until `s.done == units`: spin, yield, then park.
    fn wait(&self, s: &PhaseSync, units: usize) {
        for i in 0..SPIN_LIMIT + YIELD_LIMIT {
            if s.done.load(Ordering::SeqCst) >= units {
                return;
            }
            if i < SPIN_LIMIT {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        while s.done.load(Ordering::SeqCst) < units {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Wakes parked threads (called by whoever completes the last unit of a phase).
    fn wake(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.cv.notify_all();
        }
    }
}

/// Runs graphs on a fixed number of threads.
pub struct Executor {
    pool: Pool,
    /// Scratch shared by all threads (u64 words for alignment).
    shared: Vec<u64>,
    /// Per-thread scratch, `local_len` f32 words per thread.
    local: Vec<f32>,
    local_len: usize,
    /// One entry per phase of the graph being run.
    sync: Vec<PhaseSync>,
    parking: Parking,
}

/// Raw scratch pointers handed to the threads.
#[derive(Clone, Copy)]
struct Scratch {
    shared: *mut u8,
    shared_len: usize,
    local: *mut f32,
    local_len: usize,
}

// SAFETY: the pointers address the executor's scratch, which outlives `Pool::run`; each thread
// uses its own `local` slice and the units of a phase write disjoint parts of the shared one.
unsafe impl Sync for Scratch {}

impl Executor {
    /// An executor with `n_threads` threads (at least one), created once and reused.
    pub fn new(n_threads: usize) -> Executor {
        let pool = Pool::new(n_threads);
        Executor {
            pool,
            shared: Vec::new(),
            local: Vec::new(),
            local_len: 0,
            sync: Vec::new(),
            parking: Parking::default(),
        }
    }

    /// Number of threads.
    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// Runs every node of `graph` that has the COMPUTE flag, in order.
    ///
    /// Index errors found at run time (row ids, expert ids out of range) skip the affected rows and
    /// are returned as [`Error::IndexOutOfRange`] after the whole graph ran.
    pub fn compute(&mut self, graph: &Graph) -> Result<()> {
        let nth = self.pool.n_threads();
        let shared_words = graph.shared_bytes.div_ceil(8);
        if self.shared.len() < shared_words {
            self.shared.resize(shared_words, 0);
        }
        let local_len = graph.local_f32.next_multiple_of(16);
        if self.local_len < local_len {
            self.local_len = local_len;
            self.local = vec![0.0; local_len * nth];
        }
        let n_steps = graph.steps.len();
        if self.sync.len() < n_steps {
            self.sync.resize_with(n_steps, PhaseSync::default);
        }
        for s in &self.sync[..n_steps] {
            s.claimed.store(0, Ordering::Relaxed);
            s.done.store(0, Ordering::Relaxed);
        }
        let scratch = Scratch {
            shared: self.shared.as_mut_ptr() as *mut u8,
            shared_len: self.shared.len() * 8,
            local: self.local.as_mut_ptr(),
            local_len: self.local_len,
        };
        let errors = ErrorSink::new();
        let sync = &self.sync[..n_steps];
        let parking = &self.parking;
        let job = |ith: usize| {
            let s = scratch;
            // SAFETY: thread `ith < nth` owns local words `[ith * local_len, (ith + 1) * local_len)`,
            // inside the executor's `local` vector, which lives until `Pool::run` returns.
            let local =
                unsafe { std::slice::from_raw_parts_mut(s.local.add(ith * s.local_len), s.local_len) };
            // SAFETY: the shared scratch is valid for `shared_len` bytes for the whole run; the
            // units of a step write disjoint parts of it (each plan its own region, see below).
            let mut ctx = unsafe { Ctx::new(s.shared, s.shared_len, local, &errors) };
            for (step, ps) in graph.steps.iter().zip(sync) {
                let units = step.units;
                while let Some((first, end)) = claim(&ps.claimed, units, nth) {
                    let mut m = step.members.partition_point(|m| m.first + m.units <= first);
                    for u in first..end {
                        while step.members[m].first + step.members[m].units <= u {
                            m += 1;
                        }
                        let mem = &step.members[m];
                        let (i, plan) = &graph.plans[mem.plan];
                        let node = &graph.nodes[*i];
                        ctx.unit = u - mem.first;
                        ctx.units = mem.units;
                        // SAFETY: the plan's region `[off, off + shared_bytes)` lies inside the
                        // executor's shared scratch (sized to the schedule's total above), and no
                        // plan live at the same time has an overlapping one (`schedule`).
                        unsafe {
                            ctx.set_shared(
                                s.shared,
                                s.shared_len,
                                graph.shared_off[mem.plan],
                                plan.shared_bytes,
                            )
                        };
                        let r = catch_unwind(AssertUnwindSafe(|| ops::run(node, plan, mem.phase, &mut ctx)));
                        if r.is_err() {
                            errors.report(Error::Shape {
                                op: node.op,
                                detail: "kernel fault (internal check failed)".into(),
                            });
                        }
                    }
                    if ps.done.fetch_add(end - first, Ordering::SeqCst) + (end - first) == units {
                        parking.wake();
                    }
                }
                parking.wait(ps, units);
            }
        };
        self.pool.run_joinable(&job);
        match errors.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
