//! `llamactl run --server URL`: the run submitted as a job to a llamad's admin API (`POST /v1/jobs`),
//! its tokens streamed back over the job's event stream (SSE) to stdout as `llamactl run` prints them
//! in-process, and a summary on stderr. The daemon reads the model from its own disk and runs it
//! in-process or as the master of `--workers` (addresses or registry labels) and `--worker-label`s.
//! Ctrl-C cancels the job (it stops after its current token, the stream ends and llamactl exits 1);
//! a second Ctrl-C exits at once (130), leaving the job to its cancellation.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Context, Result};
use llamad_api::{Job, JobCreated, JobState, JobSubmit, Sampling};

use crate::cli::RunArgs;
use crate::client::{self, segment, Client};
use crate::cmd::jobs::follow;
use crate::master::SplitMode;

/// The job request `args` describe (the prompt read from `-f` here, the model path as the daemon
/// will see it: absolute when the file exists on this machine, else as given).
pub fn request(args: &RunArgs) -> Result<JobSubmit> {
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("reading the prompt from {}", f.display()))?
        }
        (None, None) => bail!("give a prompt with -p or -f"),
    };
    let model = match std::fs::canonicalize(&args.model) {
        Ok(p) => p,
        Err(_) => args.model.clone(),
    };
    let model = model
        .to_str()
        .map(str::to_string)
        .with_context(|| format!("model path {} is not UTF-8", Path::new(&args.model).display()))?;
    // -1 (until the end of generation) is bounded by the context, as in-process.
    let n_predict = if args.n_predict < 0 { args.ctx_size } else { args.n_predict as u64 };
    let n_predict = u32::try_from(n_predict).unwrap_or(u32::MAX).max(1);
    let n_ctx = u32::try_from(args.ctx_size).context("--ctx-size is too large for a job")?;
    let mut workers: Vec<String> =
        args.workers.iter().map(|w| w.trim().to_string()).filter(|w| !w.is_empty()).collect();
    workers.extend(args.worker_labels.iter().cloned());
    Ok(JobSubmit {
        model,
        prompt,
        n_predict,
        n_ctx: Some(n_ctx),
        sampling: Sampling {
            seed: args.seed,
            temp: args.temp,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            repeat_penalty: args.repeat_penalty,
            repeat_last_n: None,
        },
        workers,
        split_mode: match args.split_mode {
            SplitMode::Layer => llamad_api::SplitMode::Layer,
            SplitMode::Row => llamad_api::SplitMode::Row,
            SplitMode::Auto => llamad_api::SplitMode::Auto,
        },
        hash_threshold: Some(args.hash_threshold),
    })
}

/// Submits the job to `server` and streams its text to stdout; an error when the job does not end
/// `done` (its message names the failing worker).
pub fn run(args: &RunArgs, server: &str) -> Result<()> {
    let req = request(args)?;
    let token = client::read_token(args.token_file.as_deref())?;
    let c = Client::new(server, token.clone());
    let created: JobCreated = c.post("/v1/jobs", &req)?;
    eprintln!("llamactl: job {} submitted to {server}", created.id);
    cancel_on_interrupt(server, token, &created.id);
    let mut out = crate::output::stdout();
    let Some(job) = follow(&c, &created.id, false, &mut out)? else {
        bail!("the event stream of job {} ended before the job did (did the daemon stop?)", created.id);
    };
    out.flush()?;
    eprintln!();
    for w in &job.workers {
        eprintln!(
            "llamactl: worker {}: {}, {} sent, {} from its cache",
            w.address,
            w.holds,
            crate::output::size(w.bytes_sent),
            crate::output::size(w.bytes_cached)
        );
    }
    let tps = job.tokens_per_sec.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into());
    eprintln!(
        "llamactl: job {} {}: {} prompt tokens, {} generated, {tps} tokens per second",
        job.id, job.state, job.prompt_tokens, job.generated_tokens
    );
    match job.state {
        JobState::Done => Ok(()),
        state => match job.error {
            Some(e) => bail!("job {} {state} ({}): {}", job.id, e.code, e.message),
            None => bail!("job {} {state}", job.id),
        },
    }
}

/// Installs the Ctrl-C handler of a followed job: the first press asks the server to cancel it, the
/// second exits at once.
fn cancel_on_interrupt(server: &str, token: Option<String>, id: &str) {
    let (server, id) = (server.to_string(), id.to_string());
    let pressed = AtomicBool::new(false);
    let r = ctrlc::set_handler(move || {
        if pressed.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!("\nllamactl: cancelling job {id} (Ctrl-C again to quit at once)");
        let c = Client::new(&server, token.clone());
        if let Err(e) = c.post_empty::<Job>(&format!("/v1/jobs/{}/cancel", segment(&id))) {
            eprintln!("llamactl: cancelling job {id}: {e:#}");
        }
    });
    if let Err(e) = r {
        tracing::warn!(error = %e, "cannot install the Ctrl-C handler; Ctrl-C will not cancel the job");
    }
}
