//! Byte-level tests of every 8.0.0 command: frames written out by hand from the layouts of
//! ggml-rpc-protocol-8.md (and the `rpc_tensor` table of ggml-rpc-protocol.md §4.3), never produced
//! by the encoder under test, are decoded and compared with the expected command, and the encoder
//! must reproduce them byte for byte.

use crate::graph::GraphBlob;
use crate::msg::{decode_request_header, CommInitReq, Command, HelloRsp, Limits, Tensor2d};
use crate::tensor::RpcTensor;
use crate::version::{V7, V8};

/// The 296-byte descriptor of one tensor, field by field at the offsets of §4.3: id 1, type F32,
/// buffer 0x10, ne [8, 2, 1, 1], nb [4, 32, 64, 64], op NONE, flags COMPUTE, data 0x1000, name "t".
fn hand_tensor() -> Vec<u8> {
    let mut b = vec![0u8; 296];
    b[0] = 0x01; // id
    b[12] = 0x10; // buffer
    b[20] = 8; // ne[0]
    b[24] = 2; // ne[1]
    b[28] = 1; // ne[2]
    b[32] = 1; // ne[3]
    b[36] = 4; // nb[0]
    b[40] = 32; // nb[1]
    b[44] = 64; // nb[2]
    b[48] = 64; // nb[3]
    b[120] = 16; // flags: COMPUTE
    b[220] = 0x00; // data = 0x1000
    b[221] = 0x10;
    b[228] = b't'; // name
    b
}

fn tensor() -> RpcTensor {
    RpcTensor {
        id: 1,
        dtype: 0,
        buffer: 0x10,
        ne: [8, 2, 1, 1],
        nb: [4, 32, 64, 64],
        flags: 16,
        data: 0x1000,
        ..Default::default()
    }
    .with_name("t")
}

/// `u8 cmd, u64 len` followed by the payload pieces.
fn frame(cmd: u8, parts: &[&[u8]]) -> Vec<u8> {
    let body: Vec<u8> = parts.concat();
    let mut v = vec![cmd];
    v.extend_from_slice(&(body.len() as u64).to_le_bytes());
    v.extend_from_slice(&body);
    v
}

/// Decodes `bytes` at 8.0.0, compares with `want`, and re-encodes `want` to the same bytes.
fn check(bytes: &[u8], want: Command<'_>) {
    let (cmd, len) = decode_request_header(bytes).unwrap();
    assert_eq!(len as usize, bytes.len() - 9);
    let got = Command::decode(&V8, cmd, &bytes[9..], &Limits::default()).unwrap();
    assert_eq!(got, want);
    assert_eq!(want.encode_frame(), bytes, "{}", want.cmd());
}

#[test]
fn graph_compute_carries_the_uid_after_the_device() {
    let t = hand_tensor();
    #[rustfmt::skip]
    let head: &[u8] = &[
        0x00, 0x00, 0x00, 0x00,                         // device 0
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // uid
        0x01, 0x00, 0x00, 0x00,                         // n_nodes 1
        0x01, 0, 0, 0, 0, 0, 0, 0,                      // node id 1
        0x01, 0x00, 0x00, 0x00,                         // n_tensors 1
    ];
    let bytes = frame(10, &[head, &t]);
    assert_eq!(bytes.len(), 9 + 4 + 8 + 4 + 8 + 4 + 296);
    let g = GraphBlob { device: 0, nodes: vec![1], tensors: vec![tensor()] };
    check(&bytes, Command::GraphCompute(g.clone(), Some(0x0102_0304_0506_0708)));
    // The same bytes are not a 7.0.0 graph of uid-less layout: there they would read n_nodes = uid's
    // low half and fail.
    assert!(Command::decode(&V7, 10, &bytes[9..], &Limits::default()).is_err());
}

#[test]
fn graph_recompute_is_device_and_uid_packed_in_12_bytes() {
    let bytes = [16, 12, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0xef, 0xbe, 0xad, 0xde, 0, 0, 0, 0];
    check(&bytes, Command::GraphRecompute { device: 3, uid: Some(0xdead_beef) });
}

#[test]
fn set_tensor_2d_packs_its_rows() {
    #[rustfmt::skip]
    let fields: &[u8] = &[
        4, 0, 0, 0, 0, 0, 0, 0,  // offset 4
        3, 0, 0, 0, 0, 0, 0, 0,  // size 3
        2, 0, 0, 0, 0, 0, 0, 0,  // n_copies 2
        32, 0, 0, 0, 0, 0, 0, 0, // stride 32
    ];
    let bytes = frame(18, &[&hand_tensor(), fields, b"abcdef"]);
    assert_eq!(bytes.len(), 9 + 328 + 6);
    let h = Tensor2d { tensor: tensor(), offset: 4, size: 3, n_copies: 2, stride: 32 };
    check(&bytes, Command::SetTensor2d(h, b"abcdef"));
    // One byte short or over of size·n_copies is invalid.
    let l = Limits::default();
    assert!(Command::decode(&V8, 18, &bytes[9..bytes.len() - 1], &l).is_err());
    let mut long = bytes[9..].to_vec();
    long.push(0);
    assert!(Command::decode(&V8, 18, &long, &l).is_err());
}

#[test]
fn get_tensor_2d_is_the_328_byte_header() {
    #[rustfmt::skip]
    let fields: &[u8] = &[
        0, 0, 0, 0, 0, 0, 0, 0,  // offset 0
        8, 0, 0, 0, 0, 0, 0, 0,  // size 8
        2, 0, 0, 0, 0, 0, 0, 0,  // n_copies 2
        32, 0, 0, 0, 0, 0, 0, 0, // stride 32
    ];
    let bytes = frame(19, &[&hand_tensor(), fields]);
    let h = Tensor2d { tensor: tensor(), offset: 0, size: 8, n_copies: 2, stride: 32 };
    check(&bytes, Command::GetTensor2d(h));
}

#[test]
fn comm_init_has_a_64_byte_host() {
    let mut host = [0u8; 64];
    host[..9].copy_from_slice(b"127.0.0.1");
    #[rustfmt::skip]
    let fields: &[u8] = &[
        0, 0, 0, 0,          // device 0
        1, 0, 0, 0,          // rank 1
        2, 0, 0, 0,          // world 2
        0x6c, 0xc7, 0, 0,    // port 51052
    ];
    let bytes = frame(20, &[fields, &host]);
    assert_eq!(bytes.len(), 9 + 80);
    let req = CommInitReq::new(0, 1, 2, 51052, "127.0.0.1").unwrap();
    assert_eq!(req.host_str(), Some("127.0.0.1"));
    check(&bytes, Command::CommInit(req));
    assert!(CommInitReq::new(0, 0, 2, 1, &"h".repeat(64)).is_err(), "no room for the NUL");
}

#[test]
fn comm_allreduce_and_comm_free() {
    let bytes = frame(21, &[&[1, 0, 0, 0], &hand_tensor()]);
    assert_eq!(bytes.len(), 9 + 300);
    check(&bytes, Command::CommAllreduce { device: 1, tensor: tensor() });
    check(&[22, 4, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0], Command::CommFree { device: 2 });
}

#[test]
fn hello_answer_and_the_none_marker() {
    // A TCP-only 8.0.0 server answers 08 00 00 00 and 24 zero bytes.
    let mut want = vec![8, 0, 0, 0];
    want.extend_from_slice(&[0; 24]);
    assert_eq!(V8.hello().encode(), want);
    let h = HelloRsp::decode(&want).unwrap();
    assert!(h.is_compatible());
    // 23 (RPC_CMD_NONE) and everything above are not commands at 8.0.0; 18–22 are not at 7.0.0.
    let l = Limits::default();
    for b in [23u8, 24, 0xff] {
        assert!(Command::decode(&V8, b, &[], &l).is_err());
    }
    for b in 18u8..=22 {
        assert!(V7.spec(b).is_none());
    }
}
