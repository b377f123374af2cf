//! Request and response payloads of every command, and the [`Command`] decoder.
//!
//! ref: ggml-rpc-protocol.md §5 (sizes and offsets), §6 (HELLO), §7 (semantics).

use crate::cmd::{Cmd, CONN_CAPS_SIZE, PROTO_MAJOR, PROTO_MINOR, PROTO_PATCH};
use crate::error::{Error, Result};
use crate::graph::GraphBlob;
use crate::hash::WireHash;
use crate::tensor::{RpcTensor, MAX_SRC};
use crate::wire::{Put, Reader};

/// ALLOC_BUFFER request (12 bytes: `device` at 0, `size` at 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocBufferReq {
    /// Device index.
    pub device: u32,
    /// Requested bytes.
    pub size: u64,
}

/// ALLOC_BUFFER response (16 bytes); `{0, 0}` means the allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AllocBufferRsp {
    /// Buffer handle, 0 on failure.
    pub remote_ptr: u64,
    /// Actual size (≥ the request).
    pub remote_size: u64,
}

/// SET_TENSOR prefix (305 bytes: tensor, `cache_flag` at 296, `offset` at 297); data follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetTensorHeader {
    /// Destination tensor.
    pub tensor: RpcTensor,
    /// Non-zero: store the data in the cache.
    pub cache_flag: u8,
    /// Byte offset inside the tensor.
    pub offset: u64,
}

/// SET_TENSOR_HASH request (312 bytes: `offset` at 296, `hash` at 304).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetTensorHashReq {
    /// Destination tensor.
    pub tensor: RpcTensor,
    /// Byte offset inside the tensor.
    pub offset: u64,
    /// FNV-1a-64 of the bytes to write.
    pub hash: WireHash,
}

/// GET_TENSOR request (312 bytes: `offset` at 296, `size` at 304).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetTensorReq {
    /// Source tensor.
    pub tensor: RpcTensor,
    /// Byte offset inside the tensor.
    pub offset: u64,
    /// Bytes to read.
    pub size: u64,
}

/// MEMSET_TENSOR request (313 bytes: `offset` at 296, `size` at 304, `value` at 312).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemsetTensorReq {
    /// Tensor.
    pub tensor: RpcTensor,
    /// Byte offset inside the tensor.
    pub offset: u64,
    /// Bytes to set.
    pub size: u64,
    /// Fill byte.
    pub value: u8,
}

/// GET_ALLOC_SIZE request (3260 bytes: `tensor` at 4, `srcs` at 300).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GetAllocSizeReq {
    /// Device index.
    pub device: u32,
    /// The tensor.
    pub tensor: RpcTensor,
    /// Its sources (id 0 = absent).
    pub srcs: [RpcTensor; MAX_SRC],
}

/// HELLO response (28 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloRsp {
    /// Major version.
    pub major: u8,
    /// Minor version.
    pub minor: u8,
    /// Patch version.
    pub patch: u8,
    /// Connection capabilities (zeros for TCP only).
    pub caps: [u8; CONN_CAPS_SIZE],
}

impl HelloRsp {
    /// Our own answer: 7.0.0, zero caps (ref: §6).
    pub fn ours() -> HelloRsp {
        HelloRsp { major: PROTO_MAJOR, minor: PROTO_MINOR, patch: PROTO_PATCH, caps: [0; CONN_CAPS_SIZE] }
    }

    /// The 28-byte encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![self.major, self.minor, self.patch, 0];
        v.extend_from_slice(&self.caps);
        v
    }

    /// Decodes exactly 28 bytes.
    pub fn decode(b: &[u8]) -> Result<HelloRsp> {
        let mut r = Reader::new(b, "HELLO response");
        let (major, minor, patch, _pad) = (r.u8()?, r.u8()?, r.u8()?, r.u8()?);
        let caps = r.array()?;
        r.finish()?;
        Ok(HelloRsp { major, minor, patch, caps })
    }

    /// The master's acceptance rule: `major == 7 && minor <= 0` (ref: §2).
    // The rule is written as the master has it, so it stays right if PROTO_MINOR ever grows.
    #[allow(clippy::absurd_extreme_comparisons)]
    pub fn is_compatible(&self) -> bool {
        self.major == PROTO_MAJOR && self.minor <= PROTO_MINOR
    }
}

/// GET_DEVICE_MEMORY response (16 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMemoryRsp {
    /// Free bytes.
    pub free: u64,
    /// Total bytes.
    pub total: u64,
}

/// A decoded request. SET_TENSOR borrows its data from the payload.
// Decoded once per frame and matched immediately; boxing the descriptor variants would cost an
// allocation per command for no gain.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command<'a> {
    /// ALLOC_BUFFER.
    AllocBuffer(AllocBufferReq),
    /// GET_ALIGNMENT of a device.
    GetAlignment {
        /// Device index.
        device: u32,
    },
    /// GET_MAX_SIZE of a device.
    GetMaxSize {
        /// Device index.
        device: u32,
    },
    /// BUFFER_GET_BASE.
    BufferGetBase {
        /// Buffer handle.
        remote_ptr: u64,
    },
    /// FREE_BUFFER.
    FreeBuffer {
        /// Buffer handle.
        remote_ptr: u64,
    },
    /// BUFFER_CLEAR.
    BufferClear {
        /// Buffer handle.
        remote_ptr: u64,
        /// Fill byte.
        value: u8,
    },
    /// SET_TENSOR with its data.
    SetTensor(SetTensorHeader, &'a [u8]),
    /// SET_TENSOR_HASH.
    SetTensorHash(SetTensorHashReq),
    /// GET_TENSOR.
    GetTensor(GetTensorReq),
    /// COPY_TENSOR.
    CopyTensor {
        /// Source.
        src: RpcTensor,
        /// Destination.
        dst: RpcTensor,
    },
    /// GRAPH_COMPUTE.
    GraphCompute(GraphBlob),
    /// GET_DEVICE_MEMORY.
    GetDeviceMemory {
        /// Device index.
        device: u32,
    },
    /// INIT_TENSOR.
    InitTensor(RpcTensor),
    /// GET_ALLOC_SIZE.
    GetAllocSize(Box<GetAllocSizeReq>),
    /// HELLO with the peer's caps.
    Hello([u8; CONN_CAPS_SIZE]),
    /// DEVICE_COUNT.
    DeviceCount,
    /// GRAPH_RECOMPUTE.
    GraphRecompute {
        /// Device index.
        device: u32,
    },
    /// MEMSET_TENSOR.
    MemsetTensor(MemsetTensorReq),
}

/// Caps on graph sizes applied while decoding, before anything is allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Maximum `n_nodes`.
    pub max_nodes: u32,
    /// Maximum `n_tensors`.
    pub max_tensors: u32,
}

impl Default for Limits {
    fn default() -> Self {
        // A large model sends ~1 100 nodes / 1 400 tensors (ref: §8.2); leave generous room.
        Limits { max_nodes: 1 << 18, max_tensors: 1 << 18 }
    }
}

impl SetTensorHeader {
    /// Decodes the 305-byte prefix.
    pub fn decode(b: &[u8]) -> Result<SetTensorHeader> {
        let mut r = Reader::new(b, "SET_TENSOR header");
        let tensor = RpcTensor::read(&mut r)?;
        let h = SetTensorHeader { tensor, cache_flag: r.u8()?, offset: r.u64()? };
        r.finish()?;
        Ok(h)
    }
}

impl<'a> Command<'a> {
    /// The command id.
    pub fn cmd(&self) -> Cmd {
        match self {
            Command::AllocBuffer(_) => Cmd::AllocBuffer,
            Command::GetAlignment { .. } => Cmd::GetAlignment,
            Command::GetMaxSize { .. } => Cmd::GetMaxSize,
            Command::BufferGetBase { .. } => Cmd::BufferGetBase,
            Command::FreeBuffer { .. } => Cmd::FreeBuffer,
            Command::BufferClear { .. } => Cmd::BufferClear,
            Command::SetTensor(..) => Cmd::SetTensor,
            Command::SetTensorHash(_) => Cmd::SetTensorHash,
            Command::GetTensor(_) => Cmd::GetTensor,
            Command::CopyTensor { .. } => Cmd::CopyTensor,
            Command::GraphCompute(_) => Cmd::GraphCompute,
            Command::GetDeviceMemory { .. } => Cmd::GetDeviceMemory,
            Command::InitTensor(_) => Cmd::InitTensor,
            Command::GetAllocSize(_) => Cmd::GetAllocSize,
            Command::Hello(_) => Cmd::Hello,
            Command::DeviceCount => Cmd::DeviceCount,
            Command::GraphRecompute { .. } => Cmd::GraphRecompute,
            Command::MemsetTensor(_) => Cmd::MemsetTensor,
        }
    }

    /// Decodes the payload of command byte `cmd`. The length must match the table exactly for
    /// fixed-size commands (ref: §3.3); command bytes 18 and above are invalid.
    pub fn decode(cmd: u8, payload: &'a [u8], limits: &Limits) -> Result<Command<'a>> {
        let c = Cmd::from_u8(cmd)
            .ok_or_else(|| Error::invalid("command", format!("unknown command byte {cmd}")))?;
        if !c.accepts_len(payload.len() as u64) {
            return Err(Error::invalid(
                "command",
                format!("{c}: payload of {} bytes, table says {:?}", payload.len(), c.request_size()),
            ));
        }
        let mut r = Reader::new(payload, c.name());
        let out = match c {
            Cmd::AllocBuffer => Command::AllocBuffer(AllocBufferReq { device: r.u32()?, size: r.u64()? }),
            Cmd::GetAlignment => Command::GetAlignment { device: r.u32()? },
            Cmd::GetMaxSize => Command::GetMaxSize { device: r.u32()? },
            Cmd::BufferGetBase => Command::BufferGetBase { remote_ptr: r.u64()? },
            Cmd::FreeBuffer => Command::FreeBuffer { remote_ptr: r.u64()? },
            Cmd::BufferClear => Command::BufferClear { remote_ptr: r.u64()?, value: r.u8()? },
            Cmd::SetTensor => {
                let tensor = RpcTensor::read(&mut r)?;
                let h = SetTensorHeader { tensor, cache_flag: r.u8()?, offset: r.u64()? };
                let n = r.remaining();
                Command::SetTensor(h, r.bytes(n)?)
            }
            Cmd::SetTensorHash => Command::SetTensorHash(SetTensorHashReq {
                tensor: RpcTensor::read(&mut r)?,
                offset: r.u64()?,
                hash: WireHash(r.u64()?),
            }),
            Cmd::GetTensor => Command::GetTensor(GetTensorReq {
                tensor: RpcTensor::read(&mut r)?,
                offset: r.u64()?,
                size: r.u64()?,
            }),
            Cmd::CopyTensor => {
                Command::CopyTensor { src: RpcTensor::read(&mut r)?, dst: RpcTensor::read(&mut r)? }
            }
            Cmd::GraphCompute => {
                let g = GraphBlob::decode(payload, limits)?;
                return Ok(Command::GraphCompute(g));
            }
            Cmd::GetDeviceMemory => Command::GetDeviceMemory { device: r.u32()? },
            Cmd::InitTensor => Command::InitTensor(RpcTensor::read(&mut r)?),
            Cmd::GetAllocSize => {
                let device = r.u32()?;
                let tensor = RpcTensor::read(&mut r)?;
                let mut srcs = [RpcTensor::default(); MAX_SRC];
                for s in srcs.iter_mut() {
                    *s = RpcTensor::read(&mut r)?;
                }
                Command::GetAllocSize(Box::new(GetAllocSizeReq { device, tensor, srcs }))
            }
            Cmd::Hello => Command::Hello(r.array()?),
            Cmd::DeviceCount => Command::DeviceCount,
            Cmd::GraphRecompute => Command::GraphRecompute { device: r.u32()? },
            Cmd::MemsetTensor => Command::MemsetTensor(MemsetTensorReq {
                tensor: RpcTensor::read(&mut r)?,
                offset: r.u64()?,
                size: r.u64()?,
                value: r.u8()?,
            }),
        };
        r.finish()?;
        Ok(out)
    }

    /// The request payload (without the 9-byte frame header).
    pub fn encode_payload(&self) -> Vec<u8> {
        let mut v = Vec::new();
        match self {
            Command::AllocBuffer(a) => {
                v.put_u32(a.device);
                v.put_u64(a.size);
            }
            Command::GetAlignment { device }
            | Command::GetMaxSize { device }
            | Command::GetDeviceMemory { device }
            | Command::GraphRecompute { device } => v.put_u32(*device),
            Command::BufferGetBase { remote_ptr } | Command::FreeBuffer { remote_ptr } => {
                v.put_u64(*remote_ptr)
            }
            Command::BufferClear { remote_ptr, value } => {
                v.put_u64(*remote_ptr);
                v.put_u8(*value);
            }
            Command::SetTensor(h, data) => {
                h.tensor.encode_into(&mut v);
                v.put_u8(h.cache_flag);
                v.put_u64(h.offset);
                v.extend_from_slice(data);
            }
            Command::SetTensorHash(s) => {
                s.tensor.encode_into(&mut v);
                v.put_u64(s.offset);
                v.put_u64(s.hash.0);
            }
            Command::GetTensor(g) => {
                g.tensor.encode_into(&mut v);
                v.put_u64(g.offset);
                v.put_u64(g.size);
            }
            Command::CopyTensor { src, dst } => {
                src.encode_into(&mut v);
                dst.encode_into(&mut v);
            }
            Command::GraphCompute(g) => g.encode_into(&mut v),
            Command::InitTensor(t) => t.encode_into(&mut v),
            Command::GetAllocSize(g) => {
                v.put_u32(g.device);
                g.tensor.encode_into(&mut v);
                for s in &g.srcs {
                    s.encode_into(&mut v);
                }
            }
            Command::Hello(caps) => v.extend_from_slice(caps),
            Command::DeviceCount => {}
            Command::MemsetTensor(m) => {
                m.tensor.encode_into(&mut v);
                v.put_u64(m.offset);
                v.put_u64(m.size);
                v.put_u8(m.value);
            }
        }
        v
    }

    /// The whole request frame: `u8 cmd, u64 len, payload` (ref: §3.1).
    pub fn encode_frame(&self) -> Vec<u8> {
        let p = self.encode_payload();
        let mut v = Vec::with_capacity(9 + p.len());
        v.put_u8(self.cmd() as u8);
        v.put_u64(p.len() as u64);
        v.extend_from_slice(&p);
        v
    }
}

/// Decodes a request frame header: `(cmd byte, payload length)`.
pub fn decode_request_header(b: &[u8]) -> Result<(u8, u64)> {
    let mut r = Reader::new(b, "request header");
    Ok((r.u8()?, r.u64()?))
}

/// Encodes a response frame: `u64 len, payload` (ref: §3.2).
pub fn encode_response(payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + payload.len());
    v.put_u64(payload.len() as u64);
    v.extend_from_slice(payload);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::GraphBlob;

    fn t(id: u64) -> RpcTensor {
        RpcTensor {
            id,
            dtype: 0,
            ne: [4, 1, 1, 1],
            nb: [4, 16, 16, 16],
            data: 0x1000 + id,
            buffer: 7,
            ..Default::default()
        }
        .with_name("t")
    }

    fn all_commands() -> Vec<Command<'static>> {
        let mut srcs = [RpcTensor::default(); MAX_SRC];
        srcs[0] = t(5);
        vec![
            Command::AllocBuffer(AllocBufferReq { device: 1, size: 1 << 40 }),
            Command::GetAlignment { device: 2 },
            Command::GetMaxSize { device: 3 },
            Command::BufferGetBase { remote_ptr: 0xdead },
            Command::FreeBuffer { remote_ptr: 0xbeef },
            Command::BufferClear { remote_ptr: 9, value: 0xab },
            Command::SetTensor(SetTensorHeader { tensor: t(1), cache_flag: 1, offset: 12 }, b"hello"),
            Command::SetTensorHash(SetTensorHashReq { tensor: t(2), offset: 3, hash: WireHash(0x1234) }),
            Command::GetTensor(GetTensorReq { tensor: t(3), offset: 4, size: 5 }),
            Command::CopyTensor { src: t(1), dst: t(2) },
            Command::GraphCompute(GraphBlob { device: 0, nodes: vec![3], tensors: vec![t(1), t(2), t(3)] }),
            Command::GetDeviceMemory { device: 0 },
            Command::InitTensor(t(9)),
            Command::GetAllocSize(Box::new(GetAllocSizeReq { device: 0, tensor: t(4), srcs })),
            Command::Hello([3; 24]),
            Command::DeviceCount,
            Command::GraphRecompute { device: 0 },
            Command::MemsetTensor(MemsetTensorReq { tensor: t(6), offset: 1, size: 2, value: 3 }),
        ]
    }

    #[test]
    fn every_command_round_trips() {
        let l = Limits::default();
        for c in all_commands() {
            let frame = c.encode_frame();
            let (id, len) = decode_request_header(&frame).unwrap();
            assert_eq!(id, c.cmd() as u8);
            assert_eq!(len as usize, frame.len() - 9);
            assert!(c.cmd().accepts_len(len), "{}", c.cmd());
            let back = Command::decode(id, &frame[9..], &l).unwrap();
            assert_eq!(back, c);
        }
    }

    #[test]
    fn composite_offsets() {
        // ref: §5 offsets inside composite requests.
        let p = Command::SetTensor(
            SetTensorHeader { tensor: t(1), cache_flag: 0x5a, offset: 0x0102030405060708 },
            b"xyz",
        )
        .encode_payload();
        assert_eq!(p[296], 0x5a);
        assert_eq!(u64::from_le_bytes(p[297..305].try_into().unwrap()), 0x0102030405060708);
        assert_eq!(&p[305..], b"xyz");
        let p = Command::MemsetTensor(MemsetTensorReq { tensor: t(1), offset: 11, size: 22, value: 33 })
            .encode_payload();
        assert_eq!(p.len(), 313);
        assert_eq!(u64::from_le_bytes(p[296..304].try_into().unwrap()), 11);
        assert_eq!(u64::from_le_bytes(p[304..312].try_into().unwrap()), 22);
        assert_eq!(p[312], 33);
        let p = Command::GetTensor(GetTensorReq { tensor: t(1), offset: 11, size: 22 }).encode_payload();
        assert_eq!(u64::from_le_bytes(p[304..312].try_into().unwrap()), 22);
        let p = Command::BufferClear { remote_ptr: 1, value: 0x77 }.encode_payload();
        assert_eq!(p[8], 0x77);
        let p = Command::AllocBuffer(AllocBufferReq { device: 1, size: 0x99 }).encode_payload();
        assert_eq!(u64::from_le_bytes(p[4..12].try_into().unwrap()), 0x99);
        let mut srcs = [RpcTensor::default(); MAX_SRC];
        srcs[1] = t(8);
        let p = Command::GetAllocSize(Box::new(GetAllocSizeReq { device: 0, tensor: t(4), srcs }))
            .encode_payload();
        assert_eq!(p.len(), 3260);
        assert_eq!(u64::from_le_bytes(p[4..12].try_into().unwrap()), 4);
        assert_eq!(u64::from_le_bytes(p[300 + 296..300 + 304].try_into().unwrap()), 8);
    }

    #[test]
    fn wrong_lengths_and_ids_are_invalid() {
        let l = Limits::default();
        assert!(Command::decode(18, &[], &l).is_err());
        assert!(Command::decode(19, &[], &l).is_err());
        assert!(Command::decode(15, &[0], &l).is_err());
        assert!(Command::decode(14, &[0; 23], &l).is_err());
        assert!(Command::decode(14, &[0; 25], &l).is_err());
        assert!(Command::decode(6, &[0; 304], &l).is_err());
        assert!(matches!(Command::decode(6, &[0; 305], &l), Ok(Command::SetTensor(_, d)) if d.is_empty()));
    }

    #[test]
    fn hello_response() {
        let h = HelloRsp::ours();
        let b = h.encode();
        assert_eq!(b.len(), 28);
        assert_eq!(&b[..4], &[7, 0, 0, 0]);
        assert_eq!(HelloRsp::decode(&b).unwrap(), h);
        assert!(h.is_compatible());
        assert!(!HelloRsp { minor: 1, ..h }.is_compatible());
        assert!(!HelloRsp { major: 6, ..h }.is_compatible());
        assert!(HelloRsp { patch: 9, ..h }.is_compatible());
        assert_eq!(encode_response(&b)[..8], 28u64.to_le_bytes());
    }
}
