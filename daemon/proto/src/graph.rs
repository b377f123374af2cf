//! The GRAPH_COMPUTE blob: device, node ids, tensor table.
//!
//! ref: ggml-rpc-protocol.md §8.1; at 8.0.0 a `u64 uid` follows the device (ggml-rpc-protocol-8.md). Counts are checked against the payload length before anything is
//! allocated; the table starts at a 4-mod-8 offset, so every read is unaligned.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::msg::Limits;
use crate::tensor::{RpcTensor, RPC_TENSOR_SIZE};
use crate::wire::{Put, Reader};

/// A decoded GRAPH_COMPUTE payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphBlob {
    /// Device index.
    pub device: u32,
    /// Ids of the nodes to execute, in compute order.
    pub nodes: Vec<u64>,
    /// Every tensor reachable from the nodes, each once.
    pub tensors: Vec<RpcTensor>,
}

impl GraphBlob {
    /// Encoded size: `12 + 8·n_nodes + 296·n_tensors`.
    pub fn encoded_len(&self) -> usize {
        12 + 8 * self.nodes.len() + RPC_TENSOR_SIZE * self.tensors.len()
    }

    /// Appends the encoding.
    pub fn encode_into(&self, v: &mut Vec<u8>) {
        v.reserve(self.encoded_len());
        v.put_u32(self.device);
        self.encode_tables(v);
    }

    /// Appends the 8.0.0 encoding: `u32 device, u64 uid`, then the node and tensor tables
    /// (ref: ggml-rpc-protocol-8.md, GRAPH_COMPUTE).
    pub fn encode_with_uid_into(&self, uid: u64, v: &mut Vec<u8>) {
        v.reserve(self.encoded_len() + 8);
        v.put_u32(self.device);
        v.put_u64(uid);
        self.encode_tables(v);
    }

    fn encode_tables(&self, v: &mut Vec<u8>) {
        v.put_u32(self.nodes.len() as u32);
        for id in &self.nodes {
            v.put_u64(*id);
        }
        v.put_u32(self.tensors.len() as u32);
        for t in &self.tensors {
            t.encode_into(v);
        }
    }

    /// Decodes a 7.0.0 payload. Bytes after the table are tolerated, as the reference does (ref: §14 item 16).
    pub fn decode(b: &[u8], limits: &Limits) -> Result<GraphBlob> {
        let len = b.len() as u64;
        if len < 8 {
            return Err(Error::invalid("graph", format!("payload of {len} bytes is shorter than 8")));
        }
        let mut r = Reader::new(b, "graph");
        let device = r.u32()?;
        Self::decode_tables(device, &mut r, 4, len, limits)
    }

    /// Decodes an 8.0.0 payload: `(uid, graph)` (ref: ggml-rpc-protocol-8.md, GRAPH_COMPUTE).
    pub fn decode_with_uid(b: &[u8], limits: &Limits) -> Result<(u64, GraphBlob)> {
        let len = b.len() as u64;
        if len < 16 {
            return Err(Error::invalid("graph", format!("payload of {len} bytes is shorter than 16")));
        }
        let mut r = Reader::new(b, "graph");
        let device = r.u32()?;
        let uid = r.u64()?;
        Ok((uid, Self::decode_tables(device, &mut r, 12, len, limits)?))
    }

    /// The node and tensor tables, which start `at` bytes into a payload of `len` bytes.
    fn decode_tables(
        device: u32,
        r: &mut Reader<'_>,
        at: u64,
        len: u64,
        limits: &Limits,
    ) -> Result<GraphBlob> {
        let n_nodes = r.u32()?;
        if n_nodes > limits.max_nodes {
            return Err(Error::invalid(
                "graph",
                format!("n_nodes {n_nodes} exceeds the limit {}", limits.max_nodes),
            ));
        }
        let need = at + 8 + 8 * u64::from(n_nodes);
        if len < need {
            return Err(Error::invalid(
                "graph",
                format!("n_nodes {n_nodes} needs {need} bytes, payload has {len}"),
            ));
        }
        let mut nodes = Vec::with_capacity(n_nodes as usize);
        for _ in 0..n_nodes {
            nodes.push(r.u64()?);
        }
        let n_tensors = r.u32()?;
        if n_tensors > limits.max_tensors {
            return Err(Error::invalid(
                "graph",
                format!("n_tensors {n_tensors} exceeds the limit {}", limits.max_tensors),
            ));
        }
        let need = need + RPC_TENSOR_SIZE as u64 * u64::from(n_tensors);
        if len < need {
            return Err(Error::invalid(
                "graph",
                format!("n_tensors {n_tensors} needs {need} bytes, payload has {len}"),
            ));
        }
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            tensors.push(RpcTensor::read(r)?);
        }
        Ok(GraphBlob { device, nodes, tensors })
    }
}

impl GraphBlob {
    /// Builds the blob a master sends for `nodes` (ref: §8.2): every tensor reachable from the nodes
    /// through `src[0..9]` and `view_src`, each once, in depth-first post-order (a tensor's `src[0]`…`src[9]`
    /// subtrees, then its `view_src` subtree, then the tensor). Iterative; fails on a missing id or a cycle.
    pub fn from_nodes(device: u32, nodes: &[u64], tensors: &HashMap<u64, RpcTensor>) -> Result<GraphBlob> {
        let get = |id: u64| {
            tensors.get(&id).ok_or_else(|| Error::invalid("graph", format!("tensor id {id:#x} is not known")))
        };
        // 1 = on the stack, 2 = emitted.
        let mut state: HashMap<u64, u8> = HashMap::new();
        let mut table = Vec::new();
        for &root in nodes {
            if root == 0 {
                return Err(Error::invalid("graph", "node id 0"));
            }
            if state.contains_key(&root) {
                continue;
            }
            state.insert(root, 1);
            let mut stack: Vec<(u64, usize)> = vec![(root, 0)];
            while let Some((id, next)) = stack.last_mut() {
                let t = get(*id)?;
                let links: [u64; 11] = std::array::from_fn(|k| if k < 10 { t.src[k] } else { t.view_src });
                if *next < links.len() {
                    let child = links[*next];
                    *next += 1;
                    if child == 0 {
                        continue;
                    }
                    match state.get(&child) {
                        None => {
                            get(child)?;
                            state.insert(child, 1);
                            stack.push((child, 0));
                        }
                        Some(1) => {
                            return Err(Error::invalid(
                                "graph",
                                format!("cycle through tensor id {child:#x}"),
                            ))
                        }
                        Some(_) => {}
                    }
                } else {
                    table.push(*t);
                    state.insert(*id, 2);
                    stack.pop();
                }
            }
        }
        Ok(GraphBlob { device, nodes: nodes.to_vec(), tensors: table })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_nodes_is_post_order() {
        // w(1) and x(2) leaves; v(3) views x; m(4) = mul_mat(w, v); o(5) = add(m, x).
        let mut ts = HashMap::new();
        let leaf = |id: u64| RpcTensor { id, ..Default::default() };
        ts.insert(1, leaf(1));
        ts.insert(2, leaf(2));
        ts.insert(3, RpcTensor { view_src: 2, ..leaf(3) });
        let mut m = leaf(4);
        m.src[0] = 1;
        m.src[1] = 3;
        ts.insert(4, m);
        let mut o = leaf(5);
        o.src[0] = 4;
        o.src[1] = 2;
        ts.insert(5, o);
        let g = GraphBlob::from_nodes(0, &[4, 5], &ts).unwrap();
        let order: Vec<u64> = g.tensors.iter().map(|t| t.id).collect();
        assert_eq!(order, vec![1, 2, 3, 4, 5]);
        assert_eq!(g.nodes, vec![4, 5]);
        // A cycle and a missing id are errors.
        let mut c = ts.clone();
        c.get_mut(&1).unwrap().src[0] = 5;
        assert!(GraphBlob::from_nodes(0, &[5], &c).is_err());
        assert!(GraphBlob::from_nodes(0, &[9], &ts).is_err());
        assert!(GraphBlob::from_nodes(0, &[0], &ts).is_err());
    }

    fn blob() -> GraphBlob {
        let t =
            |id: u64| RpcTensor { id, dtype: 0, ne: [4, 1, 1, 1], nb: [4, 16, 16, 16], ..Default::default() };
        GraphBlob { device: 3, nodes: vec![30, 31], tensors: vec![t(10), t(20), t(30), t(31)] }
    }

    #[test]
    fn layout_is_exact() {
        let g = blob();
        let mut v = Vec::new();
        g.encode_into(&mut v);
        assert_eq!(v.len(), 12 + 16 + 4 * 296);
        assert_eq!(v.len(), g.encoded_len());
        assert_eq!(u32::from_le_bytes(v[0..4].try_into().unwrap()), 3);
        assert_eq!(u32::from_le_bytes(v[4..8].try_into().unwrap()), 2);
        assert_eq!(u64::from_le_bytes(v[8..16].try_into().unwrap()), 30);
        assert_eq!(u64::from_le_bytes(v[16..24].try_into().unwrap()), 31);
        assert_eq!(u32::from_le_bytes(v[24..28].try_into().unwrap()), 4);
        // First table entry (id) at 12 + 8·n_nodes, 4 mod 8.
        assert_eq!(u64::from_le_bytes(v[28..36].try_into().unwrap()), 10);
        assert_eq!(u64::from_le_bytes(v[28 + 296..36 + 296].try_into().unwrap()), 20);
    }

    #[test]
    fn round_trip_and_trailing_bytes() {
        let g = blob();
        let mut v = Vec::new();
        g.encode_into(&mut v);
        assert_eq!(GraphBlob::decode(&v, &Limits::default()).unwrap(), g);
        v.extend_from_slice(&[1, 2, 3]);
        assert_eq!(GraphBlob::decode(&v, &Limits::default()).unwrap(), g);
    }

    #[test]
    fn counts_beyond_the_payload_are_refused() {
        let g = blob();
        let mut v = Vec::new();
        g.encode_into(&mut v);
        let l = Limits::default();
        assert!(GraphBlob::decode(&v[..7], &l).is_err());
        assert!(GraphBlob::decode(&v[..v.len() - 1], &l).is_err());
        let mut w = v.clone();
        w[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(GraphBlob::decode(&w, &Limits { max_nodes: u32::MAX, max_tensors: u32::MAX }).is_err());
        assert!(GraphBlob::decode(&w, &l).is_err());
        let mut w = v.clone();
        w[24..28].copy_from_slice(&5u32.to_le_bytes());
        assert!(GraphBlob::decode(&w, &l).is_err());
        assert!(GraphBlob::decode(&v, &Limits { max_nodes: 1, max_tensors: 10 }).is_err());
        assert!(GraphBlob::decode(&v, &Limits { max_nodes: 10, max_tensors: 3 }).is_err());
        // An empty graph: device + n_nodes = 0 is only 8 bytes; n_tensors must still be there.
        assert!(GraphBlob::decode(&[0u8; 8], &l).is_err());
        assert_eq!(GraphBlob::decode(&[0u8; 12], &l).unwrap().nodes.len(), 0);
    }
}
