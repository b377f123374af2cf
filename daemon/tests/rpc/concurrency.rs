//! Several connections at once: concurrent compute, isolation, large streamed writes, shutdown.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use crate::common::*;

#[test]
fn two_clients_compute_concurrently() {
    let s = TestServer::start();
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|k| {
            let addr = s.addr;
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut c = llamad_proto::RpcClient::connect(addr).unwrap();
                let n = 1024u32;
                let (buf, base) = buffer(&mut c, 12 * n as u64);
                let (g, [a, b, out]) = add_graph(buf, base, n);
                barrier.wait();
                for it in 0..40 {
                    let xa: Vec<f32> = (0..n).map(|i| (i as f32) * (k as f32 + 1.0) + it as f32).collect();
                    let xb: Vec<f32> = (0..n).map(|i| 1000.0 * k as f32 - i as f32).collect();
                    c.set_tensor(&a, 0, &f32_bytes(&xa), false).unwrap();
                    c.set_tensor(&b, 0, &f32_bytes(&xb), false).unwrap();
                    if it % 2 == 0 {
                        c.graph_compute(&g).unwrap();
                    } else {
                        c.graph_recompute(0).unwrap();
                    }
                    let got = bytes_f32(&c.get_tensor(&out, 0, 4 * n as u64).unwrap());
                    let want: Vec<f32> = xa.iter().zip(&xb).map(|(x, y)| x + y).collect();
                    assert_eq!(got, want, "client {k} iteration {it}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(s.shared.stats.graphs_computed.load(std::sync::atomic::Ordering::Relaxed), 80);
}

#[test]
fn many_connections_at_once_are_isolated() {
    let s = TestServer::start();
    let handles: Vec<_> = (0..16u8)
        .map(|k| {
            let addr = s.addr;
            std::thread::spawn(move || {
                let mut c = llamad_proto::RpcClient::connect(addr).unwrap();
                let (buf, base) = buffer(&mut c, 4096);
                let t = llamad_proto::RpcTensor {
                    id: 1,
                    dtype: 24,
                    buffer: buf,
                    ne: [4096, 1, 1, 1],
                    nb: [1, 4096, 4096, 4096],
                    data: base,
                    ..Default::default()
                };
                c.set_tensor(&t, 0, &vec![k; 4096], false).unwrap();
                std::thread::sleep(Duration::from_millis(50));
                assert_eq!(c.get_tensor(&t, 0, 4096).unwrap(), vec![k; 4096]);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn large_set_tensor_is_streamed_into_place() {
    let s = TestServer::start();
    let mut c = s.client();
    let n = 24u64 << 20;
    let (buf, base) = buffer(&mut c, n);
    let t = llamad_proto::RpcTensor {
        id: 1,
        dtype: 24,
        buffer: buf,
        ne: [(n / 2) as u32, 2, 1, 1],
        nb: [1, (n / 2) as u32, n as u32, n as u32],
        data: base,
        ..Default::default()
    };
    let data: Vec<u8> = (0..n).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    c.set_tensor(&t, 0, &data, false).unwrap();
    let back = c.get_tensor(&t, 0, n).unwrap();
    assert!(back == data, "large write did not round-trip");
}

#[test]
fn shutdown_closes_connections_and_frees_buffers() {
    let s = TestServer::start();
    let mut c = s.client();
    buffer(&mut c, 1 << 20);
    let shared = s.shared.clone();
    drop(s); // signals shutdown and joins the server thread
    assert_closed(c.stream());
    assert_eq!(shared.memory.allocated(), 0);
}

/// Throughput and latency figures over loopback; run with `LLAMAD_SLOW_TESTS=1 -- --nocapture`.
#[test]
fn throughput_figures() {
    if std::env::var_os("LLAMAD_SLOW_TESTS").is_none() {
        return;
    }
    let s = TestServer::with_config(llamad::Config {
        threads: 2,
        mem: Some(1 << 30),
        ..llamad::Config::default()
    });
    let mut c = s.client();
    let n = 256u64 << 20;
    let (buf, base) = buffer(&mut c, n);
    let t = llamad_proto::RpcTensor {
        id: 1,
        dtype: 24,
        buffer: buf,
        ne: [(n / 4) as u32, 4, 1, 1],
        nb: [1, (n / 4) as u32, n as u32, n as u32],
        data: base,
        ..Default::default()
    };
    let data: Vec<u8> = (0..n).map(|i| ((i * 7) >> 3) as u8).collect();
    let t0 = std::time::Instant::now();
    c.set_tensor(&t, 0, &data, false).unwrap();
    assert_eq!(c.device_count().unwrap(), 1);
    let set = t0.elapsed();
    let t0 = std::time::Instant::now();
    let back = c.get_tensor(&t, 0, n).unwrap();
    let get = t0.elapsed();
    assert!(back == data);
    let mib = (n >> 20) as f64;
    eprintln!("SET_TENSOR {mib} MiB: {:.0} MiB/s", mib / set.as_secs_f64());
    eprintln!("GET_TENSOR {mib} MiB: {:.0} MiB/s", mib / get.as_secs_f64());
    let (gbuf, gbase) = buffer(&mut c, 48);
    let (g, [_, _, out]) = add_graph(gbuf, gbase, 4);
    let iters = 2000;
    let t0 = std::time::Instant::now();
    for i in 0..iters {
        if i == 0 {
            c.graph_compute(&g).unwrap();
        } else {
            c.graph_recompute(0).unwrap();
        }
        c.get_tensor(&out, 0, 16).unwrap();
    }
    eprintln!(
        "GRAPH_RECOMPUTE + GET_TENSOR round trip: {:.1} us",
        t0.elapsed().as_secs_f64() * 1e6 / iters as f64
    );
    let t0 = std::time::Instant::now();
    for _ in 0..iters {
        c.graph_compute(&g).unwrap();
        c.get_tensor(&out, 0, 16).unwrap();
    }
    eprintln!(
        "GRAPH_COMPUTE (3 tensors) + GET_TENSOR round trip: {:.1} us",
        t0.elapsed().as_secs_f64() * 1e6 / iters as f64
    );
}

#[test]
fn per_connection_quota() {
    let cfg = llamad::Config {
        threads: 1,
        mem: Some(TEST_MEM),
        max_connection_mem: Some(1 << 20),
        ..llamad::Config::default()
    };
    let s = TestServer::with_config(cfg);
    let mut a = s.client();
    let first = a.alloc_buffer(0, 1 << 20).unwrap();
    assert_ne!(first.remote_ptr, 0);
    assert_eq!(a.alloc_buffer(0, 1).unwrap().remote_ptr, 0, "quota exceeded must fail the allocation");
    let mut b = s.client();
    assert_ne!(b.alloc_buffer(0, 1 << 20).unwrap().remote_ptr, 0, "another connection has its own quota");
    a.free_buffer(first.remote_ptr).unwrap();
    assert_ne!(a.alloc_buffer(0, 1000).unwrap().remote_ptr, 0, "freeing returns quota");
}

#[test]
fn large_fill_and_copy() {
    let s = TestServer::start();
    let mut c = s.client();
    let n = 4u32 << 20;
    let (buf, base) = buffer(&mut c, n as u64);
    let whole = llamad_proto::RpcTensor {
        id: 1,
        dtype: 24,
        buffer: buf,
        ne: [n, 1, 1, 1],
        nb: [1, n, n, n],
        data: base,
        ..Default::default()
    };
    let half = n / 2;
    let lo = llamad_proto::RpcTensor { id: 2, ne: [half, 1, 1, 1], nb: [1, half, half, half], ..whole };
    let hi = llamad_proto::RpcTensor { id: 3, data: base + half as u64, ..lo };
    c.buffer_clear(buf, 0x11).unwrap();
    c.memset_tensor(&lo, 1, half as u64 - 2, 0x22).unwrap();
    assert!(c.copy_tensor(&lo, &hi).unwrap());
    let all = c.get_tensor(&whole, 0, n as u64).unwrap();
    for (i, &b) in all.iter().enumerate() {
        let j = i % half as usize;
        let want = if j == 0 || j == half as usize - 1 { 0x11 } else { 0x22 };
        assert_eq!(b, want, "byte {i}");
    }
}
