//! Protocol versions as data: one [`Protocol`] table per supported version of llama.cpp's RPC
//! protocol, chosen per connection (by configuration on a server, by the server's HELLO answer on a
//! master). Everything that differs between versions is a field of the table: the command ids a
//! version accepts, their request sizes and answers, the graph layout, the graph-store size, the op
//! and type numbering and the all-reduce constants. Code that handles a command asks the table;
//! no code branches on a version number.
//!
//! Adding a version (say 8.1.0 or 9.0.0) is a new `static` here, added to [`SUPPORTED`], plus
//! handlers for what is really new (see ARCHITECTURE.md, "Adding a protocol version").
//!
//! ref: ggml-rpc-protocol.md §2, §5 (7.0.0); ggml-rpc-protocol-8.md (8.0.0).

use crate::cmd::{Cmd, RequestSize, ResponseSize, COMM_HOST_SIZE, CONN_CAPS_SIZE, TENSOR_2D_HEADER_SIZE};
use crate::msg::HelloRsp;
use crate::tensor::RPC_TENSOR_SIZE;

/// A protocol version number, as HELLO carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major: a master refuses a server of another major.
    pub major: u8,
    /// Minor: a master refuses a server with a higher minor than its own.
    pub minor: u8,
    /// Patch: printed, never compared.
    pub patch: u8,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// How GRAPH_COMPUTE and GRAPH_RECOMPUTE lay out their requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphFormat {
    /// 7.0.0: `u32 device, u32 n_nodes, …`; RECOMPUTE `{u32 device}` replays the device's last graph.
    LastGraph,
    /// 8.0.0: `u32 device, u64 uid, u32 n_nodes, …`; RECOMPUTE `{u32 device, u64 uid}` replays the
    /// stored graph with that uid.
    Uid,
}

/// The server-to-server all-reduce of a version (COMM_INIT/COMM_ALLREDUCE/COMM_FREE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommSpec {
    /// The only group size COMM_INIT accepts.
    pub world: u32,
    /// Tensors of at least this many elements travel as BF16 on the link, smaller ones as F32.
    pub bf16_min_elements: u64,
    /// How often rank 1 tries to connect to rank 0.
    pub connect_attempts: u32,
    /// Milliseconds between two attempts.
    pub connect_interval_ms: u64,
    /// The port a master picks for a pair: rank 0's RPC port plus this.
    pub port_offset: u16,
}

/// One command of a version's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdSpec {
    /// What the command does.
    pub cmd: Cmd,
    /// Its request payload length.
    pub request: RequestSize,
    /// Its answer.
    pub response: ResponseSize,
}

impl CmdSpec {
    /// Whether the server answers this command with a frame.
    pub fn has_response(&self) -> bool {
        self.response != ResponseSize::None
    }
}

/// Everything a connection needs to know about one protocol version.
#[derive(PartialEq, Eq)]
pub struct Protocol {
    /// The version HELLO announces.
    pub version: Version,
    /// The commands, indexed by id; an id past the end (`RPC_CMD_NONE` and above) is invalid.
    pub commands: &'static [CmdSpec],
    /// The graph layout.
    pub graph: GraphFormat,
    /// Graphs a server keeps per device by uid before both sides clear the store (0: only the last
    /// graph, 7.0.0).
    pub graph_store: usize,
    /// `GGML_OP_COUNT` of the op numbering `rpc_tensor.op` uses.
    pub op_count: u32,
    /// `GGML_TYPE_COUNT` of the type numbering `rpc_tensor.type` uses.
    pub type_count: u32,
    /// The all-reduce, where the version has one.
    pub comm: Option<CommSpec>,
}

const T: u64 = RPC_TENSOR_SIZE as u64;

const fn spec(cmd: Cmd, request: RequestSize, response: ResponseSize) -> CmdSpec {
    CmdSpec { cmd, request, response }
}

use RequestSize::{AtLeast, Fixed};
use ResponseSize::{FromRequest, None as NoReply};

/// The commands 0–17 of 7.0.0 (ref: ggml-rpc-protocol.md §5).
const V7_COMMANDS: [CmdSpec; 18] = [
    spec(Cmd::AllocBuffer, Fixed(12), ResponseSize::Fixed(16)),
    spec(Cmd::GetAlignment, Fixed(4), ResponseSize::Fixed(8)),
    spec(Cmd::GetMaxSize, Fixed(4), ResponseSize::Fixed(8)),
    spec(Cmd::BufferGetBase, Fixed(8), ResponseSize::Fixed(8)),
    spec(Cmd::FreeBuffer, Fixed(8), NoReply),
    spec(Cmd::BufferClear, Fixed(9), NoReply),
    spec(Cmd::SetTensor, AtLeast(T + 9), NoReply),
    spec(Cmd::SetTensorHash, Fixed(T + 16), ResponseSize::Fixed(1)),
    spec(Cmd::GetTensor, Fixed(T + 16), FromRequest),
    spec(Cmd::CopyTensor, Fixed(2 * T), ResponseSize::Fixed(1)),
    spec(Cmd::GraphCompute, AtLeast(8), NoReply),
    spec(Cmd::GetDeviceMemory, Fixed(4), ResponseSize::Fixed(16)),
    spec(Cmd::InitTensor, Fixed(T), NoReply),
    spec(Cmd::GetAllocSize, Fixed(4 + 11 * T), ResponseSize::Fixed(8)),
    spec(Cmd::Hello, Fixed(CONN_CAPS_SIZE as u64), ResponseSize::Fixed(28)),
    spec(Cmd::DeviceCount, Fixed(0), ResponseSize::Fixed(4)),
    spec(Cmd::GraphRecompute, Fixed(4), NoReply),
    spec(Cmd::MemsetTensor, Fixed(T + 17), NoReply),
];

/// 8.0.0: 7.0.0's commands with the graph uid, and five new ones (ref: ggml-rpc-protocol-8.md).
const V8_COMMANDS: [CmdSpec; 23] = {
    let mut c = [spec(Cmd::AllocBuffer, Fixed(0), NoReply); 23];
    let mut i = 0;
    while i < V7_COMMANDS.len() {
        c[i] = V7_COMMANDS[i];
        i += 1;
    }
    c[Cmd::GraphCompute as usize] = spec(Cmd::GraphCompute, AtLeast(16), NoReply);
    c[Cmd::GraphRecompute as usize] = spec(Cmd::GraphRecompute, Fixed(12), NoReply);
    c[18] = spec(Cmd::SetTensor2d, AtLeast(TENSOR_2D_HEADER_SIZE as u64), NoReply);
    c[19] = spec(Cmd::GetTensor2d, Fixed(TENSOR_2D_HEADER_SIZE as u64), FromRequest);
    c[20] = spec(Cmd::CommInit, Fixed(16 + COMM_HOST_SIZE as u64), ResponseSize::Fixed(1));
    c[21] = spec(Cmd::CommAllreduce, Fixed(4 + T), NoReply);
    c[22] = spec(Cmd::CommFree, Fixed(4), NoReply);
    c
};

/// llama.cpp's RPC protocol 7.0.0 (llama-cpp-python 0.3.36; llama.cpp builds before b11450).
pub static V7: Protocol = Protocol {
    version: Version { major: 7, minor: 0, patch: 0 },
    commands: &V7_COMMANDS,
    graph: GraphFormat::LastGraph,
    graph_store: 0,
    op_count: 101,
    type_count: 43,
    comm: None,
};

/// llama.cpp's RPC protocol 8.0.0 (llama.cpp b11450 onwards).
pub static V8: Protocol = Protocol {
    version: Version { major: 8, minor: 0, patch: 0 },
    commands: &V8_COMMANDS,
    graph: GraphFormat::Uid,
    graph_store: 1024,
    op_count: 101,
    type_count: 43,
    comm: Some(CommSpec {
        world: 2,
        bf16_min_elements: 32_768,
        connect_attempts: 100,
        connect_interval_ms: 50,
        port_offset: 1000,
    }),
};

/// Every version this crate speaks, newest first.
pub static SUPPORTED: [&Protocol; 2] = [&V8, &V7];

/// The version a server announces unless told otherwise (current llama.cpp).
pub static DEFAULT: &Protocol = &V8;

impl Protocol {
    /// The supported version with this major.
    pub fn by_major(major: u8) -> Option<&'static Protocol> {
        SUPPORTED.iter().copied().find(|p| p.version.major == major)
    }

    /// The table a master uses with a server that answered HELLO with `rsp`: the supported version
    /// of the same major whose minor is not lower than the server's (a master's rule, ref: §2).
    pub fn for_server(rsp: &HelloRsp) -> Option<&'static Protocol> {
        Protocol::by_major(rsp.major).filter(|p| rsp.minor <= p.version.minor)
    }

    /// The command with id `byte`, if this version has it.
    pub fn spec(&self, byte: u8) -> Option<&'static CmdSpec> {
        // `commands` is 'static in every table; the lifetime is restated for callers.
        let commands: &'static [CmdSpec] = self.commands;
        commands.get(byte as usize)
    }

    /// The command `cmd`, if this version has it.
    pub fn has(&self, cmd: Cmd) -> bool {
        self.spec(cmd as u8).is_some_and(|s| s.cmd == cmd)
    }

    /// This version's HELLO answer (TCP only: zero caps).
    pub fn hello(&self) -> HelloRsp {
        let v = self.version;
        HelloRsp { major: v.major, minor: v.minor, patch: v.patch, caps: [0; CONN_CAPS_SIZE] }
    }

    /// A short name for logs and status: `"8.0.0"`.
    pub fn name(&self) -> String {
        self.version.to_string()
    }
}

/// A table is named by its version (a configuration dump shows `Protocol(8.0.0)`, not 23 commands).
impl std::fmt::Debug for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Protocol({})", self.version)
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.version.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ref: ggml-rpc-protocol.md §5 and ggml-rpc-protocol-8.md, copied from the tables by hand.
    #[test]
    fn tables_match_the_references() {
        let v7: Vec<(u8, RequestSize, bool)> =
            V7.commands.iter().map(|s| (s.cmd as u8, s.request, s.has_response())).collect();
        let want7 = [
            (0, Fixed(12), true),
            (1, Fixed(4), true),
            (2, Fixed(4), true),
            (3, Fixed(8), true),
            (4, Fixed(8), false),
            (5, Fixed(9), false),
            (6, AtLeast(305), false),
            (7, Fixed(312), true),
            (8, Fixed(312), true),
            (9, Fixed(592), true),
            (10, AtLeast(8), false),
            (11, Fixed(4), true),
            (12, Fixed(296), false),
            (13, Fixed(3260), true),
            (14, Fixed(24), true),
            (15, Fixed(0), true),
            (16, Fixed(4), false),
            (17, Fixed(313), false),
        ];
        assert_eq!(v7, want7);
        let v8: Vec<(u8, RequestSize, bool)> =
            V8.commands.iter().map(|s| (s.cmd as u8, s.request, s.has_response())).collect();
        let mut want8 = want7.to_vec();
        want8[10] = (10, AtLeast(16), false);
        want8[16] = (16, Fixed(12), false);
        want8.extend([
            (18, AtLeast(328), false),
            (19, Fixed(328), true),
            (20, Fixed(80), true),
            (21, Fixed(300), false),
            (22, Fixed(4), false),
        ]);
        assert_eq!(v8, want8);
        assert_eq!(V7.spec(18), None);
        assert_eq!(V8.spec(23), None, "23 is RPC_CMD_NONE at 8.0.0");
        assert!(V8.has(Cmd::CommInit) && !V7.has(Cmd::CommInit));
        assert_eq!(V8.graph_store, 1024);
        assert_eq!(V8.comm.map(|c| (c.world, c.bf16_min_elements)), Some((2, 32_768)));
    }

    #[test]
    fn the_op_and_type_numbering_is_the_compute_crates() {
        for p in SUPPORTED {
            assert_eq!(p.op_count, compute::op::GGML_OP_COUNT, "{p}");
            assert_eq!(p.type_count, compute::dtype::GGML_TYPE_COUNT, "{p}");
        }
    }

    #[test]
    fn a_master_picks_the_table_by_the_servers_answer() {
        let h = |major, minor, patch| HelloRsp { major, minor, patch, caps: [0; 24] };
        assert_eq!(Protocol::for_server(&h(8, 0, 0)), Some(&V8));
        assert_eq!(Protocol::for_server(&h(7, 0, 3)), Some(&V7));
        assert_eq!(Protocol::for_server(&h(8, 1, 0)), None, "a newer minor is refused");
        assert_eq!(Protocol::for_server(&h(6, 0, 0)), None);
        assert_eq!(Protocol::for_server(&h(9, 0, 0)), None);
        assert_eq!(DEFAULT.version.major, 8);
        assert_eq!(V8.hello().encode()[..4], [8, 0, 0, 0]);
    }
}
