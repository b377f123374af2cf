//! Synthetic models (`compute::model::synth`, `llamactl synth`): the file has the shape and weight
//! type asked for, reads back as a model that runs (finite logits), and the weights depend on the
//! seed and nothing else.

use std::sync::Arc;

use compute::gguf::{Gguf, GgufWriter, Value};
use compute::model::synth::{synthesize, Arch, Experts, Shape, Spec};
use compute::model::{Model, Session, SessionConfig, WeightSource};
use compute::GgmlType;

/// A GGUF holding only a 300-token SentencePiece vocabulary.
fn tokenizer(dir: &std::path::Path) -> Gguf {
    let mut w = GgufWriter::new();
    let tokens: Vec<String> = (0..300)
        .map(|i| match i {
            0 => "<unk>".into(),
            1 => "<s>".into(),
            2 => "</s>".into(),
            _ => format!("\u{2581}t{i}"),
        })
        .collect();
    w.add("tokenizer.ggml.model", "llama");
    w.add_strings("tokenizer.ggml.tokens", &tokens);
    w.add(
        "tokenizer.ggml.scores",
        Value::Array(compute::gguf::Array::F32((0..300).map(|i| -(i as f32)).collect())),
    );
    w.add("tokenizer.ggml.token_type", Value::Array(compute::gguf::Array::I32(vec![1; 300])));
    w.add("tokenizer.ggml.bos_token_id", Value::U32(1));
    let path = dir.join("tok.gguf");
    w.write_file(&path).unwrap();
    Gguf::load_resident(&path).unwrap()
}

fn synth(tok: &Gguf, wtype: GgmlType, seed: u64, dir: &std::path::Path) -> Gguf {
    let shape = Shape { embd: 256, ff: 512, heads: 4, kv_heads: 2, layers: 2 };
    let w = synthesize(&Spec {
        arch: Arch::Llama,
        experts: Experts::default(),
        shape,
        wtype,
        seed,
        tokenizer: tok,
        threads: 2,
    })
    .unwrap();
    let path = dir.join(format!("synth-{wtype}-{seed}.gguf"));
    w.write_file(&path).unwrap();
    Gguf::load_resident(&path).unwrap()
}

#[test]
fn synthetic_models_have_the_shape_and_type_asked_for_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path());
    for wtype in [GgmlType::Q4_0, GgmlType::IQ2_XS, GgmlType::TQ2_0, GgmlType::IQ4_XS] {
        let g = synth(&tok, wtype, 7, dir.path());
        assert_eq!(g.get_u32("llama.embedding_length").unwrap(), 256);
        assert_eq!(g.get_u32("llama.block_count").unwrap(), 2);
        assert_eq!(g.get_u32("llama.attention.head_count_kv").unwrap(), 2);
        assert_eq!(g.get_str_array_opt("tokenizer.ggml.tokens").unwrap().unwrap().len(), 300);
        let k = WeightSource::tensor(&g, "blk.1.attn_k.weight").unwrap();
        assert_eq!((k.dtype, k.ne[0], k.ne[1]), (wtype, 256, 128));
        assert_eq!(WeightSource::tensor(&g, "blk.0.ffn_down.weight").unwrap().dtype, wtype);
        let model = Model::new(Arc::new(g)).unwrap();
        let mut s = Session::new(model, SessionConfig { n_ctx: 32, ..SessionConfig::default() }).unwrap();
        let logits = s.decode(&[1, 5, 9]).unwrap().to_vec();
        assert_eq!(logits.len(), 300);
        assert!(logits.iter().all(|v| v.is_finite()), "{wtype}: non-finite logits");
        assert!(logits.iter().any(|&v| v != logits[0]), "{wtype}: constant logits");
    }
}

#[test]
fn synthetic_weights_depend_on_the_seed_only() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path());
    let bytes = |g: &Gguf| WeightSource::tensor(g, "blk.0.attn_q.weight").unwrap().data.to_vec();
    let a = synth(&tok, GgmlType::Q4_K, 3, dir.path());
    let b = synth(&tok, GgmlType::Q4_K, 4, dir.path());
    let again = synthesize(&Spec {
        arch: Arch::Llama,
        experts: Experts::default(),
        shape: Shape { embd: 256, ff: 512, heads: 4, kv_heads: 2, layers: 2 },
        wtype: GgmlType::Q4_K,
        seed: 3,
        tokenizer: &tok,
        threads: 1,
    })
    .unwrap()
    .to_bytes()
    .unwrap();
    assert_eq!(std::fs::read(dir.path().join("synth-q4_K-3.gguf")).unwrap(), again);
    assert_ne!(bytes(&a), bytes(&b));
    // 576-wide rows are not whole 256-element blocks: refused with the numbers.
    let bad = Shape { embd: 576, ff: 1536, heads: 9, kv_heads: 3, layers: 1 };
    let e = synthesize(&Spec {
        arch: Arch::Llama,
        experts: Experts::default(),
        shape: bad,
        wtype: GgmlType::IQ2_XS,
        seed: 1,
        tokenizer: &tok,
        threads: 1,
    })
    .err()
    .unwrap();
    assert!(e.to_string().contains("576"), "{e}");
}

#[test]
fn every_architecture_synthesizes_a_model_that_runs() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path());
    let shape = Shape { embd: 128, ff: 256, heads: 4, kv_heads: 2, layers: 2 };
    let experts = Experts { count: 4, used: 2, ff: 64, shared_ff: 96 };
    for arch in Arch::ALL {
        let w = synthesize(&Spec {
            arch,
            experts,
            shape,
            wtype: GgmlType::Q8_0,
            seed: 5,
            tokenizer: &tok,
            threads: 2,
        })
        .unwrap();
        let path = dir.path().join(format!("{}.gguf", arch.name()));
        w.write_file(&path).unwrap();
        let g = Gguf::load_resident(&path).unwrap();
        assert_eq!(g.get_str("general.architecture").unwrap(), arch.name());
        let has = |n: &str| WeightSource::tensor(&g, n).is_some();
        assert_eq!(has("blk.1.attn_q.bias"), matches!(arch, Arch::Qwen2 | Arch::Qwen2Moe), "{arch:?}");
        assert_eq!(
            has("blk.0.attn_k_norm.weight"),
            matches!(arch, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3)
        );
        assert_eq!(has("blk.0.ffn_up_exps.weight"), matches!(arch, Arch::Qwen2Moe | Arch::Qwen3Moe));
        assert_eq!(has("blk.0.ffn_up_shexp.weight"), arch == Arch::Qwen2Moe);
        assert_eq!(has("output.weight"), arch != Arch::Gemma3, "Gemma 3 ties its output to the embeddings");
        if has("blk.0.ffn_down_exps.weight") {
            let d = WeightSource::tensor(&g, "blk.0.ffn_down_exps.weight").unwrap();
            assert_eq!((d.ne[0], d.ne[1], d.ne[2]), (64, 128, 4));
        }
        let model = Model::new(Arc::new(g)).unwrap();
        let mut s = Session::new(model, SessionConfig { n_ctx: 32, ..SessionConfig::default() }).unwrap();
        let logits = s.decode(&[1, 5, 9]).unwrap().to_vec();
        assert!(logits.iter().all(|v| v.is_finite()), "{arch:?}: non-finite logits");
        assert!(logits.iter().any(|&v| v != logits[0]), "{arch:?}: constant logits");
    }
}
