//! Pre-tokenizers for byte-level BPE: the regex lists named by `tokenizer.ggml.pre`, and the split
//! that applies them in sequence.
//!
//! ref: ggml-compute-semantics.md §6.1 step 2, §6.2. Regex k+1 splits each piece produced by regex
//! k; both the matches and the unmatched gaps between them become pieces, and each regex only sees
//! its own piece (a look-ahead stops at the piece's end), as llama.cpp does.
//!
//! Known difference: `\p{L}`, `\p{N}` and `\s` come from the `regex` crate's Unicode 16 tables,
//! while llama.cpp's own tables are older; a character first assigned in Unicode 16 (for example
//! an Egyptian hieroglyph of Extended-A) is a letter here and an unassigned "other" character
//! there, so text containing one can split differently. Seeded random strings over older
//! characters match llama.cpp exactly (`random_unicode_matches_llama_cpp`).

use fancy_regex::Regex;

use crate::error::{Error, Result};

/// The GPT-2 pattern.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// The Llama 3 pattern (case-insensitive contractions spelled out).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The Qwen2 pattern: Llama 3 with digits one at a time.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The Tekken (Mistral Nemo) pattern, as llama.cpp emulates the HF original.
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Which regex family a `tokenizer.ggml.pre` name selects, and the per-family defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreKind {
    /// `llama3`, `llama-bpe`, ... (ignore_merges and add_bos default on).
    Llama3,
    /// `dbrx`, `smaug-bpe`: the Llama 3 regex without its defaults.
    Llama3Regex,
    /// `qwen2` and relatives.
    Qwen2,
    /// `smollm`, `starcoder` and relatives: digits isolated, then GPT-2.
    Smollm,
    /// `gpt-2` and relatives.
    Gpt2,
    /// `tekken` (ignore_merges and add_bos default on).
    Tekken,
    /// No or `default` pre-tokenizer.
    Default,
}

impl PreKind {
    /// The family of pre-tokenizer `name` (`None` = key absent), or an error for names we do not
    /// know (llama.cpp refuses those too).
    pub fn from_name(name: Option<&str>) -> Result<PreKind> {
        let Some(name) = name else { return Ok(PreKind::Default) };
        Ok(match name {
            "default" => PreKind::Default,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
            | "lfm2" | "jina-v5-nano" => PreKind::Llama3,
            "dbrx" | "smaug-bpe" => PreKind::Llama3Regex,
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "stablelm2" | "hunyuan" | "solar-open" => {
                PreKind::Qwen2
            }
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b"
            | "mellum2" => PreKind::Smollm,
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "mpt" | "olmo" | "jais" | "trillion"
            | "granite-docling" => PreKind::Gpt2,
            "tekken" => PreKind::Tekken,
            other => return Err(Error::Model(format!("unknown pre-tokenizer {other:?}"))),
        })
    }

    /// Whether a whole piece that is a vocabulary entry skips merging (§6.1 step 4).
    pub fn ignore_merges(self) -> bool {
        matches!(self, PreKind::Llama3 | PreKind::Tekken)
    }

    /// The default of `add_bos` for this family (§6.1 step 7).
    pub fn add_bos_default(self) -> bool {
        matches!(self, PreKind::Llama3 | PreKind::Tekken)
    }

    fn patterns(self) -> &'static [&'static str] {
        match self {
            PreKind::Llama3 | PreKind::Llama3Regex => &[LLAMA3],
            PreKind::Qwen2 => &[QWEN2],
            PreKind::Smollm => &[r"\p{N}", GPT2],
            PreKind::Gpt2 => &[GPT2],
            PreKind::Tekken => &[TEKKEN],
            PreKind::Default => &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
        }
    }
}

/// A compiled pre-tokenizer.
#[derive(Debug)]
pub struct PreTokenizer {
    kind: PreKind,
    regexes: Vec<Regex>,
}

impl PreTokenizer {
    /// Compiles the regexes of `kind`.
    pub fn new(kind: PreKind) -> Result<Self> {
        let regexes = kind
            .patterns()
            .iter()
            .map(|p| Regex::new(p).map_err(|e| Error::Model(format!("pre-tokenizer regex {p:?}: {e}"))))
            .collect::<Result<Vec<_>>>()?;
        Ok(PreTokenizer { kind, regexes })
    }

    /// The family.
    pub fn kind(&self) -> PreKind {
        self.kind
    }

    /// Splits `text` into pieces (byte ranges that tile `text`).
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut pieces: Vec<&str> = if text.is_empty() { Vec::new() } else { vec![text] };
        for re in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                split_one(re, piece, &mut next);
            }
            pieces = next;
        }
        pieces
    }
}

fn split_one<'t>(re: &Regex, piece: &'t str, out: &mut Vec<&'t str>) {
    let mut start = 0;
    for m in re.find_iter(piece) {
        let m = match m {
            Ok(m) => m,
            // A backtracking limit hit: keep the rest of the piece whole rather than drop text.
            Err(e) => {
                tracing::warn!(error = %e, "pre-tokenizer regex failed; keeping the rest of the piece whole");
                break;
            }
        };
        if m.start() == m.end() {
            continue;
        }
        if m.start() > start {
            out.push(&piece[start..m.start()]);
        }
        out.push(m.as_str());
        start = m.end();
    }
    if start < piece.len() {
        out.push(&piece[start..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(kind: PreKind, s: &str) -> Vec<&str> {
        PreTokenizer::new(kind).unwrap().split(s).into_iter().collect()
    }

    #[test]
    fn whitespace_lookahead() {
        // `\s+(?!\S)` leaves the last space of a run for the word that follows.
        assert_eq!(split(PreKind::Gpt2, "a   b"), ["a", "  ", " b"]);
        assert_eq!(split(PreKind::Gpt2, "a  "), ["a", "  "]);
        assert_eq!(split(PreKind::Gpt2, "\nx"), ["\n", "x"]);
        assert_eq!(split(PreKind::Llama3, "a \n\n b"), ["a", " \n\n", " b"]);
    }

    #[test]
    fn digits() {
        assert_eq!(split(PreKind::Llama3, "1234567"), ["123", "456", "7"]);
        assert_eq!(split(PreKind::Qwen2, "123"), ["1", "2", "3"]);
        assert_eq!(split(PreKind::Smollm, "a 12"), ["a", " ", "1", "2"]);
        assert_eq!(split(PreKind::Gpt2, "a 12"), ["a", " 12"]);
    }

    #[test]
    fn contractions() {
        assert_eq!(split(PreKind::Llama3, "I'M"), ["I", "'M"]);
        assert_eq!(split(PreKind::Gpt2, "I'M"), ["I", "'", "M"]);
    }
}
