//! Serializes (a part of) an abstract graph into a GRAPH_COMPUTE blob.
//!
//! ref: ggml-rpc-protocol.md §4.3 (how a master fills `rpc_tensor`), §8.2 (the table: every tensor
//! reachable from the nodes through `src[]` and `view_src`, each once, in depth-first post-order:
//! sources 0..9, then the view source, then the tensor), §15 item 31.
//!
//! Ids are the tensor index + 1 (0 means "no tensor"). A tensor's `buffer`/`data` come from the
//! caller's placement of its owner (`None` = not on this server: both 0); a view's address is its
//! owner's plus `view_offs`. Tensors listed in `as_inputs` are sent as leaves (op NONE, no sources,
//! INPUT flag) and are not executed: that is how the token-embedding GET_ROWS stays on the master
//! while the worker's graph starts from the embeddings the master copies in.

use std::collections::HashSet;

use compute::model::{GraphDef, TensorDef, TensorId};
use compute::op::flags;
use compute::GgmlOp;
use llamad_proto::{GraphBlob, RpcTensor};

/// Where a tensor's memory is on the worker: `(buffer handle, address)`.
pub type Place = (u64, u64);

/// The wire id of a tensor.
pub fn wire_id(id: TensorId) -> u64 {
    u64::from(id.0) + 1
}

/// Builds the GRAPH_COMPUTE blob for `device`. `place` is asked for owners (non-views) only.
pub fn export(
    g: &GraphDef,
    as_inputs: &HashSet<TensorId>,
    device: u32,
    place: &dyn Fn(TensorId, &TensorDef) -> Option<Place>,
) -> GraphBlob {
    export_nodes(g, g.nodes(), as_inputs, device, place)
}

/// As [`export`] for the nodes `nodes` of `g` only (one segment of a larger graph).
pub fn export_nodes(
    g: &GraphDef,
    nodes: &[TensorId],
    as_inputs: &HashSet<TensorId>,
    device: u32,
    place: &dyn Fn(TensorId, &TensorDef) -> Option<Place>,
) -> GraphBlob {
    let tensors = g.tensors();
    let is_leaf = |id: TensorId| as_inputs.contains(&id);
    let srcs = |id: TensorId| -> Vec<TensorId> {
        if is_leaf(id) {
            return Vec::new();
        }
        let t = &tensors[id.index()];
        t.src.iter().flatten().copied().chain(t.view_src).collect()
    };
    let nodes: Vec<TensorId> = nodes.iter().copied().filter(|&n| !is_leaf(n)).collect();

    // use_count: uses as a source by the executed nodes (ref: §4.3).
    let mut use_count = vec![0i32; tensors.len()];
    for &n in &nodes {
        for s in tensors[n.index()].src.iter().flatten() {
            use_count[s.index()] += 1;
        }
    }

    // Iterative post-order DFS from every node, in node order.
    let mut seen = vec![false; tensors.len()];
    let mut order = Vec::new();
    for &root in &nodes {
        if seen[root.index()] {
            continue;
        }
        seen[root.index()] = true;
        let mut stack: Vec<(TensorId, usize)> = vec![(root, 0)];
        while let Some(top) = stack.last_mut() {
            let (id, next) = *top;
            let children = srcs(id);
            if let Some(&c) = children.get(next) {
                top.1 += 1;
                if !seen[c.index()] {
                    seen[c.index()] = true;
                    stack.push((c, 0));
                }
            } else {
                order.push(id);
                stack.pop();
            }
        }
    }

    let owner_place = |id: TensorId| -> Option<Place> {
        let t = &tensors[id.index()];
        match t.view_src {
            Some(o) => place(o, &tensors[o.index()]).map(|(b, d)| (b, d + t.view_offs)),
            None => place(id, t),
        }
    };
    let table = order
        .iter()
        .map(|&id| {
            let t = &tensors[id.index()];
            let (buffer, data) = owner_place(id).unwrap_or((0, 0));
            let mut r = RpcTensor::new(wire_id(id), &t.layout, buffer, data).with_name(&t.name);
            r.use_count = use_count[id.index()];
            if is_leaf(id) {
                r.op = GgmlOp::None as u32;
                r.flags = flags::INPUT;
            } else {
                r.op = t.op as u32;
                r.op_params = t.op_params;
                r.flags = t.flags;
                for (d, s) in r.src.iter_mut().zip(t.src.iter()) {
                    *d = s.map_or(0, wire_id);
                }
                r.view_src = t.view_src.map_or(0, wire_id);
                r.view_offs = t.view_offs;
            }
            r
        })
        .collect();
    GraphBlob { device, nodes: nodes.iter().map(|&n| wire_id(n)).collect(), tensors: table }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compute::GgmlType;

    #[test]
    fn post_order_ids_views_and_placement() {
        let mut g = GraphDef::new();
        let w = g.weight("w", GgmlType::F32, [4, 4, 1, 1]).unwrap(); // id 1
        let tok = g.input("tok", GgmlType::I32, [2, 1, 1, 1]).unwrap(); // id 2
        let e = g.get_rows(w, tok).unwrap(); // id 3 (node)
        let x = g.input("x", GgmlType::F32, [4, 2, 1, 1]).unwrap(); // id 4
        let s = g.add(e, x).unwrap(); // id 5
        let v = g.view_1d(s, 4, 16).unwrap(); // id 6, view of s at 16
        let m = g.mul_mat(w, v).unwrap(); // id 7
        g.expand(m);
        let place = |id: TensorId, _t: &TensorDef| -> Option<Place> {
            match id.0 {
                0 => Some((11, 1000)),
                1 => None, // not on this server
                _ => Some((22, 5000 + 64 * u64::from(id.0))),
            }
        };
        let blob = export(&g, &HashSet::new(), 0, &place);
        assert_eq!(blob.nodes, vec![3, 5, 6, 7]);
        let ids: Vec<u64> = blob.tensors.iter().map(|t| t.id).collect();
        // get_rows: w, tok, e; add: x, s; view: v (view_src s already emitted); mul_mat: m.
        assert_eq!(ids, vec![1, 2, 3, 4, 5, 6, 7]);
        let t = |id: u64| blob.tensors.iter().find(|t| t.id == id).unwrap();
        assert_eq!((t(1).buffer, t(1).data), (11, 1000));
        assert_eq!((t(2).buffer, t(2).data), (0, 0));
        assert_eq!(t(6).view_src, 5);
        assert_eq!(t(6).view_offs, 16);
        assert_eq!(t(6).data, t(5).data + 16);
        assert_eq!(t(7).src[..2], [1, 6]);
        assert_eq!(t(1).use_count, 2);
        assert_eq!(t(5).use_count, 1, "the view has s as src[0], as in ggml");
        assert_eq!(t(3).op, GgmlOp::GetRows as u32);

        // The GET_ROWS result as an input: a leaf, not executed; w stays reachable via mul_mat,
        // tok is no longer reachable.
        let blob = export(&g, &HashSet::from([e]), 0, &place);
        assert_eq!(blob.nodes, vec![5, 6, 7]);
        let ids: Vec<u64> = blob.tensors.iter().map(|t| t.id).collect();
        assert_eq!(ids, vec![3, 4, 5, 6, 1, 7]);
        let t3 = blob.tensors.iter().find(|t| t.id == 3).unwrap();
        assert_eq!((t3.op, t3.flags, t3.src[0]), (0, flags::INPUT, 0));
    }
}
