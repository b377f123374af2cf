//! Command identities and the constants every protocol version shares.
//!
//! A [`Cmd`] names what a command does; its discriminant is the command byte, which no upstream
//! version has ever renumbered (ids only get added). Which ids a version accepts, how long their
//! requests are and whether they answer is the version's table ([`crate::version::Protocol`]), not
//! this enum: 18 is `RPC_CMD_NONE` (invalid) at 7.0.0 and SET_TENSOR_2D at 8.0.0.
//!
//! ref: ggml-rpc-protocol.md §5 (command table), §3.3 (payload checks); ggml-rpc-protocol-8.md
//! (command table, 8.0.0).

use crate::tensor::RPC_TENSOR_SIZE;

/// Size of the connection capability block in HELLO (`RPC_CONN_CAPS_SIZE`).
pub const CONN_CAPS_SIZE: usize = 24;
/// Bytes of a request frame header: `u8 cmd, u64 len`.
pub const REQUEST_HEADER_SIZE: usize = 9;
/// Bytes of a response frame header: `u64 len`.
pub const RESPONSE_HEADER_SIZE: usize = 8;
/// Prefix of a SET_TENSOR payload before the data: `rpc_tensor, u8 cache_flag, u64 offset`.
pub const SET_TENSOR_HEADER_SIZE: usize = RPC_TENSOR_SIZE + 1 + 8;
/// Prefix of a SET_TENSOR_2D payload before the rows, and the whole GET_TENSOR_2D request:
/// `rpc_tensor, u64 offset, u64 size, u64 n_copies, u64 stride` (ref: ggml-rpc-protocol-8.md).
pub const TENSOR_2D_HEADER_SIZE: usize = RPC_TENSOR_SIZE + 4 * 8;
/// Bytes of the host field of COMM_INIT (NUL-padded).
pub const COMM_HOST_SIZE: usize = 64;
/// The master's threshold above which weight writes go through SET_TENSOR_HASH first.
pub const HASH_THRESHOLD: u64 = 10 * 1024 * 1024;

/// A command (every id any supported version defines).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Cmd {
    /// `u32 device, u64 size` → `u64 remote_ptr, u64 remote_size`.
    AllocBuffer = 0,
    /// `u32 device` → `u64 alignment`.
    GetAlignment = 1,
    /// `u32 device` → `u64 max_size`.
    GetMaxSize = 2,
    /// `u64 remote_ptr` → `u64 base`.
    BufferGetBase = 3,
    /// `u64 remote_ptr`, no response.
    FreeBuffer = 4,
    /// `u64 remote_ptr, u8 value`, no response.
    BufferClear = 5,
    /// `rpc_tensor, u8 cache_flag, u64 offset, data`, no response.
    SetTensor = 6,
    /// `rpc_tensor, u64 offset, u64 hash` → `u8 result`.
    SetTensorHash = 7,
    /// `rpc_tensor, u64 offset, u64 size` → `size` bytes.
    GetTensor = 8,
    /// `rpc_tensor src, rpc_tensor dst` → `u8 result`.
    CopyTensor = 9,
    /// graph blob (7.0.0), or `u32 device, u64 uid`, graph (8.0.0); no response.
    GraphCompute = 10,
    /// `u32 device` → `u64 free, u64 total`.
    GetDeviceMemory = 11,
    /// `rpc_tensor`, no response.
    InitTensor = 12,
    /// `u32 device, rpc_tensor, rpc_tensor srcs[10]` → `u64 alloc_size`.
    GetAllocSize = 13,
    /// `u8 caps[24]` → `u8 major, minor, patch, pad, caps[24]`.
    Hello = 14,
    /// empty → `u32 count`.
    DeviceCount = 15,
    /// `u32 device` (7.0.0) or `u32 device, u64 uid` (8.0.0), no response.
    GraphRecompute = 16,
    /// `rpc_tensor, u64 offset, u64 size, u8 value`, no response.
    MemsetTensor = 17,
    /// 8.0.0: `rpc_tensor, u64 offset, u64 size, u64 n_copies, u64 stride, rows`, no response.
    SetTensor2d = 18,
    /// 8.0.0: `rpc_tensor, u64 offset, u64 size, u64 n_copies, u64 stride` → `size·n_copies` bytes.
    GetTensor2d = 19,
    /// 8.0.0: `u32 device, u32 rank, u32 world, u32 port, char host[64]` → `u8 ok`.
    CommInit = 20,
    /// 8.0.0: `u32 device, rpc_tensor`, no response.
    CommAllreduce = 21,
    /// 8.0.0: `u32 device`, no response.
    CommFree = 22,
}

/// Number of command identities (one past the highest id of any supported version).
pub const CMD_COUNT: usize = 23;

/// Every command identity, indexed by its id.
pub const ALL_CMDS: [Cmd; CMD_COUNT] = [
    Cmd::AllocBuffer,
    Cmd::GetAlignment,
    Cmd::GetMaxSize,
    Cmd::BufferGetBase,
    Cmd::FreeBuffer,
    Cmd::BufferClear,
    Cmd::SetTensor,
    Cmd::SetTensorHash,
    Cmd::GetTensor,
    Cmd::CopyTensor,
    Cmd::GraphCompute,
    Cmd::GetDeviceMemory,
    Cmd::InitTensor,
    Cmd::GetAllocSize,
    Cmd::Hello,
    Cmd::DeviceCount,
    Cmd::GraphRecompute,
    Cmd::MemsetTensor,
    Cmd::SetTensor2d,
    Cmd::GetTensor2d,
    Cmd::CommInit,
    Cmd::CommAllreduce,
    Cmd::CommFree,
];

/// How long a request payload must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestSize {
    /// Exactly this many bytes.
    Fixed(u64),
    /// At least this many bytes (SET_TENSOR, SET_TENSOR_2D, GRAPH_COMPUTE).
    AtLeast(u64),
}

impl RequestSize {
    /// True if `len` is an acceptable payload length.
    pub fn accepts(self, len: u64) -> bool {
        match self {
            RequestSize::Fixed(n) => len == n,
            RequestSize::AtLeast(n) => len >= n,
        }
    }
}

/// How a command is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseSize {
    /// No response frame.
    None,
    /// A frame of exactly this many payload bytes.
    Fixed(u64),
    /// A frame whose length the request gives (GET_TENSOR's `size`, GET_TENSOR_2D's `size·n_copies`).
    FromRequest,
}

impl Cmd {
    /// The identity with id `b` in any supported version; which version accepts it is the
    /// version table's business ([`crate::version::Protocol::spec`]).
    pub fn from_id(b: u8) -> Option<Cmd> {
        ALL_CMDS.get(b as usize).copied()
    }

    /// ggml's name of the command.
    pub fn name(self) -> &'static str {
        match self {
            Cmd::AllocBuffer => "ALLOC_BUFFER",
            Cmd::GetAlignment => "GET_ALIGNMENT",
            Cmd::GetMaxSize => "GET_MAX_SIZE",
            Cmd::BufferGetBase => "BUFFER_GET_BASE",
            Cmd::FreeBuffer => "FREE_BUFFER",
            Cmd::BufferClear => "BUFFER_CLEAR",
            Cmd::SetTensor => "SET_TENSOR",
            Cmd::SetTensorHash => "SET_TENSOR_HASH",
            Cmd::GetTensor => "GET_TENSOR",
            Cmd::CopyTensor => "COPY_TENSOR",
            Cmd::GraphCompute => "GRAPH_COMPUTE",
            Cmd::GetDeviceMemory => "GET_DEVICE_MEMORY",
            Cmd::InitTensor => "INIT_TENSOR",
            Cmd::GetAllocSize => "GET_ALLOC_SIZE",
            Cmd::Hello => "HELLO",
            Cmd::DeviceCount => "DEVICE_COUNT",
            Cmd::GraphRecompute => "GRAPH_RECOMPUTE",
            Cmd::MemsetTensor => "MEMSET_TENSOR",
            Cmd::SetTensor2d => "SET_TENSOR_2D",
            Cmd::GetTensor2d => "GET_TENSOR_2D",
            Cmd::CommInit => "COMM_INIT",
            Cmd::CommAllreduce => "COMM_ALLREDUCE",
            Cmd::CommFree => "COMM_FREE",
        }
    }
}

impl std::fmt::Display for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_the_discriminants() {
        for (i, c) in ALL_CMDS.iter().enumerate() {
            assert_eq!(*c as usize, i);
            assert_eq!(Cmd::from_id(i as u8), Some(*c));
        }
        assert_eq!(Cmd::from_id(23), None);
        assert_eq!(Cmd::from_id(255), None);
        assert_eq!(Cmd::Hello as u8, 14);
        assert_eq!(TENSOR_2D_HEADER_SIZE, 328);
    }
}
