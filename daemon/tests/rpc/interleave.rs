//! Interleaved weight copies (`src/rpc/weight_copy.rs`): a server with them gives the same bytes as
//! one without, bit for bit, after every kind of write to the weights (SET_TENSOR in part,
//! COPY_TENSOR, MEMSET_TENSOR, BUFFER_CLEAR, a graph writing them); GET_TENSOR returns the bytes
//! that were written; and where the kernel set has the interleaved product the copy is made and
//! charged to the memory budget.

use compute::quant::blocks::to_f16le;
use compute::{GgmlOp, GgmlType, Layout};
use llamad::config::Config;
use llamad_proto::{GraphBlob, RpcClient, RpcTensor};

use crate::common::*;

const K: u64 = 64;
const M: u64 = 32;

/// Q4_0 blocks with finite scales from a small LCG.
fn q4_0_rows(seed: u64, rows: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    let mut out = Vec::new();
    for _ in 0..rows * K / 32 {
        out.extend_from_slice(&to_f16le(0.01 + (next() % 1000) as f32 * 1e-4));
        out.extend((0..16).map(|_| next() as u8));
    }
    out
}

struct Setup {
    w: RpcTensor,
    w2: RpcTensor,
    x: RpcTensor,
    act: RpcTensor,
    dst: RpcTensor,
    wbuf: u64,
}

fn q4_0(id: u64, buffer: u64, data: u64) -> RpcTensor {
    let l = Layout::contiguous(GgmlType::Q4_0, [K, M, 1, 1]).unwrap();
    RpcTensor::new(id, &l, buffer, data)
}

fn setup(c: &mut RpcClient) -> Setup {
    let (wbuf, wbase) = buffer(c, 4096);
    let (cbuf, cbase) = buffer(c, 4096);
    let w = q4_0(1, wbuf, wbase).with_name("w");
    let w2 = q4_0(7, wbuf, wbase + 2048).with_name("w2");
    let x = q4_0(4, cbuf, cbase + 1024).with_name("x");
    let act = f32_tensor(2, cbuf, cbase, K as u32).with_name("act");
    let mut dst = f32_tensor(3, cbuf, cbase + 512, M as u32).with_name("dst");
    dst.op = GgmlOp::MulMat as u32;
    dst.flags = compute::op::flags::COMPUTE;
    dst.src[0] = 1;
    dst.src[1] = 2;
    c.set_tensor(&w, 0, &q4_0_rows(1, M), false).unwrap();
    c.set_tensor(&w2, 0, &q4_0_rows(2, M), false).unwrap();
    c.set_tensor(&x, 0, &q4_0_rows(3, M), false).unwrap();
    let a: Vec<f32> = (0..K).map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.25).collect();
    c.set_tensor(&act, 0, &f32_bytes(&a), false).unwrap();
    Setup { w, w2, x, act, dst, wbuf }
}

fn matmul(s: &Setup) -> GraphBlob {
    GraphBlob { device: 0, nodes: vec![3], tensors: vec![s.w, s.act, s.dst] }
}

/// `w = CPY(x)` (a view of `w`, as ggml_cpy makes it), then the product: `w` is written by the graph.
fn copy_then_matmul(s: &Setup) -> GraphBlob {
    let mut cpy = s.w;
    cpy.id = 5;
    cpy.op = GgmlOp::Cpy as u32;
    cpy.flags = compute::op::flags::COMPUTE;
    cpy.src[0] = s.x.id;
    cpy.src[1] = s.w.id;
    cpy.view_src = s.w.id;
    GraphBlob { device: 0, nodes: vec![5, 3], tensors: vec![s.w, s.x, cpy, s.act, s.dst] }
}

fn server(interleave: bool) -> TestServer {
    TestServer::with_config(Config { threads: 2, mem: Some(TEST_MEM), interleave, ..Config::default() })
}

#[test]
fn interleaved_copies_give_the_rows_results_after_every_kind_of_write() {
    let (with, without) = (server(true), server(false));
    let (mut a, mut b) = (with.client(), without.client());
    let (sa, sb) = (setup(&mut a), setup(&mut b));
    let free_before = a.get_device_memory(0).unwrap().free;
    type Step = fn(&mut RpcClient, &Setup);
    let steps: [(&str, Step); 8] = [
        ("first product", |c, s| c.graph_compute(&matmul(s)).unwrap()),
        ("recompute", |c, _| c.graph_recompute(0).unwrap()),
        ("SET_TENSOR of rows 8..12", |c, s| {
            c.set_tensor(&s.w, 8 * 36, &q4_0_rows(9, 4), false).unwrap();
            c.graph_recompute(0).unwrap();
        }),
        ("COPY_TENSOR", |c, s| {
            assert!(c.copy_tensor(&s.w2, &s.w).unwrap());
            c.graph_recompute(0).unwrap();
        }),
        ("MEMSET_TENSOR", |c, s| {
            c.memset_tensor(&s.w, 100, 50, 0x33).unwrap();
            c.graph_compute(&matmul(s)).unwrap();
        }),
        ("graph writing the weights", |c, s| c.graph_compute(&copy_then_matmul(s)).unwrap()),
        ("product after the graph wrote them", |c, s| c.graph_compute(&matmul(s)).unwrap()),
        ("BUFFER_CLEAR", |c, s| {
            c.buffer_clear(s.wbuf, 0x11).unwrap();
            c.graph_recompute(0).unwrap();
        }),
    ];
    let mut previous: Option<Vec<u8>> = None;
    for (name, step) in steps {
        step(&mut a, &sa);
        step(&mut b, &sb);
        let (ra, rb) = (a.get_tensor(&sa.dst, 0, 4 * M).unwrap(), b.get_tensor(&sb.dst, 0, 4 * M).unwrap());
        assert_eq!(ra, rb, "{name}: the interleaving server differs");
        assert!(bytes_f32(&ra).iter().any(|v| *v != 0.0), "{name}: an all-zero product proves nothing");
        if name != "recompute" && name != "product after the graph wrote them" {
            assert_ne!(previous.as_ref(), Some(&ra), "{name}: the weights did not change the product");
        }
        // The buffer holds what was written, not the interleaved form.
        let (wa, wb) = (a.get_tensor(&sa.w, 0, 36 * M).unwrap(), b.get_tensor(&sb.w, 0, 36 * M).unwrap());
        assert_eq!(wa, wb, "{name}: GET_TENSOR of the weights differs");
        previous = Some(ra);
    }
    let _ = sa.x;
    // The copy is charged to the budget where it is made, and freed with its buffer.
    let copy = if compute::quant::kernels(GgmlType::Q4_0).interleaved_dot.is_some() { 36 * M } else { 0 };
    assert_eq!(free_before - a.get_device_memory(0).unwrap().free, copy, "budget charged for the copy");
    assert_eq!(with.shared.memory.interleaved(), copy, "copies reported");
    assert_eq!(without.shared.memory.interleaved(), 0, "no copies with interleave off");
    a.free_buffer(sa.wbuf).unwrap();
    // FREE_BUFFER has no answer: the next command's answer orders it.
    let after = a.get_device_memory(0).unwrap().free;
    assert_eq!(with.shared.memory.interleaved(), 0, "copies freed with their buffer");
    assert_eq!(after, free_before + 4096, "the weight buffer and its copy are back in the budget");
}
