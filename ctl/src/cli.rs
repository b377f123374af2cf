//! The command line (clap derive). `run` mirrors llama.cpp's option names where one exists.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::master::upload::DEFAULT_HASH_THRESHOLD;

/// `llamactl`: run models locally or across llamad workers.
#[derive(Parser, Debug)]
#[command(name = "llamactl", version, about)]
pub struct Cli {
    /// The noun.
    #[command(subcommand)]
    pub command: Command,
    /// More log output on stderr (-v info, -vv debug); `LLAMACTL_LOG` overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// The nouns.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate text from a prompt, locally or with layers on RPC workers (`--workers`).
    Run(RunArgs),
    /// Measure prompt processing and generation speed (llama-bench style), locally or on `--workers`.
    Bench(BenchArgs),
    /// Write a synthetic llama-family model: any layer shape, any weight type, random weights, a
    /// real tokenizer copied from another GGUF (for benchmarks at sizes nobody downloads).
    Synth(SynthArgs),
    /// Admin nouns: status, workers, cache, jobs (through a llamad's admin API).
    #[command(flatten)]
    Admin(crate::cli_admin::AdminCommand),
    /// Print the shell completion script for SHELL (generated from this command line).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff, generated from this command line; every subcommand is listed).
    Man,
}

/// Flash attention mode.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlashAttn {
    /// Always.
    #[value(alias = "1")]
    On,
    /// Never.
    #[value(alias = "0")]
    Off,
    /// Let the engine choose (on: every backend here supports FLASH_ATTN_EXT).
    Auto,
}

/// `llamactl run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Numerics profile of the in-process kernels: reproduce llama.cpp built for avx2, avx512,
    /// neon-dotprod, neon-i8mm or sve, or `portable` (fastest, own summation orders) [default:
    /// $LLAMAD_NUMERICS, else this CPU's]. In-process, the weights llama.cpp's own CPU would repack
    /// (x86: Q4_0, IQ4_NL, MXFP4 and Q4_K so far) follow its local, repacked order, as llama.cpp run locally;
    /// workers (llamad) keep its RPC server's order and choose their own with their --numerics.
    #[arg(long, value_name = "PROFILE", value_parser = ["avx2", "avx512", "neon-dotprod", "neon-i8mm", "sve", "portable"])]
    pub numerics: Option<String>,
    /// NUMA placement of the in-process compute threads and memory (llama.cpp's `--numa`):
    /// `distribute`, `isolate` or `off` [default: off]. Workers (llamad) take their own --numa.
    #[arg(long, value_name = "MODE", value_parser = ["off", "distribute", "isolate"])]
    pub numa: Option<String>,
    /// GGUF model file.
    #[arg(short = 'm', long, value_name = "MODEL.gguf")]
    pub model: PathBuf,
    /// Prompt text.
    #[arg(short = 'p', long, required_unless_present = "file", conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Tokens to generate (-1 = until end of generation or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// RPC workers, `HOST:PORT,...`: the model's layers are split across them. With `--server`,
    /// addresses or labels of the daemon's worker registry.
    #[arg(long, value_delimiter = ',', value_name = "HOST:PORT,...")]
    pub workers: Vec<String>,
    /// Submit the run as a job to the llamad admin API at this URL (`http://HOST:PORT`) and stream its
    /// tokens back: that daemon loads the model (a path on its machine) and runs it in-process or,
    /// with `--workers`/`--worker-label`, as the master of those workers.
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// With `--server`: the workers carrying this label in the daemon's registry (repeatable).
    #[arg(long = "worker-label", value_name = "LABEL", requires = "server")]
    pub worker_labels: Vec<String>,
    /// With `--server`: the admin API's bearer token file [default: /etc/llamad/admin.token, else
    /// /var/lib/llamad/admin.token].
    #[arg(long = "token-file", env = "LLAMACTL_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Threads for the local computation [default: available cores].
    #[arg(short = 't', long, conflicts_with = "server")]
    pub threads: Option<usize>,
    /// Context size (KV-cache cells).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx_size: u64,
    /// Largest micro-batch of prompt tokens per forward pass.
    #[arg(long = "ubatch-size", default_value_t = 512, conflicts_with = "server")]
    pub ubatch_size: u64,
    /// Round the attended KV extent up to a multiple of N while it is short, of up to 256 as it
    /// grows (N a multiple of 64). The default, 256, is llama.cpp's rounding (the same graphs as
    /// llama.cpp's master); every value gives the same tokens, a smaller one attends fewer empty
    /// cells.
    #[arg(long = "kv-pad", value_name = "N", default_value_t = compute::model::KV_PAD, value_parser = parse_kv_pad, conflicts_with = "server")]
    pub kv_pad: u64,
    /// Temperature (≤ 0 = greedy) [default: model's, else 0.8].
    #[arg(long)]
    pub temp: Option<f32>,
    /// Top-k (≤ 0 = off) [default: model's, else 40].
    #[arg(long = "top-k", allow_negative_numbers = true)]
    pub top_k: Option<i32>,
    /// Top-p (1 = off) [default: model's, else 0.95].
    #[arg(long = "top-p")]
    pub top_p: Option<f32>,
    /// Min-p (0 = off) [default: model's, else 0.05].
    #[arg(long = "min-p")]
    pub min_p: Option<f32>,
    /// Repetition penalty (1 = off).
    #[arg(long = "repeat-penalty")]
    pub repeat_penalty: Option<f32>,
    /// Never sample an end-of-generation token, so generation runs to `-n` (llama-cli's
    /// `--ignore-eos`: minus infinity on those tokens' logits before sampling).
    #[arg(long)]
    pub ignore_eos: bool,
    /// RNG seed [default: random].
    #[arg(long)]
    pub seed: Option<u32>,
    /// Share of the offloaded layers per worker, e.g. `3,1` [default: by reported free memory].
    #[arg(long = "tensor-split", value_delimiter = ',', value_name = "W0,W1,...", conflicts_with = "server")]
    pub tensor_split: Vec<f64>,
    /// How many trailing layers (counting the output layer) go to the workers; the rest run here
    /// (llama.cpp's `-ngl`; default all). Also accepted as `-ngl N`.
    #[arg(long = "n-gpu-layers", visible_alias = "ngl", value_name = "N", conflicts_with = "server")]
    pub n_gpu_layers: Option<u32>,
    /// Apply the model's chat template to the prompt (one user message).
    #[arg(long, conflicts_with = "server")]
    pub chat: bool,
    /// Flash attention.
    #[arg(long = "flash-attn", value_enum, default_value_t = FlashAttn::Auto, conflicts_with = "server")]
    pub flash_attn: FlashAttn,
    /// How the model is split across the workers: `layer` (whole layers, run in turn; llama.cpp's
    /// tokens exactly), `row` (every layer split across the workers, run together), or `auto` (the
    /// round trips measured at connect time pick the faster of the two for the model; one worker is
    /// always `layer`). `LLAMACTL_SPLIT_MODE` sets the default.
    #[arg(long = "split-mode", visible_alias = "sm", value_enum, env = "LLAMACTL_SPLIT_MODE", default_value_t = crate::master::SplitMode::Auto)]
    pub split_mode: crate::master::SplitMode,
    /// Split mode row: relay the partial sums through llamactl even when every worker is llamad
    /// (by default llamad workers link to each other and exchange them directly).
    #[arg(long = "no-worker-links", conflicts_with = "server")]
    pub no_worker_links: bool,
    /// Weight writes larger than this many bytes try SET_TENSOR_HASH first (worker tensor cache); a
    /// write is one weight, or a run of small neighbouring weights of one layer.
    #[arg(long = "hash-threshold", default_value_t = DEFAULT_HASH_THRESHOLD, value_name = "BYTES")]
    pub hash_threshold: u64,
    /// Do not read or write the memo of the model's wire hashes (under `$XDG_CACHE_HOME/llamad`);
    /// every hash is computed from the weights.
    #[arg(long = "no-hash-memo")]
    pub no_hash_memo: bool,
    /// In-process runs: read the weights straight from the file's mapping (the page cache)
    /// instead of a private copy on huge pages, which generation reads faster.
    #[arg(long)]
    pub mmap: bool,
    /// No progress bars, even on a terminal.
    #[arg(long = "no-progress")]
    pub no_progress: bool,
    /// Shared-secret file for workers that require authentication (their `server.secret_file`);
    /// workers that do not ask (llama.cpp's rpc-server, llamad without a secret) are used as they are.
    #[arg(long = "secret-file", env = "LLAMACTL_SECRET_FILE", value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// Speak TLS to the workers, trusting the CA certificate(s) in this PEM file (workers started
    /// with `--tls-cert`/`--tls-key`); the certificate must name the address given in `--workers`.
    #[arg(long = "tls-ca", env = "LLAMACTL_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
}

/// Output format of `llamactl bench`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchOutput {
    /// A markdown table, a row per test as it finishes.
    Md,
    /// A JSON array, one object per test (llama-bench's field names).
    Json,
}

/// `llamactl synth`.
#[derive(Args, Debug, Clone)]
pub struct SynthArgs {
    /// Architecture: llama, mistral3, qwen2, qwen3, gemma3, qwen2moe or qwen3moe.
    #[arg(long, default_value = "llama")]
    pub arch: String,
    /// Experts per layer (qwen2moe, qwen3moe).
    #[arg(long, default_value_t = 8)]
    pub experts: u64,
    /// Experts used per token (qwen2moe, qwen3moe).
    #[arg(long, default_value_t = 2)]
    pub experts_used: u64,
    /// Feed-forward width of one expert (default: --ff / --experts-used).
    #[arg(long)]
    pub expert_ff: Option<u64>,
    /// Feed-forward width of Qwen2-MoE's shared expert (default: none).
    #[arg(long)]
    pub shared_expert_ff: Option<u64>,
    /// Layer shape: 1b, 8b, 70b or 405b (the llama shapes), or custom with --embd, --ff, --heads,
    /// --kv-heads.
    #[arg(long, default_value = "1b")]
    pub shape: String,
    /// Layers (default: the shape's own count).
    #[arg(long)]
    pub layers: Option<u64>,
    /// Embedding width (overrides the shape's).
    #[arg(long)]
    pub embd: Option<u64>,
    /// Feed-forward width (overrides the shape's).
    #[arg(long)]
    pub ff: Option<u64>,
    /// Query heads (overrides the shape's).
    #[arg(long)]
    pub heads: Option<u64>,
    /// Key/value heads (overrides the shape's).
    #[arg(long)]
    pub kv_heads: Option<u64>,
    /// Weight type of every matrix (ggml's name: q4_0, q4_k, iq2_xs, tq2_0, …).
    #[arg(short = 't', long = "type", default_value = "q4_0")]
    pub wtype: String,
    /// The GGUF whose tokenizer is copied.
    #[arg(long, value_name = "MODEL.gguf")]
    pub vocab_from: PathBuf,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output file.
    #[arg(short = 'o', long, value_name = "OUT.gguf")]
    pub output: PathBuf,
    /// Threads filling the tensors (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// `llamactl bench` (option names as llama-bench's; lists are comma-separated).
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Numerics profile of the in-process kernels: reproduce llama.cpp built for avx2, avx512,
    /// neon-dotprod, neon-i8mm or sve, or `portable` (fastest, own summation orders) [default:
    /// $LLAMAD_NUMERICS, else this CPU's]. In-process, the weights llama.cpp's own CPU would repack
    /// (x86: Q4_0, IQ4_NL, MXFP4 and Q4_K so far) follow its local, repacked order, as llama.cpp run locally;
    /// workers (llamad) keep its RPC server's order and choose their own with their --numerics.
    #[arg(long, value_name = "PROFILE", value_parser = ["avx2", "avx512", "neon-dotprod", "neon-i8mm", "sve", "portable"])]
    pub numerics: Option<String>,
    /// NUMA placement of the in-process compute threads and memory (llama.cpp's `--numa`):
    /// `distribute`, `isolate` or `off` [default: off]. Workers (llamad) take their own --numa.
    #[arg(long, value_name = "MODE", value_parser = ["off", "distribute", "isolate"])]
    pub numa: Option<String>,
    /// GGUF model file.
    #[arg(short = 'm', long, value_name = "MODEL.gguf", required_unless_present = "mem_bandwidth")]
    pub model: Option<PathBuf>,
    /// Prompt-processing tests: tokens per batch (0 = none).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512",
        value_name = "N,..."
    )]
    pub n_prompt: Vec<u64>,
    /// Generation tests: tokens generated one by one (0 = none).
    #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_value = "128", value_name = "N,...")]
    pub n_gen: Vec<u64>,
    /// KV-cache depth of every test (llama-bench's `-d`): that many tokens are decoded first,
    /// untimed, in each repetition, so `tg128 @ d4096` measures generation 4096 tokens deep.
    #[arg(short = 'd', long = "n-depth", value_delimiter = ',', default_value = "0", value_name = "N,...")]
    pub n_depth: Vec<u64>,
    /// Timed repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub repetitions: usize,
    /// Local threads, one set of tests per value [default: available cores].
    #[arg(short = 't', long, value_delimiter = ',', value_name = "N,...")]
    pub threads: Vec<usize>,
    /// RPC workers, `HOST:PORT,...` (as `llamactl run`); none = in-process.
    #[arg(long, value_delimiter = ',', value_name = "HOST:PORT,...")]
    pub workers: Vec<String>,
    /// Largest micro-batch of prompt tokens per forward pass (also `-ub`).
    #[arg(long = "ubatch-size", default_value_t = 512)]
    pub ubatch_size: u64,
    /// Round the attended KV extent up to a multiple of N while it is short, of up to 256 as it
    /// grows (N a multiple of 64; 256 attends what llama-bench attends). Every value gives the same
    /// logits.
    #[arg(long = "kv-pad", value_name = "N", default_value_t = compute::model::KV_PAD, value_parser = parse_kv_pad)]
    pub kv_pad: u64,
    /// Flash attention (llama-bench's default: off).
    #[arg(long = "flash-attn", value_enum, default_value_t = FlashAttn::Off)]
    pub flash_attn: FlashAttn,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = BenchOutput::Md)]
    pub output: BenchOutput,
    /// Share of the layers per worker (as `llamactl run`).
    #[arg(long = "tensor-split", value_delimiter = ',', value_name = "W0,W1,...")]
    pub tensor_split: Vec<f64>,
    /// How the model is split across the workers (as `llamactl run`, default `auto`; llama-bench's
    /// `-sm`).
    #[arg(long = "split-mode", visible_alias = "sm", value_enum, env = "LLAMACTL_SPLIT_MODE", default_value_t = crate::master::SplitMode::Auto)]
    pub split_mode: crate::master::SplitMode,
    /// Split mode row: relay the partial sums through llamactl (as `llamactl run`).
    #[arg(long = "no-worker-links")]
    pub no_worker_links: bool,
    /// Trailing layers on the workers (as `llamactl run`; default all).
    #[arg(long = "n-gpu-layers", visible_alias = "ngl", value_name = "N")]
    pub n_gpu_layers: Option<u32>,
    /// Weight writes larger than this many bytes try SET_TENSOR_HASH first (as `llamactl run`).
    #[arg(long = "hash-threshold", default_value_t = DEFAULT_HASH_THRESHOLD, value_name = "BYTES")]
    pub hash_threshold: u64,
    /// Do not use the memo of the model's wire hashes (as `llamactl run`).
    #[arg(long = "no-hash-memo")]
    pub no_hash_memo: bool,
    /// In-process runs: read the weights from the file's mapping (as `llamactl run --mmap`;
    /// llama-bench's `-mmp 1`).
    #[arg(long)]
    pub mmap: bool,
    /// Seed of the random tokens.
    #[arg(long, default_value_t = 1234)]
    pub seed: u32,
    /// Skip the untimed warm-up run of each test.
    #[arg(long = "no-warmup")]
    pub no_warmup: bool,
    /// Instead of a model: the machine's streaming-read memory bandwidth with each `-t` thread
    /// count (a buffer of this many MiB, far larger than the caches, summed `-r` times).
    #[arg(long = "mem-bandwidth", value_name = "MIB", num_args = 0..=1, default_missing_value = "512")]
    pub mem_bandwidth: Option<u64>,
}

/// A command line that parses but asks for something meaningless (`bench -r 0`): exit code 2, as
/// clap's own usage errors, where other errors exit 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

/// `--kv-pad`: a positive multiple of 64 (`compute::model::check_kv_pad`).
fn parse_kv_pad(s: &str) -> Result<u64, String> {
    let n = s.parse::<u64>().map_err(|_| format!("{s:?} is not a positive multiple of 64"))?;
    compute::model::check_kv_pad(n).map_err(|e| e.to_string())?;
    Ok(n)
}

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Rewrites llama.cpp's single-dash long options (`-ngl 99`, `-ts 3,1`) to their `--` forms, which
/// clap cannot express as short options.
pub fn normalize_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let args: Vec<OsString> = args
        .into_iter()
        .map(|a| match a.to_str() {
            Some("-ngl") => OsString::from("--n-gpu-layers"),
            Some("-ts") => OsString::from("--tensor-split"),
            Some("-fa") => OsString::from("--flash-attn"),
            Some("-ub") => OsString::from("--ubatch-size"),
            Some("-sm") => OsString::from("--split-mode"),
            _ => a,
        })
        .collect();
    hoist_server_options(args)
}

/// The options every noun that talks to a daemon takes (`--server`, `--token-file`, `-o`), in
/// their value-taking spellings.
const SERVER_OPTIONS: [&str; 4] = ["--server", "--token-file", "-o", "--output"];

/// `llamactl [--server URL] [--token-file F] [-o table|json] NOUN ...`: clap defines these options
/// on each noun (where `run` and `bench` give `--server` and `-o` their own meaning), so when they
/// come before the noun they are moved right after it. `--opt=value` spellings move as one word.
fn hoist_server_options(args: Vec<OsString>) -> Vec<OsString> {
    let mut lead = Vec::new();
    let mut i = 1;
    while i < args.len() {
        let Some(a) = args[i].to_str() else { break };
        if SERVER_OPTIONS.contains(&a) && i + 1 < args.len() {
            lead.extend_from_slice(&args[i..i + 2]);
            i += 2;
        } else if SERVER_OPTIONS.iter().any(|o| o.starts_with("--") && a.starts_with(&format!("{o}="))) {
            lead.push(args[i].clone());
            i += 1;
        } else if a.starts_with('-') {
            // Another top-level option (-v, --help, --version): keep scanning for the noun.
            i += 1;
        } else {
            break;
        }
    }
    if lead.is_empty() || i >= args.len() {
        return args;
    }
    // args[i] is the noun: everything before it that is not a hoisted option stays in front.
    let mut out: Vec<OsString> = args[..i].iter().filter(|a| !lead.contains(a)).cloned().collect();
    out.push(args[i].clone());
    out.extend(lead);
    out.extend_from_slice(&args[i + 1..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_options_before_the_noun_move_after_it() {
        let norm = |v: &[&str]| -> Vec<String> {
            normalize_args(v.iter().map(OsString::from))
                .into_iter()
                .map(|s| s.into_string().unwrap())
                .collect()
        };
        assert_eq!(
            norm(&["llamactl", "--server", "http://h:1", "-v", "-o", "json", "cache", "ls"]),
            ["llamactl", "-v", "cache", "--server", "http://h:1", "-o", "json", "ls"]
        );
        assert_eq!(
            norm(&["llamactl", "--token-file=/t", "status"]),
            ["llamactl", "status", "--token-file=/t"]
        );
        // Nothing to move, or no noun: unchanged.
        assert_eq!(norm(&["llamactl", "status", "--server", "u"]), ["llamactl", "status", "--server", "u"]);
        assert_eq!(norm(&["llamactl", "--server", "u"]), ["llamactl", "--server", "u"]);
        // The moved options parse as the noun's own.
        let cli = Cli::try_parse_from(normalize_args(
            ["llamactl", "--server", "http://h:1", "run", "-m", "x.gguf", "-p", "hi"]
                .iter()
                .map(OsString::from),
        ))
        .unwrap();
        let Command::Run(a) = cli.command else { panic!("expected run") };
        assert_eq!(a.server.as_deref(), Some("http://h:1"));
    }

    #[test]
    fn llama_cpp_style_options_parse() {
        let argv = ["llamactl", "run", "-m", "x.gguf", "-p", "hi", "-ngl", "7", "-ts", "3,1", "-n", "5"];
        let cli = Cli::try_parse_from(normalize_args(argv.iter().map(OsString::from))).unwrap();
        let Command::Run(a) = cli.command else { panic!("expected run") };
        assert_eq!(a.n_gpu_layers, Some(7));
        assert_eq!(a.tensor_split, vec![3.0, 1.0]);
        assert_eq!(a.n_predict, 5);
        assert_eq!(a.flash_attn, FlashAttn::Auto);
        let bad = ["llamactl", "run", "-m", "x.gguf"];
        assert!(Cli::try_parse_from(bad).is_err(), "a prompt or a file is required");
    }

    #[test]
    fn run_on_a_server_refuses_in_process_only_options() {
        let base = ["llamactl", "run", "--server", "http://h:1", "-m", "x.gguf", "-p", "hi"];
        let parse = |extra: &[&str]| Cli::try_parse_from(base.iter().chain(extra).copied());
        let Command::Run(a) = parse(&["--worker-label", "rack-a", "-c", "64"]).unwrap().command else {
            panic!("expected run")
        };
        assert_eq!(
            (a.server.as_deref(), a.worker_labels, a.ctx_size),
            (Some("http://h:1"), vec!["rack-a".into()], 64)
        );
        for extra in
            [&["-t", "2"][..], &["--ubatch-size", "8"], &["--flash-attn", "off"], &["--chat"], &["-ngl", "3"]]
        {
            let e = parse(
                &normalize_args(extra.iter().map(OsString::from))
                    .iter()
                    .map(|s| s.to_str().unwrap())
                    .collect::<Vec<_>>(),
            )
            .unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{extra:?}");
            assert_eq!(e.exit_code(), 2);
        }
        let lone =
            Cli::try_parse_from(["llamactl", "run", "-m", "x.gguf", "-p", "hi", "--worker-label", "a"]);
        assert!(lone.is_err(), "--worker-label needs --server");
    }

    fn bench(argv: &[&str]) -> Result<BenchArgs, clap::Error> {
        let full = ["llamactl", "bench"].iter().chain(argv).map(OsString::from);
        match Cli::try_parse_from(normalize_args(full))?.command {
            Command::Bench(a) => Ok(a),
            other => panic!("expected bench, got {other:?}"),
        }
    }

    #[test]
    fn bench_defaults_are_llama_bench_s() {
        let a = bench(&["-m", "x.gguf"]).unwrap();
        assert_eq!(a.mem_bandwidth, None);
        assert_eq!((a.n_prompt, a.n_gen, a.repetitions), (vec![512], vec![128], 5));
        assert!(a.threads.is_empty() && a.workers.is_empty());
        assert_eq!((a.flash_attn, a.output, a.ubatch_size), (FlashAttn::Off, BenchOutput::Md, 512));
    }

    #[test]
    fn bench_lists_and_llama_bench_spellings() {
        let a = bench(&[
            "-m",
            "x.gguf",
            "-p",
            "0,64,512",
            "-n",
            "16,128",
            "-r",
            "3",
            "-t",
            "1,2",
            "-o",
            "json",
            "-fa",
            "1",
            "-ub",
            "256",
            "--workers",
            "a:1,b:2",
        ])
        .unwrap();
        assert_eq!(a.n_prompt, vec![0, 64, 512]);
        assert_eq!(a.n_gen, vec![16, 128]);
        assert_eq!(a.repetitions, 3);
        assert_eq!(a.threads, vec![1, 2]);
        assert_eq!(a.output, BenchOutput::Json);
        assert_eq!(a.flash_attn, FlashAttn::On);
        assert_eq!(a.ubatch_size, 256);
        assert_eq!(a.workers, vec!["a:1", "b:2"]);
        assert!(bench(&["-m", "x.gguf", "-o", "xml"]).is_err());
        assert!(bench(&["-m", "x.gguf", "-p", "many"]).is_err());
        assert!(bench(&["-p", "5"]).is_err(), "the model is required");
        let m = bench(&["--mem-bandwidth", "-t", "2"]).unwrap();
        assert_eq!((m.mem_bandwidth, m.model), (Some(512), None));
        assert_eq!(bench(&["--mem-bandwidth", "64"]).unwrap().mem_bandwidth, Some(64));
    }
}
