//! The GGUF parser and what llamactl derives from a file: metadata, tensor table and data ranges,
//! hyper-parameters and the tokenizer. Hostile files must be errors, never panics.
#![no_main]

use compute::gguf::Gguf;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::from_bytes(data.to_vec()) else { return };
    let _ = g.version();
    let _ = g.alignment();
    for (k, _) in g.metadata() {
        let _ = g.get(k);
    }
    for t in g.tensors() {
        let _ = t.shape();
        let _ = t.dtype();
        if let Ok(d) = g.tensor_data(t) {
            std::hint::black_box(d.len());
        }
    }
    let _ = g.architecture();
    let _ = compute::model::HParams::from_source(&g);
    let _ = compute::tokenizer::Tokenizer::from_gguf(&g);
});
