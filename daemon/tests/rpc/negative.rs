//! Hostile inputs from ggml-rpc-protocol.md §14 (items 1–21) and §16 (items 1–7). Each one must close
//! the attacker's connection, return the memory it held to the account (back to the baseline taken
//! before it connected), while the server keeps accepting and a concurrently connected bystander
//! keeps its data (see `common::attack`).

use std::io::Write;

use llamad_proto::msg::{Command, GetAllocSizeReq, GetTensorReq, MemsetTensorReq, SetTensorHeader};
use llamad_proto::{GraphBlob, RpcTensor};

use crate::common::*;

fn set(t: RpcTensor, offset: u64, data: &[u8]) -> Command<'_> {
    Command::SetTensor(SetTensorHeader { tensor: t, cache_flag: 0, offset }, data)
}

fn get(t: RpcTensor, offset: u64, size: u64) -> Command<'static> {
    Command::GetTensor(GetTensorReq { tensor: t, offset, size })
}

fn graph_attack(expect: &str, edit: impl FnOnce(&mut GraphBlob, u64, u64)) {
    attack(expect, |a| {
        let (mut g, _) = add_graph(a.buf, a.base, 4);
        edit(&mut g, a.buf, a.base);
        a.send(&Command::GraphCompute(g, None));
    });
}

/// A view `v` (id 4) of `a` used as `out`'s first source: tensors [a, v, b, out].
fn view_graph(buf: u64, base: u64, view_offs: u64, data_delta: u64) -> GraphBlob {
    let (mut g, [a, b, mut out]) = add_graph(buf, base, 4);
    let mut v = f32_tensor(4, buf, base + data_delta, 4);
    v.op = 37;
    v.view_src = a.id;
    v.view_offs = view_offs;
    out.src[0] = 4;
    g.tensors = vec![a, v, b, out];
    g
}

// ---- §14 item 1: pointer and bounds classes ----

#[test]
fn n01_unknown_handle() {
    attack("unknown buffer handle", |a| a.send(&Command::BufferGetBase { remote_ptr: 0x5555 }));
}

#[test]
fn n01_freed_handle() {
    attack("unknown buffer handle", |a| {
        a.c.free_buffer(a.buf).unwrap();
        a.send(&Command::BufferClear { remote_ptr: a.buf, value: 1 });
    });
}

#[test]
fn n01_handle_of_another_connection() {
    let s = TestServer::start();
    let mut other = s.client();
    let (obuf, obase) = buffer(&mut other, 64);
    attack_on(&s, "no buffer of this connection", |a| a.send(&get(f32_tensor(1, obuf, obase, 4), 0, 16)));
    assert_eq!(other.get_tensor(&f32_tensor(1, obuf, obase, 4), 0, 16).unwrap(), vec![0; 16]);
}

#[test]
fn n01_data_below_base() {
    attack("leaves buffer", |a| a.send(&set(f32_tensor(1, a.buf, a.base - 4, 4), 0, &[1; 4])));
}

#[test]
fn n01_extent_past_buffer_end() {
    attack("leaves buffer", |a| a.send(&set(f32_tensor(1, a.buf, a.base + 1024 - 32, 16), 0, &[1; 4])));
}

#[test]
fn n01_offset_plus_size_past_buffer_end() {
    attack("leaves the buffer", |a| a.send(&get(f32_tensor(1, a.buf, a.base, 256), 1000, 100)));
}

#[test]
fn n01_data_plus_nbytes_overflows() {
    attack("leaves buffer", |a| a.send(&get(f32_tensor(1, a.buf, u64::MAX - 8, 4), 0, 4)));
}

#[test]
fn n01_offset_plus_size_overflows() {
    attack("leaves the buffer", |a| a.send(&get(f32_tensor(1, a.buf, a.base, 4), 8, u64::MAX - 4)));
}

// ---- §14 item 2: inside the buffer but past the tensor ----

#[test]
fn n02_write_past_tensor() {
    attack("leaves the tensor", |a| a.send(&set(f32_tensor(1, a.buf, a.base, 4), 8, &[7; 16])));
}

#[test]
fn n02_read_past_tensor() {
    attack("leaves the tensor", |a| a.send(&get(f32_tensor(1, a.buf, a.base, 4), 8, 16)));
}

#[test]
fn n02_memset_past_tensor() {
    attack("MEMSET_TENSOR [0x4, +13) leaves the tensor", |a| {
        a.send(&Command::MemsetTensor(MemsetTensorReq {
            tensor: f32_tensor(1, a.buf, a.base, 4),
            offset: 4,
            size: 13,
            value: 1,
        }))
    });
}

// ---- §14 item 3: graph tensors with data but no buffer ----

#[test]
fn n03_graph_null_buffer_with_data() {
    graph_attack("without a buffer of this connection", |g, _, _| g.tensors[0].buffer = 0);
}

#[test]
fn n03_graph_unknown_buffer_with_data() {
    graph_attack("without a buffer of this connection", |g, _, _| g.tensors[2].buffer = 0xdead_beef);
}

// ---- §14 item 4: COPY_TENSOR ----

#[test]
fn n04_copy_into_smaller_destination() {
    attack("different layouts", |a| {
        let src = f32_tensor(1, a.buf, a.base, 64);
        let dst = f32_tensor(2, a.buf, a.base + 1020, 1);
        a.send(&Command::CopyTensor { src, dst });
    });
}

#[test]
fn n04_copy_with_destination_leaving_its_buffer() {
    attack("leaves buffer", |a| {
        let src = f32_tensor(1, a.buf, a.base, 16);
        let dst = f32_tensor(2, a.buf, a.base + 1000, 16);
        a.send(&Command::CopyTensor { src, dst });
    });
}

// ---- §14 item 5: use after free ----

#[test]
fn n05_recompute_after_freeing_the_graphs_buffer() {
    attack("without a stored graph", |a| {
        let (buf, base) = buffer(&mut a.c, 48);
        let (g, _) = add_graph(buf, base, 4);
        a.c.graph_compute(&g).unwrap();
        a.c.free_buffer(buf).unwrap();
        a.send(&Command::GraphRecompute { device: 0, uid: None });
    });
}

// ---- §14 items 6–9: descriptors and shapes ----

#[test]
fn n06_type_out_of_range() {
    attack("ggml_type 43", |a| {
        a.send(&set(RpcTensor { dtype: 43, ..f32_tensor(1, a.buf, a.base, 4) }, 0, &[0; 4]))
    });
}

#[test]
fn n06_removed_type() {
    attack("ggml_type 4 ", |a| {
        a.send(&set(RpcTensor { dtype: 4, ..f32_tensor(1, a.buf, a.base, 4) }, 0, &[0; 4]))
    });
}

#[test]
fn n07_quantized_partial_block() {
    attack("not a multiple of the block size", |a| {
        let q = RpcTensor {
            id: 1,
            dtype: 2,
            buffer: a.buf,
            ne: [1, 1, 1, 1],
            nb: [18, 18, 18, 18],
            data: a.base,
            ..Default::default()
        };
        a.send(&set(q, 0, &[1]));
    });
}

#[test]
fn n08_element_count_overflow() {
    attack("element count overflows", |a| {
        let t = RpcTensor { ne: [u32::MAX, u32::MAX, u32::MAX, 1], ..f32_tensor(1, a.buf, a.base, 4) };
        a.send(&get(t, 0, 4));
    });
}

#[test]
fn n09_empty_tensor_allows_only_empty_access() {
    attack("leaves the tensor of 0 bytes", |a| {
        let t = RpcTensor { ne: [0, 1, 1, 1], ..f32_tensor(1, a.buf, a.base, 4) };
        assert_eq!(a.c.get_tensor(&t, 0, 0).unwrap().len(), 0);
        a.send(&set(t, 0, &[1; 4]));
    });
}

#[test]
fn n10_shapes_that_escape_are_refused() {
    // out = a + b with out twice as long as its sources.
    graph_attack("compute refused it", |g, _, _| {
        g.tensors[2].ne[0] = 8;
        g.tensors[2].nb = [4, 32, 32, 32];
    });
}

#[test]
fn n11_get_rows_index_out_of_range() {
    attack("GET_ROWS", |a| {
        // src0 f32[4 x 4] at 0, ids i32[2] = {1, 1000} at 64, out f32[4 x 2] at 128.
        let src = RpcTensor {
            id: 1,
            dtype: 0,
            buffer: a.buf,
            ne: [4, 4, 1, 1],
            nb: [4, 16, 64, 64],
            data: a.base,
            ..Default::default()
        };
        let ids = RpcTensor {
            id: 2,
            dtype: 26,
            buffer: a.buf,
            ne: [2, 1, 1, 1],
            nb: [4, 8, 8, 8],
            data: a.base + 64,
            ..Default::default()
        };
        let mut out = RpcTensor {
            id: 3,
            dtype: 0,
            buffer: a.buf,
            ne: [4, 2, 1, 1],
            nb: [4, 16, 32, 32],
            data: a.base + 128,
            ..Default::default()
        };
        out.op = compute::GgmlOp::GetRows as u32;
        out.flags = 16;
        out.src[0] = 1;
        out.src[1] = 2;
        let idx: Vec<u8> = [1i32, 1000].iter().flat_map(|x| x.to_le_bytes()).collect();
        a.c.set_tensor(&ids, 0, &idx, false).unwrap();
        a.send(&Command::GraphCompute(
            GraphBlob { device: 0, nodes: vec![3], tensors: vec![src, ids, out] },
            None,
        ));
    });
}

// ---- §14 item 12 and §16.6: ops ----

#[test]
fn n12_function_pointer_ops() {
    for op in 92..=95 {
        graph_attack("carries host function pointers", move |g, _, _| g.tensors[2].op = op);
    }
}

#[test]
fn n12_function_pointer_op_in_a_source() {
    graph_attack("carries host function pointers", |g, _, _| g.tensors[0].op = 94);
}

#[test]
fn n12_op_out_of_range() {
    graph_attack("ggml_op 101", |g, _, _| g.tensors[2].op = 101);
    graph_attack("ggml_op 4294967295", |g, _, _| g.tensors[2].op = u32::MAX);
}

#[test]
fn s6_unary_with_unknown_sub_op() {
    graph_attack("sub-op 999", |g, _, _| {
        g.tensors[2].op = compute::GgmlOp::Unary as u32;
        g.tensors[2].op_params[0] = 999;
        g.tensors[2].src[1] = 0;
    });
}

// ---- §14 items 13–16: graph structure ----

#[test]
fn n13_node_id_zero() {
    graph_attack("node id 0", |g, _, _| g.nodes = vec![3, 0]);
}

#[test]
fn n13_node_id_missing() {
    graph_attack("not in the tensor table", |g, _, _| g.nodes = vec![42]);
}

#[test]
fn n13_source_id_missing() {
    graph_attack("source id 0x2a is not in the tensor table", |g, _, _| g.tensors[2].src[1] = 42);
}

#[test]
fn n14_cycle_through_src() {
    // Tensor 1 made an ADD of the output (a leaf naming a source is refused before the walk).
    graph_attack("cycle", |g, _, _| {
        g.tensors[0].op = 2;
        g.tensors[0].src[0] = 3;
    });
}

#[test]
fn n14_cycle_through_view_src() {
    graph_attack("cycle", |g, _, _| {
        g.tensors[0].view_src = 2;
        g.tensors[1].view_src = 1;
    });
}

#[test]
fn n14_self_loop() {
    graph_attack("cycle", |g, _, _| g.tensors[2].src[2] = 3);
}

/// A chain of `n` storage-less views ending in one node; `cycle` links the first back to the last.
fn chain(n: u64, cycle: bool) -> GraphBlob {
    let mut tensors = Vec::with_capacity(n as usize);
    for id in 1..=n {
        let mut t = f32_tensor(id, 0, 0, 4);
        t.op = 37;
        t.view_src = if id == 1 {
            if cycle {
                n
            } else {
                0
            }
        } else {
            id - 1
        };
        tensors.push(t);
    }
    GraphBlob { device: 0, nodes: vec![n], tensors }
}

#[test]
fn n14_deep_chain_is_built_without_recursion() {
    // The reference dies at 200 000 links (§16.5); an iterative build accepts it and keeps going.
    let s = TestServer::start();
    let mut c = s.client();
    c.graph_compute(&chain(200_000, false)).unwrap();
    assert_eq!(c.device_count().unwrap(), 1);
}

#[test]
fn n14_leaves_with_sources_are_refused_before_any_walk() {
    // 200 000 op-NONE tensors, each naming the previous as src[0] (59 MB): malformed (a leaf has no
    // sources), refused while the table is indexed, before the graph is walked.
    attack("has op NONE but names sources", |a| {
        let n = 200_000u64;
        let tensors: Vec<_> = (1..=n)
            .map(|id| {
                let mut t = f32_tensor(id, 0, 0, 4);
                t.src[0] = id - 1;
                t
            })
            .collect();
        let t0 = std::time::Instant::now();
        a.send(&Command::GraphCompute(GraphBlob { device: 0, nodes: vec![n], tensors }, None));
        assert!(t0.elapsed() < std::time::Duration::from_secs(10));
    });
}

#[test]
fn n14_deep_cycle() {
    attack("cycle", |a| a.send(&Command::GraphCompute(chain(100_000, true), None)));
}

#[test]
fn n15_duplicate_ids() {
    graph_attack("duplicate tensor id", |g, _, _| {
        let dup = g.tensors[0];
        g.tensors.push(dup);
    });
}

#[test]
fn n15_table_id_zero() {
    graph_attack("has id 0", |g, _, _| g.tensors.push(RpcTensor::default()));
}

#[test]
fn n15_view_data_mismatch() {
    attack("does not lie at view_src", |a| {
        a.send(&Command::GraphCompute(view_graph(a.buf, a.base, 0, 4), None))
    });
}

#[test]
fn n15_view_outside_view_src() {
    attack("does not lie at view_src", |a| {
        a.send(&Command::GraphCompute(view_graph(a.buf, a.base, 8, 8), None))
    });
}

#[test]
fn n15_consistent_view_is_accepted() {
    let s = TestServer::start();
    let mut c = s.client();
    let (buf, base) = buffer(&mut c, 48);
    let g = view_graph(buf, base, 0, 0);
    c.set_tensor(&f32_tensor(1, buf, base, 4), 0, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]), false).unwrap();
    c.set_tensor(&f32_tensor(2, buf, base + 16, 4), 0, &f32_bytes(&[0.5; 4]), false).unwrap();
    c.graph_compute(&g).unwrap();
    assert_eq!(
        bytes_f32(&c.get_tensor(&f32_tensor(3, buf, base + 32, 4), 0, 16).unwrap()),
        [1.5, 2.5, 3.5, 4.5]
    );
}

#[test]
fn n16_counts_beyond_the_payload() {
    attack("n_nodes 1000 needs", |a| {
        let (g, _) = add_graph(a.buf, a.base, 4);
        let mut p = Command::GraphCompute(g, None).encode_payload();
        p[4..8].copy_from_slice(&1000u32.to_le_bytes());
        a.send_raw(&frame(10, &p));
    });
    attack("n_tensors 4 needs", |a| {
        let (g, _) = add_graph(a.buf, a.base, 4);
        let mut p = Command::GraphCompute(g, None).encode_payload();
        p[16..20].copy_from_slice(&4u32.to_le_bytes());
        a.send_raw(&frame(10, &p));
    });
    attack("exceeds the limit", |a| {
        let mut p = vec![0u8; 8];
        p[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        a.send_raw(&frame(10, &p));
    });
    attack("does not match", |a| a.send_raw(&frame(10, &[0u8; 7])));
}

#[test]
fn n16_recompute_without_graph() {
    attack("without a stored graph", |a| a.send(&Command::GraphRecompute { device: 0, uid: None }));
}

// ---- §14 item 17 and §16.1: sizes ----

fn header(cmd: u8, len: u64) -> Vec<u8> {
    let mut v = vec![cmd];
    v.extend_from_slice(&len.to_le_bytes());
    v
}

#[test]
fn n17_huge_graph_payload_lengths() {
    for len in [1u64 << 63, u64::MAX, (1 << 63) - 1, TEST_MEM + 1] {
        attack("exceeds max_frame", |a| a.send_raw(&header(10, len)));
    }
}

#[test]
fn n17_huge_set_tensor_length() {
    attack("leaves the buffer", |a| {
        let mut v = header(6, u64::MAX);
        let h = Command::SetTensor(
            SetTensorHeader { tensor: f32_tensor(1, a.buf, a.base, 4), cache_flag: 0, offset: 0 },
            &[],
        );
        v.extend_from_slice(&h.encode_payload());
        a.send_raw(&v);
    });
}

#[test]
fn n17_huge_get_tensor_size() {
    attack("leaves the buffer", |a| a.send(&get(f32_tensor(1, a.buf, a.base, 256), 0, 1 << 40)));
}

#[test]
fn n17_too_many_nodes_for_the_limit() {
    let s = TestServer::with_config(llamad::Config {
        threads: 1,
        mem: Some(TEST_MEM),
        max_graph_nodes: 4,
        ..llamad::Config::default()
    });
    attack_on(&s, "n_nodes 5 exceeds the limit 4", |a| {
        let (mut g, _) = add_graph(a.buf, a.base, 4);
        g.nodes = vec![3; 5];
        a.send(&Command::GraphCompute(g, None));
    });
}

// ---- §14 item 18: protocol order ----

#[test]
fn n18_protocol_violations() {
    let s = TestServer::start();
    let mut by = s.client();
    let (bbuf, bbase) = buffer(&mut by, 16);
    by.set_tensor(&f32_tensor(1, bbuf, bbase, 4), 0, &[9; 16], false).unwrap();
    let mut bad: Vec<(bool, Vec<u8>)> = vec![
        (false, frame(15, &[])),               // command before HELLO
        (false, frame(14, &[0; 23])),          // HELLO of the wrong size
        (true, hello_frame()),                 // second HELLO
        (true, frame(18, &[])),                // RPC_CMD_NONE
        (true, frame(19, &[])),                // beyond the table
        (true, frame(1, &[0; 5])),             // fixed size off by one
        (true, frame(15, &[0])),               // DEVICE_COUNT with a payload
        (true, frame(2, &7u32.to_le_bytes())), // device out of range
    ];
    let baseline = s.shared.memory.allocated();
    for (after_hello, bytes) in bad.drain(..) {
        let mut raw = if after_hello { s.raw_hello() } else { s.raw() };
        raw.write_all(&bytes).unwrap();
        assert_closed(&mut raw);
        assert_memory_back(&s, baseline);
        s.assert_alive();
        assert_eq!(by.get_tensor(&f32_tensor(1, bbuf, bbase, 4), 0, 16).unwrap(), vec![9; 16]);
    }
}

#[test]
fn n19_name_without_terminator_is_harmless() {
    let s = TestServer::start();
    let mut c = s.client();
    let (buf, base) = buffer(&mut c, 16);
    let t = RpcTensor { name: [b'x'; 64], ..f32_tensor(1, buf, base, 4) };
    c.set_tensor(&t, 0, &[3; 16], false).unwrap();
    assert_eq!(c.get_tensor(&t, 0, 16).unwrap(), vec![3; 16]);
}

#[test]
fn n21_backend_failure_closes_only_that_connection() {
    // An op the executor refuses (SOFT_MAX_BACK with nonsense shapes) fails the graph, not the process.
    graph_attack("compute refused it", |g, _, _| {
        g.tensors[2].op = compute::GgmlOp::SoftMaxBack as u32;
        g.tensors[2].ne = [4, 1, 1, 1];
        g.tensors[0].ne = [2, 1, 1, 1];
        g.tensors[0].nb = [4, 8, 8, 8];
    });
}

// ---- §16 ----

#[test]
fn s2_offset_wrapping_at_2_64() {
    attack("overflows", |a| a.send(&set(f32_tensor(1, a.buf, a.base + 64, 4), u64::MAX - 63, &[1; 4])));
    attack("overflows", |a| a.send(&get(f32_tensor(1, a.buf, a.base + 64, 4), u64::MAX - 63, 4)));
}

#[test]
fn s3_descriptor_outside_buffer_in_init_tensor() {
    attack("leaves buffer", |a| a.send(&Command::InitTensor(f32_tensor(1, a.buf, a.base + 1020, 4))));
}

#[test]
fn s3_descriptor_outside_buffer_in_get_alloc_size() {
    attack("leaves buffer", |a| {
        a.send(&Command::GetAllocSize(Box::new(GetAllocSizeReq {
            device: 0,
            tensor: f32_tensor(1, a.buf, a.base + 1020, 4),
            srcs: [RpcTensor::default(); 10],
        })))
    });
}

#[test]
fn s3_descriptor_outside_buffer_in_copy_tensor() {
    attack("leaves buffer", |a| {
        a.send(&Command::CopyTensor {
            src: f32_tensor(1, a.buf, a.base + 1020, 4),
            dst: f32_tensor(2, a.buf, a.base, 4),
        })
    });
}

#[test]
fn s4_zero_size_buffer_refuses_every_non_empty_access() {
    attack("leaves buffer", |a| {
        let r = a.c.alloc_buffer(0, 0).unwrap();
        assert_ne!(r.remote_ptr, 0);
        let base = a.c.buffer_get_base(r.remote_ptr).unwrap();
        a.c.buffer_clear(r.remote_ptr, 1).unwrap();
        assert_eq!(a.c.device_count().unwrap(), 1);
        a.send(&set(f32_tensor(1, r.remote_ptr, base, 1), 0, &[1; 4]));
    });
}

#[test]
fn n20_cache_hit_path_validates_the_descriptor() {
    let cache: std::sync::Arc<dyn llamad::rpc::cache::WireCache> =
        std::sync::Arc::new(llamad::rpc::cache::MemoryCache::default());
    let cfg = llamad::Config { threads: 1, mem: Some(TEST_MEM), cache: true, ..llamad::Config::default() };
    let s = TestServer::with_shared(llamad::Shared::with_cache(cfg, Some(cache)));
    attack_on(&s, "leaves buffer", |a| {
        a.send(&Command::SetTensorHash(llamad_proto::msg::SetTensorHashReq {
            tensor: f32_tensor(1, a.buf, a.base + 1020, 4),
            offset: 0,
            hash: llamad_proto::WireHash(1),
        }))
    });
    attack_on(&s, "beyond the tensor", |a| {
        a.send(&Command::SetTensorHash(llamad_proto::msg::SetTensorHashReq {
            tensor: f32_tensor(1, a.buf, a.base, 4),
            offset: 17,
            hash: llamad_proto::WireHash(1),
        }))
    });
}

#[test]
fn n18_silent_connection_is_closed_after_the_hello_timeout() {
    let cfg = llamad::Config {
        threads: 1,
        mem: Some(TEST_MEM),
        hello_timeout: std::time::Duration::from_millis(200),
        ..llamad::Config::default()
    };
    let s = TestServer::with_config(cfg);
    let mut by = s.client();
    let (_, _) = buffer(&mut by, 64);
    let baseline = s.shared.memory.allocated();
    let mut raw = s.raw();
    assert_closed(&mut raw);
    assert!(s.shared.stats.take_last_refusal().unwrap_or_default().contains("no HELLO within"));
    assert_memory_back(&s, baseline);
    assert_eq!(by.device_count().unwrap(), 1);
    s.assert_alive();
}
