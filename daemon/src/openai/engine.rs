//! One model behind the OpenAI API: its loading, its slots and the scheduler thread that batches
//! the requests of all slots into shared ubatches.
//!
//! In-process, the model runs in a [`BatchSession`]: `parallel` slots in one KV cache. Every step
//! the scheduler admits queued requests into free slots, then builds one ubatch of a generated
//! token for every generating slot and prompt chunks of the newer requests (up to `n_ubatch` tokens
//! in all), decodes it, and samples a token for every slot whose prompt is complete. On workers with
//! split mode `layer` the same ubatches go through `llamad-master`'s pipeline
//! ([`Pipeline::decode_batch`]), whose workers' KV caches hold the `parallel` slots; with split
//! mode `row` there is one slot and requests run in turn.
//!
//! A request ends with an end-of-generation token or a stop string (`stop`), at `max_tokens` or at
//! the slot's end (`length`), when its client goes away (its event receiver is closed: the slot is
//! freed at once), or at its deadline (an error event).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use compute::gguf::Gguf;
use compute::model::{BatchSession, Model, SeqChunk, SessionConfig};
use compute::sample::Sampler;
use compute::tokenizer::chat::ChatTemplate;
use compute::tokenizer::Tokenizer;
use llamad_master::pipeline::{Pipeline, SplitOptions};
use llamad_master::tensor_parallel::TensorParallel;
use llamad_master::{Forward, SplitMode};
use tokio::sync::mpsc::UnboundedSender;
use tracing::{info, warn};

use crate::openai::metrics::METRICS;
use crate::openai::text::StopText;
use crate::openai::ModelConfig;

/// What a request hears from the scheduler.
#[derive(Debug)]
pub enum Event {
    /// Text to append (already cut at a stop string).
    Text(String),
    /// The end.
    Done(Finish),
    /// A failure (the request's deadline, the engine).
    Error(String),
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finish {
    /// `"stop"` or `"length"`.
    pub reason: &'static str,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Generated tokens (an end-of-generation token included).
    pub completion_tokens: u64,
}

/// A request for the scheduler.
pub struct Job {
    /// Prompt tokens.
    pub prompt: Vec<u32>,
    /// The request's sampler.
    pub sampler: Sampler,
    /// Most tokens to generate (`None`: until the slot is full).
    pub max_tokens: Option<u64>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// When it fails with a timeout.
    pub deadline: Instant,
    /// Where its events go; closed when the client has gone.
    pub events: UnboundedSender<Event>,
    /// Request id for the log line.
    pub id: String,
    /// When the HTTP request arrived (time to first token counts from here).
    pub received: Instant,
}

/// Where a model stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Not loaded yet: it loads on its first request (`load = "request"`).
    Idle,
    /// Being read and set up.
    Loading,
    /// Serving.
    Ready,
    /// It could not be loaded.
    Failed(String),
}

impl State {
    /// `idle`, `loading`, `ready` or `failed`.
    pub fn name(&self) -> &'static str {
        match self {
            State::Idle => "idle",
            State::Loading => "loading",
            State::Ready => "ready",
            State::Failed(_) => "failed",
        }
    }
}

/// What the HTTP side needs once a model is loaded.
pub struct Loaded {
    /// The tokenizer.
    pub tok: Tokenizer,
    /// The GGUF's chat template, when it has one.
    pub template: Option<ChatTemplate>,
    /// The model's file (its `general.sampling.*` defaults).
    pub gguf: Arc<Gguf>,
    /// Cells per slot.
    pub slot_ctx: u64,
    submit: Mutex<mpsc::Sender<Job>>,
}

impl Loaded {
    /// Hands `job` to the scheduler.
    pub fn submit(&self, job: Job) -> Result<(), String> {
        let tx = self.submit.lock().map_err(|_| "engine lock poisoned".to_string())?;
        tx.send(job).map_err(|_| "the model's engine has stopped".to_string())
    }
}

/// One model of the service.
pub struct ModelHandle {
    /// Its settings.
    pub cfg: ModelConfig,
    state: Mutex<State>,
    loaded: std::sync::OnceLock<Arc<Loaded>>,
    /// Bytes of weights (the file) and KV cache held in this process.
    pub memory_bytes: AtomicU64,
    /// Requests admitted by the HTTP side (in slots or queued): the bound of the queue.
    pub permits: Arc<tokio::sync::Semaphore>,
    /// Requests waiting for a slot.
    pub queued: AtomicU64,
    /// Requests in slots.
    pub active: AtomicU64,
    /// What loading needs (compute threads, worker options), until loading starts.
    launch: Mutex<Option<(usize, SplitOptions)>>,
}

impl ModelHandle {
    /// A model not loaded yet (idle until [`ModelHandle::start_loading`]); `queue` requests may
    /// wait beyond its slots; it computes on `threads` threads in-process, with `opts` on workers.
    pub fn new(cfg: ModelConfig, queue: usize, threads: usize, opts: SplitOptions) -> ModelHandle {
        let permits = Arc::new(tokio::sync::Semaphore::new(cfg.parallel + queue));
        ModelHandle {
            cfg,
            state: Mutex::new(State::Idle),
            loaded: std::sync::OnceLock::new(),
            memory_bytes: AtomicU64::new(0),
            permits,
            queued: AtomicU64::new(0),
            active: AtomicU64::new(0),
            launch: Mutex::new(Some((threads, opts))),
        }
    }

    /// Starts loading on a thread of its own, unless loading has started before (a model loaded on
    /// request starts on its first request; later calls do nothing).
    pub fn start_loading(self: &Arc<Self>) {
        let Some((threads, opts)) = self.launch.lock().ok().and_then(|mut l| l.take()) else { return };
        self.set_state(State::Loading);
        info!(model = %self.cfg.name, on_request = self.cfg.load_on_request, "openai: loading the model");
        let m = self.clone();
        if let Err(e) = std::thread::Builder::new()
            .name(format!("openai-{}", self.cfg.name))
            .spawn(move || m.load_and_serve(threads, opts))
        {
            self.set_state(State::Failed(format!("starting the model thread: {e}")));
        }
    }

    /// Starts loading if it has not, then waits until the model is ready or failed (a request
    /// that comes first to a model loaded on request waits for the load; a client that leaves
    /// drops this future and the load goes on).
    pub async fn wait_loaded(self: &Arc<Self>) -> State {
        self.start_loading();
        loop {
            match self.state() {
                State::Idle | State::Loading => {
                    tokio::time::sleep(std::time::Duration::from_millis(25)).await
                }
                s => return s,
            }
        }
    }

    /// Its state.
    pub fn state(&self) -> State {
        self.state.lock().map(|s| s.clone()).unwrap_or(State::Failed("state lock poisoned".into()))
    }

    /// The loaded model, once ready.
    pub fn loaded(&self) -> Option<Arc<Loaded>> {
        self.loaded.get().cloned()
    }

    fn set_state(&self, s: State) {
        if let Ok(mut g) = self.state.lock() {
            *g = s;
        }
    }

    /// Loads the model (blocking: call on a thread of its own) and then runs its scheduler until
    /// the service drops every sender.
    pub fn load_and_serve(self: Arc<Self>, threads: usize, opts: SplitOptions) {
        let t0 = Instant::now();
        match self.load(threads, &opts) {
            Ok((loaded, engine, rx)) => {
                let _ = self.loaded.set(loaded.clone());
                self.set_state(State::Ready);
                info!(model = %self.cfg.name, path = %self.cfg.path.display(), slots = engine.n_slots(),
                    slot_ctx = loaded.slot_ctx, workers = ?self.cfg.workers, secs = t0.elapsed().as_secs_f64(),
                    "openai: model ready");
                Scheduler::new(self.clone(), loaded, engine).run(rx);
            }
            Err(e) => {
                warn!(model = %self.cfg.name, error = %e, "openai: model not loaded");
                self.set_state(State::Failed(e));
            }
        }
    }

    #[allow(clippy::type_complexity)]
    fn load(
        &self,
        threads: usize,
        opts: &SplitOptions,
    ) -> Result<(Arc<Loaded>, Box<dyn Engine>, mpsc::Receiver<Job>), String> {
        let c = &self.cfg;
        let gguf = Arc::new(Gguf::read(&c.path).map_err(|e| format!("{}: {e}", c.path.display()))?);
        let file_bytes = std::fs::metadata(&c.path).map(|m| m.len()).unwrap_or(0);
        let tok = Tokenizer::from_gguf(&gguf).map_err(|e| format!("tokenizer: {e}"))?;
        let template = ChatTemplate::from_tokenizer(&tok).map_err(|e| format!("chat template: {e}"))?;
        let model = Model::new(gguf.clone()).map_err(|e| format!("model: {e}"))?;
        let cfg = SessionConfig {
            n_ctx: c.ctx,
            n_ubatch: c.ubatch.max(c.parallel as u64),
            n_threads: threads,
            ..SessionConfig::default()
        };
        let workers = resolve_workers(&c.workers)?;
        let engine: Box<dyn Engine> = if workers.is_empty() {
            let hp = &model.hp;
            let b = BatchSession::new(model.clone(), cfg, c.parallel).map_err(|e| format!("session: {e}"))?;
            // K and V, F16, every layer, every cell of every slot.
            let kv = 2 * 2 * hp.n_embd_k_gqa() * u64::from(hp.n_layer) * b.slot_ctx() * c.parallel as u64;
            self.memory_bytes.store(file_bytes + kv, Ordering::Relaxed);
            Box::new(b)
        } else {
            let on_load = |_: usize, _: llamad_master::pipeline::LoadEvent<'_>| {};
            let mode = match c.split_mode {
                // Several slots are batched by the layer pipeline only.
                SplitMode::Auto if c.parallel > 1 => SplitMode::Layer,
                SplitMode::Auto => {
                    llamad_master::auto_split::choose(&workers, opts, model.hp.n_layer, model.weight_bytes())
                        .map_err(|e| e.chain())?
                        .mode
                }
                m => m,
            };
            self.memory_bytes.store(file_bytes, Ordering::Relaxed);
            match mode {
                SplitMode::Auto | SplitMode::Layer => Box::new(
                    Pipeline::with_slots(&model, cfg.clone(), c.parallel, &workers, opts, &on_load)
                        .map_err(|e| e.chain())?,
                ),
                SplitMode::Row => {
                    let fwd = TensorParallel::new(&model, cfg.clone(), &workers, opts, &on_load)
                        .map_err(|e| e.chain())?;
                    Box::new(Single { fwd: Box::new(fwd), n_ctx: cfg.n_ctx })
                }
            }
        };
        let (tx, rx) = mpsc::channel();
        let loaded =
            Arc::new(Loaded { tok, template, gguf, slot_ctx: engine.slot_ctx(), submit: Mutex::new(tx) });
        Ok((loaded, engine, rx))
    }
}

/// The workers of a model: `host:port` entries as they are; other entries are addresses or labels
/// of the admin API's worker registry (`llamactl workers add ADDR -l LABEL`), as a job's workers.
fn resolve_workers(wanted: &[String]) -> Result<Vec<String>, String> {
    if wanted.iter().all(|w| crate::admin::jobs::is_host_port(w.trim())) {
        return Ok(wanted.iter().map(|w| w.trim().to_string()).collect());
    }
    let registry = crate::admin::registry().ok_or_else(|| {
        format!("workers {wanted:?}: a label needs the admin API's worker registry, and the admin API is off")
    })?;
    let out = crate::admin::jobs::resolve_workers(wanted, registry).map_err(|e| e.body.message)?;
    if out.is_empty() {
        return Err(format!("workers {wanted:?}: no registered worker has that label"));
    }
    Ok(out)
}

/// What the scheduler runs: sequences in slots, decoded a ubatch at a time.
trait Engine: Send {
    fn n_slots(&self) -> usize;
    fn slot_ctx(&self) -> u64;
    /// The logits of each chunk's last token, in chunk order.
    fn decode(&mut self, chunks: &[SeqChunk<'_>]) -> Result<&[f32], String>;
    fn clear(&mut self, slot: usize) -> Result<(), String>;
}

impl Engine for BatchSession {
    fn n_slots(&self) -> usize {
        BatchSession::n_slots(self)
    }
    fn slot_ctx(&self) -> u64 {
        BatchSession::slot_ctx(self)
    }
    fn decode(&mut self, chunks: &[SeqChunk<'_>]) -> Result<&[f32], String> {
        BatchSession::decode(self, chunks).map_err(|e| e.to_string())
    }
    fn clear(&mut self, slot: usize) -> Result<(), String> {
        self.clear_slot(slot);
        Ok(())
    }
}

impl Engine for Pipeline {
    fn n_slots(&self) -> usize {
        Pipeline::n_slots(self)
    }
    fn slot_ctx(&self) -> u64 {
        Pipeline::slot_ctx(self)
    }
    fn decode(&mut self, chunks: &[SeqChunk<'_>]) -> Result<&[f32], String> {
        self.decode_batch(chunks).map_err(|e| e.chain())
    }
    fn clear(&mut self, slot: usize) -> Result<(), String> {
        self.clear_slot(slot).map_err(|e| e.chain())
    }
}

/// One sequence at a time over any [`Forward`] (the model on workers with split mode `row`).
struct Single {
    fwd: Box<dyn Forward + Send>,
    n_ctx: u64,
}

impl Engine for Single {
    fn n_slots(&self) -> usize {
        1
    }
    fn slot_ctx(&self) -> u64 {
        self.n_ctx
    }
    fn decode(&mut self, chunks: &[SeqChunk<'_>]) -> Result<&[f32], String> {
        match chunks {
            [c] if c.slot == 0 => self.fwd.decode(c.tokens).map_err(|e| e.chain()),
            _ => Err("one sequence at a time on workers".into()),
        }
    }
    fn clear(&mut self, _slot: usize) -> Result<(), String> {
        self.fwd.clear().map_err(|e| e.chain())
    }
}

/// A request in a slot.
struct Active {
    job: Job,
    slot: usize,
    /// Prompt tokens decoded so far.
    fed: usize,
    /// The last sampled token, to decode next.
    next: Option<u32>,
    generated: u64,
    text: StopText,
    first_token: Option<Instant>,
    last_token: Instant,
}

struct Scheduler {
    model: Arc<ModelHandle>,
    loaded: Arc<Loaded>,
    engine: Box<dyn Engine>,
    waiting: VecDeque<(Job, Instant)>,
    active: Vec<Active>,
    free: Vec<bool>,
    n_ubatch: usize,
    /// The last ubatch's logits, copied out of the engine (kept: a fresh 1.5 MiB vector per step
    /// of 8 sequences cost a map, page faults and an unmap every step).
    logits: Vec<f32>,
}

impl Scheduler {
    fn new(model: Arc<ModelHandle>, loaded: Arc<Loaded>, engine: Box<dyn Engine>) -> Scheduler {
        let n = engine.n_slots();
        let n_ubatch = model.cfg.ubatch.max(n as u64) as usize;
        Scheduler {
            model,
            loaded,
            engine,
            waiting: VecDeque::new(),
            active: Vec::new(),
            free: vec![true; n],
            n_ubatch,
            logits: Vec::new(),
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Job>) {
        loop {
            if self.active.is_empty() && self.waiting.is_empty() {
                // Idle: the gauges say so before the wait.
                self.publish_gauges();
                match rx.recv() {
                    Ok(j) => self.waiting.push_back((j, Instant::now())),
                    Err(_) => return,
                }
            }
            while let Ok(j) = rx.try_recv() {
                self.waiting.push_back((j, Instant::now()));
            }
            self.expire_waiting();
            self.admit();
            self.cancel_gone();
            self.publish_gauges();
            if !self.active.is_empty() {
                self.step();
            }
        }
    }

    fn publish_gauges(&self) {
        self.model.queued.store(self.waiting.len() as u64, Ordering::Relaxed);
        self.model.active.store(self.active.len() as u64, Ordering::Relaxed);
    }

    /// Queued requests whose client left or whose deadline passed.
    fn expire_waiting(&mut self) {
        let now = Instant::now();
        self.waiting.retain(|(j, _)| {
            if j.events.is_closed() {
                return false;
            }
            if now >= j.deadline {
                let _ = j.events.send(Event::Error("request timed out waiting for a slot".into()));
                return false;
            }
            true
        });
    }

    fn admit(&mut self) {
        while let Some(slot) = self.free.iter().position(|&f| f) {
            let Some((mut job, queued_at)) = self.waiting.pop_front() else { break };
            if job.prompt.len() as u64 >= self.loaded.slot_ctx {
                let _ = job.events.send(Event::Error(format!(
                    "the prompt has {} tokens; a slot holds {}",
                    job.prompt.len(),
                    self.loaded.slot_ctx
                )));
                continue;
            }
            if let Err(e) = self.engine.clear(slot) {
                let _ = job.events.send(Event::Error(format!("clearing the slot: {e}")));
                continue;
            }
            for &t in &job.prompt {
                job.sampler.accept(t);
            }
            METRICS.queue_wait.observe(queued_at.elapsed());
            self.free[slot] = false;
            let text = StopText::new(job.stop.clone());
            let now = Instant::now();
            self.active.push(Active {
                job,
                slot,
                fed: 0,
                next: None,
                generated: 0,
                text,
                first_token: None,
                last_token: now,
            });
        }
    }

    /// Frees the slots of requests whose client left or whose deadline passed.
    fn cancel_gone(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.active.len() {
            let a = &self.active[i];
            if a.job.events.is_closed() {
                info!(id = %a.job.id, model = %self.model.cfg.name, generated = a.generated, "openai: client gone, sequence cancelled");
                METRICS.cancelled.fetch_add(1, Ordering::Relaxed);
                self.release(i);
            } else if now >= a.job.deadline {
                let _ = a.job.events.send(Event::Error("request timed out".into()));
                METRICS.timed_out.fetch_add(1, Ordering::Relaxed);
                self.release(i);
            } else {
                i += 1;
            }
        }
    }

    fn release(&mut self, i: usize) {
        let a = self.active.swap_remove(i);
        self.free[a.slot] = true;
    }

    /// One ubatch: every generating slot's token, then prompt chunks in admission order.
    fn step(&mut self) {
        let mut order: Vec<usize> =
            (0..self.active.len()).filter(|&i| self.active[i].next.is_some()).collect();
        let mut budget = self.n_ubatch.saturating_sub(order.len());
        let mut prompt_rows: Vec<(usize, usize)> = Vec::new();
        for (i, a) in self.active.iter().enumerate() {
            if a.next.is_none() && budget > 0 {
                let n = (a.job.prompt.len() - a.fed).min(budget);
                budget -= n;
                prompt_rows.push((i, n));
                order.push(i);
            }
        }
        let singles: Vec<[u32; 1]> = order.iter().map(|&i| [self.active[i].next.unwrap_or(0)]).collect();
        let chunks: Vec<SeqChunk<'_>> = order
            .iter()
            .enumerate()
            .map(|(k, &i)| {
                let a = &self.active[i];
                match prompt_rows.iter().find(|(j, _)| *j == i) {
                    Some(&(_, n)) => SeqChunk { slot: a.slot, tokens: &a.job.prompt[a.fed..a.fed + n] },
                    None => SeqChunk { slot: a.slot, tokens: &singles[k] },
                }
            })
            .collect();
        let n_tokens: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let t0 = Instant::now();
        let mut logits = std::mem::take(&mut self.logits);
        match self.engine.decode(&chunks) {
            Ok(l) => {
                logits.clear();
                logits.extend_from_slice(l);
            }
            Err(e) => {
                warn!(model = %self.model.cfg.name, error = %e, "openai: decode failed");
                let mut gone: Vec<usize> = order.clone();
                gone.sort_unstable_by(|a, b| b.cmp(a));
                for i in gone {
                    let _ = self.active[i].job.events.send(Event::Error(format!("decode: {e}")));
                    self.release(i);
                }
                self.logits = logits;
                return;
            }
        }
        METRICS.ubatch_latency.observe(t0.elapsed());
        METRICS.ubatch_tokens.fetch_add(n_tokens as u64, Ordering::Relaxed);
        METRICS.ubatches.fetch_add(1, Ordering::Relaxed);
        let n_vocab = logits.len() / order.len().max(1);
        let mut finished: Vec<usize> = Vec::new();
        for (row, &i) in order.iter().enumerate() {
            if let Some(&(_, n)) = prompt_rows.iter().find(|(j, _)| *j == i) {
                let a = &mut self.active[i];
                a.fed += n;
                METRICS.prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
                if a.fed < a.job.prompt.len() {
                    continue;
                }
            }
            let l = &logits[row * n_vocab..(row + 1) * n_vocab];
            if self.on_logits(i, l) {
                finished.push(i);
            }
        }
        self.logits = logits;
        finished.sort_unstable_by(|a, b| b.cmp(a));
        for i in finished {
            self.release(i);
        }
    }

    /// Samples slot `i`'s next token from `logits`; true when the request is over.
    fn on_logits(&mut self, i: usize, logits: &[f32]) -> bool {
        let slot_ctx = self.loaded.slot_ctx;
        let tok = &self.loaded.tok;
        let a = &mut self.active[i];
        let Some(t) = a.job.sampler.sample(logits) else {
            let _ = a.job.events.send(Event::Error("sampling from empty logits".into()));
            return true;
        };
        a.job.sampler.accept(t);
        a.generated += 1;
        let now = Instant::now();
        match a.first_token {
            None => {
                a.first_token = Some(now);
                METRICS.ttft.observe(now - a.job_start());
            }
            Some(_) => METRICS.token_latency.observe(now - a.last_token),
        }
        a.last_token = now;
        METRICS.completion_tokens.fetch_add(1, Ordering::Relaxed);
        let mut reason = None;
        if tok.is_eog(t) {
            reason = Some("stop");
        } else {
            let (piece, stopped) = a.text.push(&tok.decode(&[t], false));
            if !piece.is_empty() {
                let _ = a.job.events.send(Event::Text(piece));
            }
            if stopped {
                reason = Some("stop");
            } else if a.job.max_tokens.is_some_and(|m| a.generated >= m)
                || a.job.prompt.len() as u64 + a.generated >= slot_ctx
            {
                reason = Some("length");
            }
        }
        let Some(reason) = reason else {
            a.next = Some(t);
            return false;
        };
        let rest = a.text.finish();
        if !rest.is_empty() {
            let _ = a.job.events.send(Event::Text(rest));
        }
        let fin = Finish { reason, prompt_tokens: a.job.prompt.len() as u64, completion_tokens: a.generated };
        let gen_s = a.first_token.map(|f| (now - f).as_secs_f64()).unwrap_or(0.0);
        info!(
            id = %a.job.id,
            model = %self.model.cfg.name,
            slot = a.slot,
            prompt_tokens = fin.prompt_tokens,
            completion_tokens = fin.completion_tokens,
            finish_reason = reason,
            ttft_ms = a.first_token.map(|f| (f - a.job_start()).as_millis() as u64).unwrap_or(0),
            tok_per_s = if gen_s > 0.0 { (a.generated.saturating_sub(1)) as f64 / gen_s } else { 0.0 },
            "openai request"
        );
        let _ = a.job.events.send(Event::Done(fin));
        true
    }
}

impl Active {
    /// When the request arrived: time to first token counts from here, queueing included.
    fn job_start(&self) -> Instant {
        self.job.received
    }
}
