//! The OpenAI API's routes: request bodies checked into a [`Job`], answered whole or as server-sent
//! events (`data: {chunk}` … `data: [DONE]`), errors in OpenAI's shape
//! (`{"error": {"message", "type", "param", "code"}}`) with its status codes.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use compute::sample::{Sampler, SamplerParams, UserSampling};
use compute::tokenizer::chat::ChatMessage;
use futures_util::stream::{self, Stream, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::admin::auth::{bearer, constant_time_eq};
use crate::openai::engine::{Event, Finish, Job, State as ModelState};
use crate::openai::metrics::METRICS;
use crate::openai::Service;

/// An error answer in OpenAI's shape.
#[derive(Debug)]
pub struct OaiError {
    status: StatusCode,
    kind: &'static str,
    code: Option<&'static str>,
    param: Option<&'static str>,
    message: String,
}

impl OaiError {
    fn bad(message: impl Into<String>, param: Option<&'static str>) -> OaiError {
        OaiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: None,
            param,
            message: message.into(),
        }
    }
    fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> OaiError {
        OaiError { status, kind, code: Some(code), param: None, message: message.into() }
    }
    fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for OaiError {
    fn into_response(self) -> Response {
        let counter = match self.status {
            StatusCode::TOO_MANY_REQUESTS => &METRICS.requests_rejected,
            s if s.is_client_error() => &METRICS.requests_client_error,
            _ => &METRICS.requests_server_error,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        (self.status, Json(self.body())).into_response()
    }
}

type OaiResult<T> = Result<T, OaiError>;

/// The routes over `svc`.
pub fn router(svc: Arc<Service>) -> Router {
    let api = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(svc.clone(), auth));
    Router::new().route("/health", get(health)).merge(api).with_state(svc)
}

async fn not_found() -> OaiError {
    OaiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "not_found", "no such route")
}

/// Checks `Authorization: Bearer KEY` when keys are configured.
async fn auth(State(svc): State<Arc<Service>>, req: Request, next: Next) -> Response {
    if svc.cfg.keys.is_empty() {
        return next.run(req).await;
    }
    match bearer(req.headers()) {
        Some(k) if svc.cfg.keys.iter().any(|x| constant_time_eq(x.as_bytes(), k.as_bytes())) => {
            next.run(req).await
        }
        Some(_) => OaiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            "incorrect API key provided",
        )
        .into_response(),
        None => OaiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            "no API key: send Authorization: Bearer KEY",
        )
        .into_response(),
    }
}

async fn health(State(svc): State<Arc<Service>>) -> Response {
    let models: Vec<Value> =
        svc.models().iter().map(|m| json!({"id": m.cfg.name, "state": m.state().name()})).collect();
    // A model loaded on request serves while idle.
    let ready = svc.models().iter().all(|m| matches!(m.state(), ModelState::Ready | ModelState::Idle));
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(json!({"status": if ready { "ok" } else { "loading" }, "models": models}))).into_response()
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

async fn models(State(svc): State<Arc<Service>>) -> Response {
    let data: Vec<Value> = svc
        .models()
        .iter()
        .map(|m| {
            let st = m.state();
            let mut v = json!({
                "id": m.cfg.name,
                "object": "model",
                "created": 0,
                "owned_by": "llamad",
                "state": st.name(),
                "parallel": m.cfg.parallel,
                "workers": m.cfg.workers,
                "memory_bytes": m.memory_bytes.load(Ordering::Relaxed),
                "queued": m.queued.load(Ordering::Relaxed),
                "busy": m.active.load(Ordering::Relaxed),
            });
            if let ModelState::Failed(e) = st {
                v["error"] = json!(e);
            }
            v
        })
        .collect();
    METRICS.requests_ok.fetch_add(1, Ordering::Relaxed);
    Json(json!({"object": "list", "data": data})).into_response()
}

/// A string or a list of strings (`stop`, `prompt`).
#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// The sampling and length fields both endpoints take (unknown fields are ignored, as OpenAI's
/// clients send many).
#[derive(Deserialize, Debug, Default)]
struct Common {
    model: Option<String>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i32>,
    min_p: Option<f32>,
    seed: Option<i64>,
    stop: Option<OneOrMany>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    /// OpenAI's `logit_bias`: token id (a decimal string) -> bias in [-100, 100], added to that
    /// token's logit before sampling (-100 bans it in practice).
    logit_bias: Option<std::collections::HashMap<String, f32>>,
    /// llama-server's (and vLLM's) `ignore_eos`: end-of-generation tokens are never sampled, so a
    /// request runs to `max_tokens` or a stop string (what benchmarks of serving throughput use).
    #[serde(default)]
    ignore_eos: bool,
    n: Option<i64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize, Debug, Default)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize, Debug)]
struct CompletionBody {
    prompt: Option<OneOrMany>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Deserialize, Debug)]
struct ChatBody {
    messages: Option<Vec<Message>>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Deserialize, Debug)]
struct Message {
    role: String,
    content: Option<Content>,
}

/// A message's content: text, or a list of parts of which the text ones are used.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize, Debug)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

fn parse<T: serde::de::DeserializeOwned>(headers: &HeaderMap, body: &Bytes) -> OaiResult<T> {
    let json_ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|v| v.starts_with("application/json"));
    if !json_ct {
        return Err(OaiError::bad("the body must be JSON (Content-Type: application/json)", None));
    }
    serde_json::from_slice(body).map_err(|e| OaiError::bad(format!("invalid request body: {e}"), None))
}

/// What a checked request becomes before it is queued.
struct Prepared {
    model: Arc<crate::openai::ModelHandle>,
    loaded: Arc<crate::openai::engine::Loaded>,
    sampler: Sampler,
    max_tokens: Option<u64>,
    stop: Vec<String>,
    stream: bool,
    include_usage: bool,
    /// When the model was ready for this request: when it arrived, or when the load it waited
    /// for ended (the request's timeout counts from here).
    ready_at: Instant,
}

/// The model `name`, once it is ready (waiting while it loads: at start, or because this request
/// is the first to a model loaded on request), with when it became ready for this request.
async fn ready_model(
    svc: &Service,
    name: &str,
) -> OaiResult<(Arc<crate::openai::ModelHandle>, Arc<crate::openai::engine::Loaded>, Instant)> {
    let model = svc.model(name).cloned().ok_or_else(|| {
        OaiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("the model `{name}` does not exist"),
        )
    })?;
    let state = match model.state() {
        ModelState::Idle | ModelState::Loading => model.wait_loaded().await,
        s => s,
    };
    let ready_at = Instant::now();
    let loaded = match state {
        ModelState::Ready => model.loaded().ok_or_else(|| {
            OaiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "model_not_ready",
                "the model is not ready",
            )
        })?,
        ModelState::Idle | ModelState::Loading => {
            return Err(OaiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "model_loading",
                format!("the model `{name}` is loading"),
            ))
        }
        ModelState::Failed(e) => {
            return Err(OaiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "model_failed",
                format!("the model `{name}` failed to load: {e}"),
            ))
        }
    };
    Ok((model, loaded, ready_at))
}

/// Checks the common fields and finds the model (waiting while it loads: at start, or because this
/// request is the first to a model loaded on request).
async fn prepare(svc: &Service, c: Common) -> OaiResult<Prepared> {
    let name = c.model.ok_or_else(|| OaiError::bad("`model` is required", Some("model")))?;
    let (model, loaded, ready_at) = ready_model(svc, &name).await?;
    if let Some(n) = c.n.filter(|&n| n != 1) {
        return Err(OaiError::bad(format!("n = {n}: only n = 1 is supported"), Some("n")));
    }
    let max_tokens = match c.max_completion_tokens.or(c.max_tokens) {
        Some(m) if m < 1 => {
            return Err(OaiError::bad(format!("max_tokens = {m} must be at least 1"), Some("max_tokens")))
        }
        Some(m) => Some(m as u64),
        None => None,
    };
    if let Some(t) = c.temperature.filter(|t| !(0.0..=2.0).contains(t) || t.is_nan()) {
        return Err(OaiError::bad(format!("temperature = {t} is not in [0, 2]"), Some("temperature")));
    }
    if let Some(p) = c.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
        return Err(OaiError::bad(format!("top_p = {p} is not in (0, 1]"), Some("top_p")));
    }
    if let Some(p) = c.min_p.filter(|p| !(0.0..=1.0).contains(p)) {
        return Err(OaiError::bad(format!("min_p = {p} is not in [0, 1]"), Some("min_p")));
    }
    for (v, what) in [(c.presence_penalty, "presence_penalty"), (c.frequency_penalty, "frequency_penalty")] {
        if let Some(v) = v.filter(|v| !(-2.0..=2.0).contains(v)) {
            return Err(OaiError::bad(format!("{what} = {v} is not in [-2, 2]"), None));
        }
    }
    let bias = logit_biases(c.logit_bias.as_ref(), c.ignore_eos, &loaded.tok)?;
    let stop = c.stop.map(OneOrMany::into_vec).unwrap_or_default();
    if stop.len() > 4 {
        return Err(OaiError::bad("at most 4 stop strings", Some("stop")));
    }
    let user = UserSampling {
        seed: c.seed.map(|s| if s < 0 { u32::MAX } else { s as u32 }),
        top_k: c.top_k,
        top_p: c.top_p,
        min_p: c.min_p,
        temp: c.temperature,
        penalty_freq: c.frequency_penalty,
        penalty_present: c.presence_penalty,
        ..UserSampling::default()
    };
    let mut params = SamplerParams::resolve(&user, Some(loaded.gguf.as_ref()))
        .map_err(|e| OaiError::bad(format!("sampling: {e}"), None))?;
    params.logit_bias = bias;
    Ok(Prepared {
        model,
        loaded,
        sampler: Sampler::new(params),
        max_tokens,
        stop,
        stream: c.stream,
        include_usage: c.stream_options.is_some_and(|o| o.include_usage),
        ready_at,
    })
}

/// The request's additions to the logits: `logit_bias` (checked: ids in the vocabulary, values in
/// [-100, 100], at most 1024 entries) and, with `ignore_eos`, minus infinity on every
/// end-of-generation token (as llama-server does).
fn logit_biases(
    bias: Option<&std::collections::HashMap<String, f32>>,
    ignore_eos: bool,
    tok: &compute::tokenizer::Tokenizer,
) -> OaiResult<Vec<(u32, f32)>> {
    let n_vocab = tok.n_vocab();
    let mut out = Vec::new();
    if let Some(m) = bias {
        if m.len() > 1024 {
            return Err(OaiError::bad(
                format!("logit_bias has {} entries (at most 1024)", m.len()),
                Some("logit_bias"),
            ));
        }
        for (k, &v) in m {
            let id = k.trim().parse::<u32>().ok().filter(|&id| (id as usize) < n_vocab).ok_or_else(|| {
                OaiError::bad(
                    format!("logit_bias: `{k}` is not a token id of this model (0..{n_vocab})"),
                    Some("logit_bias"),
                )
            })?;
            if !(-100.0..=100.0).contains(&v) {
                return Err(OaiError::bad(
                    format!("logit_bias[{k}] = {v} is not in [-100, 100]"),
                    Some("logit_bias"),
                ));
            }
            out.push((id, v));
        }
    }
    if ignore_eos {
        out.extend(tok.eog_tokens().map(|t| (t, f32::NEG_INFINITY)));
    }
    Ok(out)
}

/// Which endpoint: the shapes of its answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Completion,
    Chat,
}

async fn completions(
    State(svc): State<Arc<Service>>,
    headers: HeaderMap,
    body: Bytes,
) -> OaiResult<Response> {
    let received = Instant::now();
    let b: CompletionBody = parse(&headers, &body)?;
    let prompt = match b.prompt.map(OneOrMany::into_vec) {
        Some(v) if v.len() == 1 => v.into_iter().next().unwrap_or_default(),
        Some(v) if v.len() > 1 => return Err(OaiError::bad("one prompt per request", Some("prompt"))),
        _ => return Err(OaiError::bad("`prompt` is required", Some("prompt"))),
    };
    let p = prepare(&svc, b.common).await?;
    let tokens = p.loaded.tok.encode(&prompt, p.loaded.tok.add_bos(), true);
    run(p, tokens, Kind::Completion, received).await
}

/// `POST /tokenize` (llama-server's shape, plus `model` where several are declared):
/// `{"content": TEXT, "add_special": false}` -> `{"tokens": [ID, ...]}`; special-token text is
/// parsed as in a completion's prompt.
#[derive(Deserialize, Debug)]
struct TokenizeBody {
    model: Option<String>,
    content: Option<String>,
    #[serde(default)]
    add_special: bool,
}

/// `POST /detokenize`: `{"tokens": [ID, ...]}` -> `{"content": TEXT}`.
#[derive(Deserialize, Debug)]
struct DetokenizeBody {
    model: Option<String>,
    tokens: Option<Vec<i64>>,
}

/// The model a tokenizer request names, or the only one declared.
async fn tokenizer_model(
    svc: &Service,
    model: Option<String>,
) -> OaiResult<Arc<crate::openai::engine::Loaded>> {
    let model = match (model, svc.models()) {
        (Some(m), _) => m,
        (None, [only]) => only.cfg.name.clone(),
        (None, _) => {
            return Err(OaiError::bad("`model` is required (several models are declared)", Some("model")))
        }
    };
    Ok(ready_model(svc, &model).await?.1)
}

async fn tokenize(State(svc): State<Arc<Service>>, headers: HeaderMap, body: Bytes) -> OaiResult<Response> {
    let b: TokenizeBody = parse(&headers, &body)?;
    let content = b.content.ok_or_else(|| OaiError::bad("`content` is required", Some("content")))?;
    let loaded = tokenizer_model(&svc, b.model).await?;
    let tokens = loaded.tok.encode(&content, b.add_special, true);
    METRICS.requests_ok.fetch_add(1, Ordering::Relaxed);
    Ok(Json(json!({"tokens": tokens})).into_response())
}

async fn detokenize(State(svc): State<Arc<Service>>, headers: HeaderMap, body: Bytes) -> OaiResult<Response> {
    let b: DetokenizeBody = parse(&headers, &body)?;
    let loaded = tokenizer_model(&svc, b.model).await?;
    let n_vocab = loaded.tok.n_vocab();
    let ids = b
        .tokens
        .unwrap_or_default()
        .into_iter()
        .map(|t| {
            u32::try_from(t).ok().filter(|&t| (t as usize) < n_vocab).ok_or_else(|| {
                OaiError::bad(
                    format!("token {t} is not in this model's vocabulary (0..{n_vocab})"),
                    Some("tokens"),
                )
            })
        })
        .collect::<OaiResult<Vec<u32>>>()?;
    let text = String::from_utf8_lossy(&loaded.tok.decode(&ids, false)).into_owned();
    METRICS.requests_ok.fetch_add(1, Ordering::Relaxed);
    Ok(Json(json!({"content": text})).into_response())
}

async fn chat_completions(
    State(svc): State<Arc<Service>>,
    headers: HeaderMap,
    body: Bytes,
) -> OaiResult<Response> {
    let received = Instant::now();
    let b: ChatBody = parse(&headers, &body)?;
    let msgs = b
        .messages
        .filter(|m| !m.is_empty())
        .ok_or_else(|| OaiError::bad("`messages` must be a non-empty list", Some("messages")))?;
    let p = prepare(&svc, b.common).await?;
    let Some(tmpl) = p.loaded.template.as_ref() else {
        return Err(OaiError::bad(
            format!("the model `{}` has no chat template", p.model.cfg.name),
            Some("model"),
        ));
    };
    let mut chat = Vec::with_capacity(msgs.len());
    for m in &msgs {
        if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "developer" | "tool") {
            return Err(OaiError::bad(format!("unknown role `{}`", m.role), Some("messages")));
        }
        let text = match &m.content {
            None => String::new(),
            Some(Content::Text(s)) => s.clone(),
            Some(Content::Parts(parts)) => {
                let mut s = String::new();
                for part in parts {
                    if part.kind != "text" {
                        return Err(OaiError::bad(
                            format!("content part `{}` is not supported", part.kind),
                            Some("messages"),
                        ));
                    }
                    s.push_str(part.text.as_deref().unwrap_or(""));
                }
                s
            }
        };
        let role = if m.role == "developer" { "system" } else { m.role.as_str() };
        chat.push(ChatMessage::new(role, &text));
    }
    let text = tmpl
        .apply(&chat, true)
        .map_err(|e| OaiError::bad(format!("chat template: {e}"), Some("messages")))?;
    let tokens = p.loaded.tok.encode(&text, p.loaded.tok.add_bos(), true);
    run(p, tokens, Kind::Chat, received).await
}

/// Queues the request (429 when the model's slots and queue are full) and answers it.
async fn run(p: Prepared, prompt: Vec<u32>, kind: Kind, received: Instant) -> OaiResult<Response> {
    if prompt.is_empty() {
        return Err(OaiError::bad("the prompt has no tokens", Some("prompt")));
    }
    if prompt.len() as u64 >= p.loaded.slot_ctx {
        return Err(OaiError::bad(
            format!(
                "the prompt has {} tokens; the model's context per request is {}",
                prompt.len(),
                p.loaded.slot_ctx
            ),
            Some("prompt"),
        ));
    }
    let permit = p.model.permits.clone().try_acquire_owned().map_err(|_| {
        OaiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
            "queue_full",
            format!("model `{}` is busy: every slot and queue place is taken, retry later", p.model.cfg.name),
        )
    })?;
    let svc = crate::openai::service();
    let timeout = svc.map(|s| s.cfg.request_timeout).unwrap_or(crate::openai::DEFAULT_REQUEST_TIMEOUT);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let prefix = if kind == Kind::Chat { "chatcmpl" } else { "cmpl" };
    let id = format!("{prefix}-{:016x}", rand::random::<u64>());
    let job = Job {
        prompt,
        sampler: p.sampler,
        max_tokens: p.max_tokens,
        stop: p.stop,
        deadline: received.max(p.ready_at) + timeout,
        events: tx,
        id: id.clone(),
        received,
    };
    p.loaded
        .submit(job)
        .map_err(|e| OaiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "engine_stopped", e))?;
    let meta = Meta {
        id,
        created: unix_now(),
        model: p.model.cfg.name.clone(),
        kind,
        include_usage: p.include_usage,
    };
    if p.stream {
        let s = sse_stream(meta, rx, permit);
        return Ok(Sse::new(s).into_response());
    }
    let mut rx = rx;
    let mut text = String::new();
    let fin = loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done(f)) => break f,
            Some(Event::Error(e)) => return Err(engine_error(e)),
            None => {
                return Err(OaiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    "engine_stopped",
                    "the engine stopped",
                ))
            }
        }
    };
    drop(permit);
    METRICS.requests_ok.fetch_add(1, Ordering::Relaxed);
    let choice = match kind {
        Kind::Completion => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": fin.reason}),
        Kind::Chat => {
            json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": fin.reason})
        }
    };
    Ok(Json(json!({
        "id": meta.id,
        "object": if kind == Kind::Chat { "chat.completion" } else { "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
        "usage": usage(&fin),
    }))
    .into_response())
}

fn engine_error(e: String) -> OaiError {
    if e.contains("timed out") {
        OaiError::new(StatusCode::GATEWAY_TIMEOUT, "server_error", "timeout", e)
    } else {
        OaiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "engine_error", e)
    }
}

fn usage(f: &Finish) -> Value {
    json!({"prompt_tokens": f.prompt_tokens, "completion_tokens": f.completion_tokens, "total_tokens": f.prompt_tokens + f.completion_tokens})
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    include_usage: bool,
}

impl Meta {
    fn chunk(&self, delta_text: Option<&str>, first: bool, finish: Option<&str>) -> Value {
        let choice = match self.kind {
            Kind::Completion => {
                json!({"index": 0, "text": delta_text.unwrap_or(""), "logprobs": null, "finish_reason": finish})
            }
            Kind::Chat => {
                let mut delta = json!({});
                if first {
                    delta["role"] = json!("assistant");
                }
                if let Some(t) = delta_text {
                    delta["content"] = json!(t);
                }
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
        };
        json!({
            "id": self.id,
            "object": if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        })
    }
}

fn data(v: &Value) -> Result<SseEvent, Infallible> {
    Ok(SseEvent::default().data(v.to_string()))
}

/// The events of a streamed answer; dropping it (the client left) closes the receiver, which
/// cancels the sequence.
fn sse_stream(
    meta: Meta,
    rx: UnboundedReceiver<Event>,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let head = if meta.kind == Kind::Chat { Some(data(&meta.chunk(Some(""), true, None))) } else { None };
    let state = (Some(rx), meta, Some(permit));
    let body = stream::unfold(state, |(rx, meta, permit)| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Some(Event::Text(t)) => {
                Some((vec![data(&meta.chunk(Some(&t), false, None))], (Some(rx), meta, permit)))
            }
            Some(Event::Done(f)) => {
                let mut out = vec![data(&meta.chunk(None, false, Some(f.reason)))];
                if meta.include_usage {
                    let mut u = meta.chunk(None, false, None);
                    u["choices"] = json!([]);
                    u["usage"] = usage(&f);
                    out.push(data(&u));
                }
                out.push(Ok(SseEvent::default().data("[DONE]")));
                METRICS.requests_ok.fetch_add(1, Ordering::Relaxed);
                drop(permit);
                Some((out, (None, meta, None)))
            }
            Some(Event::Error(e)) => {
                let err = engine_error(e);
                let (c, _) = (&METRICS.requests_server_error, ());
                c.fetch_add(1, Ordering::Relaxed);
                Some((vec![data(&err.body()), Ok(SseEvent::default().data("[DONE]"))], (None, meta, None)))
            }
            None => None,
        }
    });
    stream::iter(head).chain(body.flat_map(stream::iter))
}
