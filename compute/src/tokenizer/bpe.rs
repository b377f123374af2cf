//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): the GPT-2 byte↔unicode mapping, merge
//! ranks, and the merge loop.
//!
//! ref: ggml-compute-semantics.md §6.1 steps 3–6 and 8. Each pre-tokenized piece is mapped byte by
//! byte into the GPT-2 alphabet, split into characters, and the adjacent pair with the lowest merge
//! rank (ties: leftmost) is merged until no pair has a rank.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::pre::PreTokenizer;
use super::vocab::Vocab;

/// The GPT-2 byte → code point table (§6.1 step 3).
pub fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        let kept = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let cp = if kept {
            u32::from(b)
        } else {
            let c = next;
            next += 1;
            c
        };
        table[b as usize] = char::from_u32(cp).unwrap_or('\u{FFFD}');
    }
    table
}

/// Byte-level BPE state: merge ranks and the pre-tokenizer.
#[derive(Debug)]
pub struct Bpe {
    /// `"left right"` → rank.
    ranks: HashMap<String, u32>,
    pre: PreTokenizer,
    ignore_merges: bool,
    byte_to_char: [char; 256],
    char_to_byte: HashMap<char, u8>,
}

/// A candidate merge in the queue: lowest rank first, then leftmost.
#[derive(PartialEq, Eq)]
struct Bigram {
    rank: u32,
    left: usize,
    right: usize,
    len: usize,
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap is a max-heap: the "greatest" is the lowest rank, then the lowest left.
        other.rank.cmp(&self.rank).then(other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// One symbol of a word being merged: a byte range of the mapped word, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Bpe {
    /// Builds the merge table from `tokenizer.ggml.merges` (priority order; each entry split at its
    /// first space not at position 0).
    pub fn new(merges: &[String], pre: PreTokenizer) -> Self {
        let mut ranks = HashMap::with_capacity(merges.len());
        for (i, m) in merges.iter().enumerate() {
            // ref: §5.1 `tokenizer.ggml.merges`. Entries without such a space are skipped.
            let Some(sp) = m.char_indices().skip(1).find(|&(_, c)| c == ' ').map(|(i, _)| i) else {
                tracing::warn!(merge = %m, "bpe merge without a separating space; skipped");
                continue;
            };
            debug_assert!(sp < m.len());
            // The first occurrence wins, as in llama.cpp's rank map.
            ranks.entry(m.clone()).or_insert(i as u32);
        }
        let byte_to_char = byte_to_char_table();
        let char_to_byte = byte_to_char.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
        let ignore_merges = pre.kind().ignore_merges();
        Bpe { ranks, pre, ignore_merges, byte_to_char, char_to_byte }
    }

    /// The pre-tokenizer.
    pub fn pre(&self) -> &PreTokenizer {
        &self.pre
    }

    /// Tokenizes one raw-text fragment (no special tokens in it), appending ids to `out`.
    pub fn encode_fragment(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut word = String::new();
        for piece in self.pre.split(text) {
            word.clear();
            word.extend(piece.bytes().map(|b| self.byte_to_char[b as usize]));
            self.encode_word(vocab, &word, out);
        }
    }

    fn rank(&self, key: &mut String, word: &str, l: &Symbol, r: &Symbol) -> Option<u32> {
        key.clear();
        key.push_str(&word[l.start..l.start + l.len]);
        key.push(' ');
        key.push_str(&word[r.start..r.start + r.len]);
        self.ranks.get(key.as_str()).copied()
    }

    fn encode_word(&self, vocab: &Vocab, word: &str, out: &mut Vec<u32>) {
        if self.ignore_merges {
            if let Some(id) = vocab.id_of(word) {
                out.push(id);
                return;
            }
        }
        let mut symbols: Vec<Symbol> = Vec::with_capacity(word.len());
        for (i, (start, c)) in word.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: Some(i + 1).filter(|_| start + c.len_utf8() < word.len()),
            });
        }
        let mut key = String::new();
        let mut queue = BinaryHeap::new();
        let mut push =
            |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], l: Option<usize>, r: Option<usize>| {
                if let (Some(l), Some(r)) = (l, r) {
                    if let Some(rank) = self.rank(&mut key, word, &symbols[l], &symbols[r]) {
                        queue.push(Bigram { rank, left: l, right: r, len: symbols[l].len + symbols[r].len });
                    }
                }
            };
        for i in 1..symbols.len() {
            push(&mut queue, &symbols, Some(i - 1), Some(i));
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            // Stale: one side was merged away, or the pair is no longer these two symbols.
            if l.len == 0 || r.len == 0 || l.next != Some(b.right) || l.len + r.len != b.len {
                continue;
            }
            symbols[b.left].len += r.len;
            symbols[b.right].len = 0;
            symbols[b.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(b.left);
            }
            let lp = symbols[b.left].prev;
            let ln = symbols[b.left].next;
            push(&mut queue, &symbols, lp, Some(b.left));
            push(&mut queue, &symbols, Some(b.left), ln);
        }
        for s in symbols.iter().filter(|s| s.len > 0) {
            let text = &word[s.start..s.start + s.len];
            match vocab.id_of(text) {
                Some(id) => out.push(id),
                None => {
                    // ref: §6.1 step 6: fall back to the symbol's single characters, dropping those
                    // the vocabulary lacks.
                    let mut buf = [0u8; 4];
                    for c in text.chars() {
                        if let Some(id) = vocab.id_of(c.encode_utf8(&mut buf)) {
                            out.push(id);
                        }
                    }
                }
            }
        }
    }

    /// Maps a token text in the GPT-2 alphabet back to bytes (§6.1 step 8). Characters outside the
    /// alphabet are kept as their UTF-8 bytes.
    pub fn decode_text(&self, text: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(text.len());
        let mut buf = [0u8; 4];
        for c in text.chars() {
            match self.char_to_byte.get(&c) {
                Some(&b) => out.push(b),
                None => out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes()),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_alphabet() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0], '\u{100}');
        assert_eq!(t[0xAD], '\u{143}');
        let mut seen: Vec<char> = t.to_vec();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 256);
    }
}
