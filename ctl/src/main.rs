//! The `llamactl` binary: parse the command line, init tracing, dispatch to a `cmd::` module.
//!
//! Exit codes (house style): 0 success, 1 a negative answer (`cache verify` found corruption) or an
//! error reported by the admin API, 2 usage and local errors. A closed stdout
//! (`llamactl run … | head`) counts as success.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::ExitCode;

use clap::Parser;
use llamactl::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse_from(llamactl::cli::normalize_args(std::env::args_os()));
    init_tracing(cli.verbose);
    let res = match cli.command {
        Command::Run(args) => llamactl::cmd::run::run(&args),
        Command::Bench(args) => llamactl::cmd::bench::run(&args),
        Command::Admin(cmd) => return llamactl::cli_admin::main(&cmd),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("llamactl: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
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
