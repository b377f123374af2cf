//! Every command's decoder: the first byte picks the command, the rest is its payload. A payload
//! that decodes must encode back to the same command (and, for fixed-size commands, the same bytes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use llamad_proto::cmd::{Cmd, RequestSize};
use llamad_proto::msg::{Command, HelloRsp, SetTensorHeader};
use llamad_proto::{GraphBlob, Limits, RpcTensor};

fuzz_target!(|data: &[u8]| {
    let Some((&cmd, payload)) = data.split_first() else { return };
    let limits = Limits { max_nodes: 4096, max_tensors: 4096 };
    let _ = RpcTensor::decode(payload);
    let _ = SetTensorHeader::decode(payload);
    let _ = HelloRsp::decode(payload);
    let _ = llamad_proto::msg::decode_request_header(payload);
    if let Ok(g) = GraphBlob::decode(payload, &limits) {
        let mut v = Vec::new();
        g.encode_into(&mut v);
        assert_eq!(v.len(), g.encoded_len());
        // Bytes after the table are tolerated, so the encoding is a prefix of the payload.
        assert_eq!(&payload[..v.len()], &v[..], "graph re-encoding differs");
    }
    let Ok(c) = Command::decode(cmd, payload, &limits) else { return };
    let c_id = Cmd::from_u8(cmd).expect("decoded command has a valid byte");
    assert_eq!(c.cmd(), c_id);
    let enc = c.encode_payload();
    let again = Command::decode(cmd, &enc, &limits).expect("re-encoded command decodes");
    assert_eq!(again, c, "command does not round-trip");
    if let RequestSize::Fixed(_) = c_id.request_size() {
        assert_eq!(enc, payload, "fixed-size command re-encodes to different bytes");
    }
    let frame = c.encode_frame();
    assert_eq!(frame[0], cmd);
    assert_eq!(frame.len(), 9 + enc.len());
});
