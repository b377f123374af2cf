//! SentencePiece (`tokenizer.ggml.model = "llama"`): score-driven merges over UTF-8 characters,
//! with byte fallback.
//!
//! ref: ggml-compute-semantics.md §6.3. Spaces become `▁` (U+2581); adjacent pairs whose
//! concatenation is a vocabulary token are merged highest score first (ties: leftmost); symbols
//! that are not tokens are emitted byte by byte as `<0xXX>`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::Vocab;

/// SentencePiece's whitespace marker.
pub const SPACE_MARK: &str = "\u{2581}";

#[derive(PartialEq)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Eq for Bigram {}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // Max-heap: highest score first, then the lowest left index.
        self.score.total_cmp(&other.score).then(other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// The id of byte `b`: `<0xXX>` (upper-case hex), else the one-byte token, else `unk`.
pub fn byte_token(vocab: &Vocab, b: u8, unk: Option<u32>) -> Option<u32> {
    vocab
        .id_of(&format!("<0x{b:02X}>"))
        .or_else(|| std::str::from_utf8(&[b]).ok().and_then(|s| vocab.id_of(s)))
        .or(unk)
}

/// Tokenizes one raw-text fragment: `text` already carries the space prefix, if any; spaces are
/// escaped here.
pub fn encode_fragment(vocab: &Vocab, text: &str, unk: Option<u32>, out: &mut Vec<u32>) {
    let text = text.replace(' ', SPACE_MARK);
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (i, (start, c)) in text.char_indices().enumerate() {
        symbols.push(Symbol {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: Some(i + 1).filter(|_| start + c.len_utf8() < text.len()),
        });
    }
    let mut queue = BinaryHeap::new();
    let push = |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], l: Option<usize>, r: Option<usize>| {
        if let (Some(l), Some(r)) = (l, r) {
            let (a, b) = (symbols[l], symbols[r]);
            let piece = &text[a.start..b.start + b.len];
            if let Some(id) = vocab.id_of(piece) {
                queue.push(Bigram { score: vocab.score(id), left: l, right: r, len: a.len + b.len });
            }
        }
    };
    for i in 1..symbols.len() {
        push(&mut queue, &symbols, Some(i - 1), Some(i));
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.len || l.next != Some(b.right) {
            continue;
        }
        symbols[b.left].len += r.len;
        symbols[b.right].len = 0;
        symbols[b.left].next = r.next;
        if let Some(n) = r.next {
            symbols[n].prev = Some(b.left);
        }
        let (lp, ln) = (symbols[b.left].prev, symbols[b.left].next);
        push(&mut queue, &symbols, lp, Some(b.left));
        push(&mut queue, &symbols, Some(b.left), ln);
    }
    // Every merged symbol is a token (merges only form tokens), so a final symbol is either a token
    // or a single character the vocabulary lacks, which falls back to its bytes.
    for s in symbols.iter().filter(|s| s.len > 0) {
        let piece = &text[s.start..s.start + s.len];
        match vocab.id_of(piece) {
            Some(id) => out.push(id),
            None => out.extend(piece.bytes().filter_map(|b| byte_token(vocab, b, unk))),
        }
    }
}

/// The byte a `<0xXX>` token stands for.
pub fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
