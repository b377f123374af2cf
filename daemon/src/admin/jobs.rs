//! Jobs: text generation requests run one at a time, in submission order, either in-process
//! (`compute::model::Session`) or, when the job names workers, as an RPC master over them through
//! `llamad-master` (layer or row split, the same engine as `llamactl run --workers`). Workers are
//! named by address or by label of the worker registry and resolved when the job is submitted.
//! Each job is persisted as `jobs/<id>.json` at every state change (and every [`PERSIST_EVERY`]
//! tokens); at start-up a job found `running` becomes `interrupted` and a `queued` one is queued
//! again. Live output goes to subscribers through a broadcast channel (the SSE route).
//!
//! A worker that is unreachable, refuses the model or dies while the job runs fails the job with
//! `worker-failed` and a message naming it (a closed connection is an error, never a wait).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use compute::gguf::Gguf;
use compute::model::{Model, Session, SessionConfig};
use compute::sample::{Sampler, SamplerParams, UserSampling};
use compute::tokenizer::Tokenizer;
use llamad_api::{
    code, ErrorBody, Job, JobCreated, JobEvent, JobState, JobSubmit, JobSummary, JobWorker, SplitMode,
};
use llamad_master::pipeline::{LoadEvent, Pipeline, SplitOptions};
use llamad_master::tensor_parallel::TensorParallel;
use llamad_master::Forward;
use rand::RngCore;
use tokio::sync::{broadcast, mpsc};
use tracing::{info, warn};

use crate::admin::error::{ApiError, ApiResult};
use crate::admin::metrics::Metrics;
use crate::admin::now_ms;
use crate::admin::workers::{write_json_atomic, Registry};
use crate::error::{Error, Result};

/// A running job is written to disk after this many new tokens.
pub const PERSIST_EVERY: u64 = 64;
/// Events buffered per subscriber before it lags.
const EVENT_CAPACITY: usize = 4096;
/// Default of [`JobSubmit::hash_threshold`] (llamactl's `--hash-threshold`).
pub const DEFAULT_HASH_THRESHOLD: u64 = llamad_master::upload::DEFAULT_HASH_THRESHOLD;

struct Entry {
    job: Job,
    cancel: Arc<AtomicBool>,
    /// Tokens generated in this process: `(id, text)`, replayed to late subscribers.
    tokens: Vec<(u32, String)>,
    events: broadcast::Sender<JobEvent>,
}

impl Entry {
    fn new(job: Job) -> Entry {
        Entry {
            job,
            cancel: Arc::new(AtomicBool::new(false)),
            tokens: Vec::new(),
            events: broadcast::channel(EVENT_CAPACITY).0,
        }
    }

    fn set_state(&mut self, state: JobState) {
        self.job.state = state;
        if state.is_final() {
            self.job.finished_ms = Some(now_ms());
            if state == JobState::Done {
                self.job.progress = 1.0;
            }
        }
        let _ = self.events.send(JobEvent::State { state });
        if state.is_final() {
            let _ = self.events.send(JobEvent::End { job: Box::new(self.job.clone()) });
        }
    }
}

struct Inner {
    dir: PathBuf,
    threads: usize,
    /// Shared secret for workers that ask for authentication (the daemon's `server.secret_file`).
    auth: Option<llamad_proto::auth::AuthKey>,
    /// Longest silence of a job's worker (`admin.job_io_timeout_secs`).
    io_timeout: Option<Duration>,
    metrics: Arc<Metrics>,
    table: Mutex<BTreeMap<String, Entry>>,
    stopping: AtomicBool,
}

impl Inner {
    fn persist(&self, job: &Job) {
        let path = self.dir.join(format!("{}.json", job.id));
        if let Err(e) = write_json_atomic(&path, job) {
            warn!(path = %path.display(), error = %e, "persisting job");
        }
    }

    /// Runs `f` on the entry `id` under the table lock; persists the job when `f` returns true.
    fn update<R>(&self, id: &str, f: impl FnOnce(&mut Entry) -> (R, bool)) -> Option<R> {
        let mut g = self.table.lock().ok()?;
        let e = g.get_mut(id)?;
        let (r, persist) = f(e);
        if persist {
            self.persist(&e.job);
        }
        Some(r)
    }
}

/// The job table and its runner.
pub struct Jobs {
    inner: Arc<Inner>,
    queue: mpsc::UnboundedSender<String>,
}

impl Jobs {
    /// Loads the jobs in `dir` and starts the runner (needs a tokio runtime). Jobs on workers that
    /// require authentication use `auth`.
    pub fn open(
        dir: &Path,
        threads: usize,
        auth: Option<llamad_proto::auth::AuthKey>,
        io_timeout: Option<Duration>,
        metrics: Arc<Metrics>,
    ) -> Result<Jobs> {
        std::fs::create_dir_all(dir).map_err(|e| Error::Config(format!("{}: {e}", dir.display())))?;
        let mut table = BTreeMap::new();
        let rd = std::fs::read_dir(dir).map_err(|e| Error::Config(format!("{}: {e}", dir.display())))?;
        for ent in rd.flatten() {
            let p = ent.path();
            if p.extension().is_none_or(|x| x != "json") {
                continue;
            }
            match std::fs::read(&p)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<Job>(&b).map_err(|e| e.to_string()))
            {
                Ok(job) => {
                    table.insert(job.id.clone(), Entry::new(job));
                }
                Err(e) => warn!(path = %p.display(), error = %e, "skipping unreadable job file"),
            }
        }
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            threads: threads.max(1),
            auth,
            io_timeout,
            metrics,
            table: Mutex::new(table),
            stopping: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let mut requeue = Vec::new();
        if let Ok(mut g) = inner.table.lock() {
            for e in g.values_mut() {
                match e.job.state {
                    JobState::Running => {
                        e.job.state = JobState::Interrupted;
                        e.job.finished_ms = Some(now_ms());
                        inner.persist(&e.job);
                        info!(id = %e.job.id, "job was running when the daemon stopped: interrupted");
                    }
                    JobState::Queued => requeue.push((e.job.created_ms, e.job.id.clone())),
                    _ => {}
                }
            }
        }
        requeue.sort();
        for (_, id) in requeue {
            let _ = tx.send(id);
        }
        tokio::spawn(runner(inner.clone(), rx));
        Ok(Jobs { inner, queue: tx })
    }

    /// Number of jobs.
    pub fn len(&self) -> usize {
        self.inner.table.lock().map(|g| g.len()).unwrap_or(0)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Jobs per state.
    pub fn count_by_state(&self) -> HashMap<JobState, u64> {
        let mut m = HashMap::new();
        if let Ok(g) = self.inner.table.lock() {
            for e in g.values() {
                *m.entry(e.job.state).or_insert(0) += 1;
            }
        }
        m
    }

    /// Queues a job, resolving its workers against `registry` (labels and registered addresses).
    pub fn submit(&self, req: JobSubmit, registry: &Registry) -> ApiResult<JobCreated> {
        let workers = resolve_workers(&req.workers, registry)?;
        if req.model.is_empty() {
            return Err(ApiError::bad_request("`model` is empty"));
        }
        if req.n_predict == 0 {
            return Err(ApiError::bad_request("`n_predict` must be at least 1"));
        }
        let created_ms = now_ms();
        let id = format!("{created_ms:012x}{:08x}", rand::rng().next_u32());
        let job = Job {
            id: id.clone(),
            state: JobState::Queued,
            request: req,
            created_ms,
            started_ms: None,
            finished_ms: None,
            prompt_tokens: 0,
            generated_tokens: 0,
            progress: 0.0,
            tokens_per_sec: None,
            output: String::new(),
            error: None,
            workers: workers
                .into_iter()
                .map(|address| JobWorker { address, holds: String::new(), bytes_sent: 0, bytes_cached: 0 })
                .collect(),
        };
        self.inner.persist(&job);
        let mut g = self.inner.table.lock().map_err(|_| ApiError::internal("job table lock poisoned"))?;
        g.insert(id.clone(), Entry::new(job));
        drop(g);
        self.queue.send(id.clone()).map_err(|_| ApiError::internal("job runner stopped"))?;
        info!(%id, "job queued");
        Ok(JobCreated { id, state: JobState::Queued })
    }

    /// One job.
    pub fn get(&self, id: &str) -> ApiResult<Job> {
        self.inner.update(id, |e| (e.job.clone(), false)).ok_or_else(|| not_found(id))
    }

    /// Every job, newest first.
    pub fn list(&self) -> Vec<JobSummary> {
        let mut v: Vec<JobSummary> = self
            .inner
            .table
            .lock()
            .map(|g| {
                g.values()
                    .map(|e| JobSummary {
                        id: e.job.id.clone(),
                        state: e.job.state,
                        model: e.job.request.model.clone(),
                        created_ms: e.job.created_ms,
                        generated_tokens: e.job.generated_tokens,
                        tokens_per_sec: e.job.tokens_per_sec,
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then_with(|| b.id.cmp(&a.id)));
        v
    }

    /// Cancels a queued job at once, or asks a running one to stop after its current token.
    pub fn cancel(&self, id: &str) -> ApiResult<Job> {
        self.inner
            .update(id, |e| match e.job.state {
                JobState::Queued => {
                    e.set_state(JobState::Cancelled);
                    (Ok(e.job.clone()), true)
                }
                JobState::Running => {
                    e.cancel.store(true, Ordering::Relaxed);
                    (Ok(e.job.clone()), false)
                }
                s => (
                    Err(ApiError::new(
                        StatusCode::CONFLICT,
                        code::JOB_FINISHED,
                        format!("job {id} is already {s}"),
                    )),
                    false,
                ),
            })
            .ok_or_else(|| not_found(id))?
    }

    /// Events so far (replayed) and, for a job not yet final, a receiver of the live ones. Taken under the
    /// table lock so nothing is missed or repeated.
    pub fn subscribe(&self, id: &str) -> ApiResult<(Vec<JobEvent>, Option<broadcast::Receiver<JobEvent>>)> {
        self.inner
            .update(id, |e| {
                let mut replay = vec![JobEvent::State { state: e.job.state }];
                for (i, (tid, text)) in e.tokens.iter().enumerate() {
                    replay.push(JobEvent::Token { index: i as u64, id: *tid, text: text.clone() });
                }
                if e.job.state.is_final() {
                    replay.push(JobEvent::End { job: Box::new(e.job.clone()) });
                    ((replay, None), false)
                } else {
                    ((replay, Some(e.events.subscribe())), false)
                }
            })
            .ok_or_else(|| not_found(id))
    }

    /// Stops the running job (it ends `interrupted`) and accepts no more work.
    pub fn shutdown(&self) {
        self.inner.stopping.store(true, Ordering::Relaxed);
        if let Ok(g) = self.inner.table.lock() {
            for e in g.values().filter(|e| e.job.state == JobState::Running) {
                e.cancel.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// Whether `w` has the shape `host:port` (a port number after the last colon, a host before it).
pub fn is_host_port(w: &str) -> bool {
    w.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
}

/// The addresses a job runs on: each entry is a registered address, else a label (every registered
/// worker carrying it, by address), else any `host:port`. Duplicates are dropped, first place kept.
pub fn resolve_workers(wanted: &[String], registry: &Registry) -> ApiResult<Vec<String>> {
    let known = registry.list();
    let mut out: Vec<String> = Vec::new();
    for w in wanted.iter().map(|w| w.trim()).filter(|w| !w.is_empty()) {
        let found: Vec<String> = if known.iter().any(|k| k.address == w) {
            vec![w.to_string()]
        } else {
            let labelled: Vec<String> =
                known.iter().filter(|k| k.labels.iter().any(|l| l == w)).map(|k| k.address.clone()).collect();
            if !labelled.is_empty() {
                labelled
            } else if is_host_port(w) {
                vec![w.to_string()]
            } else {
                return Err(ApiError::bad_request(format!(
                    "worker `{w}` is neither a registered worker's address or label nor host:port"
                )));
            }
        };
        for a in found {
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    Ok(out)
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(code::JOB_NOT_FOUND, format!("no job {id}"))
}

async fn runner(inner: Arc<Inner>, mut rx: mpsc::UnboundedReceiver<String>) {
    while let Some(id) = rx.recv().await {
        if inner.stopping.load(Ordering::Relaxed) {
            break;
        }
        let start = inner.update(&id, |e| {
            if e.job.state != JobState::Queued {
                return (None, false);
            }
            e.job.started_ms = Some(now_ms());
            e.set_state(JobState::Running);
            let addrs: Vec<String> = e.job.workers.iter().map(|w| w.address.clone()).collect();
            (Some((e.job.request.clone(), addrs, e.cancel.clone())), true)
        });
        let Some(Some((req, addrs, cancel))) = start else { continue };
        info!(%id, model = %req.model, workers = ?addrs, "job running");
        let (inner2, id2) = (inner.clone(), id.clone());
        let res = tokio::task::spawn_blocking(move || run_job(&inner2, &id2, &req, &addrs, &cancel)).await;
        let outcome = match res {
            Ok(r) => r,
            Err(e) => Err(ErrorBody::new(code::INTERNAL, format!("job thread: {e}"))),
        };
        let stopping = inner.stopping.load(Ordering::Relaxed);
        inner.update(&id, |e| {
            let state = match outcome {
                Ok(()) if e.cancel.load(Ordering::Relaxed) && stopping => JobState::Interrupted,
                Ok(()) if e.cancel.load(Ordering::Relaxed) => JobState::Cancelled,
                Ok(()) => JobState::Done,
                Err(body) => {
                    e.job.error = Some(body);
                    JobState::Failed
                }
            };
            info!(%id, %state, tokens = e.job.generated_tokens, tok_per_s = ?e.job.tokens_per_sec, "job finished");
            e.set_state(state);
            ((), true)
        });
    }
}

/// Splits generated bytes into text as soon as they form whole UTF-8 characters.
#[derive(Default)]
pub(crate) struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    pub(crate) fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        match std::str::from_utf8(&self.pending) {
            Ok(s) => {
                let s = s.to_string();
                self.pending.clear();
                s
            }
            // An incomplete character at the end: keep it for the next token.
            Err(e) if e.error_len().is_none() => {
                let n = e.valid_up_to();
                let s = String::from_utf8_lossy(&self.pending[..n]).into_owned();
                self.pending.drain(..n);
                s
            }
            Err(_) => self.flush(),
        }
    }

    pub(crate) fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

fn fail(code: &str, msg: impl std::fmt::Display) -> ErrorBody {
    ErrorBody::new(code, msg.to_string())
}

/// Loads the model (here, or onto the workers `addrs`) and generates; every token updates the job
/// and goes to subscribers.
fn run_job(
    inner: &Inner,
    id: &str,
    req: &JobSubmit,
    addrs: &[String],
    cancel: &AtomicBool,
) -> std::result::Result<(), ErrorBody> {
    // Read into memory rather than mapped, so a model file replaced on disk cannot change under the job.
    let gguf = Arc::new(Gguf::read(&req.model).map_err(|e| fail(code::BAD_REQUEST, format!("model: {e}")))?);
    let tok = Tokenizer::from_gguf(&gguf).map_err(|e| fail(code::BAD_REQUEST, format!("tokenizer: {e}")))?;
    let prompt = tok.encode(&req.prompt, tok.add_bos(), true);
    if prompt.is_empty() {
        return Err(fail(code::BAD_REQUEST, "the prompt has no tokens"));
    }
    let model = Model::new(gguf.clone()).map_err(|e| fail(code::BAD_REQUEST, format!("model: {e}")))?;
    let want = prompt.len() as u64 + u64::from(req.n_predict);
    let n_ctx = req.n_ctx.map(u64::from).unwrap_or(want);
    if n_ctx <= prompt.len() as u64 {
        return Err(fail(
            code::BAD_REQUEST,
            format!("n_ctx {n_ctx} leaves no room after {} prompt tokens", prompt.len()),
        ));
    }
    let max_new = (n_ctx - prompt.len() as u64).min(u64::from(req.n_predict)) as usize;
    let cfg = SessionConfig { n_ctx, n_threads: inner.threads, ..SessionConfig::default() };
    let mut fwd: Box<dyn Forward + Send> = if addrs.is_empty() {
        Box::new(Session::new(model, cfg).map_err(|e| fail(code::INTERNAL, format!("session: {e}")))?)
    } else {
        open_on_workers(inner, id, req, &model, cfg, addrs)?
    };
    let s = &req.sampling;
    let user = UserSampling {
        seed: s.seed,
        top_k: s.top_k,
        top_p: s.top_p,
        min_p: s.min_p,
        temp: s.temp,
        penalty_last_n: s.repeat_last_n,
        penalty_repeat: s.repeat_penalty,
        ..UserSampling::default()
    };
    let params = SamplerParams::resolve(&user, Some(gguf.as_ref()))
        .map_err(|e| fail(code::BAD_REQUEST, format!("sampling: {e}")))?;
    let mut sampler = Sampler::new(params);
    inner.update(id, |e| {
        e.job.prompt_tokens = prompt.len() as u64;
        ((), false)
    });

    let mut text = Utf8Stream::default();
    let mut last = Instant::now();
    let mut first: Option<Instant> = None;
    let n_predict = u64::from(req.n_predict);
    let on_token = |t: u32| -> bool {
        let now = Instant::now();
        inner.metrics.job_graph_latency.observe(now - last);
        last = now;
        let first_at = *first.get_or_insert(now);
        inner.metrics.tokens_generated.fetch_add(1, Ordering::Relaxed);
        let piece = text.push(&tok.decode(&[t], false));
        inner.update(id, |e| {
            let index = e.job.generated_tokens;
            e.job.generated_tokens += 1;
            e.job.output.push_str(&piece);
            e.job.progress = e.job.generated_tokens as f64 / n_predict as f64;
            let dt = now - first_at;
            if e.job.generated_tokens > 1 && dt > Duration::ZERO {
                e.job.tokens_per_sec = Some((e.job.generated_tokens - 1) as f64 / dt.as_secs_f64());
            }
            e.tokens.push((t, piece.clone()));
            let _ = e.events.send(JobEvent::Token { index, id: t, text: piece });
            ((), e.job.generated_tokens % PERSIST_EVERY == 0)
        });
        !cancel.load(Ordering::Relaxed)
    };
    let r = llamad_master::generate::generate(
        fwd.as_mut(),
        &prompt,
        &mut sampler,
        max_new,
        |t| tok.is_eog(t),
        on_token,
    );
    let rest = text.flush();
    if !rest.is_empty() {
        inner.update(id, |e| {
            e.job.output.push_str(&rest);
            ((), false)
        });
    }
    let failed = if addrs.is_empty() { code::INTERNAL } else { code::WORKER_FAILED };
    let r = r.map(|_| ()).map_err(|e| fail(failed, format!("generate: {}", worker_error(inner, &e))));
    if r.is_err() && !addrs.is_empty() {
        // Freeing a failed worker's buffers may wait for it (up to the I/O timeout per request):
        // the job ends now and the connections are released in the background.
        let spawned = std::thread::Builder::new().name("job-release".into()).spawn(move || drop(fwd));
        if let Err(e) = spawned {
            warn!(error = %e, "releasing the job's workers in the background");
        }
    }
    r
}

/// An engine error as one line; a worker that went silent says so.
fn worker_error(inner: &Inner, e: &llamad_master::Error) -> String {
    match inner.io_timeout {
        Some(t) if e.is_timeout() => {
            format!("{} (the worker did not answer within {} s)", e.chain(), t.as_secs_f64())
        }
        _ => e.chain(),
    }
}

/// Connects to the workers, splits the model over them and uploads its weights, recording each
/// worker's share and upload figures in the job.
fn open_on_workers(
    inner: &Inner,
    id: &str,
    req: &JobSubmit,
    model: &Model,
    cfg: SessionConfig,
    addrs: &[String],
) -> std::result::Result<Box<dyn Forward + Send>, ErrorBody> {
    let opts = SplitOptions {
        hash_threshold: req.hash_threshold.unwrap_or(DEFAULT_HASH_THRESHOLD),
        auth: inner.auth.clone(),
        io_timeout: inner.io_timeout,
        ..SplitOptions::default()
    };
    // Upload threads report here; `i` is the worker's index in `addrs`.
    let on_load = |i: usize, ev: LoadEvent<'_>| {
        inner.update(id, |e| {
            let Some(w) = e.job.workers.get_mut(i) else { return ((), false) };
            match ev {
                LoadEvent::Start { layers, .. } => {
                    w.holds = format!("layers {}..{}", layers.start, layers.end)
                }
                LoadEvent::Progress(_) => {}
                LoadEvent::Done(stats) => {
                    w.bytes_sent = stats.bytes_sent;
                    w.bytes_cached = stats.bytes_cached;
                    info!(%id, address = %w.address, holds = %w.holds, sent = stats.bytes_sent,
                        cached = stats.bytes_cached, "job: weights loaded on worker");
                }
            }
            ((), false)
        });
    };
    // Sendable, so that a failed job's workers can be released on another thread.
    let mode = match req.split_mode {
        SplitMode::Auto => {
            match llamad_master::auto_split::choose(addrs, &opts, model.hp.n_layer, model.weight_bytes()) {
                Ok(c) if c.mode == llamad_master::SplitMode::Row => SplitMode::Row,
                Ok(_) => SplitMode::Layer,
                Err(e) => {
                    return Err(fail(
                        code::WORKER_FAILED,
                        format!("measuring the workers' links: {}", worker_error(inner, &e)),
                    ))
                }
            }
        }
        m => m,
    };
    let opened: llamad_master::Result<Box<dyn Forward + Send>> = match mode {
        SplitMode::Auto | SplitMode::Layer => {
            Pipeline::new(model, cfg, addrs, &opts, &on_load).map(|p| Box::new(p) as _)
        }
        SplitMode::Row => TensorParallel::new(model, cfg, addrs, &opts, &on_load).map(|p| Box::new(p) as _),
    };
    let fwd = opened.map_err(|e| {
        fail(code::WORKER_FAILED, format!("loading the model on the workers: {}", worker_error(inner, &e)))
    })?;
    inner.update(id, |e| {
        // Workers that got no layers keep an empty share.
        for w in e.job.workers.iter_mut().filter(|w| w.holds.is_empty()) {
            w.holds = "nothing".into();
        }
        ((), true)
    });
    Ok(fwd)
}

#[cfg(test)]
mod tests {
    use super::Utf8Stream;

    #[test]
    fn utf8_stream_holds_split_characters() {
        let mut s = Utf8Stream::default();
        let e = "é".as_bytes(); // 0xC3 0xA9
        assert_eq!(s.push(b"a"), "a");
        assert_eq!(s.push(&e[..1]), "");
        assert_eq!(s.push(&e[1..]), "é");
        assert_eq!(s.push(&[0xff, b'b']), "\u{fffd}b");
        assert_eq!(s.push(&e[..1]), "");
        assert_eq!(s.flush(), "\u{fffd}");
    }
}
