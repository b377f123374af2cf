//! The worker registry: remote RPC workers by address, with labels and the latest probe, persisted as
//! `workers.json` in the state directory (written to a temporary file, then renamed).
//!
//! A probe connects with a timeout, sends HELLO, DEVICE_COUNT (timed: the RTT) and GET_DEVICE_MEMORY
//! for each device, through `llamad_proto::RpcClient` on a blocking thread.

use std::collections::BTreeMap;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use llamad_api::{code, Worker, WorkerAdd, WorkerDevice, WorkerHealth};
use llamad_proto::RpcClient;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::admin::error::{ApiError, ApiResult};
use crate::admin::{now_ms, AdminState};
use crate::error::{Error, Result};

/// Most devices a probe asks about (a worker claiming more is answered for these).
const MAX_PROBED_DEVICES: u32 = 16;

/// The registry.
pub struct Registry {
    path: PathBuf,
    probe_timeout: Duration,
    workers: Mutex<BTreeMap<String, Worker>>,
    /// The daemon's own shared secret, answered to workers that ask (`server.secret_file`).
    auth: Option<llamad_proto::auth::AuthKey>,
}

impl Registry {
    /// Loads `path` if it exists.
    pub fn open(path: &Path, probe_timeout: Duration) -> Result<Registry> {
        let workers = match std::fs::read(path) {
            Ok(b) => {
                let list: Vec<Worker> = serde_json::from_slice(&b)
                    .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
                list.into_iter().map(|w| (w.address.clone(), w)).collect()
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(Error::Config(format!("{}: {e}", path.display()))),
        };
        Ok(Registry { path: path.to_path_buf(), probe_timeout, workers: Mutex::new(workers), auth: None })
    }

    /// Probes authenticate with `key` when a worker asks for it.
    pub fn with_auth(mut self, key: Option<llamad_proto::auth::AuthKey>) -> Registry {
        self.auth = key;
        self
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.workers.lock().map(|w| w.len()).unwrap_or(0)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every worker, by address.
    pub fn list(&self) -> Vec<Worker> {
        self.workers.lock().map(|w| w.values().cloned().collect()).unwrap_or_default()
    }

    /// One worker.
    pub fn get(&self, address: &str) -> Option<Worker> {
        self.workers.lock().ok().and_then(|w| w.get(address).cloned())
    }

    /// Adds a worker; refuses an address already present or one that is not `host:port`.
    pub fn add(&self, req: WorkerAdd) -> ApiResult<Worker> {
        let address = req.address.trim().to_string();
        let port_ok =
            address.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
        if !port_ok {
            return Err(ApiError::bad_request(format!("worker address `{address}`: expected host:port")));
        }
        let w = Worker { address: address.clone(), labels: req.labels, added_ms: now_ms(), health: None };
        let mut g = self.lock()?;
        if g.contains_key(&address) {
            return Err(ApiError::new(
                axum::http::StatusCode::CONFLICT,
                code::WORKER_EXISTS,
                format!("worker {address} is already registered"),
            ));
        }
        g.insert(address.clone(), w.clone());
        self.persist(&g)?;
        info!(%address, "worker added");
        Ok(w)
    }

    /// Removes a worker.
    pub fn remove(&self, address: &str) -> ApiResult<Worker> {
        let mut g = self.lock()?;
        let w = g.remove(address).ok_or_else(|| not_found(address))?;
        self.persist(&g)?;
        info!(%address, "worker removed");
        Ok(w)
    }

    /// Stores a probe result (dropped when the worker was removed meanwhile).
    pub fn set_health(&self, address: &str, health: WorkerHealth) -> ApiResult<Worker> {
        let mut g = self.lock()?;
        let w = g.get_mut(address).ok_or_else(|| not_found(address))?;
        w.health = Some(health);
        let w = w.clone();
        self.persist(&g)?;
        Ok(w)
    }

    /// Probes `address` on a blocking thread and records the result.
    pub async fn probe(&self, address: &str) -> ApiResult<Worker> {
        if self.get(address).is_none() {
            return Err(not_found(address));
        }
        let (addr, timeout, key) = (address.to_string(), self.probe_timeout, self.auth.clone());
        let health = tokio::task::spawn_blocking(move || probe(&addr, timeout, key.as_ref())).await?;
        debug!(%address, ok = health.ok, rtt_us = ?health.rtt_us, "worker probed");
        self.set_health(address, health)
    }

    fn lock(&self) -> ApiResult<std::sync::MutexGuard<'_, BTreeMap<String, Worker>>> {
        self.workers.lock().map_err(|_| ApiError::internal("worker registry lock poisoned"))
    }

    fn persist(&self, g: &BTreeMap<String, Worker>) -> ApiResult<()> {
        let list: Vec<&Worker> = g.values().collect();
        write_json_atomic(&self.path, &list)
            .map_err(|e| ApiError::internal(format!("{}: {e}", self.path.display())))
    }
}

fn not_found(address: &str) -> ApiError {
    ApiError::not_found(code::WORKER_NOT_FOUND, format!("no worker {address}"))
}

/// Writes `value` as JSON to `path` through a temporary file and a rename.
pub(crate) fn write_json_atomic<T: serde::Serialize + ?Sized>(path: &Path, value: &T) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// One probe: HELLO, DEVICE_COUNT (timed), GET_DEVICE_MEMORY per device. Never fails: an unreachable
/// or incompatible worker gives `ok: false` and the reason. `key` answers a worker's
/// authentication challenge.
pub fn probe(address: &str, timeout: Duration, key: Option<&llamad_proto::auth::AuthKey>) -> WorkerHealth {
    let mut h = WorkerHealth {
        probed_ms: now_ms(),
        ok: false,
        protocol_version: None,
        devices: Vec::new(),
        rtt_us: None,
        error: None,
    };
    if let Err(e) = probe_into(address, timeout, key, &mut h) {
        h.error = Some(e);
    }
    h
}

fn probe_into(
    address: &str,
    timeout: Duration,
    key: Option<&llamad_proto::auth::AuthKey>,
    h: &mut WorkerHealth,
) -> std::result::Result<(), String> {
    let addr = address
        .to_socket_addrs()
        .map_err(|e| format!("resolve {address}: {e}"))?
        .next()
        .ok_or_else(|| format!("resolve {address}: no address"))?;
    let stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
    stream.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let mut c = RpcClient::hello_auth(stream, key).map_err(|e| format!("HELLO: {e}"))?;
    let v = c.server_version();
    h.protocol_version = Some(format!("{}.{}.{}", v.major, v.minor, v.patch));
    if !v.is_compatible() {
        return Err(format!("incompatible protocol {}.{}.{}", v.major, v.minor, v.patch));
    }
    let t0 = Instant::now();
    let n = c.device_count().map_err(|e| format!("DEVICE_COUNT: {e}"))?;
    h.rtt_us = Some(t0.elapsed().as_micros() as u64);
    for index in 0..n.min(MAX_PROBED_DEVICES) {
        let m = c.get_device_memory(index).map_err(|e| format!("GET_DEVICE_MEMORY {index}: {e}"))?;
        h.devices.push(WorkerDevice { index, free: m.free, total: m.total });
    }
    h.ok = true;
    Ok(())
}

/// Probes every worker each `probe_interval` until `cancel` fires (nothing when the interval is zero).
pub fn spawn_periodic_probe(state: AdminState, cancel: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let every = state.config().probe_interval;
        if every.is_zero() {
            return;
        }
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            for w in state.workers().list() {
                if cancel.is_cancelled() {
                    return;
                }
                if let Err(e) = state.workers().probe(&w.address).await {
                    warn!(address = %w.address, error = %e, "periodic probe");
                }
            }
        }
    })
}
