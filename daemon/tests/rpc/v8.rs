//! Protocol 8.0.0 server semantics (ggml-rpc-protocol-8.md): the graph store by uid and its clearing
//! rule, GRAPH_RECOMPUTE by uid, FREE_BUFFER dropping stored graphs, SET_TENSOR_2D/GET_TENSOR_2D, and
//! every hostile input of the new commands (the connection closes with a logged reason, memory
//! returns to baseline, a bystander is unaffected).

use std::io::Write;
use std::sync::atomic::Ordering;

use llamad_proto::msg::{CommInitReq, Command, Tensor2d};
use llamad_proto::version::V8;
use llamad_proto::GraphBlob;

use crate::common::*;

fn v8() -> TestServer {
    TestServer::start_proto(&V8)
}

/// An 8.0.0 client on a fresh server.
fn attack8(expect: &str, f: impl FnOnce(&mut Attacker)) {
    let server = v8();
    attack_on(&server, expect, f);
}

/// `out = a + b` over f32[4] in a fresh buffer, with a and b written.
fn add_setup(c: &mut llamad_proto::RpcClient) -> (GraphBlob, [llamad_proto::RpcTensor; 3]) {
    let (buf, base) = buffer(c, 64);
    let (g, t) = add_graph(buf, base, 4);
    c.set_tensor(&t[0], 0, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]), false).unwrap();
    c.set_tensor(&t[1], 0, &f32_bytes(&[10.0, 20.0, 30.0, 40.0]), false).unwrap();
    (g, t)
}

#[test]
fn hello_announces_8_0_0_and_the_client_picks_the_table() {
    let s = v8();
    let c = s.client();
    assert_eq!(c.server_version().version().to_string(), "8.0.0");
    assert_eq!(c.protocol(), &V8);
    let _raw = s.raw_hello(); // asserts the 36 bytes: 28, 08 00 00 00, 24 zeros
}

#[test]
fn a_stored_graph_is_replayed_by_uid() {
    let s = v8();
    let mut c = s.client();
    let (g, t) = add_setup(&mut c);
    c.graph_compute_uid(&g, 0x55).unwrap();
    assert_eq!(bytes_f32(&c.get_tensor(&t[2], 0, 16).unwrap()), [11.0, 22.0, 33.0, 44.0]);
    // New inputs, same graph: RECOMPUTE by uid picks them up.
    c.set_tensor(&t[0], 0, &f32_bytes(&[0.5, 0.5, 0.5, 0.5]), false).unwrap();
    let hits = s.shared.stats.graph_store_hits.load(Ordering::Relaxed);
    c.graph_recompute_uid(0, 0x55).unwrap();
    assert_eq!(bytes_f32(&c.get_tensor(&t[2], 0, 16).unwrap()), [10.5, 20.5, 30.5, 40.5]);
    assert_eq!(s.shared.stats.graph_store_hits.load(Ordering::Relaxed), hits + 1);
    // The legacy-style calls keep working at 8.0.0: a fresh uid, then RECOMPUTE of it.
    c.graph_compute(&g).unwrap();
    c.graph_recompute(0).unwrap();
    assert_eq!(bytes_f32(&c.get_tensor(&t[2], 0, 16).unwrap()), [10.5, 20.5, 30.5, 40.5]);
    assert_eq!(s.shared.stats.graph_store_hits.load(Ordering::Relaxed), hits + 2);
}

#[test]
fn two_graphs_are_held_at_once() {
    // Unlike 7.0.0's last graph, the store keeps both: alternate replays need no resend.
    let s = v8();
    let mut c = s.client();
    let (buf, base) = buffer(&mut c, 256);
    let (g1, t1) = add_graph(buf, base, 4);
    let (mut g2, _) = add_graph(buf, base + 64, 4);
    for t in &mut g2.tensors {
        t.id += 10;
        for src in t.src.iter_mut().filter(|s| **s != 0) {
            *src += 10;
        }
    }
    g2.nodes = vec![13];
    c.set_tensor(&t1[0], 0, &f32_bytes(&[1.0; 4]), false).unwrap();
    c.set_tensor(&t1[1], 0, &f32_bytes(&[2.0; 4]), false).unwrap();
    c.graph_compute_uid(&g1, 1).unwrap();
    c.graph_compute_uid(&g2, 2).unwrap();
    for uid in [1, 2, 1, 2] {
        c.graph_recompute_uid(0, uid).unwrap();
    }
    assert_eq!(bytes_f32(&c.get_tensor(&t1[2], 0, 16).unwrap()), [3.0; 4]);
    assert!(c.holds_graph(0, 1) && c.holds_graph(0, 2));
}

#[test]
fn the_store_clears_at_1024_graphs_in_step_with_the_master() {
    let s = v8();
    let mut c = s.client();
    let (g, t) = add_setup(&mut c);
    for uid in 1..=1024u64 {
        c.graph_compute_uid(&g, uid).unwrap();
    }
    // Full: replaying any of them works, and sending a stored uid again is not new (no clear).
    c.graph_recompute_uid(0, 1).unwrap();
    c.graph_compute_uid(&g, 1024).unwrap();
    c.graph_recompute_uid(0, 2).unwrap();
    assert_eq!(bytes_f32(&c.get_tensor(&t[2], 0, 16).unwrap()), [11.0, 22.0, 33.0, 44.0]);
    assert_eq!(s.shared.stats.graph_store_clears.load(Ordering::Relaxed), 0);
    // The 1025th distinct uid clears the store first, on both sides.
    c.graph_compute_uid(&g, 5000).unwrap();
    assert!(c.holds_graph(0, 5000) && !c.holds_graph(0, 1));
    c.graph_recompute_uid(0, 5000).unwrap();
    assert_eq!(bytes_f32(&c.get_tensor(&t[2], 0, 16).unwrap()), [11.0, 22.0, 33.0, 44.0]);
    assert_eq!(s.shared.stats.graph_store_clears.load(Ordering::Relaxed), 1);
    s.shared.stats.take_last_refusal();
    c.graph_recompute_uid(0, 1).unwrap();
    assert_closed(c.stream());
    let reason = s.shared.stats.take_last_refusal().unwrap_or_default();
    assert!(reason.contains("does not store"), "{reason}");
}

#[test]
fn recompute_of_an_unknown_uid_closes() {
    attack8("uid 0x63", |a| a.send(&Command::GraphRecompute { device: 0, uid: Some(99) }));
}

#[test]
fn uid_0_is_computed_but_not_stored() {
    attack8("uid 0x0", |a| {
        let (g, t) = add_graph(a.buf, a.base, 4);
        a.c.graph_compute_uid(&g, 0).unwrap();
        assert_eq!(a.c.get_tensor(&t[2], 0, 16).unwrap().len(), 16);
        a.send(&Command::GraphRecompute { device: 0, uid: Some(0) });
    });
}

#[test]
fn free_buffer_drops_the_stored_graphs() {
    attack8("does not store", |a| {
        let (g, _) = add_graph(a.buf, a.base, 4);
        a.c.graph_compute_uid(&g, 7).unwrap();
        let other = a.c.alloc_buffer(0, 64).unwrap();
        a.c.free_buffer(other.remote_ptr).unwrap();
        assert!(!a.c.holds_graph(0, 7), "the client forgets too");
        a.send(&Command::GraphRecompute { device: 0, uid: Some(7) });
    });
}

#[test]
fn a_7_0_0_recompute_frame_is_refused_at_8_0_0() {
    attack8("payload length 4", |a| a.send_raw(&frame(16, &[0, 0, 0, 0])));
}

#[test]
fn set_and_get_tensor_2d_move_strided_rows() {
    let s = v8();
    let mut c = s.client();
    let (buf, base) = buffer(&mut c, 256);
    // A 4×8 f32 matrix (32 floats); write columns 2..5 of every row: 3 floats at stride 32 bytes.
    let t = f32_tensor(1, buf, base, 32);
    c.set_tensor(&t, 0, &[0u8; 128], false).unwrap();
    let rows: Vec<f32> = (0..12).map(|i| i as f32 + 0.25).collect();
    let h = Tensor2d { tensor: t, offset: 8, size: 12, n_copies: 4, stride: 32 };
    c.set_tensor_2d(&h, &f32_bytes(&rows)).unwrap();
    let all = bytes_f32(&c.get_tensor(&t, 0, 128).unwrap());
    let mut want = vec![0.0f32; 32];
    for r in 0..4 {
        want[r * 8 + 2..r * 8 + 5].copy_from_slice(&rows[r * 3..r * 3 + 3]);
    }
    assert_eq!(all, want);
    // GET_TENSOR_2D packs the same rows back.
    assert_eq!(bytes_f32(&c.get_tensor_2d(&h).unwrap()), rows);
    // Zero rows and zero-byte rows are empty answers.
    assert!(c.get_tensor_2d(&Tensor2d { n_copies: 0, ..h }).unwrap().is_empty());
    assert!(c.get_tensor_2d(&Tensor2d { size: 0, ..h }).unwrap().is_empty());
    // The last row may end exactly at the tensor's end.
    let last = Tensor2d { tensor: t, offset: 20, size: 12, n_copies: 4, stride: 32 };
    assert_eq!(c.get_tensor_2d(&last).unwrap().len(), 48);
}

fn t2d(a: &Attacker, n: u32) -> llamad_proto::RpcTensor {
    f32_tensor(1, a.buf, a.base, n)
}

#[test]
fn set_tensor_2d_rows_leaving_the_tensor_or_the_buffer_close() {
    // The last row ends 4 bytes past the tensor (64 floats = 256 bytes).
    attack8("leave the tensor", |a| {
        let h = Tensor2d { tensor: t2d(a, 64), offset: 4, size: 16, n_copies: 16, stride: 16 };
        a.send(&Command::SetTensor2d(h, &[0u8; 256]));
    });
    // A tensor that claims more than its 1 KiB buffer.
    attack8("leaves buffer", |a| {
        let h = Tensor2d { tensor: t2d(a, 1024), offset: 0, size: 4, n_copies: 1, stride: 0 };
        a.send(&Command::SetTensor2d(h, &[0u8; 4]));
    });
    // Rows far apart: (n-1)·stride overflows.
    attack8("overflows", |a| {
        let h = Tensor2d { tensor: t2d(a, 64), offset: 0, size: 1, n_copies: 3, stride: u64::MAX / 2 + 1 };
        a.send(&Command::SetTensor2d(h, &[0u8; 3]));
    });
}

#[test]
fn set_tensor_2d_whose_size_times_copies_overflows_closes() {
    // size·n_copies = 2^64 wraps to 0: the payload (no data) must not pass as "0 bytes of rows".
    attack8("0 data bytes for 4294967296 rows", |a| {
        let h = Tensor2d { tensor: t2d(a, 64), offset: 0, size: 1 << 32, n_copies: 1 << 32, stride: 0 };
        let mut p = Vec::new();
        p.extend_from_slice(&Command::GetTensor2d(h).encode_payload());
        a.send_raw(&frame(18, &p));
    });
    // A payload that disagrees with size·n_copies.
    attack8("for 2 rows of 8 bytes", |a| {
        let h = Tensor2d { tensor: t2d(a, 64), offset: 0, size: 8, n_copies: 2, stride: 8 };
        let mut p = Command::GetTensor2d(h).encode_payload();
        p.extend_from_slice(&[0u8; 15]);
        a.send_raw(&frame(18, &p));
    });
}

#[test]
fn get_tensor_2d_of_absurd_sizes_closes() {
    attack8("overflows", |a| {
        let h = Tensor2d { tensor: t2d(a, 64), offset: 0, size: u64::MAX, n_copies: 2, stride: 0 };
        a.send(&Command::GetTensor2d(h));
    });
    // Rows that all lie inside the tensor but repeat: more bytes than the tensor holds.
    attack8("for a tensor of 256 bytes", |a| {
        let h = Tensor2d { tensor: t2d(a, 64), offset: 0, size: 256, n_copies: 1 << 40, stride: 0 };
        a.send(&Command::GetTensor2d(h));
    });
    attack8("leave the tensor", |a| {
        let h = Tensor2d { tensor: t2d(a, 64), offset: 256, size: 1, n_copies: 1, stride: 0 };
        a.send(&Command::GetTensor2d(h));
    });
}

fn comm_init(a: &mut Attacker, rank: u32, world: u32, port: u32, host: &str) {
    a.send(&Command::CommInit(CommInitReq::new(0, rank, world, port, host).unwrap()));
}

#[test]
fn comm_init_hostile_requests_close() {
    attack8("world 3", |a| comm_init(a, 0, 3, 40000, "127.0.0.1"));
    attack8("world 1", |a| comm_init(a, 0, 1, 40000, "127.0.0.1"));
    attack8("rank 2 out of range", |a| comm_init(a, 2, 2, 40000, "127.0.0.1"));
    attack8("port 70000 out of range", |a| comm_init(a, 1, 2, 70000, "127.0.0.1"));
    attack8("port 0", |a| comm_init(a, 0, 2, 0, "127.0.0.1"));
    // 192.0.2.1 (TEST-NET-1) is outside the default allow list (loopback): refused before any
    // connection is attempted.
    attack8("not in the allow list", |a| comm_init(a, 1, 2, 40000, "192.0.2.1"));
    attack8("host is empty", |a| comm_init(a, 1, 2, 40000, ""));
    attack8("not NUL-terminated", |a| {
        let mut req = CommInitReq::new(0, 1, 2, 40000, "127.0.0.1").unwrap();
        req.host = [b'a'; 64];
        a.send(&Command::CommInit(req));
    });
    attack8("device 3 out of range", |a| {
        a.send(&Command::CommInit(CommInitReq::new(3, 0, 2, 40000, "127.0.0.1").unwrap()))
    });
}

#[test]
fn comm_init_on_a_port_already_taken_closes() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port() as u32;
    attack8("cannot listen on port", |a| comm_init(a, 0, 2, port, "127.0.0.1"));
}

#[test]
fn allreduce_of_a_wrong_tensor_or_before_comm_init_closes() {
    attack8("before COMM_INIT", |a| {
        let mut t = t2d(a, 16);
        t.flags = 16;
        a.send(&Command::CommAllreduce { device: 0, tensor: t });
    });
    attack8("F16 tensor (only F32)", |a| {
        let mut t = t2d(a, 16);
        t.dtype = 1;
        t.nb = [2, 32, 32, 32];
        t.flags = 16;
        a.send(&Command::CommAllreduce { device: 0, tensor: t });
    });
    attack8("non-contiguous", |a| {
        let mut t = t2d(a, 8);
        t.ne = [4, 2, 1, 1];
        t.nb = [4, 32, 64, 64];
        t.flags = 16;
        a.send(&Command::CommAllreduce { device: 0, tensor: t });
    });
    attack8("without the COMPUTE flag", |a| {
        a.send(&Command::CommAllreduce { device: 0, tensor: t2d(a, 16) });
    });
}

#[test]
fn the_new_command_ids_are_unknown_at_7_0_0_and_23_at_8_0_0() {
    // 7.0.0: ids 18-22 are RPC_CMD_NONE and beyond.
    for id in 18u8..=22 {
        attack(&format!("unknown command byte {id}"), |a| a.send_raw(&frame(id, &[0, 0, 0, 0])));
    }
    attack8("unknown command byte 23", |a| a.send_raw(&frame(23, &[])));
}

#[test]
fn comm_free_without_a_link_is_harmless() {
    let s = v8();
    let mut c = s.client();
    c.comm_free(0).unwrap();
    assert_eq!(c.device_count().unwrap(), 1);
    // A 7.0.0 connection has no such command: the client refuses to send it.
    let s7 = TestServer::start();
    let mut c7 = s7.client();
    assert!(c7.comm_free(0).is_err());
    let _ = c7.stream().flush();
    assert_eq!(c7.device_count().unwrap(), 1);
}
