//! The accept loop and the state every connection shares: configuration, memory account, the one
//! compute executor and the counters.
//!
//! Connections are served concurrently (unlike the reference), at most `max_connections` at once (a
//! peer beyond that is closed at accept with a log line, as is a peer outside the allow list, see
//! [`crate::rpc::access`]); each has its own buffers and stored graphs. Shutdown stops accepting, signals the connections, and drains them
//! before a deadline.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use compute::graph::Executor;
use llamad_proto::{Limits, Protocol};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn, Instrument};

use crate::config::Config;
use crate::error::Result;
use crate::rpc::buffer::MemoryAccount;
use crate::rpc::cache::WireCache;
use crate::rpc::conn;
use crate::rpc::exec::SharedExecutor;
use crate::rpc::stats::ServerStats;

/// How long shutdown waits for open connections.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(10);

/// State shared by every connection.
pub struct Shared {
    /// The validated configuration.
    pub cfg: Config,
    /// Memory budget and synthetic address space.
    pub memory: Arc<MemoryAccount>,
    /// GET_MAX_SIZE, fixed for the life of the process.
    pub max_size: u64,
    /// The one compute executor.
    pub executor: SharedExecutor,
    /// Counters.
    pub stats: ServerStats,
    /// Graph decoding limits.
    pub limits: Limits,
    /// Largest buffered payload: `max_frame`, never above the memory budget.
    pub max_frame: u64,
    /// The tensor cache, when enabled.
    pub cache: Option<Arc<dyn WireCache>>,
}

impl Shared {
    /// Shared state for `cfg`, without a cache (SET_TENSOR_HASH always misses).
    pub fn new(cfg: Config) -> Arc<Shared> {
        Shared::with_cache(cfg, None)
    }

    /// Shared state for `cfg` with a tensor cache behind SET_TENSOR_HASH and `cache_flag`.
    pub fn with_cache(cfg: Config, cache: Option<Arc<dyn WireCache>>) -> Arc<Shared> {
        let memory = Arc::new(MemoryAccount::new(cfg.mem).with_huge_pages(cfg.huge_pages));
        let max_size = memory.max_size();
        let limits = Limits { max_nodes: cfg.max_graph_nodes, max_tensors: cfg.max_graph_tensors };
        let executor = Arc::new(Mutex::new(Executor::new(cfg.threads)));
        let max_frame = cfg.max_frame.min(cfg.mem.unwrap_or(u64::MAX));
        Arc::new(Shared {
            cfg,
            memory,
            max_size,
            executor,
            stats: ServerStats::default(),
            limits,
            max_frame,
            cache,
        })
    }
}

/// Accepts connections on `listener`, each speaking protocol `proto`, until `shutdown` resolves,
/// then drains them.
pub async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    proto: &'static Protocol,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let cancel = CancellationToken::new();
    let tracker = TaskTracker::new();
    let permits = Arc::new(Semaphore::new(shared.cfg.max_connections));
    let mut backoff = Duration::from_millis(10);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(x) => {
                backoff = Duration::from_millis(10);
                x
            }
            Err(e) => {
                // Out of file descriptors and the like: wait and retry rather than spin.
                warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "accept failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        if !shared.cfg.allow.allows(peer.ip()) {
            shared.stats.denied.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            warn!(
                %peer,
                allow = %shared.cfg.allow,
                "refused connection: peer not in the allow list; to admit it add {} to --allow \
                 (or server.allow / LLAMAD__SERVER__ALLOW)",
                crate::rpc::access::host_cidr(peer.ip())
            );
            drop(stream);
            continue;
        }
        // A peer over the limit is told at once (closed) rather than left hanging in the backlog.
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            shared.stats.over_limit.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            warn!(
                %peer,
                max_connections = shared.cfg.max_connections,
                "refused connection: connection limit reached (limits.max_connections)"
            );
            drop(stream);
            continue;
        };
        if let Err(e) = stream.set_nodelay(true) {
            warn!(%peer, error = %e, "TCP_NODELAY");
        }
        let shared = shared.clone();
        let token = cancel.child_token();
        let span = tracing::info_span!("conn", %peer);
        tracker.spawn(
            async move {
                conn::serve(stream, peer, shared, proto, token).await;
                drop(permit);
            }
            .instrument(span),
        );
    }
    info!("shutdown: stopped accepting");
    drop(listener);
    cancel.cancel();
    tracker.close();
    info!(connections = tracker.len(), "shutdown: draining connections");
    if tokio::time::timeout(DRAIN_DEADLINE, tracker.wait()).await.is_err() {
        warn!(connections = tracker.len(), "shutdown: drain deadline passed, dropping the rest");
    }
    info!("shutdown: done");
    Ok(())
}
