//! The `llamad` binary: parse the command line, load the configuration, init tracing, run.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand};
use llamad::config::{Config, Overrides};

#[derive(Parser, Debug)]
#[command(
    name = "llamad",
    disable_version_flag = true,
    about = "Worker daemon speaking llama.cpp's RPC protocol (8.0.0, or 7.0.0 for older llama.cpp builds)"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    /// Address to bind (IPv4/IPv6 literal or host name) [default: 127.0.0.1].
    #[arg(short = 'H', long, global = true)]
    host: Option<String>,
    /// TCP port [default: 50052].
    #[arg(short, long, global = true)]
    port: Option<u16>,
    /// RPC protocol major version announced on --port: 8 for llama.cpp b11450 and later, 7 for
    /// older builds (llama-cpp-python 0.3.36) [default: 8].
    #[arg(long, global = true, value_name = "8|7", value_parser = clap::value_parser!(u8).range(7..=8))]
    protocol: Option<u8>,
    /// Also serve protocol 7.0.0 on this port (with --protocol 8 on --port), for masters of both
    /// generations [default: none].
    #[arg(long, global = true, value_name = "PORT")]
    port_v7: Option<u16>,
    /// Compute threads [default: physical cores].
    #[arg(short, long, global = true)]
    threads: Option<usize>,
    /// Numerics profile: reproduce the arithmetic of llama.cpp built for avx2, avx512,
    /// neon-dotprod, neon-i8mm or sve, or `portable` (fastest, own summation orders) [default:
    /// $LLAMAD_NUMERICS, else this CPU's, as ggml's CPU-variant loader picks]. As an RPC server
    /// llamad keeps the order of llama.cpp's RPC server; its in-process models follow llama.cpp's
    /// local, repacked order for the weights llama.cpp's own CPU would repack (x86: Q4_0, IQ4_NL, MXFP4, Q4_K).
    #[arg(long, global = true, value_name = "PROFILE")]
    numerics: Option<String>,
    /// NUMA placement of the compute threads and memory on multi-node servers: `distribute`
    /// (threads over all nodes in turn, pages interleaved), `isolate` (threads and pages on the
    /// node llamad starts on) or `off` [default: off].
    #[arg(long, global = true, value_name = "MODE", value_parser = ["off", "distribute", "isolate"])]
    numa: Option<String>,
    /// Print the version, the numerics profile and the kernel set, and exit.
    #[arg(short = 'V', long)]
    version: bool,
    /// Devices, separated by `,` or `/` (only CPU exists).
    #[arg(short, long, global = true)]
    device: Option<String>,
    /// Enable the tensor cache.
    #[arg(short, long, global = true)]
    cache: bool,
    /// Read weight matrices row by row only: no interleaved copies for generation (saves as much
    /// memory as the Q4_0/Q4_1/Q5_0/Q8_0 matrices take).
    #[arg(long, global = true)]
    no_interleave: bool,
    /// Memory budget for buffers (e.g. 8G) [default: available memory].
    #[arg(long, global = true, value_name = "SIZE")]
    mem: Option<String>,
    /// Admin API address (host:port or a Unix socket path), or `off` [default: 127.0.0.1:50053].
    #[arg(long, global = true, value_name = "ADDR")]
    admin_listen: Option<String>,
    /// Admin API bearer token file (created with a random token, mode 0600, when absent).
    #[arg(long, global = true, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// Peers allowed on the RPC port: CIDR networks or addresses, `loopback`, `any`, comma-separated
    /// (e.g. `10.0.0.0/8,::1`) [default: loopback].
    #[arg(long, global = true, value_name = "CIDR,...")]
    allow: Option<String>,
    /// Shared-secret file: RPC peers must authenticate with it (llamactl `--secret-file`; llama.cpp
    /// masters cannot, so leave it unset for them) [default: no authentication].
    #[arg(long, global = true, value_name = "FILE")]
    secret_file: Option<PathBuf>,
    /// TLS certificate chain (PEM) for the RPC port; with --tls-key turns TLS on (llamactl
    /// `--tls-ca`; llama.cpp masters speak plain TCP only, see --tls-optional) [default: no TLS].
    #[arg(long, global = true, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) of --tls-cert.
    #[arg(long, global = true, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// With TLS on, also serve peers that speak plain TCP on the same port (llama.cpp masters)
    /// [default: TLS required].
    #[arg(long, global = true)]
    tls_optional: bool,
    /// Cache root [default: $LLAMA_CACHE/rpc, else ~/.cache/llama.cpp/rpc].
    #[arg(long, global = true, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Cache size limit (e.g. 50G); least recently used objects are evicted [default: unlimited].
    #[arg(long, global = true, value_name = "SIZE")]
    cache_max_size: Option<String>,
    /// Serve the OpenAI-compatible API on this address (host:port) [default: off].
    #[arg(long, global = true, value_name = "ADDR")]
    openai_listen: Option<String>,
    /// Bearer keys of the OpenAI API, one per line [default: none: loopback addresses only].
    #[arg(long, global = true, value_name = "FILE")]
    openai_key_file: Option<PathBuf>,
    /// A model for the OpenAI API, served in-process (repeatable; `[[models]]` in the configuration
    /// file also names workers, ctx and parallel slots).
    #[arg(long = "model", global = true, value_name = "NAME=PATH")]
    models: Vec<String>,
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
    /// Print the shell completion script for SHELL (generated from this command line).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff, section 8, generated from this command line).
    Man,
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

/// Writes `bytes` to stdout; a closed pipe (`llamad man | head`) is not an error.
fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    let flags = Overrides {
        host: cli.host,
        port: cli.port,
        protocol: cli.protocol,
        port_v7: cli.port_v7,
        threads: cli.threads,
        numerics: cli.numerics,
        numa: cli.numa,
        device: cli.device,
        cache: cli.cache,
        no_interleave: cli.no_interleave,
        mem: cli.mem,
        cache_dir: cli.cache_dir,
        cache_max_size: cli.cache_max_size,
        admin_listen: cli.admin_listen,
        admin_token_file: cli.admin_token_file,
        allow: cli.allow,
        secret_file: cli.secret_file,
        tls_cert: cli.tls_cert,
        tls_key: cli.tls_key,
        tls_optional: cli.tls_optional,
        openai_listen: cli.openai_listen,
        openai_key_file: cli.openai_key_file,
        models: cli.models,
    };
    match cli.command {
        Some(Sub::Completions { shell }) => {
            // Into memory first: `generate` panics on a write error (a closed pipe).
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "llamad", &mut buf);
            return write_stdout(&buf);
        }
        Some(Sub::Man) => {
            let mut buf = Vec::new();
            clap_mangen::Man::new(Cli::command())
                .section("8")
                .render(&mut buf)
                .context("rendering the man page")?;
            return write_stdout(&buf);
        }
        _ => {}
    }
    let config_path = cli.config.clone();
    let cfg =
        Config::load(cli.config.as_deref(), std::env::vars(), &flags).context("loading the configuration")?;
    if cli.version {
        // Chosen as serving would choose it (a profile this CPU cannot run falls back, with a warning).
        let numerics = compute::numerics::init(cfg.numerics.map(|n| n.name()));
        if let Some(want) = cfg.numerics.filter(|&n| n != numerics) {
            eprintln!(
                "llamad: this CPU (or LLAMAD_KERNELS) cannot run numerics profile {want}; using {numerics}"
            );
        }
        println!(
            "llamad {} (RPC protocol 8.0.0 by default; 7.0.0 with --protocol 7 or on --port-v7)\nnumerics: {} (kernels: {})",
            env!("CARGO_PKG_VERSION"),
            numerics,
            compute::quant::active_isa()
        );
        return Ok(());
    }
    if let Some(Sub::CheckConfig) = cli.command {
        println!("configuration ok: {cfg:?}");
        return Ok(());
    }
    llamad::telemetry::init();
    let numerics = compute::numerics::init(cfg.numerics.map(|n| n.name()));
    tracing::info!(%numerics, kernels = compute::quant::active_isa(), "numerics profile");
    // Before the runtime: its threads inherit the memory policy.
    compute::numa::init(cfg.numa);
    let rt =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    rt.block_on(async move {
        let addrs: Vec<_> = tokio::net::lookup_host((cfg.host.as_str(), cfg.port))
            .await
            .with_context(|| format!("resolving {}", cfg.host))?
            .collect();
        let addr = *addrs.first().with_context(|| format!("{} resolves to no address", cfg.host))?;
        let mut listeners = Vec::new();
        for (port, proto) in cfg.listeners() {
            let a = std::net::SocketAddr::new(addr.ip(), port);
            let l = tokio::net::TcpListener::bind(a).await.with_context(|| format!("binding {a}"))?;
            listeners.push((l, proto));
        }
        let protocols = cfg.protocols_text();
        if !addr.ip().is_loopback() && cfg.tls.is_none() {
            tracing::warn!(%addr, "listening beyond loopback: the RPC protocol has no encryption unless TLS is on (--tls-cert, --tls-key)");
        }
        let cache = if cfg.cache { Some(open_cache(&cfg)?) } else { None };
        let _watcher = match &cache {
            Some(c) => Some(
                cachestore::watch::Watcher::start(c.store().clone(), std::time::Duration::from_secs(2))
                    .context("watching the cache directory")?,
            ),
            None => None,
        };
        let store = cache.as_ref().map(|c| c.store().clone());
        let store_for_reload = store.clone();
        let wire_cache = cache.map(|c| c as std::sync::Arc<dyn llamad::rpc::cache::WireCache>);
        let admin = cfg.admin.clone();
        let openai = cfg.openai.clone();
        let openai_auth = cfg.auth.clone();
        let shared = llamad::Shared::with_cache(cfg, wire_cache);
        // One signal handler for both servers.
        let stop = tokio_util::sync::CancellationToken::new();
        let on_signal = stop.clone();
        tokio::spawn(async move {
            llamad::lifecycle::shutdown_signal().await;
            on_signal.cancel()
        });
        // The admin API; a failure to start it is logged, not fatal (the RPC service matters most).
        if let Some(admin) = admin {
            let started =
                llamad::admin::start(admin, shared.clone(), Some(addr.to_string()), store, stop.clone().cancelled_owned());
            if let Err(e) = started.await {
                tracing::warn!(error = %e, "admin API not started");
            }
        }
        // The OpenAI API: a failure to bind it is fatal (it was asked for explicitly).
        if let Some(o) = openai {
            let opts = llamad_master::pipeline::SplitOptions {
                auth: openai_auth,
                io_timeout: Some(o.request_timeout),
                ..llamad_master::pipeline::SplitOptions::default()
            };
            llamad::openai::start(o, opts, stop.clone().cancelled_owned()).await.context("starting the OpenAI API")?;
        }
        tokio::spawn(llamad::lifecycle::watchdog(stop.clone()));
        if let Some(mut hup) = llamad::lifecycle::hangups() {
            let (config, flags) = (config_path.clone(), flags.clone());
            let store = store_for_reload;
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    reload(config.as_deref(), &flags, store.as_deref());
                }
            });
        }
        llamad::lifecycle::notify("READY=1");
        llamad::lifecycle::notify(&format!("STATUS=serving RPC protocol {protocols} on {addr}"));
        llamad::serve_all(shared, listeners, stop.cancelled_owned()).await?;
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

/// SIGHUP: reads the configuration again and applies what can change while running (the cache's size
/// limit); a bad file is reported and the running configuration kept. Listeners, threads and the memory
/// budget need a restart.
fn reload(config: Option<&std::path::Path>, flags: &Overrides, store: Option<&cachestore::Store>) {
    llamad::lifecycle::notify("RELOADING=1");
    match Config::load(config, std::env::vars(), flags) {
        Ok(cfg) => {
            if let Some(store) = store {
                if let Err(e) = store.set_max_size(cfg.cache_max_size) {
                    tracing::warn!(error = %e, "reload: cache size limit not applied");
                }
            }
            tracing::info!(cache_max_size = ?cfg.cache_max_size, "configuration reloaded (listeners, threads and memory budget change on restart)");
        }
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "reload failed; keeping the running configuration")
        }
    }
    llamad::lifecycle::notify("READY=1");
}
