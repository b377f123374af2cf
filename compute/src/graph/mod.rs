//! Executable graphs: nodes over raw tensor memory, validated once, run by an [`Executor`].
//!
//! This is the API the daemon and the model engine build on. [`Graph::new`] validates and plans
//! every node that will run (`crate::ops`); [`Executor`] runs a graph on a persistent thread pool
//! (`crate::pool`): each node's phases are cut into units of work that the threads claim, and a
//! step starts only when the previous one is complete. A step is one phase of one node, or the
//! phases of several nodes that touch disjoint memory (a generation step's Q, K and V products all
//! read the normed input and write their own outputs): [`schedule`] puts each phase in the first
//! step after every phase it depends on, so the threads wait once for the three instead of three
//! times.
//!
//! Expectations and gotchas for callers:
//! - `Graph::new` is the security boundary. It refuses (`UnsupportedOp`, `UnsupportedTypes`,
//!   `Shape`, `Layout`) anything a kernel could not run inside the tensors' own extents, including
//!   destinations that overlap a source (except the exact in-place aliasing ggml-alloc produces for
//!   row-wise ops) and destinations whose elements overlap each other. Nodes without the COMPUTE
//!   flag and view ops are not validated and never run.
//! - Indices read from tensor data (GET_ROWS/SET_ROWS rows, MUL_MAT_ID/ADD_ID expert ids) are
//!   checked while the graph runs: a bad one skips its row, the rest of the graph still runs, and
//!   `compute` returns `IndexOutOfRange` at the end. A kernel that trips an internal check reports
//!   `Shape` ("kernel fault") instead of crashing the process.
//! - A `Graph` may be computed any number of times (new input data each time); nothing is
//!   re-validated and, once the executor's scratch has grown to the graph's needs, nothing is
//!   allocated. `Graph::scratch_bytes` tells how much scratch that is.
//! - Results do not depend on the thread count (each output element is computed by one unit with
//!   the same arithmetic), so 1-thread and N-thread runs are bit-identical.

mod exec;
mod fusion;
mod schedule;

pub use exec::Executor;

use crate::error::Result;
use crate::op::{flags, GgmlOp};
use crate::ops::{self, Plan};
use crate::tensor::Layout;

/// Maximum number of sources of a node (`GGML_MAX_SRC`).
pub const MAX_SRC: usize = 10;

/// A tensor the executor reads or writes: a layout and the address of element 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// Type, shape and strides.
    pub layout: Layout,
    /// Address of element (0, 0, 0, 0).
    pub data: *mut u8,
}

/// An interleaved copy of a MUL_MAT node's weights (see [`crate::quant::interleave`]): generation
/// steps (one or two activation rows) read it instead of the weight rows, with the same results.
#[derive(Clone, Copy, Debug)]
pub struct Interleaved {
    /// Address of the copy.
    pub data: *const u8,
    /// Its length in bytes.
    pub len: usize,
}

/// What the backend that built a graph knows about a MUL_MAT node's weights (src0).
#[derive(Clone, Copy, Debug, Default)]
pub struct WeightHint {
    /// An interleaved copy of the weights, for generation steps.
    pub interleaved: Option<Interleaved>,
    /// The weights are a model's own matrix computed in-process: where llama.cpp's CPU backend
    /// would repack them on its local CPU, the product follows that order
    /// ([`crate::quant::local`]) instead of the RPC server's.
    pub local: bool,
}

/// One node: an op, its parameters, its destination and its sources.
#[derive(Clone, Debug)]
pub struct Node {
    /// The op.
    pub op: GgmlOp,
    /// Raw op parameters (floats stored bit-wise).
    pub op_params: [i32; 16],
    /// Tensor flags; nodes without [`flags::COMPUTE`] are not evaluated.
    pub flags: i32,
    /// The node's own tensor (where the result goes).
    pub dst: Tensor,
    /// Sources, `None` when absent.
    pub src: [Option<Tensor>; MAX_SRC],
}

impl Node {
    /// True if the executor will evaluate this node.
    pub fn runs(&self) -> bool {
        self.flags & flags::COMPUTE != 0 && !self.op.is_view()
    }
}

/// A validated graph.
pub struct Graph {
    nodes: Vec<Node>,
    /// `(node index, plan)` for every node that runs, in order.
    plans: Vec<(usize, Plan)>,
    /// The phases of `plans` grouped into steps, in execution order.
    steps: Vec<schedule::Step>,
    /// Per plan: where its shared scratch starts.
    shared_off: Vec<usize>,
    /// Shared scratch the steps need, in bytes.
    shared_bytes: usize,
    /// Largest per-thread scratch any node needs, in f32 words.
    local_f32: usize,
}

// SAFETY: a Graph only holds addresses; the contract of `Graph::new` makes the caller responsible for
// the memory behind them, including that no one else touches it while the graph runs.
unsafe impl Send for Graph {}
// SAFETY: computing needs `&mut Executor`; a shared `&Graph` only exposes the nodes' metadata.
unsafe impl Sync for Graph {}

impl Graph {
    /// Validates every node that will run and plans its scratch memory.
    ///
    /// Fails with `UnsupportedOp` / `UnsupportedTypes` for ops or operand types this backend does
    /// not implement, and with `Shape` / `Layout` for shapes, strides or op_params that break the
    /// op's rules (ref: ggml-rpc-protocol.md §14 items 7–12).
    ///
    /// # Safety
    /// For every tensor of every node, `[data, data + layout.nbytes())` must be valid for reads and
    /// writes for as long as the graph exists, and nothing else may access that memory while
    /// [`Executor::compute`] runs the graph.
    pub unsafe fn new(nodes: Vec<Node>) -> Result<Graph> {
        // SAFETY: forwarded contract; no interleaved copies.
        unsafe { Graph::with_interleaved(nodes, &[]) }
    }

    /// As [`Graph::new`], with interleaved copies of weights: `interleaved[i]` belongs to node `i`
    /// (a MUL_MAT whose src0 it interleaves; nodes past the slice's end have none). A copy is used
    /// where the node's shapes and kernels allow it and ignored elsewhere.
    ///
    /// # Safety
    /// As [`Graph::new`]; besides, every copy's `[data, data + len)` must stay valid for reads for
    /// as long as the graph exists, and nothing may write it while [`Executor::compute`] runs the
    /// graph. A copy that does not hold
    /// `interleave::interleave` of its node's src0 gives wrong results, never an access outside it.
    pub unsafe fn with_interleaved(nodes: Vec<Node>, interleaved: &[Option<Interleaved>]) -> Result<Graph> {
        let hints: Vec<WeightHint> =
            interleaved.iter().map(|&interleaved| WeightHint { interleaved, local: false }).collect();
        // SAFETY: forwarded contract.
        unsafe { Graph::with_weight_hints(nodes, &hints) }
    }

    /// As [`Graph::with_interleaved`], with what the backend knows of each MUL_MAT node's weights:
    /// `hints[i]` belongs to node `i` (nodes past the slice's end have none).
    ///
    /// # Safety
    /// As [`Graph::with_interleaved`], for every hint's copy.
    pub unsafe fn with_weight_hints(nodes: Vec<Node>, hints: &[WeightHint]) -> Result<Graph> {
        let mut plans = Vec::new();
        let mut local_f32 = 0usize;
        let masks = fusion::masked_products(&nodes);
        tracing::debug!(
            products = masks.iter().flatten().count(),
            softmaxes = nodes.iter().filter(|n| n.op == GgmlOp::SoftMax).count(),
            "products only a masked softmax reads"
        );
        for (i, n) in nodes.iter().enumerate().filter(|(_, n)| n.runs()) {
            let hint = hints.get(i).copied().unwrap_or_default();
            // SAFETY: forwarded contract of this function; a mask is a source of another node,
            // under the same contract.
            let plan = unsafe { ops::prepare(n, hint, masks[i].as_ref())? };
            local_f32 = local_f32.max(plan.local_f32);
            if plan.phases > 0 {
                plans.push((i, plan));
            }
        }
        let s = schedule::schedule(&nodes, &plans, &masks);
        Ok(Graph {
            nodes,
            plans,
            steps: s.steps,
            shared_off: s.shared_off,
            shared_bytes: s.shared_bytes,
            local_f32,
        })
    }

    /// The nodes, in execution order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// How many steps (waits for all threads) a run takes.
    pub fn steps(&self) -> usize {
        self.steps.len()
    }

    /// How many phases the graph's nodes have in all (the steps a run would take one phase at a
    /// time).
    pub fn phases(&self) -> usize {
        self.plans.iter().map(|(_, p)| p.phases as usize).sum()
    }

    /// Bytes of scratch memory the graph needs besides its tensors (shared + per thread for
    /// `n_threads` threads).
    pub fn scratch_bytes(&self, n_threads: usize) -> usize {
        self.shared_bytes.saturating_add(self.local_f32.saturating_mul(4).saturating_mul(n_threads))
    }
}
