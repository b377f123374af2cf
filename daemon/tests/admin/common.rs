//! Test harness: an `AdminState` in a temp dir, requests through the router without sockets, a tiny
//! GGUF model, and an in-process RPC server.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use compute::gguf::{Array, GgufWriter};
use http_body_util::BodyExt;
use llamad::admin::{AdminConfig, AdminState};
use serde_json::Value;
use tower::ServiceExt;

/// An admin API over a temp state dir.
pub struct Api {
    pub app: Router,
    pub token: String,
}

pub fn rpc_shared() -> Arc<llamad::Shared> {
    llamad::Shared::new(llamad::Config { threads: 1, mem: Some(16 << 20), ..llamad::Config::default() })
}

pub fn config(dir: &Path) -> AdminConfig {
    AdminConfig {
        probe_interval: Duration::ZERO,
        probe_timeout: Duration::from_secs(2),
        ..AdminConfig::with_state_dir(dir)
    }
}

impl Api {
    /// A state in `dir` (created or reopened), with the cache if given.
    pub fn open(dir: &Path, cache: Option<Arc<cachestore::Store>>, rpc: Arc<llamad::Shared>) -> Api {
        let state = AdminState::new(config(dir), rpc, Some("127.0.0.1:50052".into()), cache).unwrap();
        let token = state.token().expose().to_string();
        Api { app: llamad::admin::router(state), token }
    }

    pub fn new(dir: &Path) -> Api {
        Api::open(dir, None, rpc_shared())
    }

    /// One request with an optional bearer token and JSON body.
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (StatusCode, Bytes) {
        let mut b = Request::builder().method(Method::from_bytes(method.as_bytes()).unwrap()).uri(path);
        if let Some(t) = token {
            b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = match body {
            Some(v) => {
                b.header(header::CONTENT_TYPE, "application/json").body(Body::from(v.to_string())).unwrap()
            }
            None => b.body(Body::empty()).unwrap(),
        };
        let rsp = self.app.clone().oneshot(req).await.unwrap();
        let status = rsp.status();
        let bytes = tokio::time::timeout(Duration::from_secs(120), rsp.into_body().collect())
            .await
            .expect("body within 120 s")
            .unwrap()
            .to_bytes();
        (status, bytes)
    }

    /// An authenticated request; the answer parsed as JSON.
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let (s, b) = self.raw(method, path, Some(&self.token), body.as_ref()).await;
        let v =
            serde_json::from_slice(&b).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&b).into()));
        (s, v)
    }

    /// `GET /metrics` as text.
    pub async fn metrics(&self) -> String {
        let (s, b) = self.raw("GET", "/metrics", Some(&self.token), None).await;
        assert_eq!(s, StatusCode::OK);
        String::from_utf8(b.to_vec()).unwrap()
    }
}

/// The value of a sample line `name value` in Prometheus text.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')).map(|v| v.trim().parse().unwrap())
    })
}

/// Serves RPC on 127.0.0.1:0 with `shared`; returns the address and a stop handle.
pub async fn rpc_server(
    shared: Arc<llamad::Shared>,
) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(llamad::serve(shared, listener, async move {
        let _ = rx.await;
    }));
    (addr, tx)
}

/// A deterministic pseudo-random stream (xorshift) in [-1, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Tokens of the tiny SentencePiece vocabulary: `<unk> <s> </s>`, 256 byte tokens, then a few pieces.
pub const TINY_VOCAB: usize = 3 + 256 + 8;

/// Writes a one-layer llama model (embedding 32, 2 heads of 16, one KV head, FFN 64, tied output)
/// with a SentencePiece tokenizer to `path`, as `compute/tests/model_gguf.rs` and `tokenizer.rs` build theirs.
pub fn write_tiny_model(path: &Path) {
    write_tiny_model_with(path, 1, 1);
}

/// [`write_tiny_model`] with `n_layer` layers and `hkv` KV heads (of 2 query heads): three layers
/// (llama.cpp's split gives two workers 2 + 1 with the output) and two KV heads let two workers share
/// it by layers or by rows.
pub fn write_tiny_model_with(path: &Path, n_layer: u64, hkv: u64) {
    let (e, h, d, f, nv) = (32u64, 2u64, 16u64, 64u64, TINY_VOCAB as u64);
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama");
    let u = |x: u64| compute::gguf::Value::U32(x as u32);
    w.add("llama.embedding_length", u(e));
    w.add("llama.block_count", u(n_layer));
    w.add("llama.feed_forward_length", u(f));
    w.add("llama.attention.head_count", u(h));
    w.add("llama.attention.head_count_kv", u(hkv));
    w.add("llama.attention.key_length", u(d));
    w.add("llama.attention.value_length", u(d));
    w.add("llama.attention.layer_norm_rms_epsilon", compute::gguf::Value::F32(1e-5));
    w.add("llama.rope.freq_base", compute::gguf::Value::F32(10000.0));
    w.add("llama.context_length", u(4096));
    w.add("llama.vocab_size", u(nv));
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2i32, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for p in ["▁", "a", "b", "c", "ab", "bc", "▁a", "abc"] {
        tokens.push(p.into());
        types.push(1);
    }
    let scores: Vec<f32> = (0..tokens.len()).map(|i| -(i as f32) / 10.0).collect();
    assert_eq!(tokens.len(), TINY_VOCAB);
    w.add("tokenizer.ggml.model", "llama");
    w.add("tokenizer.ggml.tokens", Array::String(tokens));
    w.add("tokenizer.ggml.scores", scores);
    w.add("tokenizer.ggml.token_type", types);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut add = |w: &mut GgufWriter, name: &str, ne: &[u64], scale: f32, offset: f32| {
        let n: u64 = ne.iter().product();
        let v: Vec<f32> = (0..n).map(|_| offset + scale * rng.next()).collect();
        w.add_f32_tensor(name, ne, &v).unwrap();
    };
    add(&mut w, "token_embd.weight", &[e, nv], 1.0, 0.0);
    add(&mut w, "output_norm.weight", &[e], 0.2, 1.0);
    for il in 0..n_layer {
        let n = |x: &str| format!("blk.{il}.{x}");
        add(&mut w, &n("attn_norm.weight"), &[e], 0.2, 1.0);
        add(&mut w, &n("attn_q.weight"), &[e, h * d], 0.25, 0.0);
        add(&mut w, &n("attn_k.weight"), &[e, hkv * d], 0.25, 0.0);
        add(&mut w, &n("attn_v.weight"), &[e, hkv * d], 0.25, 0.0);
        add(&mut w, &n("attn_output.weight"), &[h * d, e], 0.25, 0.0);
        add(&mut w, &n("ffn_norm.weight"), &[e], 0.2, 1.0);
        add(&mut w, &n("ffn_gate.weight"), &[e, f], 0.25, 0.0);
        add(&mut w, &n("ffn_up.weight"), &[e, f], 0.25, 0.0);
        add(&mut w, &n("ffn_down.weight"), &[f, e], 0.2, 0.0);
    }
    w.write_file(path).unwrap();
}

/// Parses an SSE body into `(event, data as JSON)`.
pub fn parse_sse(body: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for block in body.split("\n\n") {
        let (mut ev, mut data) = (None, String::new());
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                ev = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        if let Some(ev) = ev {
            out.push((ev, serde_json::from_str(&data).unwrap()));
        }
    }
    out
}
