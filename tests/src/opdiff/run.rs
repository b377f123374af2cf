//! Runs a [`Graph`] on one server over `llamad_proto::RpcClient`: one buffer holds every tensor,
//! the inputs are uploaded, the graph computed and the outputs read back
//! (ref: ggml-rpc-protocol.md §5, §8.1).

use std::net::SocketAddr;
use std::time::Duration;

use llamad_proto::{GraphBlob, RpcClient, RpcTensor};

use super::graph::{Graph, Id};
use super::{Error, Result};

/// Bytes between tensors (at least the server's alignment).
const MIN_ALIGN: u64 = 64;

fn wire_id(id: Id) -> u64 {
    id as u64 + 1
}

/// The descriptors of every tensor of `g`, placed in `buffer` at `base`.
fn describe(g: &Graph, buffer: u64, base: u64, align: u64) -> Result<(Vec<RpcTensor>, u64)> {
    let mut offset = vec![0u64; g.tensors.len()];
    let mut end = 0u64;
    for (i, t) in g.tensors.iter().enumerate() {
        if t.view_src.is_none() {
            offset[i] = end;
            let n = t.layout.nbytes().ok_or_else(|| Error::Case("tensor size overflows".into()))?;
            end += n.div_ceil(align) * align;
        }
    }
    let mut out = Vec::with_capacity(g.tensors.len());
    for (i, t) in g.tensors.iter().enumerate() {
        let data = match t.view_src {
            Some(r) => base + offset[r] + t.view_offs,
            None => base + offset[i],
        };
        let mut r = RpcTensor::new(wire_id(i), &t.layout, buffer, data);
        r.op = t.op as u32;
        r.op_params = t.params;
        r.flags = t.flags;
        for (k, s) in t.src.iter().enumerate() {
            r.src[k] = wire_id(*s);
        }
        r.view_src = t.view_src.map_or(0, wire_id);
        r.view_offs = t.view_offs;
        out.push(r.with_name(&format!("t{i}")));
    }
    Ok((out, end.max(align)))
}

/// Runs `g` on the server at `addr`; returns the bytes of each output.
pub fn run_graph(addr: SocketAddr, g: &Graph) -> Result<Vec<Vec<u8>>> {
    let mut c = RpcClient::connect_timeout(&addr, Duration::from_secs(120))?;
    let align = c.get_alignment(0)?.max(MIN_ALIGN);
    let (_, size) = describe(g, 0, 0, align)?;
    let buf = c.alloc_buffer(0, size)?;
    if buf.remote_ptr == 0 {
        return Err(Error::Server(format!("ALLOC_BUFFER({size}) failed")));
    }
    let base = c.buffer_get_base(buf.remote_ptr)?;
    let (tensors, _) = describe(g, buf.remote_ptr, base, align)?;
    for (i, t) in g.tensors.iter().enumerate() {
        if let Some(d) = &t.data {
            c.set_tensor(&tensors[i], 0, d, false)?;
        }
    }
    let blob = GraphBlob {
        device: 0,
        nodes: g.nodes.iter().map(|&i| wire_id(i)).collect(),
        tensors: tensors.clone(),
    };
    c.graph_compute(&blob)?;
    let mut outs = Vec::with_capacity(g.outputs.len());
    for &o in &g.outputs {
        let n = g.tensors[o].layout.nbytes().unwrap_or(0);
        outs.push(c.get_tensor(&tensors[o], 0, n)?);
    }
    c.free_buffer(buf.remote_ptr)?;
    Ok(outs)
}
