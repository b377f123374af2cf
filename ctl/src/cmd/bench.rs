//! `llamactl bench`: prompt-processing and generation throughput in the manner of llama.cpp's
//! `llama-bench`, through the same engine as `llamactl run` (in-process [`Session`] or the RPC
//! [`Pipeline`] over `--workers`).
//!
//! Tests: for every `-p N` (N > 0) a `ppN` test decodes one batch of N random prompt tokens from an
//! empty cache; for every `-n N` (N > 0) a `tgN` test decodes N random tokens one at a time from
//! an empty cache (no sampling, as llama-bench). Each test runs once untimed (warm-up: the graph is
//! built, buffers grow), then `-r` timed repetitions, each after clearing the KV cache. A
//! repetition's speed is `tokens / seconds`; the report gives their mean and sample standard
//! deviation (`avg_ts`, `stddev_ts`) as llama-bench does.
//!
//! The context holds `max(256, pad256(p + n))` cells for the largest test, as llama-bench's does.
//! The attended extent `Nkv` of a step is the used cells rounded up to `--kv-pad` (256 by default,
//! what llama-bench attends, see `compute::model::KV_PAD`); `--kv-pad 64` gives the same logits and
//! attends fewer empty cells while the cache is short.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use compute::gguf::Gguf;
use compute::model::{Model, Session, SessionConfig};
use compute::quant::active_isa;
use compute::sample::Mt19937;
use compute::GgmlType;
use serde_json::{json, Value};

use crate::cli::{BenchArgs, BenchOutput, FlashAttn};
use crate::master::hash_memo::FileIdentity;
use crate::master::pipeline::SplitOptions;
use crate::master::{Forward, SplitMode};

/// One test: a prompt batch (`n_gen == 0`) or a generation run (`n_prompt == 0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Test {
    /// Prompt tokens decoded as one batch (split into ubatches of `--ubatch-size`).
    pub n_prompt: u64,
    /// Tokens generated one at a time.
    pub n_gen: u64,
    /// Tokens already in the KV cache when the timed part starts (llama-bench's `-d`).
    pub n_depth: u64,
}

impl Test {
    /// llama-bench's name: `pp512`, `tg128`.
    /// llama-bench's name: `pp512`, `tg128`, `tg128 @ d4096`.
    pub fn name(&self) -> String {
        let base = match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, n) => format!("tg{n}"),
            (p, n) => format!("pp{p}+tg{n}"),
        };
        match self.n_depth {
            0 => base,
            d => format!("{base} @ d{d}"),
        }
    }

    /// The timed tokens (the depth is decoded before the clock starts).
    fn tokens(&self) -> u64 {
        self.n_prompt + self.n_gen
    }

    /// KV cells the test fills.
    fn cells(&self) -> u64 {
        self.n_depth + self.tokens()
    }
}

/// The tests of `-p`, `-n` and `-d` lists, in llama-bench's order (per depth, prompt tests first);
/// zero prompt and generation sizes are skipped.
pub fn tests_of(n_prompt: &[u64], n_gen: &[u64], n_depth: &[u64]) -> Vec<Test> {
    let depths: &[u64] = if n_depth.is_empty() { &[0] } else { n_depth };
    let mut tests = Vec::new();
    for &d in depths {
        let pp = n_prompt.iter().filter(|&&p| p > 0).map(|&p| Test { n_prompt: p, n_gen: 0, n_depth: d });
        let tg = n_gen.iter().filter(|&&n| n > 0).map(|&n| Test { n_prompt: 0, n_gen: n, n_depth: d });
        tests.extend(pp.chain(tg));
    }
    tests
}

/// KV cells for a set of tests: `max(256, pad256(largest d + p + n))`.
pub fn ctx_for(tests: &[Test]) -> u64 {
    let most = tests.iter().map(Test::cells).max().unwrap_or(1);
    most.div_ceil(256).max(1) * 256
}

/// Mean and sample standard deviation (n − 1 in the denominator; 0 for fewer than two values).
pub fn mean_stddev(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// What describes the model in every result row.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    /// File name.
    pub filename: String,
    /// Architecture name (`llama`).
    pub arch: String,
    /// The weight type holding the most bytes (`Q4_1`).
    pub wtype: String,
    /// Bytes of all tensors.
    pub size: u64,
    /// Elements of all tensors.
    pub n_params: u64,
    /// Weight bytes a generated token reads: every tensor, except the token embedding when the
    /// model has a separate `output.weight` (then only one embedding row is read).
    pub bytes_per_token: u64,
}

impl ModelInfo {
    fn of(path: &Path, gguf: &Gguf, model: &Model) -> ModelInfo {
        let mut by_type: Vec<(GgmlType, u64)> = Vec::new();
        let (mut size, mut n_params) = (0u64, 0u64);
        for t in gguf.tensors() {
            size += t.size;
            n_params += t.layout.nelements().unwrap_or(0);
            match by_type.iter_mut().find(|(d, _)| *d == t.dtype()) {
                Some((_, b)) => *b += t.size,
                None => by_type.push((t.dtype(), t.size)),
            }
        }
        let embd = gguf.tensor_info("token_embd.weight").map_or(0, |t| t.size);
        let untied = gguf.tensor_info("output.weight").is_some();
        let bytes_per_token = if untied { size - embd } else { size };
        let wtype = by_type
            .iter()
            .max_by_key(|(_, b)| *b)
            .map_or_else(|| "?".to_string(), |(d, _)| d.name().to_uppercase());
        ModelInfo {
            filename: path.file_name().map_or_else(String::new, |f| f.to_string_lossy().into_owned()),
            arch: model.hp.arch.name().to_string(),
            wtype,
            size,
            n_params,
            bytes_per_token,
        }
    }

    /// `llama 134.52M Q4_1`.
    pub fn model_type(&self) -> String {
        format!("{} {} {}", self.arch, human_count(self.n_params), self.wtype)
    }
}

fn human_count(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2}B", n / 1e9)
    } else {
        format!("{:.2}M", n / 1e6)
    }
}

/// The settings of one row of results.
#[derive(Clone, Debug, PartialEq)]
pub struct RunInfo {
    /// Local executor threads.
    pub threads: usize,
    /// RPC workers (empty = in-process).
    pub workers: Vec<String>,
    /// Largest ubatch.
    pub n_ubatch: u64,
    /// Flash attention.
    pub flash_attn: bool,
    /// `layer` or `row` (with workers).
    pub split_mode: &'static str,
}

/// One measured test.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchResult {
    /// The model.
    pub model: ModelInfo,
    /// The settings.
    pub run: RunInfo,
    /// The test.
    pub test: Test,
    /// Wall time of each repetition, in nanoseconds.
    pub samples_ns: Vec<u64>,
}

impl BenchResult {
    /// Tokens per second of each repetition.
    pub fn samples_ts(&self) -> Vec<f64> {
        let n = self.test.tokens() as f64;
        self.samples_ns.iter().map(|&ns| if ns == 0 { 0.0 } else { n * 1e9 / ns as f64 }).collect()
    }

    /// Mean and standard deviation of the tokens per second.
    pub fn ts(&self) -> (f64, f64) {
        mean_stddev(&self.samples_ts())
    }

    /// The JSON object of this result (llama-bench's field names where one exists).
    pub fn to_json(&self) -> Value {
        let ns: Vec<f64> = self.samples_ns.iter().map(|&x| x as f64).collect();
        let (avg_ns, stddev_ns) = mean_stddev(&ns);
        let (avg_ts, stddev_ts) = self.ts();
        let backend = if self.run.workers.is_empty() { "CPU" } else { "RPC" };
        json!({
            "build": env!("CARGO_PKG_VERSION"),
            "kernels": active_isa(),
            "numerics": compute::numerics::active().name(),
            "model": self.model.filename,
            "model_filename": self.model.filename,
            "model_type": self.model.model_type(),
            "type": self.model.wtype,
            "model_size": self.model.size,
            "model_n_params": self.model.n_params,
            "model_bytes_per_token": self.model.bytes_per_token,
            "backend": backend,
            "workers": self.run.workers,
            "threads": self.run.threads,
            "n_threads": self.run.threads,
            "n_ubatch": self.run.n_ubatch,
            "split_mode": self.run.split_mode,
            "flash_attn": self.run.flash_attn,
            "type_k": "f16",
            "type_v": "f16",
            "test": self.test.name(),
            "n_prompt": self.test.n_prompt,
            "n_gen": self.test.n_gen,
            "n_depth": self.test.n_depth,
            "avg_ns": avg_ns.round() as u64,
            "stddev_ns": stddev_ns.round() as u64,
            "avg_ts": avg_ts,
            "stddev_ts": stddev_ts,
            "samples_ns": self.samples_ns,
            "samples_ts": self.samples_ts(),
        })
    }
}

/// Markdown columns: name, width, right-aligned.
const MD_COLS: [(&str, usize, bool); 7] = [
    ("model", 30, false),
    ("size", 10, true),
    ("params", 10, true),
    ("backend", 10, false),
    ("threads", 7, true),
    ("test", 13, true),
    ("t/s", 20, true),
];

/// The markdown table header and separator (llama-bench's columns).
pub fn md_header() -> String {
    let names: Vec<String> = MD_COLS
        .iter()
        .map(|&(n, w, right)| if right { format!(" {n:>w$} ") } else { format!(" {n:<w$} ") })
        .collect();
    let rule: Vec<String> = MD_COLS
        .iter()
        .map(
            |&(_, w, right)| {
                if right {
                    format!(" {}: ", "-".repeat(w - 1))
                } else {
                    format!(" {} ", "-".repeat(w))
                }
            },
        )
        .collect();
    format!("|{}|\n|{}|", names.join("|"), rule.join("|"))
}

/// One markdown row.
pub fn md_row(r: &BenchResult) -> String {
    let (avg, sd) = r.ts();
    let backend =
        if r.run.workers.is_empty() { "CPU".to_string() } else { format!("RPC x{}", r.run.workers.len()) };
    format!(
        "| {:<30} | {:>10} | {:>10} | {:<10} | {:>7} | {:>13} | {:>20} |",
        r.model.model_type(),
        format!("{:.2} MiB", r.model.size as f64 / (1024.0 * 1024.0)),
        human_count(r.model.n_params),
        backend,
        r.run.threads,
        r.test.name(),
        format!("{avg:.2} ± {sd:.2}")
    )
}

/// Runs one test `reps` times (after a warm-up unless `warmup` is false); returns the wall time
/// of each repetition in nanoseconds.
pub fn measure(
    fwd: &mut dyn Forward,
    test: Test,
    reps: usize,
    n_vocab: u64,
    rng: &mut Mt19937,
    warmup: bool,
) -> Result<Vec<u64>> {
    let token = |rng: &mut Mt19937| (u64::from(rng.next_u32()) % n_vocab) as u32;
    // The untimed prefix of a test at depth, decoded in ubatches like any prompt.
    let fill = |fwd: &mut dyn Forward, rng: &mut Mt19937| -> Result<()> {
        if test.n_depth > 0 {
            let prefix: Vec<u32> = (0..test.n_depth).map(|_| token(rng)).collect();
            fwd.decode(&prefix).context("filling the KV cache to the test's depth")?;
        }
        Ok(())
    };
    if warmup {
        fwd.clear()?;
        if test.n_prompt > 0 {
            let batch: Vec<u32> = (0..test.n_prompt).map(|_| token(rng)).collect();
            fwd.decode(&batch).context("warm-up")?;
        }
        if test.n_gen > 0 {
            fwd.decode(&[token(rng)]).context("warm-up")?;
        }
    }
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        fwd.clear()?;
        fill(fwd, rng)?;
        let batch: Vec<u32> = (0..test.n_prompt).map(|_| token(rng)).collect();
        let gen: Vec<u32> = (0..test.n_gen).map(|_| token(rng)).collect();
        let t0 = Instant::now();
        if !batch.is_empty() {
            fwd.decode(&batch)?;
        }
        for &t in &gen {
            fwd.decode(&[t])?;
        }
        samples.push(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
    Ok(samples)
}

/// Runs `llamactl bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    if let Some(mib) = args.mem_bandwidth {
        return run_mem_bandwidth(args, mib);
    }
    let usage = |msg: &str| anyhow::Error::new(crate::cli::UsageError(msg.to_string()));
    let Some(path) = &args.model else { return Err(usage("give a model with -m (or --mem-bandwidth)")) };
    let tests = tests_of(&args.n_prompt, &args.n_gen, &args.n_depth);
    if tests.is_empty() {
        return Err(usage("nothing to measure: every -p and -n value is 0"));
    }
    if args.repetitions == 0 {
        return Err(usage("-r must be at least 1"));
    }
    let threads = if args.threads.is_empty() {
        vec![std::thread::available_parallelism().map_or(1, |n| n.get())]
    } else {
        args.threads.clone()
    };
    if threads.contains(&0) {
        return Err(usage("-t values must be at least 1"));
    }
    if !path.is_file() {
        bail!("model file {} does not exist", path.display());
    }
    let workers: Vec<String> =
        args.workers.iter().map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect();
    let identity = FileIdentity::of(path).ok();
    let gguf = Arc::new(
        super::open_gguf(path, !args.mmap && workers.is_empty())
            .with_context(|| format!("{} is not a readable GGUF file", path.display()))?,
    );
    let model = super::open_model(path, &gguf)?;
    let info = ModelInfo::of(path, &gguf, &model);
    let n_ctx = ctx_for(&tests);
    let flash_attn = args.flash_attn == FlashAttn::On;
    let mut out = crate::output::stdout();
    if args.output == BenchOutput::Md {
        writeln!(out, "{}", md_header())?;
        out.flush()?;
    }
    let mut rng = Mt19937::new(args.seed);
    let mut results = Vec::new();
    let memo = if workers.is_empty() {
        None
    } else {
        super::run::open_hash_memo(path, identity, &gguf, args.no_hash_memo)
    };
    for &nt in &threads {
        let cfg = SessionConfig {
            n_ctx,
            n_ubatch: args.ubatch_size.max(1),
            flash_attn,
            kv_type: GgmlType::F16,
            n_threads: nt,
            kv_pad: args.kv_pad,
        };
        // Auto resolves to the mode measured when the workers connect.
        let mut mode = args.split_mode;
        let mut fwd: Box<dyn Forward> = if workers.is_empty() {
            Box::new(Session::new(model.clone(), cfg.clone())?)
        } else {
            let opts = SplitOptions {
                // Interactive: a worker that hangs is the user's Ctrl-C to end.
                io_timeout: None,
                tensor_split: args.tensor_split.clone(),
                n_gpu_layers: args.n_gpu_layers,
                hash_threshold: args.hash_threshold,
                hash_memo: memo.clone(),
                auth: None,
                tls: None,
                no_worker_links: args.no_worker_links,
            };
            if args.split_mode == SplitMode::Auto {
                let c = crate::master::auto_split::choose(
                    &workers,
                    &opts,
                    model.hp.n_layer,
                    model.weight_bytes(),
                )?;
                eprintln!("llamactl: {c}");
                mode = c.mode;
            }
            let f = crate::master::open_workers(&model, cfg.clone(), &workers, &opts, mode, &|_, _| {})?;
            super::run::save_hash_memo(memo.as_deref());
            f
        };
        let split_mode = match mode {
            SplitMode::Auto | SplitMode::Layer => "layer",
            SplitMode::Row => "row",
        };
        let run =
            RunInfo { threads: nt, workers: workers.clone(), n_ubatch: cfg.n_ubatch, flash_attn, split_mode };
        for &test in &tests {
            tracing::info!(test = %test.name(), threads = nt, "measuring");
            let samples =
                measure(fwd.as_mut(), test, args.repetitions, model.hp.n_vocab, &mut rng, !args.no_warmup)
                    .with_context(|| format!("test {}", test.name()))?;
            let r = BenchResult { model: info.clone(), run: run.clone(), test, samples_ns: samples };
            if args.output == BenchOutput::Md {
                writeln!(out, "{}", md_row(&r))?;
                out.flush()?;
            }
            results.push(r);
        }
    }
    if args.output == BenchOutput::Json {
        let arr = Value::Array(results.iter().map(BenchResult::to_json).collect());
        writeln!(out, "{}", serde_json::to_string_pretty(&arr)?)?;
    }
    out.flush()?;
    Ok(())
}

/// `--mem-bandwidth`: streaming-read bandwidth per thread count.
fn run_mem_bandwidth(args: &BenchArgs, mib: u64) -> Result<()> {
    let threads = if args.threads.is_empty() {
        vec![std::thread::available_parallelism().map_or(1, |n| n.get())]
    } else {
        args.threads.clone()
    };
    let words = usize::try_from(mib.max(1) * (1 << 20) / 8).context("buffer size")?;
    let mut buf: Vec<u64> = Vec::new();
    buf.try_reserve_exact(words).with_context(|| format!("cannot allocate {mib} MiB"))?;
    // Written once, so every page is backed before the timed reads.
    buf.extend((0..words as u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    let bytes = (words * 8) as u64;
    let mut rows = Vec::new();
    let mut out = crate::output::stdout();
    for &nt in &threads {
        let nt = nt.max(1);
        read_all(&buf, nt); // warm-up
        let samples: Vec<f64> = (0..args.repetitions.max(1))
            .map(|_| {
                let t0 = Instant::now();
                std::hint::black_box(read_all(&buf, nt));
                bytes as f64 / t0.elapsed().as_secs_f64() / 1e9
            })
            .collect();
        let (avg, sd) = mean_stddev(&samples);
        if args.output == BenchOutput::Md {
            writeln!(
                out,
                "memory bandwidth, streaming read of {mib} MiB, {nt} thread(s): {avg:.2} ± {sd:.2} GB/s"
            )?;
        }
        rows.push(json!({
            "test": "mem_read",
            "n_threads": nt,
            "threads": nt,
            "bytes": bytes,
            "avg_gbps": avg,
            "stddev_gbps": sd,
            "max_gbps": samples.iter().copied().fold(0.0, f64::max),
            "samples_gbps": samples,
        }));
    }
    if args.output == BenchOutput::Json {
        writeln!(out, "{}", serde_json::to_string_pretty(&Value::Array(rows))?)?;
    }
    Ok(())
}

/// Sums `buf` on `nt` threads, each streaming through one contiguous part with eight
/// independent accumulators (so the loads, not the adds, are the limit).
fn read_all(buf: &[u64], nt: usize) -> u64 {
    let part = buf.len().div_ceil(nt).max(1);
    std::thread::scope(|s| {
        let hs: Vec<_> = buf
            .chunks(part)
            .map(|c| {
                s.spawn(move || {
                    let mut acc = [0u64; 8];
                    let mut it = c.chunks_exact(8);
                    for ch in &mut it {
                        for (a, x) in acc.iter_mut().zip(ch) {
                            *a = a.wrapping_add(*x);
                        }
                    }
                    let tail: u64 = it.remainder().iter().fold(0, |a, x| a.wrapping_add(*x));
                    acc.iter().fold(tail, |a, x| a.wrapping_add(*x))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or(0)).fold(0, u64::wrapping_add)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_all_sums_every_word_once_for_any_thread_count() {
        let v: Vec<u64> = (1..=1001).collect();
        for nt in [1, 2, 3, 7] {
            assert_eq!(read_all(&v, nt), 1001 * 1002 / 2, "{nt} threads");
        }
    }

    #[test]
    fn tests_in_llama_bench_order_without_zeros() {
        let t = tests_of(&[512, 0, 64], &[128, 0], &[0]);
        let names: Vec<String> = t.iter().map(Test::name).collect();
        assert_eq!(names, ["pp512", "pp64", "tg128"]);
        assert!(tests_of(&[0], &[0], &[0, 512]).is_empty());
        let t = tests_of(&[64], &[16], &[0, 4096]);
        let names: Vec<String> = t.iter().map(Test::name).collect();
        assert_eq!(names, ["pp64", "tg16", "pp64 @ d4096", "tg16 @ d4096"]);
    }

    #[test]
    fn context_is_padded_to_256() {
        assert_eq!(ctx_for(&tests_of(&[512], &[128], &[0])), 512);
        assert_eq!(ctx_for(&tests_of(&[0], &[16], &[0])), 256);
        assert_eq!(ctx_for(&tests_of(&[600], &[0], &[0])), 768);
        // The depth is in the cache too: 4096 + 16 cells.
        assert_eq!(ctx_for(&tests_of(&[0], &[16], &[4096])), 4352);
    }

    #[test]
    fn mean_and_sample_stddev_by_hand() {
        // 2, 4, 4, 4, 5, 5, 7, 9: mean 5, Σ(x−5)² = 32, sample variance 32/7.
        let (m, s) = mean_stddev(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(m, 5.0);
        assert!((s - (32.0f64 / 7.0).sqrt()).abs() < 1e-12, "{s}");
        assert_eq!(mean_stddev(&[3.0]), (3.0, 0.0));
    }

    fn sample() -> BenchResult {
        BenchResult {
            model: ModelInfo {
                filename: "m.gguf".into(),
                arch: "llama".into(),
                wtype: "Q4_1".into(),
                size: 3 << 20,
                n_params: 134_515_008,
                bytes_per_token: 3 << 20,
            },
            run: RunInfo {
                threads: 2,
                workers: vec!["a:1".into(), "b:2".into()],
                n_ubatch: 512,
                flash_attn: false,
                split_mode: "layer",
            },
            test: Test { n_prompt: 0, n_gen: 100, n_depth: 0 },
            // 100 tokens in 1 s and in 0.5 s: 100 and 200 t/s.
            samples_ns: vec![1_000_000_000, 500_000_000],
        }
    }

    #[test]
    fn json_object_has_llama_bench_fields() {
        let v = sample().to_json();
        assert_eq!(v["n_prompt"], 0);
        assert_eq!(v["n_gen"], 100);
        assert_eq!(v["avg_ts"], 150.0);
        let sd = v["stddev_ts"].as_f64().unwrap();
        assert!((sd - 50.0 * 2f64.sqrt()).abs() < 1e-9, "{sd}");
        assert_eq!(v["avg_ns"], 750_000_000u64);
        assert_eq!(v["model"], "m.gguf");
        assert_eq!(v["type"], "Q4_1");
        assert_eq!(v["threads"], 2);
        assert_eq!(v["workers"], json!(["a:1", "b:2"]));
        assert_eq!(v["backend"], "RPC");
        assert_eq!(v["test"], "tg100");
        assert_eq!(v["samples_ts"], json!([100.0, 200.0]));
    }

    #[test]
    fn markdown_row_lines_up_with_the_header() {
        let h = md_header();
        let row = md_row(&sample());
        let widths = |s: &str| s.split('|').map(|c| c.chars().count()).collect::<Vec<_>>();
        for line in h.lines() {
            assert_eq!(widths(line), widths(&row), "{line}\n{row}");
        }
        assert!(row.contains("150.00 ± 70.71"), "{row}");
        assert!(row.contains("llama 134.52M Q4_1") && row.contains("RPC x2"), "{row}");
    }
}
