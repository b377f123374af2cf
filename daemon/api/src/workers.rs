//! `/v1/workers`: remote llamad (or llama.cpp RPC) workers this daemon knows, and their health.

use serde::{Deserialize, Serialize};

/// `POST /v1/workers` body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkerAdd {
    /// `host:port` of the worker's RPC listener.
    pub address: String,
    /// Free-form labels (`rack-a`, `big`), used to pick workers for a job.
    #[serde(default)]
    pub labels: Vec<String>,
}

/// A registered worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Worker {
    /// `host:port`; also the worker's id in routes.
    pub address: String,
    /// Labels.
    pub labels: Vec<String>,
    /// When it was added (ms since the epoch).
    pub added_ms: u64,
    /// The latest probe, if any ran.
    pub health: Option<WorkerHealth>,
}

/// The result of one probe: HELLO, DEVICE_COUNT, GET_DEVICE_MEMORY per device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkerHealth {
    /// When the probe ran (ms since the epoch).
    pub probed_ms: u64,
    /// The worker answered and speaks a compatible protocol.
    pub ok: bool,
    /// The version it announced in HELLO.
    pub protocol_version: Option<String>,
    /// Free and total memory per device.
    pub devices: Vec<WorkerDevice>,
    /// Round trip of the DEVICE_COUNT command, microseconds.
    pub rtt_us: Option<u64>,
    /// What went wrong when `ok` is false.
    pub error: Option<String>,
}

/// One device of a worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkerDevice {
    /// Device index.
    pub index: u32,
    /// Free bytes.
    pub free: u64,
    /// Total bytes.
    pub total: u64,
}

/// `GET /v1/workers`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkerList {
    /// Every registered worker, by address.
    pub workers: Vec<Worker>,
}
