//! Property tests: decoders never panic on arbitrary bytes, and encodings round-trip.

use proptest::prelude::*;

use crate::graph::GraphBlob;
use crate::msg::{Command, Limits};
use crate::tensor::{RpcTensor, RPC_TENSOR_SIZE};

fn tensor() -> impl Strategy<Value = RpcTensor> {
    (any::<[u64; 4]>(), any::<[u32; 9]>(), any::<[i32; 16]>(), any::<[u64; 10]>(), any::<[u8; 32]>())
        .prop_map(|(w, n, op_params, src, name_half)| {
            let mut name = [0u8; 64];
            name[..32].copy_from_slice(&name_half);
            RpcTensor {
                id: w[0],
                dtype: n[0],
                buffer: w[1],
                ne: [n[1], n[2], n[3], n[4]],
                nb: [n[5], n[6], n[7], n[8]],
                op: n[0].rotate_left(7),
                op_params,
                flags: op_params[3],
                src,
                view_src: w[2],
                view_offs: w[3],
                data: w[0] ^ w[3],
                name,
                use_count: op_params[5],
            }
        })
}

proptest! {
    #[test]
    fn decode_never_panics(cmd in any::<u8>(), payload in proptest::collection::vec(any::<u8>(), 0..4000)) {
        for proto in crate::version::SUPPORTED {
            let _ = Command::decode(proto, cmd, &payload, &Limits::default());
        }
        let _ = GraphBlob::decode_with_uid(&payload, &Limits::default());
        let _ = GraphBlob::decode(&payload, &Limits::default());
        let _ = RpcTensor::decode(&payload);
    }

    #[test]
    fn fixed_size_payloads_of_the_right_length_decode(cmd in 0u8..23, bytes in proptest::collection::vec(any::<u8>(), 3260)) {
        for proto in crate::version::SUPPORTED {
            let Some(spec) = proto.spec(cmd) else {
                prop_assert!(Command::decode(proto, cmd, &bytes[..0], &Limits::default()).is_err());
                continue;
            };
            match spec.request {
                crate::cmd::RequestSize::Fixed(n) => {
                    prop_assert!(Command::decode(proto, cmd, &bytes[..n as usize], &Limits::default()).is_ok());
                }
                crate::cmd::RequestSize::AtLeast(_) => {
                    // Variable-size commands: any content of any length decodes or fails cleanly.
                    for n in [0usize, 7, 8, 12, 16, 305, 328, 1000, 3260] {
                        let _ = Command::decode(proto, cmd, &bytes[..n], &Limits::default());
                    }
                }
            }
        }
    }

    #[test]
    fn tensor_round_trips(t in tensor()) {
        let b = t.encode();
        prop_assert_eq!(b.len(), RPC_TENSOR_SIZE);
        prop_assert_eq!(RpcTensor::decode(&b).unwrap(), t);
    }

    #[test]
    fn graph_round_trips(device in any::<u32>(), nodes in proptest::collection::vec(any::<u64>(), 0..20),
                         tensors in proptest::collection::vec(tensor(), 0..6)) {
        let g = GraphBlob { device, nodes, tensors };
        let mut v = Vec::new();
        g.encode_into(&mut v);
        prop_assert_eq!(v.len(), g.encoded_len());
        prop_assert_eq!(GraphBlob::decode(&v, &Limits::default()).unwrap(), g);
    }
}
