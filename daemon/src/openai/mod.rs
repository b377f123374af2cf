//! The OpenAI-compatible HTTP API (`--openai-listen`, `[openai]`): llamad as the front door of
//! the cluster. Off by default, on a listener of its own.
//!
//! - [`engine`]: each model (`--model NAME=PATH`, `[[models]]`) is loaded on a thread of its own,
//!   in-process or on the workers it names, and its scheduler batches the requests of its
//!   `parallel` slots into shared ubatches (`compute::model::BatchSession`).
//! - [`http`]: the routes (`GET /health`, `GET /v1/models`, `POST /v1/completions`,
//!   `POST /v1/chat/completions`, with and without `stream`), bearer keys, OpenAI's error JSON,
//!   the bounded queue (429 when full).
//! - [`text`]: stop strings; [`metrics`]: counters and histograms in the admin API's `/metrics`.

pub mod engine;
pub mod http;
pub mod metrics;
pub mod text;

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use llamad_master::SplitMode;
use serde::Deserialize;

use crate::error::{Error, Result};
pub use engine::ModelHandle;

/// Default of [`OpenAiConfig::queue`]: requests that may wait beyond a model's slots.
pub const DEFAULT_QUEUE: usize = 32;
/// Default of [`ModelConfig::ctx`]: KV cells per slot.
pub const DEFAULT_CTX: u64 = 2048;
/// Default of [`OpenAiConfig::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
/// Default of [`ModelConfig::ubatch`].
pub const DEFAULT_UBATCH: u64 = 512;

/// `[openai]` in the configuration file.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawOpenAi {
    /// `host:port` of the OpenAI API. Default: none (the API is off).
    pub listen: Option<String>,
    /// File of bearer keys, one per line (`#` comments). Without keys only a loopback address
    /// may be bound. Default: none.
    pub key_file: Option<PathBuf>,
    /// Requests that may wait beyond a model's slots before the API answers 429. Default 32.
    pub queue: Option<usize>,
    /// Longest time one request may take, in seconds. Default 600.
    pub request_timeout_secs: Option<u64>,
    /// Compute threads of in-process models. Default: the server's `threads`.
    pub threads: Option<usize>,
}

/// `[[models]]`: one model served by the OpenAI API.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    /// The name clients ask for (`model`).
    pub name: String,
    /// The GGUF file.
    pub path: PathBuf,
    /// Workers the model runs on: `host:port`, or addresses or labels of the admin API's worker
    /// registry (resolved when the model loads); empty = in this process. Default: none.
    #[serde(default)]
    pub workers: Vec<String>,
    /// `layer` or `row`. Default `layer`.
    pub split_mode: Option<String>,
    /// KV cells per slot (prompt plus generated tokens of one request). Default 2048.
    pub ctx: Option<u64>,
    /// Slots: requests decoded together, in-process or on workers with split mode `layer`
    /// (`auto` then means `layer`); split mode `row` has one. Default 1.
    pub parallel: Option<usize>,
    /// Most tokens in one ubatch (all slots together). Default 512.
    pub ubatch: Option<u64>,
    /// When the model is loaded: `start` (when llamad starts) or `request` (on its first request,
    /// which waits for the load). Default `start`.
    pub load: Option<String>,
}

/// A validated model entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    /// The name clients ask for.
    pub name: String,
    /// The GGUF file.
    pub path: PathBuf,
    /// Workers; empty = in-process.
    pub workers: Vec<String>,
    /// Split mode across the workers.
    pub split_mode: SplitMode,
    /// KV cells per slot.
    pub ctx: u64,
    /// Slots.
    pub parallel: usize,
    /// Most tokens in one ubatch.
    pub ubatch: u64,
    /// Loaded on its first request rather than at start.
    pub load_on_request: bool,
}

impl ModelConfig {
    /// Validates a raw entry.
    pub fn from_raw(r: &RawModel) -> Result<ModelConfig> {
        let bad = |m: String| Error::Config(format!("models.{}: {m}", r.name));
        if r.name.is_empty() || r.name.contains(char::is_whitespace) {
            return Err(Error::Config(format!(
                "models: name {:?} must be non-empty, without spaces",
                r.name
            )));
        }
        let split_mode = match r.split_mode.as_deref() {
            None | Some("layer") => SplitMode::Layer,
            Some("row") => SplitMode::Row,
            Some("auto") => SplitMode::Auto,
            Some(s) => return Err(bad(format!("split_mode {s:?} is not layer, row or auto"))),
        };
        let ctx = r.ctx.unwrap_or(DEFAULT_CTX);
        if ctx < 16 {
            return Err(bad(format!("ctx {ctx} is too small")));
        }
        let parallel = r.parallel.unwrap_or(1);
        if parallel == 0 || parallel > 256 {
            return Err(bad(format!("parallel {parallel} is not in 1..=256")));
        }
        if !r.workers.is_empty() && parallel > 1 && split_mode == SplitMode::Row {
            return Err(bad(
                "parallel > 1 on workers needs split_mode layer (split mode row serves one request at a time)"
                    .into(),
            ));
        }
        let ubatch = r.ubatch.unwrap_or(DEFAULT_UBATCH);
        if ubatch == 0 {
            return Err(bad("ubatch must be at least 1".into()));
        }
        let load_on_request = match r.load.as_deref() {
            None | Some("start") => false,
            Some("request") => true,
            Some(s) => return Err(bad(format!("load {s:?} is not start or request"))),
        };
        Ok(ModelConfig {
            name: r.name.clone(),
            path: r.path.clone(),
            workers: r.workers.clone(),
            split_mode,
            ctx,
            parallel,
            ubatch,
            load_on_request,
        })
    }

    /// `--model NAME=PATH`.
    pub fn parse_flag(s: &str) -> Result<RawModel> {
        let (name, path) =
            s.split_once('=').ok_or_else(|| Error::Config(format!("--model {s:?}: expected NAME=PATH")))?;
        Ok(RawModel { name: name.to_string(), path: PathBuf::from(path), ..RawModel::default() })
    }
}

/// The validated `[openai]` settings (`Debug` shows how many keys, never the keys).
#[derive(Clone, PartialEq, Eq)]
pub struct OpenAiConfig {
    /// `host:port`.
    pub listen: String,
    /// Accepted bearer keys; empty = no authentication (loopback only).
    pub keys: Vec<String>,
    /// Requests that may wait beyond a model's slots.
    pub queue: usize,
    /// Longest time of one request.
    pub request_timeout: Duration,
    /// Compute threads of in-process models.
    pub threads: usize,
    /// The models.
    pub models: Vec<ModelConfig>,
}

impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("listen", &self.listen)
            .field("keys", &format_args!("{} key(s)", self.keys.len()))
            .field("queue", &self.queue)
            .field("request_timeout", &self.request_timeout)
            .field("threads", &self.threads)
            .field("models", &self.models)
            .finish()
    }
}

impl OpenAiConfig {
    /// Validates `[openai]` and the models; `None` when no listen address is set.
    pub fn from_raw(raw: &RawOpenAi, models: &[RawModel], threads: usize) -> Result<Option<OpenAiConfig>> {
        let Some(listen) = raw.listen.clone().filter(|l| !l.is_empty() && l != "off") else {
            return Ok(None);
        };
        let keys = match &raw.key_file {
            Some(p) => read_keys(p)?,
            None => Vec::new(),
        };
        let mut out: Vec<ModelConfig> = Vec::new();
        for m in models {
            let c = ModelConfig::from_raw(m)?;
            if out.iter().any(|o| o.name == c.name) {
                return Err(Error::Config(format!("models: {} is declared twice", c.name)));
            }
            out.push(c);
        }
        let threads = raw.threads.unwrap_or(threads);
        if threads == 0 {
            return Err(Error::Config("openai.threads: must be at least 1".into()));
        }
        Ok(Some(OpenAiConfig {
            listen,
            keys,
            queue: raw.queue.unwrap_or(DEFAULT_QUEUE),
            request_timeout: Duration::from_secs(
                raw.request_timeout_secs.unwrap_or(DEFAULT_REQUEST_TIMEOUT.as_secs()).max(1),
            ),
            threads,
            models: out,
        }))
    }
}

/// Bearer keys, one per line; blank lines and `#` comments skipped.
fn read_keys(p: &std::path::Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(p)
        .map_err(|e| Error::Config(format!("openai.key_file {}: {e}", p.display())))?;
    let keys: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    if keys.is_empty() {
        return Err(Error::Config(format!("openai.key_file {}: no keys", p.display())));
    }
    Ok(keys)
}

/// The running service: its models (for `/metrics` and the admin API's model list).
pub struct Service {
    models: Vec<Arc<ModelHandle>>,
    cfg: OpenAiConfig,
    /// The address the API listens on.
    pub local_addr: std::net::SocketAddr,
}

impl Service {
    /// The models, in declaration order.
    pub fn models(&self) -> &[Arc<ModelHandle>] {
        &self.models
    }

    /// A model by name.
    pub fn model(&self, name: &str) -> Option<&Arc<ModelHandle>> {
        self.models.iter().find(|m| m.cfg.name == name)
    }
}

static SERVICE: OnceLock<Arc<Service>> = OnceLock::new();

/// The process's service, once started.
pub fn service() -> Option<&'static Arc<Service>> {
    SERVICE.get()
}

/// Binds the API's listener (refusing a non-loopback address without keys), starts loading every
/// model not loaded on request, each on a thread of its own, and serves until `shutdown`.
pub async fn start(
    cfg: OpenAiConfig,
    opts: llamad_master::pipeline::SplitOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host(cfg.listen.as_str())
        .await
        .map_err(|e| Error::Config(format!("openai.listen {}: {e}", cfg.listen)))?
        .collect();
    let addr =
        *addrs.first().ok_or_else(|| Error::Config(format!("openai.listen {}: no address", cfg.listen)))?;
    if cfg.keys.is_empty() && !addr.ip().is_loopback() {
        return Err(Error::Config(format!(
            "openai.listen {addr}: not a loopback address and no API keys (set --openai-key-file)"
        )));
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Config(format!("openai.listen {addr}: {e}")))?;
    let local = listener.local_addr()?;
    let models: Vec<Arc<ModelHandle>> = cfg
        .models
        .iter()
        .map(|m| Arc::new(ModelHandle::new(m.clone(), cfg.queue, cfg.threads, opts.clone())))
        .collect();
    for m in models.iter().filter(|m| !m.cfg.load_on_request) {
        m.start_loading();
    }
    let svc = Arc::new(Service { models, cfg, local_addr: local });
    let _ = SERVICE.set(svc.clone());
    tracing::info!(addr = %local, models = svc.models.len(), keys = svc.cfg.keys.len(), "OpenAI API listening");
    let app = http::router(svc);
    Ok(tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(shutdown).await }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(name: &str) -> RawModel {
        RawModel { name: name.into(), path: "/m.gguf".into(), ..RawModel::default() }
    }

    #[test]
    fn off_without_listen_and_validated_with_it() {
        assert_eq!(OpenAiConfig::from_raw(&RawOpenAi::default(), &[model("a")], 2).unwrap(), None);
        let raw = RawOpenAi { listen: Some("127.0.0.1:8080".into()), ..RawOpenAi::default() };
        let c = OpenAiConfig::from_raw(&raw, &[model("a")], 2).unwrap().unwrap();
        assert_eq!((c.queue, c.threads, c.keys.len()), (DEFAULT_QUEUE, 2, 0));
        let m = &c.models[0];
        assert_eq!((m.parallel, m.ctx, m.split_mode), (1, DEFAULT_CTX, SplitMode::Layer));
        assert!(OpenAiConfig::from_raw(&raw, &[model("a"), model("a")], 2).is_err(), "duplicate");
        let bad = RawModel { split_mode: Some("column".into()), ..model("a") };
        assert!(OpenAiConfig::from_raw(&raw, &[bad], 2).is_err());
        let on_workers = RawModel { workers: vec!["h:1".into()], parallel: Some(4), ..model("a") };
        let c = OpenAiConfig::from_raw(&raw, std::slice::from_ref(&on_workers), 2).unwrap().unwrap();
        assert_eq!(c.models[0].parallel, 4, "slots on workers (layer split)");
        let row = RawModel { split_mode: Some("row".into()), ..on_workers };
        assert!(OpenAiConfig::from_raw(&raw, &[row], 2).is_err(), "parallel with split mode row");
        assert!(OpenAiConfig::from_raw(&raw, &[RawModel { parallel: Some(0), ..model("a") }], 2).is_err());
    }

    #[test]
    fn model_flags_and_key_files() {
        let m = ModelConfig::parse_flag("smol=/models/s.gguf").unwrap();
        assert_eq!((m.name.as_str(), m.path.to_str()), ("smol", Some("/models/s.gguf")));
        assert!(ModelConfig::parse_flag("no-path").is_err());
        let dir = std::env::temp_dir().join(format!("llamad-openai-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("keys");
        std::fs::write(&p, "# comment\n\n sk-a \nsk-b\n").unwrap();
        assert_eq!(read_keys(&p).unwrap(), vec!["sk-a".to_string(), "sk-b".to_string()]);
        let raw = RawOpenAi {
            listen: Some("127.0.0.1:1".into()),
            key_file: Some(p.clone()),
            ..RawOpenAi::default()
        };
        let c = OpenAiConfig::from_raw(&raw, &[], 1).unwrap().unwrap();
        let shown = format!("{c:?}");
        assert!(shown.contains("2 key(s)") && !shown.contains("sk-a"), "{shown}");
        std::fs::write(&p, "# only a comment\n").unwrap();
        assert!(read_keys(&p).is_err(), "a key file without keys");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
