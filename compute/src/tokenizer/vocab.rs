//! The vocabulary: token texts, types and scores, and the text → id map.
//!
//! ref: ggml-compute-semantics.md §5.1 (`tokenizer.ggml.tokens`, `token_type`, `scores`).

use std::collections::HashMap;

/// `tokenizer.ggml.token_type` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum TokenType {
    /// 0: no type given.
    Undefined = 0,
    /// 1: an ordinary token.
    Normal = 1,
    /// 2: the unknown token.
    Unknown = 2,
    /// 3: a control token (`<|im_start|>`, BOS, EOS...).
    Control = 3,
    /// 4: a user-defined token, matched in raw text even without special parsing.
    UserDefined = 4,
    /// 5: unused.
    Unused = 5,
    /// 6: a byte-fallback token `<0xXX>`.
    Byte = 6,
}

impl TokenType {
    /// The type with value `v`; unknown values count as [`TokenType::Undefined`].
    pub fn from_i64(v: i64) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// Token texts, types and scores.
#[derive(Debug, Clone)]
pub struct Vocab {
    texts: Vec<String>,
    types: Vec<TokenType>,
    scores: Vec<f32>,
    ids: HashMap<String, u32>,
}

impl Vocab {
    /// A vocabulary; `types` and `scores` default to NORMAL and 0 where shorter than `texts`.
    ///
    /// A text is cut at its first NUL byte, as llama.cpp reads token texts as C strings (a token
    /// `"\0"` is therefore unreachable and byte fallback is used instead); an empty text becomes
    /// `[EMPTY_<id>]`, as llama.cpp names them.
    pub fn new(mut texts: Vec<String>, types: Vec<TokenType>, scores: Vec<f32>) -> Vocab {
        for (i, t) in texts.iter_mut().enumerate() {
            if let Some(nul) = t.find('\0') {
                t.truncate(nul);
            }
            if t.is_empty() {
                *t = format!("[EMPTY_{i}]");
            }
        }
        let mut ids = HashMap::with_capacity(texts.len());
        for (i, t) in texts.iter().enumerate() {
            // A later duplicate text takes the id, as in llama.cpp.
            ids.insert(t.clone(), i as u32);
        }
        Vocab { texts, types, scores, ids }
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    /// True for an empty vocabulary.
    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }

    /// The id of the token with exactly this text.
    pub fn id_of(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The text of token `id`.
    pub fn text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The type of token `id` (NORMAL if the file gave none).
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        if (id as usize) < self.texts.len() {
            Some(self.types.get(id as usize).copied().unwrap_or(TokenType::Normal))
        } else {
            None
        }
    }

    /// The score of token `id` (0 if the file gave none).
    pub fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }

    pub(crate) fn set_type(&mut self, id: u32, t: TokenType) {
        let n = self.texts.len();
        if self.types.len() < n {
            self.types.resize(n, TokenType::Normal);
        }
        if let Some(slot) = self.types.get_mut(id as usize) {
            *slot = t;
        }
    }
}
