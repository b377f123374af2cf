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
        if cfg.cache {
            tracing::warn!("the tensor cache is not wired into this build yet; SET_TENSOR_HASH answers 0");
        }
        let shared = llamad::Shared::new(cfg);
        // One signal handler for both servers.
        let stop = tokio_util::sync::CancellationToken::new();
        let on_signal = stop.clone();
        tokio::spawn(async move { llamad::lifecycle::shutdown_signal().await; on_signal.cancel() });
        // The admin API (defaults until config.rs has an `[admin]` section); a failure to start it is logged, not fatal.
        if let Ok(Some(admin)) = llamad::admin::AdminConfig::from_raw(&Default::default()) {
            let started = llamad::admin::start(admin, shared.clone(), Some(addr.to_string()), None, stop.clone().cancelled_owned());
            if let Err(e) = started.await {
                tracing::warn!(error = %e, "admin API not started");
            }
        }
        llamad::lifecycle::notify("READY=1");
        llamad::serve(shared, listener, stop.cancelled_owned()).await?;
        Ok(())
    })
}
