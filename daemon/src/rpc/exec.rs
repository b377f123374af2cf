//! Graph reconstruction and execution: a validated [`GraphBlob`] becomes a `compute::graph::Graph`
//! whose every tensor lies inside a live buffer of the connection, run on the process-wide executor
//! off the async runtime.
//!
//! ref: ggml-rpc-protocol.md §8.3 (reconstruction), §14 items 3, 5, 10–16, §16.5–6. The build is
//! iterative (no recursion on `src` chains) and refuses cycles, duplicate or missing ids, storage-less
//! tensors of executed nodes, inconsistent views and ops it must never run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use compute::graph::{Executor, Graph, Interleaved, Node, Tensor};
use compute::quant::interleave::SERVE_MAX_COLS;
use compute::{GgmlOp, Layout};
use llamad_proto::{GraphBlob, RpcTensor};

use crate::error::{refuse, Error, Result};
use crate::rpc::buffer::Buffer;
use crate::rpc::weight_copy::WeightCopy;

/// A graph ready to run, holding the buffers it points into so they outlive any run.
pub struct StoredGraph {
    // A Mutex makes the stored graph shareable (`Graph` is Send, not Sync); runs are serialised anyway.
    graph: Mutex<Graph>,
    _buffers: Vec<Arc<Buffer>>,
    /// Interleaved weight copies the graph reads, with the buffer each was made from.
    copies: Vec<(Arc<Buffer>, Arc<WeightCopy>)>,
    /// What the graph writes: each executed node's destination (buffer, offset, bytes).
    writes: Vec<(Arc<Buffer>, u64, u64)>,
    /// Nodes sent by the peer.
    pub n_nodes: usize,
    /// Nodes that will be evaluated.
    pub n_run: usize,
}

impl StoredGraph {
    /// Runs the graph on `executor` on the calling thread (the server calls it from [`run`]; the
    /// fuzz targets call it directly).
    pub fn run_blocking(&self, executor: &SharedExecutor) -> Result<()> {
        let mut ex = executor.lock().map_err(|_| Error::Refused("compute executor poisoned".into()))?;
        let g = self.graph.lock().map_err(|_| Error::Refused("stored graph poisoned".into()))?;
        for (buf, c) in &self.copies {
            // SAFETY: the session runs one command at a time and awaits this run, so nothing writes
            // the buffer meanwhile, and no other graph runs (the executor is held).
            unsafe { c.refresh(buf) };
        }
        let r = ex.compute(&g);
        // Whatever ran (even a failed run may have written some), copies of those bytes are stale.
        for (buf, off, len) in &self.writes {
            buf.invalidate(*off, *len);
        }
        r?;
        Ok(())
    }
}

/// Where a table entry's bytes live.
#[derive(Clone)]
struct Placed {
    layout: Layout,
    nbytes: u64,
    /// The buffer and the offset of `data` in it; `None` for tensors not on this server.
    storage: Option<(Arc<Buffer>, u64)>,
}

/// The process-wide executor, used by one graph at a time.
pub type SharedExecutor = Arc<Mutex<Executor>>;

/// Builds the graph of `blob` against this connection's `buffers`; with `interleave` (the threads
/// that may make copies), MUL_MAT nodes whose weights qualify read interleaved copies of them (see
/// [`crate::rpc::weight_copy`]).
///
/// The caller must hold the connection's buffers exclusively (no graph running, one command at a
/// time): new weight copies read the buffers.
pub fn build(
    blob: &GraphBlob,
    buffers: &HashMap<u64, Arc<Buffer>>,
    interleave: Option<usize>,
) -> Result<StoredGraph> {
    let table = &blob.tensors;
    // 1. Index the table; id 0 and duplicates are refused (§14 item 15).
    let mut index: HashMap<u64, usize> = HashMap::with_capacity(table.len());
    for (i, t) in table.iter().enumerate() {
        if t.id == 0 {
            refuse!("graph: tensor table entry {i} has id 0");
        }
        if index.insert(t.id, i).is_some() {
            refuse!("graph: duplicate tensor id {:#x} in the table", t.id);
        }
        // A leaf (op NONE) has no sources in ggml; one that names some is malformed, and refusing it
        // here keeps a deep chain of them from being walked at all.
        if t.op == 0 && t.src.iter().any(|&s| s != 0) {
            refuse!("graph: tensor {:#x} ({}) has op NONE but names sources", t.id, t.name_str());
        }
    }
    let lookup = |id: u64, what: &str| -> Result<usize> {
        match index.get(&id) {
            Some(&i) => Ok(i),
            None => Err(Error::Refused(format!("graph: {what} id {id:#x} is not in the tensor table"))),
        }
    };
    // 2. Node ids: non-zero, present, each once (§14 item 13).
    let mut node_idx = Vec::with_capacity(blob.nodes.len());
    let mut seen_node = vec![false; table.len()];
    for &id in &blob.nodes {
        if id == 0 {
            refuse!("graph: node id 0");
        }
        let i = lookup(id, "node")?;
        if std::mem::replace(&mut seen_node[i], true) {
            refuse!("graph: node id {id:#x} listed twice");
        }
        node_idx.push(i);
    }
    // 3. Iterative depth-first walk over src[] and view_src from every node: marks what is
    //    reachable and refuses cycles (§14 item 14). 0 = unvisited, 1 = on the stack, 2 = done.
    let mut state = vec![0u8; table.len()];
    let mut stack: Vec<(usize, usize)> = Vec::new();
    for &root in &node_idx {
        if state[root] == 2 {
            continue;
        }
        state[root] = 1;
        stack.push((root, 0));
        while let Some(&mut (cur, ref mut next)) = stack.last_mut() {
            let links = links(&table[cur]);
            if *next < links.len() {
                let (k, child_id) = (*next, links[*next]);
                *next += 1;
                // ggml_cast names its CPY node as its own destination (src[1] = itself), which the
                // walk passes over; any other self-reference is a cycle.
                let cast = k == 1 && child_id == table[cur].id && table[cur].op == GgmlOp::Cpy as u32;
                if child_id == 0 || cast {
                    continue;
                }
                let child = lookup(child_id, "source")?;
                match state[child] {
                    0 => {
                        state[child] = 1;
                        stack.push((child, 0));
                    }
                    1 => refuse!("graph: cycle through tensor id {child_id:#x}"),
                    _ => {}
                }
            } else {
                state[cur] = 2;
                stack.pop();
            }
        }
    }
    // 4. Validate and place every reachable tensor (§4.4, §14 items 1, 3, 6–8, 12).
    let mut placed: Vec<Option<Placed>> = vec![None; table.len()];
    for (i, t) in table.iter().enumerate() {
        if state[i] == 2 {
            placed[i] = Some(place(t, buffers)?);
        }
    }
    let get = |i: usize| -> Result<&Placed> {
        placed[i].as_ref().ok_or_else(|| Error::Refused("graph: internal: tensor not placed".into()))
    };
    // 5. Views must point where their view_src says and stay inside it (§14 item 15).
    for (i, t) in table.iter().enumerate() {
        if state[i] != 2 || t.view_src == 0 {
            continue;
        }
        let v = get(i)?;
        let s = get(lookup(t.view_src, "view_src")?)?;
        match (&v.storage, &s.storage) {
            (None, None) => {}
            (Some((vb, voff)), Some((sb, soff))) => {
                let want = soff.checked_add(t.view_offs);
                let v_end = voff.checked_add(v.nbytes);
                let s_end = soff.checked_add(s.nbytes);
                if !Arc::ptr_eq(vb, sb)
                    || want != Some(*voff)
                    || v_end.is_none()
                    || s_end.is_none()
                    || v_end > s_end
                {
                    refuse!(
                        "graph: view {:#x} ({}) does not lie at view_src {:#x} + {} inside it",
                        t.id,
                        t.name_str(),
                        t.view_src,
                        t.view_offs
                    );
                }
            }
            _ => refuse!("graph: view {:#x} and its view_src {:#x} disagree on storage", t.id, t.view_src),
        }
    }
    // 6. Nodes that run need storage for themselves and every source (§14 item 3), and an op we may run.
    let mut nodes = Vec::new();
    let mut keep: Vec<Arc<Buffer>> = Vec::new();
    let mut writes: Vec<(Arc<Buffer>, u64, u64)> = Vec::new();
    // MUL_MAT weights that may be read interleaved: (node position, buffer, offset, layout).
    let mut weights: Vec<(usize, Arc<Buffer>, u64, Layout)> = Vec::new();
    for &i in &node_idx {
        let t = &table[i];
        let op = t.ggml_op().map_err(|e| Error::Refused(format!("graph: {e}")))?;
        let node_runs = t.flags & compute::op::flags::COMPUTE != 0 && !op.is_view();
        if !node_runs {
            continue;
        }
        check_sub_op(t, op)?;
        let dst = tensor_of(t, get(i)?, &mut keep)?;
        if let Some((b, off)) = &get(i)?.storage {
            writes.push((b.clone(), *off, get(i)?.nbytes));
        }
        let mut src: [Option<Tensor>; compute::graph::MAX_SRC] = [None; compute::graph::MAX_SRC];
        for (j, &sid) in t.src.iter().enumerate() {
            if sid == 0 {
                continue;
            }
            let si = lookup(sid, "source")?;
            src[j] = Some(tensor_of(&table[si], get(si)?, &mut keep)?);
        }
        // Only generation-shaped products (up to 8 activation rows: one sequence, or the parallel
        // slots of a batched master) read a copy.
        let generation = src[1].is_some_and(|b| b.layout.ne[1] <= SERVE_MAX_COLS as u64);
        if let (true, GgmlOp::MulMat, true, true) = (interleave.is_some(), op, generation, src[0].is_some()) {
            let p = get(lookup(t.src[0], "source")?)?;
            if let Some((b, off)) = &p.storage {
                weights.push((nodes.len(), b.clone(), *off, p.layout));
            }
        }
        nodes.push(Node { op, op_params: t.op_params, flags: t.flags, dst, src });
    }
    // Weights this graph also writes are read from their rows (they change while it runs).
    let mut interleaved: Vec<Option<Interleaved>> = Vec::new();
    let mut copies = Vec::new();
    for (pos, buf, off, layout) in weights {
        let len = layout.nbytes().unwrap_or(u64::MAX);
        let written = writes.iter().any(|(b, o, n)| {
            Arc::ptr_eq(b, &buf) && *n > 0 && *o < off.saturating_add(len) && off < o.saturating_add(*n)
        });
        if written {
            continue;
        }
        // SAFETY: the caller holds the buffers exclusively (this function's contract).
        if let Some(c) = unsafe { buf.weight_copy(off, layout, interleave.unwrap_or(1)) } {
            interleaved.resize(nodes.len(), None);
            interleaved[pos] = Some(c.interleaved());
            copies.push((buf, c));
        }
    }
    keep.sort_by_key(|b| b.handle());
    keep.dedup_by_key(|b| b.handle());
    let n_run = nodes.len();
    let first_ops: Vec<&str> = nodes.iter().map(|n| n.op.name()).collect();
    // SAFETY: every tensor of every node passed here resolves to `[data, data + nbytes)` inside a
    // live buffer of this connection (checked by `place` and `tensor_of`); the buffers are kept alive
    // by `keep`, stored next to the graph; and the session never touches buffer memory while the
    // graph runs (it awaits every run before the next command). Each interleaved copy is owned by a
    // buffer and held by `copies`, stored next to the graph; it is only written by `refresh`, before
    // a run, from the very bytes its node's src0 holds.
    let graph = unsafe { Graph::with_interleaved(nodes, &interleaved) }.map_err(|e| {
        Error::Refused(format!(
            "graph: compute refused it ({} runnable ops: {}): {e}",
            n_run,
            summarize(&first_ops)
        ))
    })?;
    Ok(StoredGraph {
        graph: Mutex::new(graph),
        _buffers: keep,
        copies,
        writes,
        n_nodes: blob.nodes.len(),
        n_run,
    })
}

fn summarize(ops: &[&str]) -> String {
    let mut v: Vec<&str> = ops.to_vec();
    v.sort_unstable();
    v.dedup();
    v.join(",")
}

/// UNARY and GLU name their sub-operation in `op_params[0]`; unknown values are refused (ref: §16.6).
fn check_sub_op(t: &RpcTensor, op: GgmlOp) -> Result<()> {
    let sub = t.op_params[0];
    let known = match op {
        GgmlOp::Unary => compute::op::UnaryOp::from_i32(sub).is_some(),
        GgmlOp::Glu => compute::op::GluOp::from_i32(sub).is_some(),
        _ => true,
    };
    if !known {
        refuse!("graph: tensor {:#x} ({}): unknown {} sub-op {sub}", t.id, t.name_str(), op);
    }
    Ok(())
}

/// `src[0..9]` then `view_src`: the links the reference follows.
fn links(t: &RpcTensor) -> [u64; 11] {
    let mut l = [0u64; 11];
    l[..10].copy_from_slice(&t.src);
    l[10] = t.view_src;
    l
}

/// Validates a table entry and finds its storage.
fn place(t: &RpcTensor, buffers: &HashMap<u64, Arc<Buffer>>) -> Result<Placed> {
    let what = || format!("graph: tensor {:#x} ({})", t.id, t.name_str());
    let op = t.ggml_op().map_err(|e| Error::Refused(format!("{}: {e}", what())))?;
    if op.carries_function_pointer() {
        refuse!("{}: op {} carries host function pointers", what(), op);
    }
    let layout = t.layout().map_err(|e| Error::Refused(format!("{}: {e}", what())))?;
    let nbytes = layout.nbytes().ok_or_else(|| Error::Refused(format!("{}: extent overflows", what())))?;
    // An unknown handle counts as no buffer (ref: §4.4 step 4); then data must be 0 (§14 item 3).
    let storage = match buffers.get(&t.buffer) {
        Some(b) if t.buffer != 0 => {
            let Some(off) = b.offset_of(t.data, nbytes) else {
                refuse!("{}: data {:#x} + {nbytes} bytes leaves its buffer", what(), t.data);
            };
            Some((b.clone(), off))
        }
        _ => {
            if t.data != 0 {
                refuse!("{}: data {:#x} without a buffer of this connection", what(), t.data);
            }
            None
        }
    };
    Ok(Placed { layout, nbytes, storage })
}

fn tensor_of(t: &RpcTensor, p: &Placed, keep: &mut Vec<Arc<Buffer>>) -> Result<Tensor> {
    let Some((buf, off)) = &p.storage else {
        refuse!(
            "graph: tensor {:#x} ({}) is used by a computed node but has no storage here",
            t.id,
            t.name_str()
        );
    };
    let Some(data) = buf.addr(*off) else {
        refuse!("graph: tensor {:#x} offset outside its buffer", t.id);
    };
    keep.push(buf.clone());
    Ok(Tensor { layout: p.layout, data })
}

/// Runs `graph` on the shared executor; the caller awaits the result before reading its next
/// command.
pub async fn run(executor: SharedExecutor, graph: Arc<StoredGraph>) -> Result<()> {
    blocking(move || graph.run_blocking(&executor)).await
}

/// Runs blocking work for a connection. On the daemon's multi-thread runtime it runs in place on
/// the connection's thread (`block_in_place`: the runtime hands this thread's other tasks to
/// another worker), which saves the two cross-thread wake-ups of a `spawn_blocking` round trip:
/// a row-split master sends 61 small graphs per token, where those wake-ups cost more than the
/// compute. Elsewhere (a current-thread runtime in tests) it goes to the blocking pool.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    use tokio::runtime::{Handle, RuntimeFlavor};
    if Handle::current().runtime_flavor() == RuntimeFlavor::MultiThread {
        return tokio::task::block_in_place(f);
    }
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(Error::Refused(format!("compute task failed: {e}"))),
    }
}
