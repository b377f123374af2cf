//! ggml-rpc-protocol.md §15, the worker items that need no real master (1–23, 25–28; 24 needs the cache).

use std::io::{Read, Write};
use std::time::Duration;

use llamad_proto::cmd::{Cmd, RequestSize};
use llamad_proto::msg::{AllocBufferReq, Command, GetAllocSizeReq, GetTensorReq, SetTensorHeader};
use llamad_proto::{GraphBlob, RpcTensor, WireHash};

use crate::common::*;

#[test]
fn c01_hello_reply_bytes() {
    let s = TestServer::start();
    let mut raw = s.raw();
    raw.write_all(&hello_frame()).unwrap();
    let mut rsp = [0u8; 36];
    raw.read_exact(&mut rsp).unwrap();
    let want: Vec<u8> = [&[0x1c, 0, 0, 0, 0, 0, 0, 0][..], &[7, 0, 0, 0], &[0u8; 24]].concat();
    assert_eq!(rsp.to_vec(), want);
    assert_silent(&mut raw, 100);
}

#[test]
fn c02_first_command_must_be_a_24_byte_hello() {
    let s = TestServer::start();
    let mut raw = s.raw();
    raw.write_all(&frame(15, &[])).unwrap();
    assert_closed(&mut raw);
    for n in [0usize, 23, 25] {
        let mut raw = s.raw();
        raw.write_all(&frame(14, &vec![0u8; n])).unwrap();
        assert_closed(&mut raw);
    }
    s.assert_alive();
}

#[test]
fn c03_second_hello_none_and_unknown_commands_close() {
    let s = TestServer::start();
    for bad in [hello_frame(), frame(18, &[]), frame(19, &[]), frame(255, &[])] {
        let mut raw = s.raw_hello();
        raw.write_all(&bad).unwrap();
        assert_closed(&mut raw);
    }
    s.assert_alive();
}

#[test]
fn c04_device_count() {
    let s = TestServer::start();
    let mut raw = s.raw_hello();
    raw.write_all(&frame(15, &[])).unwrap();
    let mut rsp = [0u8; 12];
    raw.read_exact(&mut rsp).unwrap();
    assert_eq!(rsp, [4, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
    raw.write_all(&frame(15, &[0])).unwrap();
    assert_closed(&mut raw);
}

#[test]
fn c05_fixed_sizes_off_by_one_close() {
    // Every fixed-size command of each version's table, one byte short and one over, at that version.
    for proto in llamad_proto::version::SUPPORTED {
        let s = TestServer::start_proto(proto);
        for spec in proto.commands {
            let RequestSize::Fixed(n) = spec.request else { continue };
            if spec.cmd == Cmd::Hello {
                continue; // a second HELLO closes anyway (c03)
            }
            let mut lens = vec![n + 1];
            if n > 0 {
                lens.push(n - 1);
            }
            for len in lens {
                let mut raw = s.raw_hello();
                raw.write_all(&frame(spec.cmd as u8, &vec![0u8; len as usize])).unwrap();
                assert_closed(&mut raw);
            }
        }
        s.assert_alive();
    }
}

#[test]
fn c06_device_out_of_range_closes() {
    let s = TestServer::start();
    let t = f32_tensor(1, 0, 0, 4);
    let cmds: Vec<Command<'static>> = vec![
        Command::AllocBuffer(AllocBufferReq { device: 1, size: 16 }),
        Command::GetAlignment { device: 1 },
        Command::GetMaxSize { device: 7 },
        Command::GetDeviceMemory { device: u32::MAX },
        Command::GetAllocSize(Box::new(GetAllocSizeReq {
            device: 1,
            tensor: t,
            srcs: [RpcTensor::default(); 10],
        })),
        Command::GraphCompute(GraphBlob { device: 1, nodes: vec![], tensors: vec![] }, None),
        Command::GraphRecompute { device: 1, uid: None },
    ];
    for c in cmds {
        let mut raw = s.raw_hello();
        raw.write_all(&c.encode_frame()).unwrap();
        assert_closed(&mut raw);
    }
    s.assert_alive();
}

#[test]
fn c07_alignment_and_max_size_are_stable() {
    let s = TestServer::start();
    let mut c = s.client();
    let a = c.get_alignment(0).unwrap();
    let m = c.get_max_size(0).unwrap();
    assert!(a.is_power_of_two());
    assert!(m > 0);
    buffer(&mut c, 1 << 20);
    let mut d = s.client();
    assert_eq!(d.get_alignment(0).unwrap(), a);
    assert_eq!(d.get_max_size(0).unwrap(), m);
    assert_eq!(m, TEST_MEM);
}

#[test]
fn c08_alloc_buffer_and_failure_keeps_connection() {
    let s = TestServer::start();
    let mut c = s.client();
    let r = c.alloc_buffer(0, 1000).unwrap();
    assert_ne!(r.remote_ptr, 0);
    assert!(r.remote_size >= 1000);
    for huge in [1u64 << 62, TEST_MEM + 1, u64::MAX] {
        let r = c.alloc_buffer(0, huge).unwrap();
        assert_eq!((r.remote_ptr, r.remote_size), (0, 0));
    }
    // Budget exhausted by live buffers: the next one fails, freeing makes room again.
    let big = c.alloc_buffer(0, TEST_MEM - 1000).unwrap();
    assert_ne!(big.remote_ptr, 0);
    assert_eq!(c.alloc_buffer(0, 1).unwrap().remote_ptr, 0);
    c.free_buffer(big.remote_ptr).unwrap();
    assert_ne!(c.alloc_buffer(0, 1 << 20).unwrap().remote_ptr, 0);
    assert_eq!(c.device_count().unwrap(), 1);
}

#[test]
fn c09_bases_aligned_nonzero_disjoint() {
    let s = TestServer::start();
    let mut c = s.client();
    let align = c.get_alignment(0).unwrap();
    let mut ranges = Vec::new();
    for size in [1u64, 31, 32, 33, 4096, 100_000, 7] {
        let (h, base) = buffer(&mut c, size);
        assert_ne!(h, 0);
        assert_ne!(base, 0);
        assert_eq!(base % align, 0);
        ranges.push((base, base + size));
    }
    let mut d = s.client();
    let (_, base) = buffer(&mut d, 64);
    ranges.push((base, base + 64));
    for (i, a) in ranges.iter().enumerate() {
        for b in &ranges[i + 1..] {
            assert!(a.1 <= b.0 || b.1 <= a.0, "{a:x?} overlaps {b:x?}");
        }
    }
}

#[test]
fn c10_seven_commands_send_nothing() {
    let s = TestServer::start();
    let mut c = s.client();
    let (buf, base) = buffer(&mut c, 256);
    let (g, [a, _, _]) = add_graph(buf, base, 4);
    let (tmp, _) = buffer(&mut c, 16);
    c.set_tensor(&a, 0, &[0u8; 16], false).unwrap();
    c.buffer_clear(buf, 0).unwrap();
    c.init_tensor(&a).unwrap();
    c.memset_tensor(&a, 0, 4, 1).unwrap();
    c.graph_compute(&g).unwrap();
    c.graph_recompute(0).unwrap();
    c.free_buffer(tmp).unwrap();
    assert_silent(c.stream(), 300);
    // The next response is exactly DEVICE_COUNT's 12 bytes.
    let raw = c.stream();
    raw.write_all(&frame(15, &[])).unwrap();
    let mut rsp = [0u8; 12];
    raw.read_exact(&mut rsp).unwrap();
    assert_eq!(rsp, [4, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
    assert_silent(raw, 100);
}

#[test]
fn c11_set_then_get_round_trips() {
    let s = TestServer::start();
    let mut c = s.client();
    let (buf, base) = buffer(&mut c, 4096);
    let t = RpcTensor {
        id: 5,
        dtype: 24,
        buffer: buf,
        ne: [1000, 1, 1, 1],
        nb: [1, 1000, 1000, 1000],
        data: base + 96,
        ..Default::default()
    };
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 31 + 7) as u8).collect();
    c.set_tensor(&t, 0, &data, false).unwrap();
    assert_eq!(c.get_tensor(&t, 0, 1000).unwrap(), data);
    assert_eq!(c.get_tensor(&t, 10, 20).unwrap(), data[10..30]);
    c.set_tensor(&t, 500, &[0xee; 3], false).unwrap();
    let back = c.get_tensor(&t, 499, 5).unwrap();
    assert_eq!(back, vec![data[499], 0xee, 0xee, 0xee, data[503]]);
    // Frame length equals the requested size exactly (RpcClient checks it), including 0.
    assert_eq!(c.get_tensor(&t, 0, 0).unwrap().len(), 0);
}

#[test]
fn c12_buffer_clear_fills_every_byte() {
    let s = TestServer::start();
    let mut c = s.client();
    let (buf, base) = buffer(&mut c, 1000);
    let whole = RpcTensor {
        id: 1,
        dtype: 24,
        buffer: buf,
        ne: [1000, 1, 1, 1],
        nb: [1, 1000, 1000, 1000],
        data: base,
        ..Default::default()
    };
    c.set_tensor(&whole, 0, &[3u8; 1000], false).unwrap();
    c.buffer_clear(buf, 0xa5).unwrap();
    assert_eq!(c.get_tensor(&whole, 0, 1000).unwrap(), vec![0xa5; 1000]);
}

#[test]
fn c13_memset_sets_exactly_the_range() {
    let s = TestServer::start();
    let mut c = s.client();
    let (buf, base) = buffer(&mut c, 256);
    let whole = RpcTensor {
        id: 1,
        dtype: 24,
        buffer: buf,
        ne: [256, 1, 1, 1],
        nb: [1, 256, 256, 256],
        data: base,
        ..Default::default()
    };
    let t = RpcTensor { id: 2, ne: [100, 1, 1, 1], nb: [1, 100, 100, 100], data: base + 50, ..whole };
    c.buffer_clear(buf, 0).unwrap();
    c.memset_tensor(&t, 10, 20, 0x7f).unwrap();
    let all = c.get_tensor(&whole, 0, 256).unwrap();
    for (i, b) in all.iter().enumerate() {
        let want = if (60..80).contains(&i) { 0x7f } else { 0 };
        assert_eq!(*b, want, "byte {i}");
    }
}

#[test]
fn c14_copy_tensor() {
    let s = TestServer::start();
    let mut c = s.client();
    let (b1, base1) = buffer(&mut c, 64);
    let (b2, base2) = buffer(&mut c, 128);
    let src = f32_tensor(1, b1, base1, 16);
    let dst = f32_tensor(2, b2, base2 + 64, 16);
    let data: Vec<f32> = (0..16).map(|i| i as f32 - 3.25).collect();
    c.set_tensor(&src, 0, &f32_bytes(&data), false).unwrap();
    assert!(c.copy_tensor(&src, &dst).unwrap());
    assert_eq!(bytes_f32(&c.get_tensor(&dst, 0, 64).unwrap()), data);
}

#[test]
fn c15_unknown_handles_and_out_of_range_descriptors_close() {
    let s = TestServer::start();
    for cmd in [
        Command::BufferGetBase { remote_ptr: 0x1234 },
        Command::FreeBuffer { remote_ptr: 0x1234 },
        Command::BufferClear { remote_ptr: 0x1234, value: 0 },
    ] {
        attack_on(&s, "unknown", |a| a.send(&cmd));
    }
    attack_on(&s, "leaves buffer", |a| {
        let t = f32_tensor(1, a.buf, a.base + 1024 - 8, 4); // extent leaves the buffer
        a.send(&Command::GetTensor(GetTensorReq { tensor: t, offset: 0, size: 4 }));
    });
    attack_on(&s, "leaves the tensor", |a| {
        let t = f32_tensor(1, a.buf, a.base, 4);
        a.send(&Command::GetTensor(GetTensorReq { tensor: t, offset: 8, size: 16 }));
    });
}

#[test]
fn c16_add_graph_without_synchronisation() {
    let s = TestServer::start();
    let mut c = s.client();
    let (buf, base) = buffer(&mut c, 48);
    let (g, [a, b, out]) = add_graph(buf, base, 4);
    c.set_tensor(&a, 0, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]), false).unwrap();
    c.set_tensor(&b, 0, &f32_bytes(&[10.0, 20.0, 30.0, 40.5]), false).unwrap();
    c.graph_compute(&g).unwrap();
    assert_eq!(bytes_f32(&c.get_tensor(&out, 0, 16).unwrap()), [11.0, 22.0, 33.0, 44.5]);
}

#[test]
fn c17_recompute_sees_new_inputs() {
    let s = TestServer::start();
    let mut c = s.client();
    let (buf, base) = buffer(&mut c, 48);
    let (g, [a, b, out]) = add_graph(buf, base, 4);
    c.set_tensor(&a, 0, &f32_bytes(&[1.0; 4]), false).unwrap();
    c.set_tensor(&b, 0, &f32_bytes(&[2.0; 4]), false).unwrap();
    c.graph_compute(&g).unwrap();
    assert_eq!(bytes_f32(&c.get_tensor(&out, 0, 16).unwrap()), [3.0; 4]);
    c.set_tensor(&a, 0, &f32_bytes(&[5.0, 6.0, 7.0, 8.0]), false).unwrap();
    c.graph_recompute(0).unwrap();
    assert_eq!(bytes_f32(&c.get_tensor(&out, 0, 16).unwrap()), [7.0, 8.0, 9.0, 10.0]);
}

#[test]
fn c18_recompute_without_graph_or_after_free_closes() {
    let s = TestServer::start();
    attack_on(&s, "without a stored graph", |a| a.send(&Command::GraphRecompute { device: 0, uid: None }));
    attack_on(&s, "without a stored graph", |a| {
        let (buf, base) = buffer(&mut a.c, 48);
        let (g, _) = add_graph(buf, base, 4);
        a.c.graph_compute(&g).unwrap();
        a.c.graph_recompute(0).unwrap();
        assert_eq!(a.c.device_count().unwrap(), 1);
        // Freeing an unrelated buffer drops the stored graphs too, as the reference does.
        a.c.free_buffer(a.buf).unwrap();
        a.send(&Command::GraphRecompute { device: 0, uid: None });
    });
}

#[test]
fn c19_nodes_without_compute_flag_or_view_ops_are_not_evaluated() {
    let s = TestServer::start();
    let mut c = s.client();
    let (buf, base) = buffer(&mut c, 48);
    let (mut g, [a, b, out]) = add_graph(buf, base, 4);
    c.set_tensor(&a, 0, &f32_bytes(&[1.0; 4]), false).unwrap();
    c.set_tensor(&b, 0, &f32_bytes(&[2.0; 4]), false).unwrap();
    c.set_tensor(&out, 0, &f32_bytes(&[-1.0; 4]), false).unwrap();
    g.tensors[2].flags = 2; // OUTPUT only, no COMPUTE
    c.graph_compute(&g).unwrap();
    assert_eq!(bytes_f32(&c.get_tensor(&out, 0, 16).unwrap()), [-1.0; 4]);
    for op in [36u32, 37, 38, 39] {
        g.tensors[2].flags = 16;
        g.tensors[2].op = op;
        c.graph_compute(&g).unwrap();
        assert_eq!(bytes_f32(&c.get_tensor(&out, 0, 16).unwrap()), [-1.0; 4], "op {op}");
    }
    // A NONE node is not evaluated either; one that names sources is malformed and refused outright
    // (stricter than the reference, which walks it: a deep chain of them costs seconds).
    g.tensors[2].src = [0; 10];
    g.tensors[2].op = 0;
    c.graph_compute(&g).unwrap();
    assert_eq!(bytes_f32(&c.get_tensor(&out, 0, 16).unwrap()), [-1.0; 4], "op NONE");
}

fn graph_attack(expect: &str, edit: impl FnOnce(&mut GraphBlob, u64, u64)) {
    attack(expect, |a| {
        let (mut g, _) = add_graph(a.buf, a.base, 4);
        let (buf, base) = (a.buf, a.base);
        edit(&mut g, buf, base);
        a.send(&Command::GraphCompute(g, None));
    });
}

#[test]
fn c20_graph_structure_violations_close() {
    graph_attack("node id 0", |g, _, _| g.nodes = vec![0]);
    graph_attack("is not in the tensor table", |g, _, _| g.nodes = vec![99]);
    graph_attack("cycle", |g, _, _| {
        // a -> out -> a, with a made a computed node (a leaf naming a source is refused earlier)
        g.tensors[0].op = 2;
        g.tensors[0].src[0] = 3;
    });
    graph_attack("has op NONE but names sources", |g, _, _| g.tensors[0].src[0] = 2);
    graph_attack("no storage here", |g, _, _| {
        // computed node without storage
        g.tensors[2].buffer = 0;
        g.tensors[2].data = 0;
    });
    graph_attack("no storage here", |g, _, _| {
        // a source without storage
        g.tensors[1].buffer = 0;
        g.tensors[1].data = 0;
    });
    graph_attack("ggml_op 101 is out of range", |g, _, _| g.tensors[2].op = 101);
    for op in 92..=95 {
        graph_attack("carries host function pointers", move |g, _, _| g.tensors[2].op = op);
    }
}

#[test]
fn c21_get_alloc_size() {
    let s = TestServer::start();
    let mut c = s.client();
    let srcs = [RpcTensor::default(); 10];
    assert_eq!(c.get_alloc_size(0, &f32_tensor(1, 0, 0, 4), &srcs).unwrap(), 16);
    // q4_0 [64, 3]: rows of 2 blocks × 18 bytes.
    let q = RpcTensor { id: 2, dtype: 2, ne: [64, 3, 1, 1], nb: [18, 36, 108, 108], ..Default::default() };
    assert!(c.get_alloc_size(0, &q, &srcs).unwrap() >= 108);
}

#[test]
fn c22_device_memory() {
    let s = TestServer::start();
    let mut c = s.client();
    let m = c.get_device_memory(0).unwrap();
    assert!(m.free <= m.total && m.free > 0 && m.total > 0);
    assert_eq!((m.free, m.total), (TEST_MEM, TEST_MEM));
    buffer(&mut c, 1 << 20);
    let m2 = s.client().get_device_memory(0).unwrap();
    assert_eq!(m2.free, TEST_MEM - (1 << 20));
    // Without --mem the numbers come from /proc/meminfo.
    let s2 = TestServer::with_config(llamad::Config { threads: 1, ..llamad::Config::default() });
    let m = s2.client().get_device_memory(0).unwrap();
    assert!(m.free <= m.total && m.free > 0);
}

#[test]
fn c23_set_tensor_hash_without_cache_answers_zero() {
    let s = TestServer::start();
    let mut c = s.client();
    let (buf, base) = buffer(&mut c, 64);
    assert!(!c.set_tensor_hash(&f32_tensor(1, buf, base, 16), 0, WireHash::of(&[0u8; 64])).unwrap());
    // An all-0xFF descriptor is not even examined.
    let mut p = vec![0xffu8; 312];
    p[296..].copy_from_slice(&[0; 16]);
    let raw = c.stream();
    raw.write_all(&frame(7, &p)).unwrap();
    let mut rsp = [0u8; 9];
    raw.read_exact(&mut rsp).unwrap();
    assert_eq!(rsp, [1, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(c.device_count().unwrap(), 1);
}

#[test]
fn c25_fnv1a_vectors() {
    assert_eq!(WireHash::of(b"").to_string(), "cbf29ce484222325");
    assert_eq!(WireHash::of(&[0x61]).to_string(), "af63dc4c8601ec8c");
}

#[test]
fn c26_close_releases_everything() {
    let s = TestServer::start();
    let mut c = s.client();
    let (buf, _) = buffer(&mut c, 8 << 20);
    assert_eq!(s.client().get_device_memory(0).unwrap().free, TEST_MEM - (8 << 20));
    drop(c);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while s.shared.memory.allocated() != 0 {
        assert!(std::time::Instant::now() < deadline, "buffers not released");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(s.client().get_device_memory(0).unwrap().free, TEST_MEM);
    // A new connection does not know the old handle and has no stored graph.
    let mut raw = s.raw_hello();
    raw.write_all(&Command::BufferGetBase { remote_ptr: buf }.encode_frame()).unwrap();
    assert_closed(&mut raw);
    let mut raw = s.raw_hello();
    raw.write_all(&Command::GraphRecompute { device: 0, uid: None }.encode_frame()).unwrap();
    assert_closed(&mut raw);
}

#[test]
fn c27_pipelined_commands_execute_in_order() {
    let s = TestServer::start();
    let mut c = s.client();
    let (buf, base) = buffer(&mut c, 4 * 3 * 256);
    let (g, [a, b, out]) = add_graph(buf, base, 256);
    let xa: Vec<f32> = (0..256).map(|i| i as f32).collect();
    let xb: Vec<f32> = (0..256).map(|i| (i * i) as f32 * 0.5).collect();
    let mut bytes = Vec::new();
    for (t, x) in [(a, &xa), (b, &xb)] {
        bytes.extend(
            Command::SetTensor(SetTensorHeader { tensor: t, cache_flag: 0, offset: 0 }, &f32_bytes(x))
                .encode_frame(),
        );
    }
    bytes.extend(Command::GraphCompute(g, None).encode_frame());
    bytes.extend(
        Command::SetTensor(SetTensorHeader { tensor: a, cache_flag: 0, offset: 0 }, &f32_bytes(&[0.0; 256]))
            .encode_frame(),
    );
    bytes.extend(Command::GraphRecompute { device: 0, uid: None }.encode_frame());
    bytes.extend(Command::GetTensor(GetTensorReq { tensor: out, offset: 0, size: 1024 }).encode_frame());
    c.stream().write_all(&bytes).unwrap();
    let rsp = llamad_proto::client::read_response(c.stream(), Cmd::GetTensor, 1024).unwrap();
    assert_eq!(bytes_f32(&rsp), xb);
}

#[test]
fn c28_rapid_probe_connections() {
    let s = TestServer::start();
    for i in 0..30 {
        let mut c = s.client();
        match i % 4 {
            0 => assert_eq!(c.device_count().unwrap(), 1),
            1 => assert!(c.get_device_memory(0).unwrap().total > 0),
            2 => assert_eq!(c.get_alignment(0).unwrap(), 32),
            _ => assert!(
                c.get_alloc_size(0, &f32_tensor(1, 0, 0, 8), &[RpcTensor::default(); 10]).unwrap() >= 32
            ),
        }
    }
    s.assert_alive();
}

fn cached_server() -> (TestServer, std::sync::Arc<llamad::rpc::cache::MemoryCache>) {
    let cache = std::sync::Arc::new(llamad::rpc::cache::MemoryCache::default());
    let cfg = llamad::Config { threads: 1, mem: Some(TEST_MEM), cache: true, ..llamad::Config::default() };
    let dyn_cache: std::sync::Arc<dyn llamad::rpc::cache::WireCache> = cache.clone();
    (TestServer::with_shared(llamad::Shared::with_cache(cfg, Some(dyn_cache))), cache)
}

fn bytes_tensor(id: u64, buf: u64, data: u64, n: u32) -> RpcTensor {
    RpcTensor { id, dtype: 24, buffer: buf, ne: [n, 1, 1, 1], nb: [1, n, n, n], data, ..Default::default() }
}

#[test]
fn c24_cache_store_then_hit_on_a_new_connection() {
    let (s, cache) = cached_server();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 13 % 251) as u8).collect();
    let hash = WireHash::of(&data);
    {
        let mut c = s.client();
        let (buf, base) = buffer(&mut c, 4096);
        let t = bytes_tensor(1, buf, base, 4096);
        assert!(!c.set_tensor_hash(&t, 0, hash).unwrap());
        c.set_tensor(&t, 0, &data, false).unwrap();
        assert_eq!(c.device_count().unwrap(), 1);
        assert!(cache.is_empty(), "cache_flag = 0 must not create an entry");
        c.set_tensor(&t, 0, &data, true).unwrap();
        assert_eq!(c.device_count().unwrap(), 1);
        assert_eq!(cache.len(), 1);
    }
    let mut c = s.client();
    let (buf, base) = buffer(&mut c, 8192);
    let t = bytes_tensor(2, buf, base + 4096, 4096);
    assert!(c.set_tensor_hash(&t, 0, hash).unwrap());
    assert_eq!(c.get_tensor(&t, 0, 4096).unwrap(), data);
    // Another hash, or a tensor of another length, is a miss.
    assert!(!c.set_tensor_hash(&t, 0, WireHash(hash.0 ^ 1)).unwrap());
    assert!(!c.set_tensor_hash(&bytes_tensor(3, buf, base, 2048), 0, hash).unwrap());
    // An entry whose bytes do not hash to its key (planted by another client) is never served.
    let planted = WireHash::of(b"something else");
    cache.insert_raw(planted, vec![0x66; 4096]);
    assert!(!c.set_tensor_hash(&t, 0, planted).unwrap());
}

/// A cache whose lookups take 40 ms and count how many run at once.
#[derive(Default)]
struct SlowCache {
    inner: llamad::rpc::cache::MemoryCache,
    running: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl llamad::rpc::cache::WireCache for SlowCache {
    fn load(&self, hash: WireHash, dst: &mut [u8]) -> llamad::rpc::cache::Loaded {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.running.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        std::thread::sleep(Duration::from_millis(40));
        let r = self.inner.load(hash, dst);
        self.running.fetch_sub(1, SeqCst);
        r
    }

    fn store(&self, hash: WireHash, data: &[u8]) {
        self.inner.store(hash, data)
    }
}

#[test]
fn c26_pipelined_lookups_overlap_but_act_in_order() {
    use llamad::rpc::cache::WireCache;
    let cache = std::sync::Arc::new(SlowCache::default());
    let cfg = llamad::Config { threads: 1, mem: Some(TEST_MEM), cache: true, ..llamad::Config::default() };
    let dyn_cache: std::sync::Arc<dyn WireCache> = cache.clone();
    let s = TestServer::with_shared(llamad::Shared::with_cache(cfg, Some(dyn_cache)));
    let entry = |seed: u32| -> Vec<u8> { (0..4096u32).map(|i| (i.wrapping_mul(seed) % 251) as u8).collect() };
    let (a, b, c, d) = (entry(7), entry(11), entry(13), entry(17));
    for x in [&a, &b, &c, &d] {
        cache.store(WireHash::of(x), x);
    }
    let mut cl = s.client();
    let (buf, base) = buffer(&mut cl, 6 * 4096);
    let at = |id: u64, off: u64| bytes_tensor(id, buf, base + off, 4096);
    // All sent before any answer is read, as llamactl does. In order: a hit, a miss, a hit over bytes
    // that overlap the first (it must land after it), a SET_TENSOR over the first hit's bytes (it must
    // land after the lookups before it), then two independent hits (these two may run at once).
    let zeros = [0u8; 16];
    cl.send_set_tensor_hash(&at(1, 0), 0, WireHash::of(&a)).unwrap();
    cl.send_set_tensor_hash(&at(2, 4 * 4096), 0, WireHash(1)).unwrap();
    cl.send_set_tensor_hash(&at(3, 2048), 0, WireHash::of(&b)).unwrap();
    cl.set_tensor(&bytes_tensor(4, buf, base, 16), 0, &zeros, false).unwrap();
    cl.send_set_tensor_hash(&at(5, 2 * 4096), 0, WireHash::of(&c)).unwrap();
    cl.send_set_tensor_hash(&at(6, 4 * 4096), 0, WireHash::of(&d)).unwrap();
    let answers: Vec<bool> = (0..5).map(|_| cl.recv_set_tensor_hash().unwrap()).collect();
    assert_eq!(answers, [true, false, true, true, true]);
    let got = cl.get_tensor(&bytes_tensor(7, buf, base, 6 * 4096), 0, 6 * 4096).unwrap();
    let mut want = vec![0u8; 6 * 4096];
    want[..2048].copy_from_slice(&a[..2048]);
    want[2048..2048 + 4096].copy_from_slice(&b);
    want[..16].fill(0);
    want[2 * 4096..3 * 4096].copy_from_slice(&c);
    want[4 * 4096..5 * 4096].copy_from_slice(&d);
    assert!(got == want, "the buffer holds what the requests give in order");
    assert_eq!(cache.most.load(std::sync::atomic::Ordering::SeqCst), 2, "two lookups ran at once");
}

#[test]
fn c31_master_side_graph_encoding_is_accepted() {
    // (a + b) + a, encoded the way a master does (post-order table from the node list).
    let s = TestServer::start();
    let mut c = s.client();
    let (buf, base) = buffer(&mut c, 64);
    let (_, [a, b, mut sum]) = add_graph(buf, base, 4);
    let mut out = f32_tensor(4, buf, base + 48, 4).with_name("out");
    out.op = 2;
    out.flags = 16;
    out.src = [3, 1, 0, 0, 0, 0, 0, 0, 0, 0];
    sum.flags = 16;
    let table: std::collections::HashMap<u64, RpcTensor> =
        [a, b, sum, out].into_iter().map(|t| (t.id, t)).collect();
    let g = GraphBlob::from_nodes(0, &[3, 4], &table).unwrap();
    assert_eq!(g.tensors.iter().map(|t| t.id).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    c.set_tensor(&a, 0, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]), false).unwrap();
    c.set_tensor(&b, 0, &f32_bytes(&[0.5; 4]), false).unwrap();
    c.graph_compute(&g).unwrap();
    assert_eq!(bytes_f32(&c.get_tensor(&out, 0, 16).unwrap()), [2.5, 4.5, 6.5, 8.5]);
}

#[test]
fn c29_alternating_graphs_see_new_inputs_and_survive_frees() {
    // Two graphs sent in turn with GRAPH_COMPUTE (the second and later sends of each are answered
    // from the connection's built-graph cache): each run reads the inputs written just before it,
    // and freeing a buffer forgets the cached graphs without harming the live ones.
    let s = TestServer::start();
    let mut c = s.client();
    let (b1, base1) = buffer(&mut c, 48);
    let (b2, base2) = buffer(&mut c, 48);
    let (g1, [a1, x1, o1]) = add_graph(b1, base1, 4);
    let (g2, [a2, x2, o2]) = add_graph(b2, base2, 4);
    for step in 0..4 {
        let v = step as f32;
        c.set_tensor(&a1, 0, &f32_bytes(&[v; 4]), false).unwrap();
        c.set_tensor(&x1, 0, &f32_bytes(&[1.0; 4]), false).unwrap();
        c.graph_compute(&g1).unwrap();
        assert_eq!(bytes_f32(&c.get_tensor(&o1, 0, 16).unwrap()), [v + 1.0; 4], "g1 step {step}");
        c.set_tensor(&a2, 0, &f32_bytes(&[v; 4]), false).unwrap();
        c.set_tensor(&x2, 0, &f32_bytes(&[10.0; 4]), false).unwrap();
        c.graph_compute(&g2).unwrap();
        assert_eq!(bytes_f32(&c.get_tensor(&o2, 0, 16).unwrap()), [v + 10.0; 4], "g2 step {step}");
    }
    c.free_buffer(b2).unwrap();
    c.set_tensor(&a1, 0, &f32_bytes(&[7.0; 4]), false).unwrap();
    c.graph_compute(&g1).unwrap();
    assert_eq!(bytes_f32(&c.get_tensor(&o1, 0, 16).unwrap()), [8.0; 4]);
}
