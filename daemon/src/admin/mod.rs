//! The admin REST API (`/v1/`, axum): status, tensor cache, workers, jobs, Prometheus metrics and
//! the OpenAPI description, behind a bearer token.
//!
//! - [`router`] builds the routes ([`router::ROUTES`] lists them); [`handlers`] answers them.
//! - [`auth`] loads or creates the token file and checks `Authorization: Bearer` on every route
//!   except `GET /v1/health`.
//! - [`workers`] is the persisted registry of remote workers and their probes; [`jobs`] the persisted
//!   job table and its in-process runner; [`metrics`] the Prometheus text.
//! - [`serve`] runs the router on a TCP or Unix listener with graceful shutdown, a request timeout
//!   and the periodic worker probe.
//!
//! The API types themselves live in `llamad-api`.

pub mod auth;
pub mod error;
pub mod handlers;
pub mod jobs;
pub mod metrics;
pub mod openapi;
pub mod router;
pub mod workers;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;
use tracing::info;

pub use auth::Token;
pub use error::ApiError;
pub use router::router;

use crate::rpc::server::Shared;

/// Default admin listen address (loopback only).
pub const DEFAULT_LISTEN: &str = llamad_api::DEFAULT_ADMIN_ADDR;
/// Default state directory (systemd `StateDirectory=llamad`).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/llamad";
/// Default of [`AdminConfig::job_io_timeout`]: longer than any one graph of a sensible model share
/// takes, short enough that a vanished worker host does not hold a job for long.
pub const DEFAULT_JOB_IO_TIMEOUT: Duration = Duration::from_secs(600);
/// Token file name inside the state directory when no path is configured.
pub const TOKEN_FILE_NAME: &str = "admin.token";

/// Settings of the admin API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminConfig {
    /// `host:port`, or a Unix socket path (starting with `/` or `unix:`).
    pub listen: String,
    /// Bearer token file; created with a random token (mode 0600) when absent.
    pub token_file: PathBuf,
    /// Where `workers.json` and `jobs/` live.
    pub state_dir: PathBuf,
    /// How often every worker is probed (zero disables the periodic probe).
    pub probe_interval: Duration,
    /// Longest time one request may take (SSE streams excepted once their headers are sent).
    pub request_timeout: Duration,
    /// Connect and I/O timeout of one worker probe.
    pub probe_timeout: Duration,
    /// Compute threads of a job.
    pub job_threads: usize,
    /// Longest silence of a job's worker while an answer is awaited; `None` waits forever.
    pub job_io_timeout: Option<Duration>,
}

impl AdminConfig {
    /// Defaults rooted at `state_dir` (token file `state_dir/admin.token`).
    pub fn with_state_dir(state_dir: impl Into<PathBuf>) -> AdminConfig {
        let state_dir = state_dir.into();
        AdminConfig {
            listen: DEFAULT_LISTEN.to_string(),
            token_file: state_dir.join(TOKEN_FILE_NAME),
            state_dir,
            probe_interval: Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
            probe_timeout: Duration::from_secs(3),
            job_threads: 1,
            job_io_timeout: Some(DEFAULT_JOB_IO_TIMEOUT),
        }
    }
}

impl Default for AdminConfig {
    fn default() -> AdminConfig {
        AdminConfig::with_state_dir(DEFAULT_STATE_DIR)
    }
}

/// `[admin]` of the configuration file, every field optional (for `config::RawConfig`); unknown keys are
/// refused. Environment: `LLAMAD__ADMIN__LISTEN` and so on.
#[derive(Clone, Debug, Default, serde::Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    /// Serve the admin API. Default true.
    pub enabled: Option<bool>,
    /// `host:port` or a Unix socket path (`/run/llamad/admin.sock` or `unix:/...`). Default `127.0.0.1:50053`.
    pub listen: Option<String>,
    /// Bearer token file, created (random, mode 0600) when absent. Default `<state_dir>/admin.token`.
    pub token_file: Option<PathBuf>,
    /// Directory of `workers.json` and `jobs/`. Default `$STATE_DIRECTORY` (systemd), else `/var/lib/llamad`.
    pub state_dir: Option<PathBuf>,
    /// Seconds between worker probes; 0 disables. Default 30.
    pub probe_interval_secs: Option<u64>,
    /// Longest request, seconds. Default 60.
    pub request_timeout_secs: Option<u64>,
    /// Compute threads of a job. Default 1.
    pub job_threads: Option<usize>,
    /// Seconds a job's worker may stay silent while an answer is awaited (its host vanished, a
    /// partition) before the job fails; 0 waits forever. Default 600.
    pub job_io_timeout_secs: Option<u64>,
}

impl AdminConfig {
    /// The validated settings of `raw`; `None` when the admin API is disabled.
    pub fn from_raw(raw: &RawAdmin) -> crate::Result<Option<AdminConfig>> {
        if raw.enabled == Some(false) {
            return Ok(None);
        }
        let state_dir = raw
            .state_dir
            .clone()
            .or_else(|| std::env::var_os("STATE_DIRECTORY").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        let mut c = AdminConfig::with_state_dir(state_dir);
        if let Some(l) = &raw.listen {
            if l.trim().is_empty() {
                return Err(crate::Error::Config("admin.listen: empty".into()));
            }
            c.listen = l.clone();
        }
        // Under systemd the package's unit hands the root-only /etc/llamad/admin.token over as a credential.
        if let Some(cred) = std::env::var_os("CREDENTIALS_DIRECTORY") {
            let t = PathBuf::from(cred).join(TOKEN_FILE_NAME);
            if t.exists() {
                c.token_file = t;
            }
        }
        if let Some(t) = &raw.token_file {
            c.token_file = t.clone();
        }
        if let Some(s) = raw.probe_interval_secs {
            c.probe_interval = Duration::from_secs(s);
        }
        match raw.request_timeout_secs {
            Some(0) => {
                return Err(crate::Error::Config("admin.request_timeout_secs: must be at least 1".into()))
            }
            Some(s) => c.request_timeout = Duration::from_secs(s),
            None => {}
        }
        match raw.job_threads {
            Some(0) => return Err(crate::Error::Config("admin.job_threads: must be at least 1".into())),
            Some(t) => c.job_threads = t,
            None => {}
        }
        match raw.job_io_timeout_secs {
            Some(0) => c.job_io_timeout = None,
            Some(s) => c.job_io_timeout = Some(Duration::from_secs(s)),
            None => {}
        }
        Ok(Some(c))
    }
}

/// Everything the handlers share. Cheap to clone.
#[derive(Clone)]
pub struct AdminState {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: AdminConfig,
    token: Token,
    rpc: Arc<Shared>,
    rpc_addr: Option<String>,
    cache: Option<Arc<cachestore::Store>>,
    started: Instant,
    workers: workers::Registry,
    jobs: jobs::Jobs,
    metrics: Arc<metrics::Metrics>,
    stopping: CancellationToken,
}

impl AdminState {
    /// Loads (or creates) the token, the worker registry and the job table (jobs found `running`
    /// become `interrupted`), and starts the job runner. Must be called inside a tokio runtime.
    pub fn new(
        cfg: AdminConfig,
        rpc: Arc<Shared>,
        rpc_addr: Option<String>,
        cache: Option<Arc<cachestore::Store>>,
    ) -> crate::Result<AdminState> {
        std::fs::create_dir_all(&cfg.state_dir)
            .map_err(|e| crate::Error::Config(format!("state dir {}: {e}", cfg.state_dir.display())))?;
        let token = Token::load_or_create(&cfg.token_file)?;
        let metrics = Arc::new(metrics::Metrics::default());
        let workers = workers::Registry::open(&cfg.state_dir.join("workers.json"), cfg.probe_timeout)?
            .with_auth(rpc.cfg.auth.clone());
        // Jobs on workers authenticate with this daemon's own shared secret, if it has one.
        let jobs = jobs::Jobs::open(
            &cfg.state_dir.join("jobs"),
            cfg.job_threads,
            rpc.cfg.auth.clone(),
            cfg.job_io_timeout,
            metrics.clone(),
        )?;
        info!(
            state_dir = %cfg.state_dir.display(),
            token_file = %cfg.token_file.display(),
            workers = workers.len(),
            jobs = jobs.len(),
            "admin API state loaded"
        );
        Ok(AdminState {
            inner: Arc::new(Inner {
                cfg,
                token,
                rpc,
                rpc_addr,
                cache,
                started: Instant::now(),
                workers,
                jobs,
                metrics,
                stopping: CancellationToken::new(),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &AdminConfig {
        &self.inner.cfg
    }

    /// The bearer token.
    pub fn token(&self) -> &Token {
        &self.inner.token
    }

    /// The RPC server's shared state.
    pub fn rpc(&self) -> &Arc<Shared> {
        &self.inner.rpc
    }

    /// The RPC listen address, when known.
    pub fn rpc_addr(&self) -> Option<&str> {
        self.inner.rpc_addr.as_deref()
    }

    /// The tensor cache, when enabled.
    pub fn cache(&self) -> Option<&Arc<cachestore::Store>> {
        self.inner.cache.as_ref()
    }

    /// Time since the state was created.
    pub fn uptime(&self) -> Duration {
        self.inner.started.elapsed()
    }

    /// The worker registry.
    pub fn workers(&self) -> &workers::Registry {
        &self.inner.workers
    }

    /// The job table.
    pub fn jobs(&self) -> &jobs::Jobs {
        &self.inner.jobs
    }

    /// Cancelled when the server shuts down (ends event streams).
    pub fn stopping(&self) -> &CancellationToken {
        &self.inner.stopping
    }

    /// Admin-side metrics (job decode latency, tokens).
    pub fn metrics(&self) -> &Arc<metrics::Metrics> {
        &self.inner.metrics
    }
}

/// Binds a Unix socket at `path` (a stale socket file is replaced) with mode 0600.
pub fn bind_unix(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if path.exists() {
        std::fs::remove_file(path)?;
    }
    let l = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Serves the admin API on `listener` until `shutdown` resolves, then drains open requests. The
/// periodic worker probe runs alongside and stops with it.
pub async fn serve<L>(
    listener: L,
    state: AdminState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let cancel = state.stopping().clone();
    let prober = workers::spawn_periodic_probe(state.clone(), cancel.clone());
    let app = router(state.clone());
    info!(addr = ?listener.local_addr().ok(), "admin API listening");
    let st = state.clone();
    let res = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            // Stop the running job (it ends `interrupted`) and close event streams, so that open
            // connections can drain.
            info!("admin API: shutting down: stopping jobs and event streams");
            st.jobs().shutdown();
            st.stopping().cancel();
        })
        .await;
    cancel.cancel();
    let _ = prober.await;
    info!("admin API: stopped");
    res
}

/// Loads the state, binds `cfg.listen` (TCP, or a Unix socket when it starts with `/` or `unix:`) and
/// spawns [`serve`] until `shutdown`. Returns once the listener is bound.
/// The running admin API's state, for the parts of the daemon that read its worker registry.
static STATE: std::sync::OnceLock<AdminState> = std::sync::OnceLock::new();

/// The worker registry of the running admin API (`None` when it is off).
pub fn registry() -> Option<&'static workers::Registry> {
    STATE.get().map(|s| s.workers())
}

pub async fn start(
    cfg: AdminConfig,
    rpc: Arc<Shared>,
    rpc_addr: Option<String>,
    cache: Option<Arc<cachestore::Store>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> crate::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    let listen = cfg.listen.clone();
    let state = AdminState::new(cfg, rpc, rpc_addr, cache)?;
    let _ = STATE.set(state.clone());
    let bind_err = |e: std::io::Error| crate::Error::Config(format!("admin.listen {listen}: {e}"));
    let unix = listen.strip_prefix("unix:").or_else(|| listen.starts_with('/').then_some(listen.as_str()));
    Ok(match unix {
        Some(path) => {
            let l = bind_unix(Path::new(path)).map_err(bind_err)?;
            tokio::spawn(serve(l, state, shutdown))
        }
        None => {
            let l = tokio::net::TcpListener::bind(listen.as_str()).await.map_err(bind_err)?;
            if l.local_addr().is_ok_and(|a| !a.ip().is_loopback()) {
                tracing::warn!(addr = %listen, "admin API listening beyond loopback (token-protected, no TLS)");
            }
            tokio::spawn(serve(l, state, shutdown))
        }
    })
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
