//! Test support: in-process llamad workers, running the `llamactl` binary, a tiny random llama
//! model (with a byte-level BPE tokenizer) written with the GGUF writer.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::thread::JoinHandle;

use compute::gguf::{GgufWriter, Value};
use compute::quant::kernels;
use compute::GgmlType;
use llamad::{Config, Shared};

/// A llamad worker running in-process on 127.0.0.1:0; stopped on drop.
pub struct Worker {
    pub addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    pub fn start(mem: u64) -> Worker {
        Worker::with_shared(Shared::new(Config { threads: 1, mem: Some(mem), ..Config::default() }))
    }

    /// A worker over caller-held state (to read its command counters, or give it a cache).
    pub fn with_shared(shared: Arc<Shared>) -> Worker {
        let (tx_addr, rx_addr) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt =
                tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx_addr.send(l.local_addr().unwrap()).unwrap();
                llamad::serve(shared, l, async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
            });
        });
        let addr = rx_addr.recv().unwrap().to_string();
        Worker { addr, stop: Some(stop), thread: Some(thread) }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs `llamactl` with `args`.
pub fn llamactl(args: &[&str]) -> Output {
    llamactl_cmd().args(args).output().unwrap()
}

/// A `llamactl` command whose user cache directory (`$XDG_CACHE_HOME`, where the hash memo lives)
/// is a temporary directory of this test process, so tests neither read nor litter the real one.
/// Its default split mode is `layer` (`LLAMACTL_SPLIT_MODE`): these tests compare texts bit for bit
/// with in-process runs and llama.cpp, which split mode `auto` would trade for speed where it picks
/// `row`; the tests of `auto` itself clear the variable.
pub fn llamactl_cmd() -> Command {
    static CACHE_HOME: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let home = CACHE_HOME.get_or_init(|| tempfile::tempdir().unwrap());
    let mut c = Command::new(env!("CARGO_BIN_EXE_llamactl"));
    c.env("XDG_CACHE_HOME", home.path()).env("LLAMACTL_SPLIT_MODE", "layer");
    c
}

/// Runs `llamactl run` and returns stdout (raw bytes: a random model emits any byte), failing
/// the test with stderr on a non-zero exit.
pub fn run_ok(args: &[&str]) -> Vec<u8> {
    let mut full = vec!["run"];
    full.extend_from_slice(args);
    let out = llamactl(&full);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "llamactl {full:?} failed ({:?}):\n{stderr}", out.status);
    out.stdout
}

/// [`run_ok`] for output that must be UTF-8.
pub fn run_text(args: &[&str]) -> String {
    String::from_utf8(run_ok(args)).unwrap()
}

/// The SmolLM2 model: `$LLAMAD_MODEL`, else `models/SmolLM2-135M-Instruct.Q4_1.gguf`; panics
/// with instructions when absent.
pub fn smollm2() -> PathBuf {
    if let Ok(p) = std::env::var("LLAMAD_MODEL") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "LLAMAD_MODEL={} does not exist", p.display());
        return p;
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "SmolLM2 model not found at {}: run scripts/fetch-model.sh or set LLAMAD_MODEL",
        p.display()
    );
    p
}

/// GPT-2's byte → printable character mapping (the byte-level BPE alphabet).
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut out = vec!['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let c = if printable.contains(&b) {
            b
        } else {
            next += 1;
            next - 1
        };
        out[b as usize] = char::from_u32(c).unwrap();
    }
    out
}

/// A small xorshift generator (deterministic weights without extra crates).
struct Rng(u64);

impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Writes a tiny random llama model (E 64, 4 layers, GQA 4/2, F 96, 260 tokens) to `path`.
/// Matrices are Q8_0 and F16, norms F32, the embedding Q8_0 (so the master's dequantized lookup
/// is exercised), with a separate F32 output head.
pub fn write_tiny_model(path: &Path, n_layer: usize) {
    write_tiny_model_arch(path, n_layer, "llama");
}

/// [`write_tiny_model`] for another `general.architecture`: `qwen2` adds Q/K/V biases, `qwen3`
/// Q/K norms, `gemma3` Q/K norms, post-attention/FFN norms, a sliding window of 3 on every
/// other layer and a tied LM head; any other name keeps llama's tensors.
pub fn write_tiny_model_arch(path: &Path, n_layer: usize, arch: &str) {
    let (e, h, hkv, d, f, nv) = (64u64, 4u64, 2u64, 16u64, 96u64, 260u64);
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String(arch.into()));
    w.add("general.name", Value::String("tiny-random".into()));
    let k = |x: &str| format!("{arch}.{x}");
    for (key, v) in [
        ("embedding_length", e),
        ("block_count", n_layer as u64),
        ("feed_forward_length", f),
        ("attention.head_count", h),
        ("attention.head_count_kv", hkv),
        ("attention.key_length", d),
        ("attention.value_length", d),
        ("context_length", 512),
        ("vocab_size", nv),
    ] {
        w.add(&k(key), Value::U32(v as u32));
    }
    w.add(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-5));
    w.add(&k("rope.freq_base"), Value::F32(10000.0));
    let gemma = arch == "gemma3";
    if gemma {
        w.add(&k("attention.sliding_window"), Value::U32(3));
        w.add(&k("attention.sliding_window_pattern"), Value::U32(2));
        w.add(&k("rope.freq_base_swa"), Value::F32(10000.0));
    }
    // Byte-level BPE: 256 byte tokens, a few merges, an end-of-text token.
    let chars = byte_chars();
    let mut tokens: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    let merges = ["Ġ t", "h e", "Ġt he"];
    tokens.extend(["Ġt", "he", "Ġthe"].iter().map(|s| s.to_string()));
    tokens.push("<|endoftext|>".into());
    assert_eq!(tokens.len() as u64, nv);
    let mut types = vec![1i32; tokens.len()];
    *types.last_mut().unwrap() = 3;
    w.add("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.add("tokenizer.ggml.pre", Value::String("default".into()));
    w.add_strings("tokenizer.ggml.tokens", &tokens);
    w.add("tokenizer.ggml.token_type", compute::gguf::Array::I32(types));
    w.add_strings("tokenizer.ggml.merges", &merges);
    w.add("tokenizer.ggml.eos_token_id", Value::U32(nv as u32 - 1));
    w.add("tokenizer.ggml.bos_token_id", Value::U32(nv as u32 - 1));
    w.add("tokenizer.ggml.add_bos_token", Value::Bool(false));

    let mut add = |w: &mut GgufWriter, name: &str, dtype: GgmlType, ne: &[u64], scale: f32, offset: f32| {
        let n: u64 = ne.iter().product();
        let vals: Vec<f32> = (0..n).map(|_| offset + scale * rng.next_f32()).collect();
        if dtype == GgmlType::F32 {
            w.add_f32_tensor(name, ne, &vals).unwrap();
            return;
        }
        let row = dtype.row_size(ne[0]).unwrap() as usize;
        let rows = (n / ne[0]) as usize;
        let mut q = vec![0u8; row * rows];
        let from = kernels(dtype).from_f32.unwrap();
        for (src, dst) in vals.chunks_exact(ne[0] as usize).zip(q.chunks_exact_mut(row)) {
            from(src, dst);
        }
        w.add_tensor(name, dtype, ne, q).unwrap();
    };
    let lin = |k: u64| 1.5 / (k as f32).sqrt();
    add(&mut w, "token_embd.weight", GgmlType::Q8_0, &[e, nv], 1.0, 0.0);
    add(&mut w, "output_norm.weight", GgmlType::F32, &[e], 0.2, 1.0);
    if !gemma {
        add(&mut w, "output.weight", GgmlType::F32, &[e, nv], lin(e), 0.0);
    }
    for il in 0..n_layer {
        let b = |n: &str| format!("blk.{il}.{n}");
        add(&mut w, &b("attn_norm.weight"), GgmlType::F32, &[e], 0.2, 1.0);
        add(&mut w, &b("attn_q.weight"), GgmlType::F16, &[e, h * d], lin(e), 0.0);
        add(&mut w, &b("attn_k.weight"), GgmlType::F16, &[e, hkv * d], lin(e), 0.0);
        add(&mut w, &b("attn_v.weight"), GgmlType::Q8_0, &[e, hkv * d], lin(e), 0.0);
        add(&mut w, &b("attn_output.weight"), GgmlType::Q8_0, &[h * d, e], lin(h * d), 0.0);
        if arch == "qwen2" {
            add(&mut w, &b("attn_q.bias"), GgmlType::F32, &[h * d], 0.3, 0.0);
            add(&mut w, &b("attn_k.bias"), GgmlType::F32, &[hkv * d], 0.3, 0.0);
            add(&mut w, &b("attn_v.bias"), GgmlType::F32, &[hkv * d], 0.3, 0.0);
        }
        if arch == "qwen3" || gemma {
            add(&mut w, &b("attn_q_norm.weight"), GgmlType::F32, &[d], 0.2, 1.0);
            add(&mut w, &b("attn_k_norm.weight"), GgmlType::F32, &[d], 0.2, 1.0);
        }
        if gemma {
            add(&mut w, &b("post_attention_norm.weight"), GgmlType::F32, &[e], 0.2, 1.0);
            add(&mut w, &b("post_ffw_norm.weight"), GgmlType::F32, &[e], 0.2, 1.0);
        }
        add(&mut w, &b("ffn_norm.weight"), GgmlType::F32, &[e], 0.2, 1.0);
        add(&mut w, &b("ffn_gate.weight"), GgmlType::Q8_0, &[e, f], lin(e), 0.0);
        add(&mut w, &b("ffn_up.weight"), GgmlType::F16, &[e, f], lin(e), 0.0);
        add(&mut w, &b("ffn_down.weight"), GgmlType::Q8_0, &[f, e], lin(f), 0.0);
    }
    w.write_file(path).unwrap();
}
