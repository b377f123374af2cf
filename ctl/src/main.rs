//! The `llamactl` binary: parse the command line, init tracing, dispatch to a `cmd::` module.
//!
//! Exit codes: 0 success; 1 an error or a negative answer (`cache verify` found corruption, a job
//! failed, a worker is unhealthy); 2 a usage error (clap's own). A closed stdout
//! (`llamactl run … | head`) counts as success.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::ExitCode;

use clap::Parser;
use llamactl::cli::{Cli, Command};

/// `--numa`'s mode (clap accepts only the modes' names).
fn numa_mode(s: Option<&str>) -> compute::numa::NumaMode {
    s.and_then(compute::numa::NumaMode::parse).unwrap_or_default()
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(llamactl::cli::normalize_args(std::env::args_os()));
    init_tracing(cli.verbose);
    match &cli.command {
        Command::Run(a) if a.server.is_none() => {
            compute::numerics::init(a.numerics.as_deref());
            compute::numa::init(numa_mode(a.numa.as_deref()));
        }
        Command::Bench(a) => {
            compute::numerics::init(a.numerics.as_deref());
            compute::numa::init(numa_mode(a.numa.as_deref()));
        }
        _ => {}
    }
    let res = match cli.command {
        Command::Run(args) => match &args.server {
            Some(server) => llamactl::cmd::run_job::run(&args, server),
            None => llamactl::cmd::run::run(&args),
        },
        Command::Bench(args) => llamactl::cmd::bench::run(&args),
        Command::Synth(args) => llamactl::cmd::synth::run(&args),
        Command::Admin(cmd) => return llamactl::cli_admin::main(&cmd),
        Command::Completions { shell } => {
            llamactl::cmd::docs::completions(shell, &mut llamactl::output::stdout())
        }
        Command::Man => llamactl::cmd::docs::man(&mut llamactl::output::stdout()),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if llamactl::output::is_stdout_closed(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("llamactl: error: {e:#}");
            let usage = e.chain().any(|c| c.is::<llamactl::cli::UsageError>());
            ExitCode::from(if usage { 2 } else { 1 })
        }
    }
}

fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info,llamactl=info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("LLAMACTL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}
