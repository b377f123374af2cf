//! `GET /v1/status` and `GET /v1/health`.

use serde::{Deserialize, Serialize};

/// `GET /v1/health`: liveness, no authentication.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Health {
    /// Always `"ok"` when the daemon answers.
    pub status: String,
}

/// `GET /v1/status`: what the daemon is and does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Status {
    /// llamad's version.
    pub version: String,
    /// The RPC protocol version of the main port, `"8.0.0"` or `"7.0.0"`.
    pub protocol_version: String,
    /// Every RPC listener with the protocol version it serves (the main port first).
    #[serde(default)]
    pub protocols: Vec<ProtocolListener>,
    /// Seconds since the daemon started.
    pub uptime_secs: u64,
    /// The RPC listen address, when known.
    pub rpc_addr: Option<String>,
    /// Devices in RPC index order.
    pub devices: Vec<DeviceStatus>,
    /// Memory account of the RPC server.
    pub memory: MemoryStatus,
    /// Compute threads.
    pub threads: u64,
    /// The numerics profile the kernels follow (`avx2`, `avx512`, `neon-dotprod`, `neon-i8mm`,
    /// `sve` or `portable`; see `compute::numerics`), and the kernel set in use.
    #[serde(default)]
    pub numerics: String,
    /// The kernel (instruction) set in use (`LLAMAD_KERNELS`): `scalar`, `avx2`, `avx512`, `neon`,
    /// `neon-dotprod` or `neon-i8mm`.
    #[serde(default)]
    pub kernels: String,
    /// RPC connection counters.
    pub rpc: RpcStatus,
    /// Whether the tensor cache is enabled.
    pub cache_enabled: bool,
}

/// One RPC listener and its protocol version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProtocolListener {
    /// TCP port.
    pub port: u16,
    /// Protocol version announced at HELLO, `"8.0.0"`.
    pub version: String,
}

/// One compute device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeviceStatus {
    /// RPC device index.
    pub index: u32,
    /// Device name (`CPU`).
    pub name: String,
}

/// Memory as the RPC server accounts it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemoryStatus {
    /// Total bytes (the budget, or the machine's memory).
    pub total: u64,
    /// Bytes free (GET_DEVICE_MEMORY's answer).
    pub free: u64,
    /// Bytes held by buffers that RPC peers allocated.
    pub allocated_rpc: u64,
    /// Bytes of `allocated_rpc` held by interleaved copies of weight matrices (see llamad's
    /// `server.interleave`).
    #[serde(default)]
    pub interleaved: u64,
}

/// RPC traffic since start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RpcStatus {
    /// Connections open now.
    pub open_connections: u64,
    /// Connections accepted since start.
    pub connections_total: u64,
    /// Connections closed for breaking a protocol rule.
    pub connections_refused: u64,
    /// Graphs computed (GRAPH_COMPUTE and GRAPH_RECOMPUTE).
    pub graphs_computed: u64,
    /// Protocol 8.0.0: GRAPH_RECOMPUTEs served from the graph store by uid.
    #[serde(default)]
    pub graph_store_hits: u64,
    /// Protocol 8.0.0: graphs stored by uid.
    #[serde(default)]
    pub graph_store_inserts: u64,
    /// Protocol 8.0.0: full per-device graph stores cleared.
    #[serde(default)]
    pub graph_store_clears: u64,
    /// Protocol 8.0.0: COMM_ALLREDUCEs completed.
    #[serde(default)]
    pub allreduces: u64,
    /// Request bytes received, all commands.
    pub bytes_in: u64,
    /// Response bytes sent, all commands.
    pub bytes_out: u64,
    /// Per-command totals (commands seen at least once).
    pub commands: Vec<CommandStats>,
    /// The connections open now, oldest first.
    #[serde(default)]
    pub connections: Vec<ConnectionStatus>,
}

/// One open RPC connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ConnectionStatus {
    /// Connection number, in accept order since start.
    pub id: u64,
    /// The peer's address (`IP:PORT`).
    pub peer: String,
    /// Seconds since it was accepted.
    pub connected_secs: u64,
    /// Commands received.
    pub commands: u64,
    /// Request bytes received.
    pub bytes_in: u64,
    /// Response bytes sent.
    pub bytes_out: u64,
    /// Graphs computed for it.
    pub graphs: u64,
}

/// One RPC command's totals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CommandStats {
    /// Command name (`GRAPH_COMPUTE`).
    pub command: String,
    /// Times received.
    pub count: u64,
    /// Request bytes.
    pub bytes_in: u64,
    /// Response bytes.
    pub bytes_out: u64,
}
