//! A scripted 8.0.0 master session after ggml-rpc-protocol-8.md ("What a master does differently at
//! 8.0.0", `-sm tensor` on two servers): HELLO, COMM_INIT on both ranks, the weight halves uploaded
//! with SET_TENSOR_2D, one graph per rank computing its partial product, COMM_ALLREDUCE, and the
//! summed results read back. The sums are checked bit for bit against a local computation (exact
//! integer-grid arithmetic, and an independent BF16 rounding for tensors of 32 768 elements or
//! more); then the failure paths: a peer that vanished, and a connection that is not the named peer.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use llamad::config::Config;
use llamad::Shared;
use llamad_proto::msg::{CommInitReq, Tensor2d};
use llamad_proto::version::V8;
use llamad_proto::{GraphBlob, RpcClient, RpcTensor};

use crate::common::*;

const K: u32 = 64;

fn server() -> TestServer {
    let cfg = Config {
        threads: 2,
        mem: Some(256 << 20),
        hello_timeout: Duration::from_secs(3),
        ..Config::default()
    };
    TestServer::with_shared_proto(Shared::new(cfg), "127.0.0.1:0", &V8)
}

/// W: `M` rows of `K` small integers; x: `K` values on a 2^-9 grid. Every partial product and sum
/// is exact in f32, so any summation order gives the same bits.
fn w_at(m: u32, k: u32) -> f32 {
    ((m * 7 + k * 3) % 7) as f32 - 3.0
}

fn x_at(k: u32) -> f32 {
    (k % 7) as f32 - 3.0 + (k % 5) as f32 / 512.0
}

/// The partial of rank `r` (columns `r·K/2 .. (r+1)·K/2`) for row `m`, in f64 (exact).
fn partial(r: u32, m: u32) -> f64 {
    (r * K / 2..(r + 1) * K / 2).map(|k| f64::from(w_at(m, k)) * f64::from(x_at(k))).sum()
}

/// ggml's f32 → bf16 → f32, written from the reference's formula (round to nearest even on the
/// top 16 bits), independent of the server's code.
fn bf16_round(v: f32) -> f32 {
    let b = v.to_bits();
    f32::from_bits(((b + 0x7fff + ((b >> 16) & 1)) >> 16) << 16)
}

struct Rank {
    c: RpcClient,
    w: RpcTensor,
    y: RpcTensor,
    graph: GraphBlob,
}

/// One rank: a buffer holding W (full size, `K × m` f32, zero except this rank's column half), x and
/// y; W's half uploaded with SET_TENSOR_2D (rows of `K/2` floats, `K` floats apart on the server).
fn rank(s: &TestServer, r: u32, m: u32) -> Rank {
    let mut c = s.client();
    assert_eq!(c.protocol(), &V8);
    let w_bytes = u64::from(K) * u64::from(m) * 4;
    let size = w_bytes + u64::from(K) * 4 + u64::from(m) * 4;
    let (buf, base) = buffer(&mut c, size);
    c.buffer_clear(buf, 0).unwrap();
    let w = RpcTensor {
        id: 1,
        dtype: 0,
        buffer: buf,
        ne: [K, m, 1, 1],
        nb: [4, 4 * K, 4 * K * m, 4 * K * m],
        data: base,
        ..Default::default()
    }
    .with_name("w");
    let x = f32_tensor(2, buf, base + w_bytes, K).with_name("x");
    let mut y = f32_tensor(3, buf, base + w_bytes + u64::from(K) * 4, m).with_name("y");
    y.op = compute::GgmlOp::MulMat as u32;
    y.flags = compute::op::flags::COMPUTE;
    y.src[0] = 1;
    y.src[1] = 2;
    // This rank's half of every row, packed on the wire.
    let half: Vec<f32> =
        (0..m).flat_map(|row| (r * K / 2..(r + 1) * K / 2).map(move |k| w_at(row, k))).collect();
    let h = Tensor2d {
        tensor: w,
        offset: u64::from(r * K / 2) * 4,
        size: u64::from(K / 2) * 4,
        n_copies: m.into(),
        stride: u64::from(K) * 4,
    };
    c.set_tensor_2d(&h, &f32_bytes(&half)).unwrap();
    c.set_tensor(&x, 0, &f32_bytes(&(0..K).map(x_at).collect::<Vec<_>>()), false).unwrap();
    let graph = GraphBlob { device: 0, nodes: vec![3], tensors: vec![w, x, y] };
    Rank { c, w, y, graph }
}

fn link(ranks: &mut [Rank; 2], port: u16) {
    for (r, k) in ranks.iter_mut().enumerate() {
        k.c.send_comm_init(&CommInitReq::new(0, r as u32, 2, u32::from(port), "127.0.0.1").unwrap()).unwrap();
    }
    for k in ranks.iter_mut() {
        assert!(k.c.recv_comm_init().unwrap(), "link up");
    }
}

/// The whole session for `m` output rows; returns the two servers for further checks.
fn session(m: u32) -> (TestServer, TestServer) {
    let (s0, s1) = (server(), server());
    let mut ranks = [rank(&s0, 0, m), rank(&s1, 1, m)];
    // The W halves landed where they belong: row 0 read back whole.
    let row0 = bytes_f32(&ranks[1].c.get_tensor(&ranks[1].w, 0, u64::from(K) * 4).unwrap());
    let want: Vec<f32> = (0..K).map(|k| if k < K / 2 { 0.0 } else { w_at(0, k) }).collect();
    assert_eq!(row0, want);
    link(&mut ranks, e2e::server::free_port().unwrap());
    for k in ranks.iter_mut() {
        let uid = k.c.fresh_uid();
        k.c.graph_compute_uid(&k.graph, uid).unwrap();
        k.c.comm_allreduce(0, &k.y).unwrap();
    }
    let bf16 = m >= 32_768;
    for (r, k) in ranks.iter_mut().enumerate() {
        let got = bytes_f32(&k.c.get_tensor(&k.y, 0, u64::from(m) * 4).unwrap());
        let (own, peer) = (r as u32, 1 - r as u32);
        for (row, v) in got.iter().enumerate() {
            let mine = partial(own, row as u32) as f32;
            let theirs = partial(peer, row as u32) as f32;
            let want = mine + if bf16 { bf16_round(theirs) } else { theirs };
            assert_eq!(v.to_bits(), want.to_bits(), "rank {r}, row {row}: {v} != {want} (bf16 {bf16})");
        }
        if !bf16 {
            // Both ranks hold the same full product, W·x.
            let exact: Vec<f32> = (0..m).map(|row| (partial(0, row) + partial(1, row)) as f32).collect();
            assert_eq!(got, exact);
        }
    }
    if bf16 {
        // The link's rounding is visible: the two ranks differ somewhere.
        let a = ranks[0].c.get_tensor(&ranks[0].y, 0, u64::from(m) * 4).unwrap();
        let b = ranks[1].c.get_tensor(&ranks[1].y, 0, u64::from(m) * 4).unwrap();
        assert_ne!(a, b);
    }
    for k in ranks.iter_mut() {
        k.c.comm_free(0).unwrap();
        assert_eq!(k.c.device_count().unwrap(), 1);
    }
    assert_eq!(s0.shared.stats.allreduces.load(Ordering::Relaxed), 1);
    assert_eq!(s1.shared.stats.allreduces.load(Ordering::Relaxed), 1);
    (s0, s1)
}

#[test]
fn allreduce_f32_on_the_link_gives_the_exact_sum() {
    session(256);
}

#[test]
fn allreduce_just_under_the_bf16_threshold_stays_f32() {
    session(32_767);
}

#[test]
fn allreduce_bf16_on_the_link_from_32768_elements() {
    session(32_768);
}

#[test]
fn a_dead_peer_fails_the_allreduce_cleanly() {
    let (s0, s1) = (server(), server());
    let mut ranks = [rank(&s0, 0, 64), rank(&s1, 1, 64)];
    link(&mut ranks, e2e::server::free_port().unwrap());
    let [r0, mut r1] = ranks;
    // Rank 0's master connection closes: its link goes with it.
    drop(r0);
    s1.shared.stats.take_last_refusal();
    let t0 = Instant::now();
    r1.c.graph_compute_uid(&r1.graph, 1).unwrap();
    r1.c.comm_allreduce(0, &r1.y).unwrap();
    assert_closed(r1.c.stream());
    assert!(t0.elapsed() < Duration::from_secs(5), "failed in {:?}", t0.elapsed());
    let reason = s1.shared.stats.take_last_refusal().unwrap_or_default();
    assert!(reason.contains("COMM_ALLREDUCE with"), "{reason}");
    drop(r1);
    assert_memory_back(&s1, 0);
    s1.assert_alive();
    s0.assert_alive();
}

#[test]
fn rank_0_admits_only_the_named_peer() {
    // Rank 0 is told its peer is 127.0.0.2; a connection from 127.0.0.1 is dropped, and with no
    // other peer the link is not made (answer 0, within the bounded wait), the connection stays.
    let s0 = server();
    let mut r0 = rank(&s0, 0, 8);
    let port = e2e::server::free_port().unwrap();
    r0.c.send_comm_init(&CommInitReq::new(0, 0, 2, u32::from(port), "127.0.0.2").unwrap()).unwrap();
    let t0 = Instant::now();
    let mut impostor = None;
    while t0.elapsed() < Duration::from_secs(2) && impostor.is_none() {
        impostor = std::net::TcpStream::connect(("127.0.0.1", port)).ok();
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut impostor = impostor.expect("rank 0 listens");
    assert!(!r0.c.recv_comm_init().unwrap(), "no link with an unnamed peer");
    assert!(t0.elapsed() < Duration::from_secs(6));
    assert_closed(&mut impostor);
    assert_eq!(r0.c.device_count().unwrap(), 1);
}

#[test]
fn a_link_does_not_outlive_its_master_connection() {
    // Rank 1 waits in an all-reduce for rank 0, whose master sends nothing; then rank 1's master
    // leaves. The wait ends with it (not after the 300 s exchange timeout), the link closes, and
    // rank 0's next all-reduce fails at once.
    let (s0, s1) = (server(), server());
    let mut ranks = [rank(&s0, 0, 64), rank(&s1, 1, 64)];
    link(&mut ranks, e2e::server::free_port().unwrap());
    let [mut r0, mut r1] = ranks;
    r1.c.graph_compute_uid(&r1.graph, 1).unwrap();
    r1.c.comm_allreduce(0, &r1.y).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    drop(r1);
    assert_memory_back(&s1, 0);
    assert!(t0.elapsed() < Duration::from_secs(3), "rank 1's connection ended after {:?}", t0.elapsed());
    s0.shared.stats.take_last_refusal();
    r0.c.graph_compute_uid(&r0.graph, 1).unwrap();
    r0.c.comm_allreduce(0, &r0.y).unwrap();
    assert_closed(r0.c.stream());
    let reason = s0.shared.stats.take_last_refusal().unwrap_or_default();
    assert!(reason.contains("COMM_ALLREDUCE with"), "{reason}");
    s0.assert_alive();
    s1.assert_alive();
}
