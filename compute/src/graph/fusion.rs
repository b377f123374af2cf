//! Graph-level facts a node's plan may use beyond its own tensors.
//!
//! Attention without flash attention is `KQ = MUL_MAT(K, Q)` followed by `SOFT_MAX(KQ, mask)`.
//! Where the mask holds -inf the softmax gives exactly 0 whatever KQ holds there, as long as it is
//! finite, so the product need not compute those elements: a causal mask hides about half of them
//! in a prompt. The product may only write 0 there instead if nothing else sees KQ, which is the
//! rule ggml's own backends apply before fusing nodes: KQ is not a graph output, the softmax is its
//! only reader, and the mask does not change between the two.

use super::schedule::{extent, overlaps};
use super::{Node, Tensor};
use crate::op::{flags, GgmlOp};

/// For each node, the mask of the softmax that alone reads its result, when the node is a
/// MUL_MAT that may skip the elements the mask hides (see the module documentation).
pub(crate) fn masked_products(nodes: &[Node]) -> Vec<Option<Tensor>> {
    masked_products_within(
        nodes,
        SCAN_BUDGET_BASE.saturating_add(SCAN_BUDGET_PER_NODE.saturating_mul(nodes.len())),
    )
}

/// Node visits [`masked_products`] may spend: a peer's graph of many softmaxes must not make the
/// scans quadratic. A llama graph spends about one pass over the graph per layer (SmolLM2: 30
/// softmaxes over 900 nodes).
const SCAN_BUDGET_BASE: usize = 100_000;
const SCAN_BUDGET_PER_NODE: usize = 8;
/// Most separate written ranges [`dead_after`] tracks before it gives up (and the product is
/// computed in full).
const MAX_WRITTEN_RANGES: usize = 64;

/// [`masked_products`] with at most `budget` node visits; once it is spent, the remaining products
/// are computed in full.
fn masked_products_within(nodes: &[Node], mut budget: usize) -> Vec<Option<Tensor>> {
    let mut out = vec![None; nodes.len()];
    for (s, sm) in nodes.iter().enumerate() {
        if sm.op != GgmlOp::SoftMax || !sm.runs() {
            continue;
        }
        let (Some(kq), Some(mask)) = (sm.src[0], sm.src[1]) else { continue };
        let (Some(kx), Some(mx)) = (extent(&kq), extent(&mask)) else { continue };
        // The last node before the softmax that touches KQ's bytes must be the product writing
        // exactly KQ, and nothing between the two may write the mask.
        let Some(back) = nodes[..s].iter().rev().take(budget).position(|n| n.runs() && touches(n, kx)) else {
            return out;
        };
        budget -= back + 1;
        let i = s - 1 - back;
        let p = &nodes[i];
        if p.op != GgmlOp::MulMat || p.dst != kq || p.flags & flags::OUTPUT != 0 || overlaps(kx, mx) {
            continue;
        }
        // Every node between was visited above already.
        if nodes[i + 1..s].iter().any(|n| n.runs() && writes(n, mx)) {
            continue;
        }
        match dead_after(&nodes[s + 1..], kx, extent(&sm.dst), &mut budget) {
            Some(true) => out[i] = Some(mask),
            Some(false) => {}
            None => return out,
        }
    }
    out
}

/// Whether the running node `n` reads or writes bytes of `x`.
fn touches(n: &Node, x: (usize, usize)) -> bool {
    writes(n, x) || n.src.iter().flatten().filter_map(extent).any(|r| overlaps(r, x))
}

fn writes(n: &Node, x: (usize, usize)) -> bool {
    extent(&n.dst).is_some_and(|d| overlaps(d, x))
}

/// Whether no node of `rest` reads bytes of `x` before they are written again (a reuse of the
/// memory: the reader sees the new bytes); `first` was written just before `rest` (the softmax's
/// destination, which ggml's allocator often places over its source). Each node visited costs one
/// of `budget`; `None` when it runs out. Too many separate rewritten parts count as a read.
fn dead_after(
    rest: &[Node],
    x: (usize, usize),
    first: Option<(usize, usize)>,
    budget: &mut usize,
) -> Option<bool> {
    // The parts of `x` written since, as sorted disjoint ranges.
    let mut written: Vec<(usize, usize)> = Vec::new();
    if let Some(part) = first.and_then(|d| clip(d, x)) {
        add(&mut written, part);
    }
    for n in rest {
        *budget = budget.checked_sub(1)?;
        if !n.runs() {
            continue;
        }
        if n.src.iter().flatten().filter_map(extent).filter_map(|r| clip(r, x)).any(|p| !covered(&written, p))
        {
            return Some(false);
        }
        if let Some(part) = extent(&n.dst).and_then(|d| clip(d, x)) {
            if written.len() >= MAX_WRITTEN_RANGES {
                return Some(false);
            }
            add(&mut written, part);
            if covered(&written, x) {
                return Some(true);
            }
        }
    }
    Some(true)
}

/// The part of `r` inside `x`, `None` when they do not overlap.
fn clip(r: (usize, usize), x: (usize, usize)) -> Option<(usize, usize)> {
    let part = (r.0.max(x.0), r.1.min(x.1));
    (part.0 < part.1).then_some(part)
}

/// Whether the sorted disjoint ranges `set` cover `r`.
fn covered(set: &[(usize, usize)], r: (usize, usize)) -> bool {
    set.iter().any(|&(a, b)| a <= r.0 && r.1 <= b)
}

/// Adds `r` to the sorted disjoint ranges `set`, merging what touches it.
fn add(set: &mut Vec<(usize, usize)>, r: (usize, usize)) {
    let (mut a, mut b) = r;
    set.retain(|&(s, e)| {
        let apart = e < a || b < s;
        if !apart {
            a = a.min(s);
            b = b.max(e);
        }
        apart
    });
    let at = set.partition_point(|&(s, _)| s < a);
    set.insert(at, (a, b));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::GgmlType;
    use crate::graph::MAX_SRC;
    use crate::tensor::Layout;

    /// A tensor of `n` f32 at the (never dereferenced) address `at`.
    fn t(at: usize, n: u64) -> Tensor {
        Tensor { layout: Layout::contiguous(GgmlType::F32, [n, 1, 1, 1]).unwrap(), data: at as *mut u8 }
    }

    fn node(op: GgmlOp, dst: Tensor, srcs: &[Tensor]) -> Node {
        let mut src = [None; MAX_SRC];
        for (s, v) in src.iter_mut().zip(srcs) {
            *s = Some(*v);
        }
        Node { op, op_params: [0; 16], flags: flags::COMPUTE, dst, src }
    }

    const K: usize = 0x1000;
    const Q: usize = 0x2000;
    const KQ: usize = 0x10000;
    const MASK: usize = 0x20000;
    const SM: usize = 0x30000;
    const OUT: usize = 0x40000;

    /// `[product, softmax, rest...]`: whether the product may skip.
    fn fused(sm_dst: Tensor, rest: &[Node], product_flags: i32) -> bool {
        let mut p = node(GgmlOp::MulMat, t(KQ, 256), &[t(K, 64), t(Q, 64)]);
        p.flags |= product_flags;
        let mut nodes = vec![p, node(GgmlOp::SoftMax, sm_dst, &[t(KQ, 256), t(MASK, 256)])];
        nodes.extend_from_slice(rest);
        masked_products(&nodes)[0].is_some()
    }

    #[test]
    fn a_product_skips_only_when_the_softmax_alone_reads_it() {
        let sm = t(SM, 256);
        let read = |at: usize, n: u64| node(GgmlOp::Cpy, t(OUT, n), &[t(at, n)]);
        let write = |at: usize, n: u64| node(GgmlOp::Cpy, t(at, n), &[t(OUT, n)]);
        assert!(fused(sm, &[], 0), "nothing else reads it");
        assert!(!fused(sm, &[], flags::OUTPUT), "a graph output");
        assert!(!fused(sm, &[read(KQ + 512, 4)], 0), "read again");
        // The softmax in place (ggml's allocator does that): its readers read the softmax.
        assert!(fused(t(KQ, 256), &[read(KQ, 256)], 0), "in place");
        // Memory reused: a part written, then read, is new data; a part not written is KQ.
        assert!(fused(sm, &[write(KQ, 16), read(KQ, 16)], 0), "reused part read");
        assert!(!fused(sm, &[write(KQ, 16), read(KQ, 32)], 0), "beyond the reused part");
        assert!(fused(sm, &[write(KQ, 256), read(KQ, 256)], 0), "rewritten whole");
        // The mask changed between the product and the softmax.
        let p = node(GgmlOp::MulMat, t(KQ, 256), &[t(K, 64), t(Q, 64)]);
        let nodes = vec![p, write(MASK, 8), node(GgmlOp::SoftMax, sm, &[t(KQ, 256), t(MASK, 256)])];
        assert!(masked_products(&nodes)[0].is_none(), "mask written in between");
        // Something else wrote KQ after the product.
        let nodes = vec![
            node(GgmlOp::MulMat, t(KQ, 256), &[t(K, 64), t(Q, 64)]),
            write(KQ, 8),
            node(GgmlOp::SoftMax, sm, &[t(KQ, 256), t(MASK, 256)]),
        ];
        assert!(masked_products(&nodes).iter().all(Option::is_none), "KQ written in between");
        // Not a product: nothing to skip.
        let nodes = vec![
            node(GgmlOp::Add, t(KQ, 256), &[t(K, 256), t(Q, 256)]),
            node(GgmlOp::SoftMax, sm, &[t(KQ, 256), t(MASK, 256)]),
        ];
        assert!(masked_products(&nodes).iter().all(Option::is_none), "an ADD");
    }

    #[test]
    fn written_ranges_merge_and_cover() {
        let mut w = Vec::new();
        add(&mut w, (10, 20));
        add(&mut w, (30, 40));
        assert!(covered(&w, (12, 18)) && !covered(&w, (15, 35)));
        add(&mut w, (20, 30));
        assert_eq!(w, vec![(10, 40)]);
        assert!(covered(&w, (15, 35)));
        add(&mut w, (0, 5));
        add(&mut w, (45, 50));
        assert_eq!(w, vec![(0, 5), (10, 40), (45, 50)]);
        assert!(!covered(&w, (4, 11)));
    }

    #[test]
    fn the_scans_stop_when_their_budget_is_spent() {
        // Many softmaxes over one product: each scan goes back to it; a small budget fuses
        // nothing, an ample one the product.
        let mut nodes = vec![node(GgmlOp::MulMat, t(KQ, 256), &[t(K, 64), t(Q, 64)])];
        for i in 0..50 {
            nodes.push(node(GgmlOp::Cpy, t(OUT + 0x1000 * i, 4), &[t(K, 4)]));
        }
        nodes.push(node(GgmlOp::SoftMax, t(SM, 256), &[t(KQ, 256), t(MASK, 256)]));
        nodes.push(node(GgmlOp::Cpy, t(OUT, 4), &[t(SM, 4)]));
        assert!(masked_products_within(&nodes, 1000)[0].is_some());
        assert!(masked_products_within(&nodes, 50)[0].is_none(), "the product is 51 nodes back");
        assert!(masked_products_within(&nodes, 51)[0].is_none(), "nothing left for the forward scan");
        assert!(masked_products_within(&nodes, 52)[0].is_some());
        // The default budget of a huge graph stays linear in its size and still fuses here.
        assert!(masked_products(&nodes)[0].is_some());
    }
}
