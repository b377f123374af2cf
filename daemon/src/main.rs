//! The `llamad` binary: parse the command line, load the configuration, init tracing, run.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use llamad::config::{Config, Overrides};

#[derive(Parser, Debug)]
#[command(name = "llamad", version = concat!(env!("CARGO_PKG_VERSION"), " (protocol 7.0.0)"), about = "Worker daemon speaking llama.cpp's RPC protocol 7.0.0")]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    /// Address to bind (IPv4/IPv6 literal or host name) [default: 127.0.0.1].
    #[arg(short = 'H', long, global = true)]
    host: Option<String>,
    /// TCP port [default: 50052].
    #[arg(short, long, global = true)]
    port: Option<u16>,
    /// Compute threads [default: physical cores].
    #[arg(short, long, global = true)]
    threads: Option<usize>,
    /// Devices, separated by `,` or `/` (only CPU exists).
    #[arg(short, long, global = true)]
    device: Option<String>,
    /// Enable the tensor cache.
    #[arg(short, long, global = true)]
    cache: bool,
    /// Memory budget for buffers (e.g. 8G) [default: available memory].
    #[arg(long, global = true, value_name = "SIZE")]
    mem: Option<String>,
    /// Cache root [default: $LLAMA_CACHE/rpc, else ~/.cache/llama.cpp/rpc].
    #[arg(long, global = true, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Cache size limit (e.g. 50G); least recently used objects are evicted [default: unlimited].
    #[arg(long, global = true, value_name = "SIZE")]
    cache_max_size: Option<String>,
    /// Configuration file [default: /etc/llamad/llamad.toml when present].
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(Subcommand, Debug, Clone, Copy)]
enum Sub {
    /// Serve RPC connections (the default).
    Serve,
    /// Validate the configuration and exit.
    CheckConfig,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("llamad: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    let flags = Overrides {
        host: cli.host,
        port: cli.port,
        threads: cli.threads,
        device: cli.device,
        cache: cli.cache,
        mem: cli.mem,
        cache_dir: cli.cache_dir,
        cache_max_size: cli.cache_max_size,
    };
    let cfg =
        Config::load(cli.config.as_deref(), std::env::vars(), &flags).context("loading the configuration")?;
    if let Some(Sub::CheckConfig) = cli.command {
        println!("configuration ok: {cfg:?}");
        return Ok(());
    }
    llamad::telemetry::init();
    let rt =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    rt.block_on(async move {
        let addrs: Vec<_> = tokio::net::lookup_host((cfg.host.as_str(), cfg.port))
            .await
            .with_context(|| format!("resolving {}", cfg.host))?
            .collect();
        let addr = *addrs.first().with_context(|| format!("{} resolves to no address", cfg.host))?;
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "listening beyond loopback: the RPC protocol has no authentication or encryption");
        }
        let cache = if cfg.cache { Some(open_cache(&cfg)?) } else { None };
        let _watcher = match &cache {
            Some(c) => Some(
                cachestore::watch::Watcher::start(c.store().clone(), std::time::Duration::from_secs(2))
                    .context("watching the cache directory")?,
            ),
            None => None,
        };
        let wire_cache = cache.map(|c| c as std::sync::Arc<dyn llamad::rpc::cache::WireCache>);
        let shared = llamad::Shared::with_cache(cfg, wire_cache);
        llamad::lifecycle::notify("READY=1");
        llamad::serve(shared, listener, llamad::lifecycle::shutdown_signal()).await?;
        Ok(())
    })
}

/// Opens the tensor cache where llama.cpp would keep it (or `cache_dir`), in llamad's own layout.
fn open_cache(cfg: &Config) -> anyhow::Result<std::sync::Arc<llamad::rpc::store_cache::StoreCache>> {
    let root = match &cfg.cache_dir {
        Some(d) => d.clone(),
        None => cachestore::try_default_root().context("finding the cache directory (set LLAMA_CACHE)")?,
    };
    let opts = cachestore::Options {
        max_size: cfg.cache_max_size,
        verify_on_read: cfg.cache_verify,
        wire_hasher: Some(llamad::rpc::store_cache::wire_hasher()),
        ..cachestore::Options::default()
    };
    let store = cachestore::Store::open(&root, opts)
        .with_context(|| format!("opening the cache in {}", root.display()))?;
    let totals = store.totals();
    tracing::info!(dir = %root.display(), objects = totals.count, bytes = totals.bytes, "tensor cache open");
    Ok(std::sync::Arc::new(llamad::rpc::store_cache::StoreCache::new(std::sync::Arc::new(store))))
}
