//! Tokenizes text with a GGUF's tokenizer and prints the ids and pieces:
//! `cargo run -p compute --example tokenize -- MODEL.gguf "some text"`.
//! With `--bench FILE` instead of the text, it times the tokenizer on FILE's contents.

use std::time::Instant;

use anyhow::Context;
use compute::gguf::Gguf;
use compute::tokenizer::Tokenizer;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().context("usage: tokenize MODEL.gguf TEXT | --bench FILE")?;
    let t0 = Instant::now();
    // SAFETY: the file is only read while this short-lived process runs; we do not modify it.
    let g = unsafe { Gguf::open(model) }.with_context(|| format!("opening {model}"))?;
    let t1 = Instant::now();
    let tok = Tokenizer::from_gguf(&g)?;
    let t2 = Instant::now();
    eprintln!(
        "parse {:.1} ms, tokenizer {:.1} ms, {} tokens",
        (t1 - t0).as_secs_f64() * 1e3,
        (t2 - t1).as_secs_f64() * 1e3,
        tok.n_vocab()
    );
    if args.get(1).map(String::as_str) == Some("--bench") {
        let path = args.get(2).context("--bench needs a file")?;
        let text = std::fs::read_to_string(path)?;
        let t = Instant::now();
        let ids = tok.encode(&text, false, true);
        let dt = t.elapsed().as_secs_f64();
        println!(
            "{} bytes -> {} tokens in {:.3} s: {:.2} MB/s, {:.0} tokens/s",
            text.len(),
            ids.len(),
            dt,
            text.len() as f64 / dt / 1e6,
            ids.len() as f64 / dt
        );
        return Ok(());
    }
    let text = args.get(1).context("no text given")?;
    for id in tok.encode(text, true, true) {
        println!("{id:>7} {:?}", String::from_utf8_lossy(tok.decode_token(id)));
    }
    Ok(())
}
