//! llamad's split-mode-row extension (`llamad_proto::ext`): negotiated in HELLO so llama.cpp peers
//! see the reference's bytes; linked workers run a whole ubatch with the partial sums exchanged
//! between them (checked against hand-computed values); and every malformed or out-of-order use is
//! refused with the connection closed, memory back to baseline and bystanders untouched.

use std::io::{Read, Write};

use llamad_proto::client::read_response;
use llamad_proto::ext::{self, LinkDial, TpRun};
use llamad_proto::{Cmd, GraphBlob, RpcClient, RpcTensor};

use crate::common::*;

fn answer(c: &mut RpcClient, len: u64) -> Vec<u8> {
    read_response(c.stream(), Cmd::GraphCompute, len).unwrap()
}

fn store_frame(slot: u32, blob: &GraphBlob, input: &RpcTensor, output: &RpcTensor) -> Vec<u8> {
    ext::graph_store_frame(slot, input, output, blob)
}

/// One `out = x + b` graph over f32[4] on `c`, with `b` set and stored in slots 0, 1 and 2.
fn store_add_slots(c: &mut RpcClient, b: [f32; 4]) -> [RpcTensor; 3] {
    store_add_slots_from(c, b, 0)
}

/// As [`store_add_slots`], in its own buffer and in slots `first..first + 3`.
fn store_add_slots_from(c: &mut RpcClient, b: [f32; 4], first: u32) -> [RpcTensor; 3] {
    let (buf, base) = buffer(c, 64);
    let (blob, [x, bt, out]) = add_graph(buf, base, 4);
    c.set_tensor(&bt, 0, &f32_bytes(&b), false).unwrap();
    let mut frames = Vec::new();
    for slot in first..first + 3 {
        frames.extend(store_frame(slot, &blob, &x, &out));
    }
    c.stream().write_all(&frames).unwrap();
    [x, bt, out]
}

fn tp_run(rank: u32, n_ranks: u32, x: &[u8]) -> Vec<u8> {
    TpRun { rank, n_ranks, n_tokens: 1, n_outputs: 1, n_embd: 4, slots: vec![0, 1, 2], x }.encode_frame()
}

#[test]
fn only_a_master_that_asks_gets_the_extension() {
    let s = TestServer::start();
    // llama.cpp's HELLO (zero caps): the reference's answer, byte for byte (raw_hello asserts it).
    let mut raw = s.raw_hello();
    // ... and extension commands are refused on that connection.
    s.shared.stats.take_last_refusal();
    raw.write_all(&tp_run(0, 1, &f32_bytes(&[0.0; 4]))).unwrap();
    assert_closed(&mut raw);
    let reason = s.shared.stats.take_last_refusal().unwrap_or_default();
    assert!(reason.contains("did not negotiate"), "{reason}");
    // A master that asks gets the grant.
    let mut raw = s.raw();
    raw.write_all(&frame(14, &ext::request_caps())).unwrap();
    let mut rsp = [0u8; 36];
    raw.read_exact(&mut rsp).unwrap();
    assert_eq!(&rsp[..12], &hello_reply()[..12]);
    assert_eq!(rsp[12..], ext::grant_caps());
    assert_eq!(s.client().ext_version(), Some(ext::EXT_VERSION));
    s.assert_alive();
}

#[test]
fn one_rank_runs_the_slots_over_the_residual() {
    let s = TestServer::start();
    let mut c = s.client();
    let [_, _, out] = store_add_slots(&mut c, [10.0, 20.0, 30.0, 40.0]);
    c.stream().write_all(&tp_run(0, 1, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]))).unwrap();
    // Slot 0: x ← x + (x + b) = [12, 24, 36, 48]; slot 1 (on the output rows, here all of x):
    // [34, 68, 102, 136]; slot 2 (the head) answers x + b.
    assert_eq!(bytes_f32(&answer(&mut c, 16)), [44.0, 88.0, 132.0, 176.0]);
    // The connection goes on with the plain protocol; the head's output is in place.
    assert_eq!(bytes_f32(&c.get_tensor(&out, 0, 16).unwrap()), [44.0, 88.0, 132.0, 176.0]);
}

#[test]
fn two_linked_ranks_exchange_partial_sums() {
    let (sa, sb) = (TestServer::start(), TestServer::start());
    let (mut a, mut b) = (sa.client(), sb.client());
    let token = [0x5a; ext::TOKEN_SIZE];
    a.stream().write_all(&ext::link_offer_frame(&token)).unwrap();
    let port = answer(&mut a, 2);
    let dial = LinkDial {
        peer_rank: 0,
        token,
        port: u16::from_le_bytes([port[0], port[1]]),
        host: "127.0.0.1".into(),
    };
    b.stream().write_all(&dial.encode_frame()).unwrap();
    a.stream().write_all(&ext::link_accept_frame(1, &token)).unwrap();
    assert_eq!(answer(&mut a, 1), [1]);
    assert_eq!(answer(&mut b, 1), [1]);
    store_add_slots(&mut a, [10.0, 20.0, 30.0, 40.0]);
    store_add_slots(&mut b, [1.0, 1.0, 1.0, 1.0]);
    let x = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    a.stream().write_all(&tp_run(0, 2, &x)).unwrap();
    b.stream().write_all(&tp_run(1, 2, &x)).unwrap();
    // Each phase: x ← x + (x + b_A) + (x + b_B) = 3x + [11, 21, 31, 41]:
    // [14, 27, 40, 53], then [53, 102, 151, 200]; each head answers x + its own b.
    assert_eq!(bytes_f32(&answer(&mut a, 16)), [63.0, 122.0, 181.0, 240.0]);
    assert_eq!(bytes_f32(&answer(&mut b, 16)), [54.0, 103.0, 152.0, 201.0]);
    // Again, on the same link.
    a.stream().write_all(&tp_run(0, 2, &x)).unwrap();
    b.stream().write_all(&tp_run(1, 2, &x)).unwrap();
    assert_eq!(bytes_f32(&answer(&mut a, 16)), [63.0, 122.0, 181.0, 240.0]);
    assert_eq!(bytes_f32(&answer(&mut b, 16)), [54.0, 103.0, 152.0, 201.0]);
    // A peer that leaves makes the other's next run fail (closed, with the reason), not hang.
    drop(b);
    drop(sb);
    sa.shared.stats.take_last_refusal();
    a.stream().write_all(&tp_run(0, 2, &x)).unwrap();
    assert_closed(a.stream());
    let reason = sa.shared.stats.take_last_refusal().unwrap_or_default();
    assert!(reason.contains("rank 1"), "{reason}");
    sa.assert_alive();
}

/// Links two servers (rank 0 on `a`, rank 1 on `b`).
fn link(a: &mut RpcClient, b: &mut RpcClient) {
    let token = [0x3c; ext::TOKEN_SIZE];
    a.stream().write_all(&ext::link_offer_frame(&token)).unwrap();
    let port = answer(a, 2);
    let port = u16::from_le_bytes([port[0], port[1]]);
    let dial = LinkDial { peer_rank: 0, token, port, host: "127.0.0.1".into() };
    b.stream().write_all(&dial.encode_frame()).unwrap();
    a.stream().write_all(&ext::link_accept_frame(1, &token)).unwrap();
    assert_eq!(answer(a, 1), [1]);
    assert_eq!(answer(b, 1), [1]);
}

#[test]
fn two_streams_interleave_on_linked_ranks() {
    let (sa, sb) = (TestServer::start(), TestServer::start());
    let (mut a, mut b) = (sa.client(), sb.client());
    link(&mut a, &mut b);
    // Stream 0 in slots 0..3, stream 1 in slots 3..6, each over its own buffer.
    for (c, bias) in [(&mut a, [10.0, 20.0, 30.0, 40.0]), (&mut b, [1.0; 4])] {
        store_add_slots_from(c, bias, 0);
        store_add_slots_from(c, bias, 3);
    }
    let (x0, x1) = (f32_bytes(&[1.0, 2.0, 3.0, 4.0]), f32_bytes(&[0.0; 4]));
    fn run(rank: u32, x: &[u8], first: u32) -> TpRun<'_> {
        TpRun {
            rank,
            n_ranks: 2,
            n_tokens: 1,
            n_outputs: 1,
            n_embd: 4,
            slots: (first..first + 3).collect(),
            x,
        }
    }
    for _ in 0..2 {
        a.stream().write_all(&ext::tp_run_streams_frame(&[run(0, &x0, 0), run(0, &x1, 3)])).unwrap();
        b.stream().write_all(&ext::tp_run_streams_frame(&[run(1, &x0, 0), run(1, &x1, 3)])).unwrap();
        // Stream 0 as in `two_linked_ranks_exchange_partial_sums`. Stream 1 from x = 0: [11, 21, 31,
        // 41], then 3x + [11, 21, 31, 41] = [44, 84, 124, 164]; each head answers x + its own b.
        // The answer is both heads, in stream order.
        let want_a = [63.0, 122.0, 181.0, 240.0, 54.0, 104.0, 154.0, 204.0];
        let want_b = [54.0, 103.0, 152.0, 201.0, 45.0, 85.0, 125.0, 165.0];
        assert_eq!(bytes_f32(&answer(&mut a, 32)), want_a);
        assert_eq!(bytes_f32(&answer(&mut b, 32)), want_b);
    }
    // A stream over a slot that was never stored is refused before anything runs.
    sa.shared.stats.take_last_refusal();
    a.stream().write_all(&ext::tp_run_streams_frame(&[run(0, &x0, 0), run(0, &x1, 6)])).unwrap();
    assert_closed(a.stream());
    let reason = sa.shared.stats.take_last_refusal().unwrap_or_default();
    assert!(reason.contains("never stored"), "{reason}");
    sa.assert_alive();
    sb.assert_alive();
}

#[test]
fn a_dialler_without_the_token_gets_no_link() {
    let s = TestServer::start();
    let mut c = s.client();
    let token = [7u8; ext::TOKEN_SIZE];
    c.stream().write_all(&ext::link_offer_frame(&token)).unwrap();
    let port = answer(&mut c, 2);
    let port = u16::from_le_bytes([port[0], port[1]]);
    let mut intruder = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    intruder.write_all(&[8u8; ext::TOKEN_SIZE]).unwrap();
    c.stream().write_all(&ext::link_accept_frame(1, &token)).unwrap();
    // The intruder is dropped without the ack; nobody else dials, so the accept answers 0 after its
    // timeout and the connection stays usable (the master then relays).
    let mut ack = [0u8; 1];
    intruder.set_read_timeout(Some(std::time::Duration::from_secs(15))).unwrap();
    assert!(matches!(intruder.read(&mut ack), Ok(0) | Err(_)), "the intruder got an ack");
    assert_eq!(answer(&mut c, 1), [0]);
    assert_eq!(c.device_count().unwrap(), 1);
}

#[test]
fn malformed_extension_use_is_refused() {
    let x = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    attack("never stored", |a| a.send_raw(&tp_run(0, 1, &x)));
    attack("without a LINK_OFFER", |a| a.send_raw(&ext::link_accept_frame(1, &[0; 32])));
    attack("another token", |a| {
        a.send_raw(&ext::link_offer_frame(&[1; 32]));
        let _ = answer(&mut a.c, 2);
        a.send_raw(&ext::link_accept_frame(1, &[2; 32]));
    });
    attack("no link to rank 1", |a| {
        let (blob, [x_t, _, out]) = add_graph(a.buf, a.base, 4);
        for slot in 0..3 {
            a.send_raw(&store_frame(slot, &blob, &x_t, &out));
        }
        a.send_raw(&tp_run(0, 2, &x));
    });
    attack("leaves buffer", |a| {
        let (blob, [x_t, _, out]) = add_graph(a.buf, a.base, 4);
        let outside = f32_tensor(9, a.buf, a.base + 1020, 4);
        a.send_raw(&store_frame(0, &blob, &x_t, &outside));
        let _ = out;
    });
    attack("EXT_TP_RUN", |a| {
        let f = tp_run(0, 1, &x);
        // The residual one byte short (the frame length adjusted to match).
        let mut p = f[9..f.len() - 1].to_vec();
        let mut g = vec![ext::CMD_TP_RUN];
        g.extend_from_slice(&(p.len() as u64).to_le_bytes());
        g.append(&mut p);
        a.send_raw(&g);
    });
    attack("never stored", |a| {
        // Slots die with any FREE_BUFFER (they may point into the freed buffer).
        let (blob, [x_t, _, out]) = add_graph(a.buf, a.base, 4);
        for slot in 0..3 {
            a.send_raw(&store_frame(slot, &blob, &x_t, &out));
        }
        let (other, _) = buffer(&mut a.c, 32);
        a.c.free_buffer(other).unwrap();
        a.send_raw(&tp_run(0, 1, &x));
    });
    attack("slot", |a| {
        let (blob, [x_t, _, out]) = add_graph(a.buf, a.base, 4);
        a.send_raw(&store_frame(ext::MAX_SLOTS, &blob, &x_t, &out));
    });
}
