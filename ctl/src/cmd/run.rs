//! `llamactl run`: prompt → tokens → forward passes (in-process or across workers) → sampled
//! tokens streamed to stdout as text; a llama.cpp-style timing summary on stderr.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use compute::gguf::Gguf;
use compute::model::{Session, SessionConfig};
use compute::sample::{Sampler, SamplerParams, UserSampling};
use compute::tokenizer::chat::{ChatMessage, ChatTemplate};
use compute::tokenizer::Tokenizer;
use compute::GgmlType;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::{FlashAttn, RunArgs};
use crate::master::hash_memo::{FileIdentity, HashMemo};
use crate::master::pipeline::{LoadEvent, Pipeline, SplitOptions};
use crate::master::remote::mib;
use crate::master::tensor_parallel::TensorParallel;
use crate::master::Forward;
use crate::master::SplitMode;

/// Runs `llamactl run`.
pub fn run(args: &RunArgs) -> Result<()> {
    let t_start = Instant::now();
    let path = &args.model;
    if !path.is_file() {
        bail!("model file {} does not exist", path.display());
    }
    // Taken before the mapping, so that the hash memo can tell whether the file moved under it.
    let identity = FileIdentity::of(path).ok();
    let gguf = Arc::new(
        super::open_gguf(path, !args.mmap && args.workers.is_empty())
            .with_context(|| format!("{} is not a readable GGUF file", path.display()))?,
    );
    let text = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("reading the prompt from {}", f.display()))?
        }
        (None, None) => bail!("give a prompt with -p or -f"),
    };
    let user = UserSampling {
        seed: args.seed,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        temp: args.temp,
        penalty_repeat: args.repeat_penalty,
        ..UserSampling::default()
    };
    let params = SamplerParams::resolve(&user, Some(gguf.as_ref())).context("sampler parameters")?;
    let mut sampler = Sampler::new(params);
    // The tokenizer (about 20 ms for SmolLM2's 49k tokens and merges) is built and the prompt encoded on
    // a thread of its own while the model is opened and its weights loaded: a third of a warm load
    // through the workers' caches. A prompt that cannot run is reported once the load is over.
    let (prepared, opened) = std::thread::scope(|s| {
        let prep = s.spawn(|| prepare_prompt(args, &gguf, text));
        let opened = open_forward(args, identity, &gguf);
        let prepared = prep
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("preparing the prompt failed (thread panicked)")));
        (prepared, opened)
    });
    let (tok, prompt) = prepared?;
    if args.ignore_eos {
        sampler.set_logit_bias(tok.eog_tokens().map(|t| (t, f32::NEG_INFINITY)).collect());
    }
    let mut fwd = opened?;
    let load_time = t_start.elapsed();

    // Generation, streaming the text as it is produced.
    let max_new = if args.n_predict < 0 { usize::MAX } else { args.n_predict as usize };
    for &t in &prompt {
        sampler.accept(t);
    }
    let mut out = crate::output::stdout();
    let mut pending: Vec<u8> = Vec::new();
    let t0 = Instant::now();
    let mut next = sampler.sample(fwd.decode(&prompt)?);
    let prompt_time = t0.elapsed();
    let mut n_gen = 0usize;
    let mut eval_time = Duration::ZERO;
    while n_gen < max_new {
        let t = next.context("sampling from empty logits")?;
        sampler.accept(t);
        n_gen += 1;
        if tok.is_eog(t) {
            break;
        }
        // Control tokens are not printed (llama.cpp's default).
        pending.extend_from_slice(tok.decode_token_with(t, false));
        let valid = utf8_prefix(&pending);
        out.write_all(&pending[..valid])?;
        out.flush()?;
        pending.drain(..valid);
        if n_gen == max_new || fwd.n_past() + 1 > args.ctx_size {
            break;
        }
        let t1 = Instant::now();
        let logits = fwd.decode(&[t])?;
        eval_time += t1.elapsed();
        next = sampler.sample(logits);
    }
    out.write_all(&pending)?;
    out.write_all(b"\n")?;
    out.flush()?;
    let n_eval = n_gen.saturating_sub(1);
    print_timings(load_time, prompt.len(), prompt_time, n_eval, eval_time, t_start.elapsed());
    for line in fwd.summary() {
        eprintln!("llamactl: {line}");
    }
    Ok(())
}

/// The tokenizer and the prompt's tokens, checked against the context size.
fn prepare_prompt(args: &RunArgs, gguf: &Gguf, text: String) -> Result<(Tokenizer, Vec<u32>)> {
    let path = &args.model;
    let tok = Tokenizer::from_gguf(gguf).with_context(|| format!("{}: tokenizer", path.display()))?;
    let text = if args.chat {
        let tmpl = ChatTemplate::from_tokenizer(&tok)
            .context("chat template")?
            .with_context(|| format!("{} has no chat template (drop --chat)", path.display()))?;
        tmpl.apply(&[ChatMessage::new("user", &text)], true).context("applying the chat template")?
    } else {
        text
    };
    let prompt = tok.encode(&text, tok.add_bos(), true);
    if prompt.is_empty() {
        bail!("the prompt is empty after tokenization");
    }
    if prompt.len() as u64 >= args.ctx_size {
        bail!(
            "the prompt has {} tokens; the context holds {} (raise --ctx-size)",
            prompt.len(),
            args.ctx_size
        );
    }
    Ok((tok, prompt))
}

/// The model, in-process or loaded onto `--workers` (the hash memo saved after the load).
fn open_forward(
    args: &RunArgs,
    identity: Option<FileIdentity>,
    gguf: &Arc<Gguf>,
) -> Result<Box<dyn Forward>> {
    let path = &args.model;
    let model = super::open_model(path, gguf)?;
    if args.ctx_size > model.hp.n_ctx_train {
        eprintln!(
            "llamactl: warning: --ctx-size {} is beyond the model's training context ({} tokens): quality may \
             degrade past it",
            args.ctx_size, model.hp.n_ctx_train
        );
    }

    let threads =
        args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    let cfg = SessionConfig {
        n_ctx: args.ctx_size,
        n_ubatch: args.ubatch_size.max(1),
        flash_attn: args.flash_attn != FlashAttn::Off,
        kv_type: GgmlType::F16,
        n_threads: threads,
        kv_pad: args.kv_pad,
    };
    let fwd: Box<dyn Forward> = if args.workers.is_empty() {
        Box::new(Session::new(model, cfg)?)
    } else {
        let opts = SplitOptions {
            // Interactive: a worker that hangs is the user's Ctrl-C to end.
            io_timeout: None,
            tensor_split: args.tensor_split.clone(),
            n_gpu_layers: args.n_gpu_layers,
            hash_threshold: args.hash_threshold,
            hash_memo: open_hash_memo(path, identity, gguf, args.no_hash_memo),
            auth: match &args.secret_file {
                Some(p) => {
                    let bytes = std::fs::read(p)
                        .map_err(|e| anyhow::anyhow!("--secret-file {}: {e}", p.display()))?;
                    Some(llamad_proto::auth::AuthKey::from_secret(&bytes).ok_or_else(|| {
                        anyhow::anyhow!(
                            "--secret-file {}: the secret must be at least {} bytes",
                            p.display(),
                            llamad_proto::auth::MIN_SECRET_LEN
                        )
                    })?)
                }
                None => None,
            },
            tls: match &args.tls_ca {
                Some(p) => Some(
                    llamad_proto::TlsClient::from_ca_file(p).map_err(|e| anyhow::anyhow!("--tls-ca: {e}"))?,
                ),
                None => None,
            },
            no_worker_links: args.no_worker_links,
        };
        let memo = opts.hash_memo.clone();
        let show_bars = !args.no_progress && std::io::stderr().is_terminal();
        let progress = LoadProgress::new(show_bars);
        let addrs: Vec<String> =
            args.workers.iter().map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect();
        let mode = match args.split_mode {
            SplitMode::Auto => {
                let c =
                    crate::master::auto_split::choose(&addrs, &opts, model.hp.n_layer, model.weight_bytes())?;
                eprintln!("llamactl: {c}");
                c.mode
            }
            m => m,
        };
        let fwd: Box<dyn Forward> = if mode == SplitMode::Row {
            let tp = TensorParallel::new(&model, cfg, &addrs, &opts, &|i, ev| progress.event(i, ev))?;
            progress.finish();
            eprintln!(
                "llamactl: split mode row over {} worker(s): {}",
                addrs.len(),
                tp.shards()
                    .iter()
                    .zip(tp.kv_bytes())
                    .map(|((a, s), kv)| format!(
                        "{a} [heads {:?} (kv {:?}), ffn {:?}, vocab {:?}, KV cache {}]",
                        s.q_heads,
                        s.kv_heads(),
                        s.ff,
                        s.vocab,
                        mib(kv)
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            Box::new(tp)
        } else {
            let p = Pipeline::new(&model, cfg, &addrs, &opts, &|i, ev| progress.event(i, ev))?;
            progress.finish();
            eprintln!(
                "llamactl: {} layers here, {} on {} worker(s): {}",
                p.local_layers(),
                model.hp.n_layer - p.local_layers(),
                p.workers().len(),
                p.workers()
                    .iter()
                    .map(|w| format!(
                        "{} [{}..{}) KV cache {}",
                        w.addr,
                        w.layers.start,
                        w.layers.end,
                        mib(w.kv_bytes())
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            Box::new(p)
        };
        save_hash_memo(memo.as_deref());
        fwd
    };
    Ok(fwd)
}

/// Length of the longest prefix that is complete UTF-8 (an incomplete trailing sequence waits for
/// the next token; invalid bytes are passed through).
fn utf8_prefix(b: &[u8]) -> usize {
    match std::str::from_utf8(b) {
        Ok(_) => b.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => b.len(),
    }
}

fn print_timings(
    load: Duration,
    n_prompt: usize,
    prompt: Duration,
    n_eval: usize,
    eval: Duration,
    total: Duration,
) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let rate = |n: usize, d: Duration| {
        let per = if n > 0 { ms(d) / n as f64 } else { 0.0 };
        let tps = if d.as_secs_f64() > 0.0 { n as f64 / d.as_secs_f64() } else { 0.0 };
        format!("({per:8.2} ms per token, {tps:8.2} tokens per second)")
    };
    eprintln!();
    eprintln!("llamactl:        load time = {:10.2} ms", ms(load));
    eprintln!(
        "llamactl: prompt eval time = {:10.2} ms / {n_prompt:5} tokens {}",
        ms(prompt),
        rate(n_prompt, prompt)
    );
    eprintln!("llamactl:        eval time = {:10.2} ms / {n_eval:5} runs   {}", ms(eval), rate(n_eval, eval));
    eprintln!("llamactl:       total time = {:10.2} ms / {:5} tokens", ms(total), n_prompt + n_eval);
}

/// The hash memo of the model at `path` (`$XDG_CACHE_HOME/llamad/hash-memo`), unless `--no-hash-memo`
/// or it cannot be trusted for this run (see [`HashMemo::open`]). `before` is the model file's identity
/// taken before it was mapped.
pub(crate) fn open_hash_memo(
    path: &Path,
    before: Option<FileIdentity>,
    gguf: &Arc<Gguf>,
    disabled: bool,
) -> Option<Arc<HashMemo>> {
    if disabled {
        return None;
    }
    let Some(dir) = dirs::cache_dir() else {
        tracing::info!("no cache directory (neither $XDG_CACHE_HOME nor $HOME): hash memo not used");
        return None;
    };
    HashMemo::open(&dir.join("llamad").join("hash-memo"), path, before?, gguf.clone()).map(Arc::new)
}

/// Writes the hash memo back after a load (a failure only costs the next load a hashing pass).
pub(crate) fn save_hash_memo(memo: Option<&HashMemo>) {
    let Some(m) = memo else { return };
    let (loaded, hits, added) = m.counts();
    tracing::debug!(memo = %m.path().display(), loaded, hits, added, "hash memo after the load");
    if let Err(e) = m.save() {
        tracing::info!(memo = %m.path().display(), error = %e, "cannot save the hash memo");
    }
}

/// Per-worker load progress: indicatif bars on a terminal, plain log lines otherwise.
struct LoadProgress {
    bars: Option<(MultiProgress, Mutex<HashMap<usize, ProgressBar>>)>,
    started: Mutex<HashMap<usize, (String, Instant)>>,
    /// Summaries printed once the bars are gone.
    done: Mutex<Vec<String>>,
}

impl LoadProgress {
    fn new(show: bool) -> LoadProgress {
        let bars = show.then(|| {
            (MultiProgress::with_draw_target(ProgressDrawTarget::stderr()), Mutex::new(HashMap::new()))
        });
        LoadProgress { bars, started: Mutex::new(HashMap::new()), done: Mutex::new(Vec::new()) }
    }

    fn event(&self, i: usize, ev: LoadEvent<'_>) {
        match ev {
            LoadEvent::Start { addr, layers, total } => {
                let label = format!("{addr} layers {}..{}", layers.start, layers.end);
                if let Ok(mut s) = self.started.lock() {
                    s.insert(i, (label.clone(), Instant::now()));
                }
                match &self.bars {
                    Some((mp, map)) => {
                        let pb = mp.add(ProgressBar::new(total));
                        let style = ProgressStyle::with_template(
                            "{prefix:>32} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
                        )
                        .map(|s| s.progress_chars("=> "))
                        .unwrap_or_else(|_| ProgressStyle::default_bar());
                        pb.set_style(style);
                        pb.set_prefix(label);
                        if let Ok(mut m) = map.lock() {
                            m.insert(i, pb);
                        }
                    }
                    None => eprintln!("llamactl: loading {} of weights to {label}", mib(total)),
                }
            }
            LoadEvent::Progress(b) => {
                if let Some((_, map)) = &self.bars {
                    if let Some(pb) = map.lock().ok().and_then(|m| m.get(&i).cloned()) {
                        pb.inc(b);
                    }
                }
            }
            LoadEvent::Done(stats) => {
                let (label, t) = self
                    .started
                    .lock()
                    .ok()
                    .and_then(|s| s.get(&i).cloned())
                    .unwrap_or_else(|| (format!("worker {i}"), Instant::now()));
                let msg = format!(
                    "{label}: {} tensors in {} writes, {} sent, {} from the worker's cache, {:.2} s",
                    stats.tensors,
                    stats.writes,
                    mib(stats.bytes_sent),
                    mib(stats.bytes_cached),
                    t.elapsed().as_secs_f64()
                );
                match &self.bars {
                    Some((_, map)) => {
                        if let Some(pb) = map.lock().ok().and_then(|m| m.get(&i).cloned()) {
                            pb.finish();
                        }
                        if let Ok(mut d) = self.done.lock() {
                            d.push(msg);
                        }
                    }
                    None => eprintln!("llamactl: loaded {msg}"),
                }
            }
        }
    }

    fn finish(&self) {
        if let Some((mp, _)) = &self.bars {
            let _ = mp.clear();
            for msg in self.done.lock().map(|d| d.clone()).unwrap_or_default() {
                eprintln!("llamactl: loaded {msg}");
            }
        }
    }
}
