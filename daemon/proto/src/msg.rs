//! Request and response payloads of every command, and the [`Command`] decoder.
//!
//! Decoding takes the connection's [`Protocol`] table: the same byte means another command, or
//! another layout, in another version (GRAPH_COMPUTE's uid, id 18).
//!
//! ref: ggml-rpc-protocol.md §5 (sizes and offsets), §6 (HELLO), §7 (semantics);
//! ggml-rpc-protocol-8.md (the 8.0.0 commands).

use crate::cmd::{Cmd, COMM_HOST_SIZE, CONN_CAPS_SIZE};
use crate::error::{Error, Result};
use crate::graph::GraphBlob;
use crate::hash::WireHash;
use crate::tensor::{RpcTensor, MAX_SRC};
use crate::version::{GraphFormat, Protocol};
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

/// SET_TENSOR_2D prefix (328 bytes; the rows follow, packed) and GET_TENSOR_2D request (8.0.0):
/// `n_copies` rows of `size` bytes, row `i` at tensor offset `offset + i·stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor2d {
    /// The tensor.
    pub tensor: RpcTensor,
    /// Byte offset of the first row inside the tensor.
    pub offset: u64,
    /// Bytes per row.
    pub size: u64,
    /// Rows.
    pub n_copies: u64,
    /// Distance between two rows' starts on the server.
    pub stride: u64,
}

impl Tensor2d {
    /// Bytes on the wire, `size·n_copies`; `None` when the product overflows.
    pub fn packed_len(&self) -> Option<u64> {
        self.size.checked_mul(self.n_copies)
    }

    /// Decodes the 328-byte prefix.
    pub fn decode(b: &[u8]) -> Result<Tensor2d> {
        let mut r = Reader::new(b, "2D tensor header");
        let t = Tensor2d::read(&mut r)?;
        r.finish()?;
        Ok(t)
    }

    fn read(r: &mut Reader<'_>) -> Result<Tensor2d> {
        Ok(Tensor2d {
            tensor: RpcTensor::read(r)?,
            offset: r.u64()?,
            size: r.u64()?,
            n_copies: r.u64()?,
            stride: r.u64()?,
        })
    }

    fn encode_into(&self, v: &mut Vec<u8>) {
        self.tensor.encode_into(v);
        v.put_u64(self.offset);
        v.put_u64(self.size);
        v.put_u64(self.n_copies);
        v.put_u64(self.stride);
    }
}

/// COMM_INIT request (80 bytes, 8.0.0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommInitReq {
    /// Device index.
    pub device: u32,
    /// This server's rank (0 listens, 1 connects).
    pub rank: u32,
    /// Group size (2).
    pub world: u32,
    /// The link's port: rank 0 listens on it, rank 1 connects to it.
    pub port: u32,
    /// NUL-padded host name or address.
    pub host: [u8; COMM_HOST_SIZE],
}

impl CommInitReq {
    /// A request with `host` copied in (at most 63 bytes, so that a NUL follows).
    pub fn new(device: u32, rank: u32, world: u32, port: u32, host: &str) -> Result<CommInitReq> {
        let mut h = [0u8; COMM_HOST_SIZE];
        let b = host.as_bytes();
        if b.len() >= COMM_HOST_SIZE {
            return Err(Error::invalid("COMM_INIT", format!("host {host:?} longer than 63 bytes")));
        }
        h[..b.len()].copy_from_slice(b);
        Ok(CommInitReq { device, rank, world, port, host: h })
    }

    /// The host up to its first NUL; `None` when it is not UTF-8 or has no NUL.
    pub fn host_str(&self) -> Option<&str> {
        let end = self.host.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&self.host[..end]).ok()
    }
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

    /// Whether a master speaking every supported version accepts this server (ref: §2: same major,
    /// a minor not above its own).
    pub fn is_compatible(&self) -> bool {
        Protocol::for_server(self).is_some()
    }

    /// The version the answer announces.
    pub fn version(&self) -> crate::version::Version {
        crate::version::Version { major: self.major, minor: self.minor, patch: self.patch }
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
    /// GRAPH_COMPUTE; the uid is `Some` at 8.0.0 (0: do not store), `None` at 7.0.0.
    GraphCompute(GraphBlob, Option<u64>),
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
        /// The stored graph's uid (8.0.0); `None` replays the last graph (7.0.0).
        uid: Option<u64>,
    },
    /// MEMSET_TENSOR.
    MemsetTensor(MemsetTensorReq),
    /// SET_TENSOR_2D with its packed rows (8.0.0).
    SetTensor2d(Tensor2d, &'a [u8]),
    /// GET_TENSOR_2D (8.0.0).
    GetTensor2d(Tensor2d),
    /// COMM_INIT (8.0.0).
    CommInit(CommInitReq),
    /// COMM_ALLREDUCE (8.0.0).
    CommAllreduce {
        /// Device index.
        device: u32,
        /// The F32 tensor summed in place.
        tensor: RpcTensor,
    },
    /// COMM_FREE (8.0.0).
    CommFree {
        /// Device index.
        device: u32,
    },
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
            Command::GraphCompute(..) => Cmd::GraphCompute,
            Command::GetDeviceMemory { .. } => Cmd::GetDeviceMemory,
            Command::InitTensor(_) => Cmd::InitTensor,
            Command::GetAllocSize(_) => Cmd::GetAllocSize,
            Command::Hello(_) => Cmd::Hello,
            Command::DeviceCount => Cmd::DeviceCount,
            Command::GraphRecompute { .. } => Cmd::GraphRecompute,
            Command::MemsetTensor(_) => Cmd::MemsetTensor,
            Command::SetTensor2d(..) => Cmd::SetTensor2d,
            Command::GetTensor2d(_) => Cmd::GetTensor2d,
            Command::CommInit(_) => Cmd::CommInit,
            Command::CommAllreduce { .. } => Cmd::CommAllreduce,
            Command::CommFree { .. } => Cmd::CommFree,
        }
    }

    /// Decodes the payload of command byte `cmd` as version `proto` has it. The length must match
    /// the table exactly for fixed-size commands (ref: §3.3); a byte the table lacks is invalid.
    pub fn decode(proto: &Protocol, cmd: u8, payload: &'a [u8], limits: &Limits) -> Result<Command<'a>> {
        let spec = proto.spec(cmd).ok_or_else(|| {
            Error::invalid("command", format!("unknown command byte {cmd} at protocol {proto}"))
        })?;
        let c = spec.cmd;
        if !spec.request.accepts(payload.len() as u64) {
            return Err(Error::invalid(
                "command",
                format!("{c}: payload of {} bytes, table says {:?}", payload.len(), spec.request),
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
                return Ok(match proto.graph {
                    GraphFormat::LastGraph => {
                        Command::GraphCompute(GraphBlob::decode(payload, limits)?, None)
                    }
                    GraphFormat::Uid => {
                        let (uid, g) = GraphBlob::decode_with_uid(payload, limits)?;
                        Command::GraphCompute(g, Some(uid))
                    }
                });
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
            Cmd::GraphRecompute => Command::GraphRecompute {
                device: r.u32()?,
                uid: match proto.graph {
                    GraphFormat::LastGraph => None,
                    GraphFormat::Uid => Some(r.u64()?),
                },
            },
            Cmd::MemsetTensor => Command::MemsetTensor(MemsetTensorReq {
                tensor: RpcTensor::read(&mut r)?,
                offset: r.u64()?,
                size: r.u64()?,
                value: r.u8()?,
            }),
            Cmd::SetTensor2d => {
                let h = Tensor2d::read(&mut r)?;
                let n = r.remaining();
                if h.packed_len() != Some(n as u64) {
                    return Err(Error::invalid(
                        "SET_TENSOR_2D",
                        format!("{n} data bytes for {} rows of {} bytes", h.n_copies, h.size),
                    ));
                }
                Command::SetTensor2d(h, r.bytes(n)?)
            }
            Cmd::GetTensor2d => Command::GetTensor2d(Tensor2d::read(&mut r)?),
            Cmd::CommInit => Command::CommInit(CommInitReq {
                device: r.u32()?,
                rank: r.u32()?,
                world: r.u32()?,
                port: r.u32()?,
                host: r.array()?,
            }),
            Cmd::CommAllreduce => {
                Command::CommAllreduce { device: r.u32()?, tensor: RpcTensor::read(&mut r)? }
            }
            Cmd::CommFree => Command::CommFree { device: r.u32()? },
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
            | Command::CommFree { device } => v.put_u32(*device),
            Command::GraphRecompute { device, uid } => {
                v.put_u32(*device);
                if let Some(uid) = uid {
                    v.put_u64(*uid);
                }
            }
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
            Command::GraphCompute(g, None) => g.encode_into(&mut v),
            Command::GraphCompute(g, Some(uid)) => g.encode_with_uid_into(*uid, &mut v),
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
            Command::SetTensor2d(h, data) => {
                h.encode_into(&mut v);
                v.extend_from_slice(data);
            }
            Command::GetTensor2d(h) => h.encode_into(&mut v),
            Command::CommInit(c) => {
                v.put_u32(c.device);
                v.put_u32(c.rank);
                v.put_u32(c.world);
                v.put_u32(c.port);
                v.extend_from_slice(&c.host);
            }
            Command::CommAllreduce { device, tensor } => {
                v.put_u32(*device);
                tensor.encode_into(&mut v);
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
            Command::GraphCompute(
                GraphBlob { device: 0, nodes: vec![3], tensors: vec![t(1), t(2), t(3)] },
                None,
            ),
            Command::GetDeviceMemory { device: 0 },
            Command::InitTensor(t(9)),
            Command::GetAllocSize(Box::new(GetAllocSizeReq { device: 0, tensor: t(4), srcs })),
            Command::Hello([3; 24]),
            Command::DeviceCount,
            Command::GraphRecompute { device: 0, uid: None },
            Command::MemsetTensor(MemsetTensorReq { tensor: t(6), offset: 1, size: 2, value: 3 }),
        ]
    }

    /// 7.0.0's commands with 8.0.0's graph layout, and the five new ones.
    fn all_commands_v8() -> Vec<Command<'static>> {
        let mut v: Vec<Command<'static>> = all_commands()
            .into_iter()
            .map(|c| match c {
                Command::GraphCompute(g, None) => Command::GraphCompute(g, Some(0x1122_3344_5566_7788)),
                Command::GraphRecompute { device, uid: None } => {
                    Command::GraphRecompute { device, uid: Some(9) }
                }
                c => c,
            })
            .collect();
        let h = Tensor2d { tensor: t(4), offset: 8, size: 3, n_copies: 2, stride: 16 };
        v.push(Command::SetTensor2d(h, b"abcdef"));
        v.push(Command::GetTensor2d(h));
        v.push(Command::CommInit(CommInitReq::new(0, 1, 2, 51052, "10.0.0.2").unwrap()));
        v.push(Command::CommAllreduce { device: 0, tensor: t(5) });
        v.push(Command::CommFree { device: 0 });
        v
    }

    #[test]
    fn every_command_round_trips() {
        let l = Limits::default();
        for (proto, cmds) in [(&crate::version::V7, all_commands()), (&crate::version::V8, all_commands_v8())]
        {
            for c in cmds {
                let frame = c.encode_frame();
                let (id, len) = decode_request_header(&frame).unwrap();
                assert_eq!(id, c.cmd() as u8);
                assert_eq!(len as usize, frame.len() - 9);
                assert!(proto.spec(id).unwrap().request.accepts(len), "{} at {proto}", c.cmd());
                let back = Command::decode(proto, id, &frame[9..], &l).unwrap();
                assert_eq!(back, c);
            }
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
        let v7 = &crate::version::V7;
        assert!(Command::decode(v7, 18, &[0; 328], &l).is_err(), "18 is RPC_CMD_NONE at 7.0.0");
        assert!(Command::decode(v7, 19, &[], &l).is_err());
        assert!(Command::decode(v7, 15, &[0], &l).is_err());
        assert!(Command::decode(v7, 14, &[0; 23], &l).is_err());
        assert!(Command::decode(v7, 14, &[0; 25], &l).is_err());
        assert!(Command::decode(v7, 6, &[0; 304], &l).is_err());
        assert!(
            matches!(Command::decode(v7, 6, &[0; 305], &l), Ok(Command::SetTensor(_, d)) if d.is_empty())
        );
        let v8 = &crate::version::V8;
        assert!(Command::decode(v8, 23, &[], &l).is_err(), "23 is RPC_CMD_NONE at 8.0.0");
        assert!(Command::decode(v8, 16, &[0; 4], &l).is_err(), "8.0.0 RECOMPUTE carries a uid");
        assert!(Command::decode(v7, 16, &[0; 12], &l).is_err());
    }

    #[test]
    fn hello_response() {
        let h = crate::version::V7.hello();
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
