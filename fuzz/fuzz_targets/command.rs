//! Every command's decoder, at every supported protocol version (8.0.0 and 7.0.0): the first byte
//! picks the command, the rest is its payload. A payload that decodes must encode back to the same
//! command (and, for fixed-size commands, the same bytes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use llamad_proto::cmd::RequestSize;
use llamad_proto::msg::{Command, HelloRsp, SetTensorHeader, Tensor2d};
use llamad_proto::{GraphBlob, Limits, RpcTensor};

fuzz_target!(|data: &[u8]| {
    let Some((&cmd, payload)) = data.split_first() else { return };
    let limits = Limits { max_nodes: 4096, max_tensors: 4096 };
    let _ = RpcTensor::decode(payload);
    let _ = SetTensorHeader::decode(payload);
    let _ = HelloRsp::decode(payload);
    let _ = Tensor2d::decode(payload);
    let _ = llamad_proto::msg::decode_request_header(payload);
    if let Ok((uid, g)) = GraphBlob::decode_with_uid(payload, &limits) {
        let mut v = Vec::new();
        g.encode_with_uid_into(uid, &mut v);
        assert_eq!(&payload[..v.len()], &v[..], "8.0.0 graph re-encoding differs");
    }
    if let Ok(g) = GraphBlob::decode(payload, &limits) {
        let mut v = Vec::new();
        g.encode_into(&mut v);
        assert_eq!(v.len(), g.encoded_len());
        // Bytes after the table are tolerated, so the encoding is a prefix of the payload.
        assert_eq!(&payload[..v.len()], &v[..], "graph re-encoding differs");
    }
    for proto in llamad_proto::version::SUPPORTED {
        let Ok(c) = Command::decode(proto, cmd, payload, &limits) else { continue };
        let spec = proto.spec(cmd).expect("decoded command is in the table");
        assert_eq!(c.cmd(), spec.cmd);
        let enc = c.encode_payload();
        let again = Command::decode(proto, cmd, &enc, &limits).expect("re-encoded command decodes");
        assert_eq!(again, c, "command does not round-trip at {proto}");
        if let RequestSize::Fixed(_) = spec.request {
            assert_eq!(enc, payload, "fixed-size command re-encodes to different bytes at {proto}");
        }
        let frame = c.encode_frame();
        assert_eq!(frame[0], cmd);
        assert_eq!(frame.len(), 9 + enc.len());
    }
});
