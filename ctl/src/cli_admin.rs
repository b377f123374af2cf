//! The admin nouns of `llamactl` (clap derive): `status`, `workers`, `cache`, `jobs`, each talking to
//! llamad's admin API. [`AdminCommand`] is self-contained so it can be flattened into the main command
//! enum; [`main`] runs one and maps the result to an exit code: 0 success, 1 a negative answer (a
//! corrupt object, a failed job) or an error, 2 usage (clap's own).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::client::{self, Client};
use crate::cmd;
use crate::output::OutputMode;

/// Where the server is and how to talk to it; accepted by every admin noun.
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// Admin API URL (`host:port` means `http://host:port`).
    #[arg(long, env = "LLAMACTL_SERVER", default_value = client::DEFAULT_SERVER, global = true)]
    pub server: String,
    /// File holding the bearer token [default: /etc/llamad/admin.token, else /var/lib/llamad/admin.token].
    #[arg(long, env = "LLAMACTL_TOKEN_FILE", value_name = "FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputMode::Table, global = true)]
    pub output: OutputMode,
}

/// The admin nouns.
#[derive(Subcommand, Debug, Clone)]
pub enum AdminCommand {
    /// What the daemon is and does: version, uptime, memory, RPC traffic.
    Status(StatusArgs),
    /// Remote workers: list, add, remove, probe.
    Workers(WorkersArgs),
    /// The tensor cache: list, inspect, remove, pin, verify, collect garbage, import a GGUF.
    Cache(CacheArgs),
    /// Generation jobs run by the daemon: list, show, follow, cancel, submit.
    Jobs(JobsArgs),
    /// Models served by the daemon's OpenAI API: state, slots, memory.
    Models(ModelsArgs),
}

/// `llamactl models`.
#[derive(Args, Debug, Clone)]
pub struct ModelsArgs {
    /// Server options.
    #[command(flatten)]
    pub server: ServerArgs,
    /// The verb.
    #[command(subcommand)]
    pub verb: ModelsVerb,
}

/// Verbs of `models`.
#[derive(Subcommand, Debug, Clone)]
pub enum ModelsVerb {
    /// List the models, their state, slots, queue and memory.
    Ls,
}

/// `llamactl status`.
#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// Server options.
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `llamactl workers`.
#[derive(Args, Debug, Clone)]
pub struct WorkersArgs {
    /// Server options.
    #[command(flatten)]
    pub server: ServerArgs,
    /// The verb.
    #[command(subcommand)]
    pub verb: WorkersVerb,
}

/// Verbs of `workers`.
#[derive(Subcommand, Debug, Clone)]
pub enum WorkersVerb {
    /// List workers and their last probe.
    Ls,
    /// Register a worker.
    Add {
        /// `host:port` of its RPC listener.
        address: String,
        /// A label (repeatable).
        #[arg(short, long = "label")]
        labels: Vec<String>,
    },
    /// Forget a worker.
    Rm {
        /// `host:port`.
        address: String,
    },
    /// Probe a worker now (HELLO, devices, memory, round trip); exit 1 when it is unhealthy.
    Probe {
        /// `host:port`.
        address: String,
    },
}

/// `llamactl cache`.
#[derive(Args, Debug, Clone)]
pub struct CacheArgs {
    /// Server options.
    #[command(flatten)]
    pub server: ServerArgs,
    /// The verb.
    #[command(subcommand)]
    pub verb: CacheVerb,
}

/// Sort keys of `cache ls`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortArg {
    /// Size.
    Size,
    /// Last use.
    LastUsed,
    /// Hits.
    Hits,
    /// Creation.
    Created,
}

/// Verbs of `cache`.
#[derive(Subcommand, Debug, Clone)]
pub enum CacheVerb {
    /// List objects (newest use first) and the totals.
    Ls {
        /// Only objects whose name contains this.
        #[arg(long)]
        name: Option<String>,
        /// Only objects at least this large (`4M`, `1G`).
        #[arg(long, value_parser = parse_size_arg)]
        min_size: Option<u64>,
        /// Only pinned objects.
        #[arg(long)]
        pinned: bool,
        /// Sort key.
        #[arg(long, value_enum, default_value_t = SortArg::LastUsed)]
        sort: SortArg,
        /// Ascending order.
        #[arg(long)]
        asc: bool,
        /// Skip this many.
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Show at most this many.
        #[arg(long, default_value_t = 100)]
        limit: u64,
    },
    /// Show one object.
    Stat {
        /// Digest (64 hex digits).
        digest: String,
    },
    /// Remove an object.
    Rm {
        /// Digest.
        digest: String,
    },
    /// Pin an object (never evicted).
    Pin {
        /// Digest.
        digest: String,
    },
    /// Unpin an object.
    Unpin {
        /// Digest.
        digest: String,
    },
    /// Re-hash one or all objects; exit 1 when any is corrupt.
    Verify {
        /// One object; all when absent.
        digest: Option<String>,
    },
    /// Repair the index against the files.
    Gc,
    /// Store every tensor of a GGUF file (a path the daemon can read).
    Import {
        /// GGUF file.
        path: String,
    },
}

fn parse_size_arg(s: &str) -> std::result::Result<u64, String> {
    crate::output::parse_size(s).ok_or_else(|| format!("`{s}` is not a size (e.g. 4096, 4K, 1.5M, 2G)"))
}

/// `llamactl jobs`.
#[derive(Args, Debug, Clone)]
pub struct JobsArgs {
    /// Server options.
    #[command(flatten)]
    pub server: ServerArgs,
    /// The verb.
    #[command(subcommand)]
    pub verb: JobsVerb,
}

/// Verbs of `jobs`.
#[derive(Subcommand, Debug, Clone)]
pub enum JobsVerb {
    /// List jobs, newest first.
    Ls,
    /// Show one job; exit 1 when it failed.
    Show {
        /// Job id.
        id: String,
    },
    /// Print a job's output; with -f, follow it until the job ends.
    Logs {
        /// Job id.
        id: String,
        /// Follow the live output.
        #[arg(short, long)]
        follow: bool,
    },
    /// Cancel a job.
    Cancel {
        /// Job id.
        id: String,
    },
    /// Submit a job (the model path is read by the daemon).
    Submit {
        /// GGUF model file on the daemon's machine.
        #[arg(short = 'm', long)]
        model: String,
        /// Prompt text.
        #[arg(short = 'p', long)]
        prompt: String,
        /// Tokens to generate.
        #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
        n_predict: u32,
        /// Temperature (≤ 0 = greedy).
        #[arg(long)]
        temp: Option<f32>,
        /// RNG seed.
        #[arg(long)]
        seed: Option<u32>,
        /// Workers by address or by label of the daemon's registry (none: the daemon runs it itself).
        #[arg(long, value_delimiter = ',')]
        workers: Vec<String>,
        /// Context size [default: prompt + n-predict].
        #[arg(short = 'c', long = "ctx-size")]
        ctx_size: Option<u32>,
        /// How the model is split across the workers (as `llamactl run`: default `auto`).
        #[arg(long = "split-mode", value_enum, env = "LLAMACTL_SPLIT_MODE", default_value_t = crate::master::SplitMode::Auto)]
        split_mode: crate::master::SplitMode,
        /// Weight writes larger than this many bytes go through the workers' tensor caches (as `llamactl
        /// run`) [default: 1 MiB].
        #[arg(long = "hash-threshold", value_name = "BYTES")]
        hash_threshold: Option<u64>,
    },
}

/// The admin nouns as a standalone command line (tests; the `llamactl` binary flattens [`AdminCommand`]).
#[derive(Parser, Debug)]
#[command(name = "llamactl")]
pub struct AdminCli {
    /// The noun.
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Exit 0.
    Success,
    /// Exit 1: the server answered, and the answer is "no" (corruption found, job failed, worker down).
    Negative,
}

impl AdminCommand {
    /// The server options of whichever noun this is.
    pub fn server(&self) -> &ServerArgs {
        match self {
            AdminCommand::Status(a) => &a.server,
            AdminCommand::Workers(a) => &a.server,
            AdminCommand::Cache(a) => &a.server,
            AdminCommand::Jobs(a) => &a.server,
            AdminCommand::Models(a) => &a.server,
        }
    }
}

/// Runs `cmd`, writing data to `out`.
pub fn execute(cmd: &AdminCommand, out: &mut dyn Write) -> Result<Outcome> {
    let s = cmd.server();
    let token = client::read_token(s.token_file.as_deref())?;
    let c = Client::new(&s.server, token);
    match cmd {
        AdminCommand::Status(_) => cmd::status::run(&c, s.output, out),
        AdminCommand::Workers(a) => cmd::workers::run(&c, &a.verb, s.output, out),
        AdminCommand::Cache(a) => cmd::cache::run(&c, &a.verb, s.output, out),
        AdminCommand::Jobs(a) => cmd::jobs::run(&c, &a.verb, s.output, out),
        AdminCommand::Models(a) => cmd::models::run(&c, &a.verb, s.output, out),
    }
}

/// Runs `cmd` on stdout and returns the exit code (errors are printed to stderr).
pub fn main(cmd: &AdminCommand) -> ExitCode {
    let mut lock = crate::output::stdout();
    match execute(cmd, &mut lock) {
        Ok(Outcome::Success) => ExitCode::SUCCESS,
        Ok(Outcome::Negative) => ExitCode::from(1),
        Err(e) if crate::output::is_stdout_closed(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("llamactl: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The way the main command line takes these nouns: `#[command(flatten)]` on a variant.
    #[derive(Parser, Debug)]
    struct Main {
        #[command(subcommand)]
        command: MainCommand,
    }

    #[derive(Subcommand, Debug)]
    enum MainCommand {
        Run,
        #[command(flatten)]
        Admin(AdminCommand),
    }

    #[test]
    fn flattens_into_a_main_command_enum() {
        let m = Main::try_parse_from(["llamactl", "cache", "ls", "--sort", "size", "-o", "json"]).unwrap();
        let MainCommand::Admin(AdminCommand::Cache(a)) = m.command else { panic!("{m:?}") };
        assert!(matches!(a.verb, CacheVerb::Ls { sort: SortArg::Size, .. }));
        assert_eq!(a.server.output, OutputMode::Json);
        assert_eq!(a.server.server, client::DEFAULT_SERVER);
        let m = Main::try_parse_from(["llamactl", "jobs", "logs", "-f", "abc", "--server", "http://h:1"])
            .unwrap();
        let MainCommand::Admin(AdminCommand::Jobs(j)) = m.command else { panic!("{m:?}") };
        assert!(matches!(j.verb, JobsVerb::Logs { follow: true, ref id } if id == "abc"));
        assert_eq!(j.server.server, "http://h:1");
        assert!(matches!(Main::try_parse_from(["llamactl", "run"]).unwrap().command, MainCommand::Run));
    }
}
