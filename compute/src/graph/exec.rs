//! The executor: a persistent thread pool running a graph's nodes in lockstep.
//!
//! Every thread walks the same list of planned nodes; each node runs in one or more phases, each
//! phase split across the threads by the op, with a barrier after it. Scratch memory is owned by
//! the executor and grows only at the start of a `compute` (never per op), so recomputing a graph
//! allocates nothing.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::Graph;
use crate::error::{Error, Result};
use crate::ops::{self, Ctx, ErrorSink};
use crate::pool::{Barrier, Pool};

/// Runs graphs on a fixed number of threads.
pub struct Executor {
    pool: Pool,
    barrier: Barrier,
    /// Scratch shared by all threads (u64 words for alignment).
    shared: Vec<u64>,
    /// Per-thread scratch, `local_len` f32 words per thread.
    local: Vec<f32>,
    local_len: usize,
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
// uses its own `local` slice and the ops split the shared part between threads (see `Ctx`).
unsafe impl Sync for Scratch {}

impl Executor {
    /// An executor with `n_threads` threads (at least one), created once and reused.
    pub fn new(n_threads: usize) -> Executor {
        let pool = Pool::new(n_threads);
        let barrier = Barrier::new(pool.n_threads());
        Executor { pool, barrier, shared: Vec::new(), local: Vec::new(), local_len: 0 }
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
        let scratch = Scratch {
            shared: self.shared.as_mut_ptr() as *mut u8,
            shared_len: self.shared.len() * 8,
            local: self.local.as_mut_ptr(),
            local_len: self.local_len,
        };
        let errors = ErrorSink::new();
        let barrier = &self.barrier;
        let job = |ith: usize| {
            let s = scratch;
            // SAFETY: thread `ith < nth` owns local words `[ith * local_len, (ith + 1) * local_len)`,
            // inside the executor's `local` vector, which lives until `Pool::run` returns.
            let local =
                unsafe { std::slice::from_raw_parts_mut(s.local.add(ith * s.local_len), s.local_len) };
            // SAFETY: the shared scratch is valid for `shared_len` bytes for the whole run; the ops
            // write disjoint parts of it per thread within a phase.
            let mut ctx = unsafe { Ctx::new(ith, nth, s.shared, s.shared_len, local, &errors) };
            for (i, plan) in &graph.plans {
                let node = &graph.nodes[*i];
                for phase in 0..plan.phases {
                    let r = catch_unwind(AssertUnwindSafe(|| ops::run(node, plan, phase, &mut ctx)));
                    if r.is_err() {
                        errors.report(Error::Shape {
                            op: node.op,
                            detail: "kernel fault (internal check failed)".into(),
                        });
                    }
                    barrier.wait();
                }
            }
        };
        self.pool.run(&job);
        match errors.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
