//! `llamad`: the worker daemon library. It serves llama.cpp's RPC protocol (8.0.0 by default, 7.0.0
//! by configuration, or both on two ports) so an unmodified llama.cpp master can put model layers
//! on this machine, computing with the `compute` crate.
//!
//! [`run`] takes a bound listener and a shutdown future (mini-redis style), so tests start the server
//! in-process on `127.0.0.1:0`:
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let rt = tokio::runtime::Runtime::new()?;
//! let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
//! let addr = listener.local_addr()?;
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let cfg = llamad::Config { threads: 1, mem: Some(16 << 20), ..llamad::Config::default() };
//! let server = rt.spawn(llamad::run(cfg, listener, async move {
//!     let _ = stopped.await;
//! }));
//!
//! let mut client = llamad_proto::RpcClient::connect(addr)?;
//! assert_eq!(client.device_count()?, 1);
//! assert_eq!(client.get_device_memory(0)?.total, 16 << 20);
//!
//! let _ = stop.send(());
//! rt.block_on(server)??;
//! # Ok(())
//! # }
//! ```
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod admin;
pub mod config;
pub mod error;
pub mod lifecycle;
pub mod openai;
pub mod rpc;
pub mod telemetry;

use std::future::Future;
use std::sync::Arc;

pub use config::Config;
pub use error::{Error, Result};
pub use rpc::server::Shared;

/// Serves RPC connections on `listener` with `cfg` until `shutdown` resolves.
pub async fn run(
    cfg: Config,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    serve(Shared::new(cfg), listener, shutdown).await
}

/// As [`run`], with shared state the caller keeps (to read the counters, or to share with the admin
/// API); the listener speaks `shared.cfg.protocol`.
pub async fn serve(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let proto = shared.cfg.protocol;
    serve_all(shared, vec![(listener, proto)], shutdown).await
}

/// Serves several listeners, each with its own protocol version (`--port` and `--port-v7`), over one
/// shared state, until `shutdown` resolves.
pub async fn serve_all(
    shared: Arc<Shared>,
    listeners: Vec<(tokio::net::TcpListener, &'static llamad_proto::Protocol)>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let stop = tokio_util::sync::CancellationToken::new();
    let mut servers = tokio::task::JoinSet::new();
    for (listener, proto) in listeners {
        announce(&shared, &listener, proto)?;
        let (shared, stop) = (shared.clone(), stop.clone());
        servers
            .spawn(async move { rpc::server::serve(shared, listener, proto, stop.cancelled_owned()).await });
    }
    tokio::select! {
        _ = shutdown => stop.cancel(),
        _ = stop.cancelled() => {}
    }
    let mut result = Ok(());
    while let Some(r) = servers.join_next().await {
        match r {
            Ok(Err(e)) => result = Err(e),
            Err(e) => result = Err(Error::Refused(format!("RPC server task failed: {e}"))),
            Ok(Ok(())) => {}
        }
    }
    result
}

/// The startup log line of one listener.
fn announce(
    shared: &Shared,
    listener: &tokio::net::TcpListener,
    proto: &llamad_proto::Protocol,
) -> Result<()> {
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() && shared.cfg.allow.is_loopback_only() {
        tracing::warn!(
            %addr,
            "listening beyond loopback but only loopback peers are allowed: list the masters' \
             networks with --allow (or server.allow)"
        );
    }
    tracing::info!(
        %addr,
        allow = %shared.cfg.allow,
        threads = shared.cfg.threads,
        devices = %shared.cfg.devices.join(","),
        cache = shared.cfg.cache,
        tls = match &shared.cfg.tls {
            None => "off",
            Some(t) if t.require => "required",
            Some(_) => "optional",
        },
        max_size = shared.max_size,
        protocol = %proto,
        "llamad serving RPC protocol {proto}"
    );
    Ok(())
}
