//! Executable graphs: nodes over raw tensor memory, validated once, run by an [`Executor`].
//!
//! This is the API the daemon and the model engine build on. The executor behind it (thread pool,
//! per-op work splitting, every op) lives in the ops modules.

use crate::error::{Error, Result};
use crate::op::{flags, GgmlOp};
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
}

// SAFETY: a Graph only holds addresses; the contract of `Graph::new` makes the caller responsible for
// the memory behind them, including that no one else touches it while the graph runs.
unsafe impl Send for Graph {}

impl Graph {
    /// Validates every node that will run.
    ///
    /// # Safety
    /// For every tensor of every node, `[data, data + layout.nbytes())` must be valid for reads and
    /// writes for as long as the graph exists, and nothing else may access that memory while
    /// [`Executor::compute`] runs the graph.
    pub unsafe fn new(nodes: Vec<Node>) -> Result<Graph> {
        for n in nodes.iter().filter(|n| n.runs()) {
            validate(n)?;
        }
        Ok(Graph { nodes })
    }

    /// The nodes, in execution order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }
}

fn validate(n: &Node) -> Result<()> {
    match n.op {
        GgmlOp::Add => {
            let (Some(a), Some(b)) = (n.src[0], n.src[1]) else {
                return Err(Error::Shape { op: n.op, detail: "missing source".into() });
            };
            if !(a.layout.is_contiguous() && b.layout.is_contiguous() && n.dst.layout.is_contiguous())
                || a.layout.ne != b.layout.ne
                || a.layout.ne != n.dst.layout.ne
                || [a, b, n.dst].iter().any(|t| t.layout.dtype != crate::GgmlType::F32)
            {
                return Err(Error::UnsupportedTypes { op: n.op, detail: "interim executor: f32 same shape only".into() });
            }
            Ok(())
        }
        op => Err(Error::UnsupportedOp { op, detail: "not implemented yet".into() }),
    }
}

/// Runs graphs on a fixed number of threads.
pub struct Executor {
    n_threads: usize,
}

impl Executor {
    /// An executor with `n_threads` threads (at least one).
    pub fn new(n_threads: usize) -> Executor {
        Executor { n_threads: n_threads.max(1) }
    }

    /// Number of threads.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs every node of `graph` that has the COMPUTE flag, in order.
    pub fn compute(&mut self, graph: &Graph) -> Result<()> {
        for n in graph.nodes().iter().filter(|n| n.runs()) {
            let (Some(a), Some(b)) = (n.src[0], n.src[1]) else { continue };
            let count = a.layout.nelements().unwrap_or(0) as usize;
            for i in 0..count {
                // SAFETY: validated contiguous f32 tensors of `count` elements; memory per Graph::new.
                unsafe {
                    let x = (a.data as *const f32).add(i).read_unaligned();
                    let y = (b.data as *const f32).add(i).read_unaligned();
                    (n.dst.data as *mut f32).add(i).write_unaligned(x + y);
                }
            }
        }
        Ok(())
    }
}
