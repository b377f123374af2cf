//! Command ids, their fixed request sizes and which ones have a response.
//!
//! ref: ggml-rpc-protocol.md §5 (command table), §3.3 (payload checks).

use crate::tensor::RPC_TENSOR_SIZE;

/// Protocol version spoken (ref: §2).
pub const PROTO_MAJOR: u8 = 7;
/// Minor version.
pub const PROTO_MINOR: u8 = 0;
/// Patch version.
pub const PROTO_PATCH: u8 = 0;
/// Size of the connection capability block in HELLO (`RPC_CONN_CAPS_SIZE`).
pub const CONN_CAPS_SIZE: usize = 24;
/// Bytes of a request frame header: `u8 cmd, u64 len`.
pub const REQUEST_HEADER_SIZE: usize = 9;
/// Bytes of a response frame header: `u64 len`.
pub const RESPONSE_HEADER_SIZE: usize = 8;
/// Prefix of a SET_TENSOR payload before the data: `rpc_tensor, u8 cache_flag, u64 offset`.
pub const SET_TENSOR_HEADER_SIZE: usize = RPC_TENSOR_SIZE + 1 + 8;
/// The master's threshold above which weight writes go through SET_TENSOR_HASH first.
pub const HASH_THRESHOLD: u64 = 10 * 1024 * 1024;

/// A command id (every value below `RPC_CMD_NONE = 18`).
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
    /// graph blob, no response.
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
    /// `u32 device`, no response.
    GraphRecompute = 16,
    /// `rpc_tensor, u64 offset, u64 size, u8 value`, no response.
    MemsetTensor = 17,
}

/// Number of valid command ids (`RPC_CMD_NONE`, 18, is internal to the master and invalid on the wire).
pub const CMD_COUNT: usize = 18;

/// Every command, indexed by its id.
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
];

/// How long a request payload must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestSize {
    /// Exactly this many bytes.
    Fixed(u64),
    /// At least this many bytes (SET_TENSOR, GRAPH_COMPUTE).
    AtLeast(u64),
}

impl Cmd {
    /// The command with id `b`; `None` for 18 (`RPC_CMD_NONE`) and everything above.
    pub fn from_u8(b: u8) -> Option<Cmd> {
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
        }
    }

    /// The request payload size the table in §5 requires.
    pub fn request_size(self) -> RequestSize {
        let t = RPC_TENSOR_SIZE as u64;
        match self {
            Cmd::AllocBuffer => RequestSize::Fixed(12),
            Cmd::GetAlignment | Cmd::GetMaxSize | Cmd::GetDeviceMemory | Cmd::GraphRecompute => {
                RequestSize::Fixed(4)
            }
            Cmd::BufferGetBase | Cmd::FreeBuffer => RequestSize::Fixed(8),
            Cmd::BufferClear => RequestSize::Fixed(9),
            Cmd::SetTensor => RequestSize::AtLeast(SET_TENSOR_HEADER_SIZE as u64),
            Cmd::SetTensorHash | Cmd::GetTensor => RequestSize::Fixed(t + 16),
            Cmd::CopyTensor => RequestSize::Fixed(2 * t),
            Cmd::GraphCompute => RequestSize::AtLeast(8),
            Cmd::InitTensor => RequestSize::Fixed(t),
            Cmd::GetAllocSize => RequestSize::Fixed(4 + 11 * t),
            Cmd::Hello => RequestSize::Fixed(CONN_CAPS_SIZE as u64),
            Cmd::DeviceCount => RequestSize::Fixed(0),
            Cmd::MemsetTensor => RequestSize::Fixed(t + 17),
        }
    }

    /// True if `len` is an acceptable payload length for this command.
    pub fn accepts_len(self, len: u64) -> bool {
        match self.request_size() {
            RequestSize::Fixed(n) => len == n,
            RequestSize::AtLeast(n) => len >= n,
        }
    }

    /// True if the server answers this command with a frame.
    pub fn has_response(self) -> bool {
        !matches!(
            self,
            Cmd::FreeBuffer
                | Cmd::BufferClear
                | Cmd::SetTensor
                | Cmd::GraphCompute
                | Cmd::InitTensor
                | Cmd::GraphRecompute
                | Cmd::MemsetTensor
        )
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
    fn ids_match_the_table() {
        for (i, c) in ALL_CMDS.iter().enumerate() {
            assert_eq!(*c as usize, i);
            assert_eq!(Cmd::from_u8(i as u8), Some(*c));
        }
        assert_eq!(Cmd::from_u8(18), None);
        assert_eq!(Cmd::from_u8(19), None);
        assert_eq!(Cmd::from_u8(255), None);
        assert_eq!(Cmd::Hello as u8, 14);
    }

    #[test]
    fn sizes_match_the_table() {
        // ref: ggml-rpc-protocol.md §5, sizes copied from the table by hand.
        let fixed = [
            (Cmd::AllocBuffer, 12),
            (Cmd::GetAlignment, 4),
            (Cmd::GetMaxSize, 4),
            (Cmd::BufferGetBase, 8),
            (Cmd::FreeBuffer, 8),
            (Cmd::BufferClear, 9),
            (Cmd::SetTensorHash, 312),
            (Cmd::GetTensor, 312),
            (Cmd::CopyTensor, 592),
            (Cmd::GetDeviceMemory, 4),
            (Cmd::InitTensor, 296),
            (Cmd::GetAllocSize, 3260),
            (Cmd::Hello, 24),
            (Cmd::DeviceCount, 0),
            (Cmd::GraphRecompute, 4),
            (Cmd::MemsetTensor, 313),
        ];
        for (c, n) in fixed {
            assert_eq!(c.request_size(), RequestSize::Fixed(n), "{c}");
            assert!(c.accepts_len(n));
            assert!(!c.accepts_len(n + 1));
            assert!(n == 0 || !c.accepts_len(n - 1));
        }
        assert_eq!(Cmd::SetTensor.request_size(), RequestSize::AtLeast(305));
        assert_eq!(Cmd::GraphCompute.request_size(), RequestSize::AtLeast(8));
    }

    #[test]
    fn seven_commands_have_no_response() {
        let none: Vec<u8> = ALL_CMDS.iter().filter(|c| !c.has_response()).map(|c| *c as u8).collect();
        assert_eq!(none, vec![4, 5, 6, 10, 12, 16, 17]);
    }
}
