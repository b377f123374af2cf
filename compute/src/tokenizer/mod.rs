//! Tokenizers built from a GGUF's `tokenizer.*` metadata: byte-level BPE (`gpt2`) and
//! SentencePiece (`llama`), with special-token parsing, BOS/EOS handling, decoding, the
//! end-of-generation set, and chat templates.
//!
//! ref: ggml-compute-semantics.md §5.1 (keys) and §6 (algorithms). The behaviour follows
//! llama.cpp's `llama_tokenize` so ids match it exactly; `compute/tests/tokenizer.rs` checks that
//! against the real llama.cpp.
//!
//! ```
//! use compute::gguf::{Gguf, GgufWriter};
//! use compute::tokenizer::{bpe::byte_to_char_table, Tokenizer};
//! // A byte-level vocabulary: the 256 GPT-2 characters, one merge "a b" -> "ab", and a control token.
//! let mut tokens: Vec<String> = byte_to_char_table().iter().map(|c| c.to_string()).collect();
//! tokens.push("ab".into());
//! tokens.push("<|end|>".into());
//! let mut types = vec![1i32; 257];
//! types.push(3);
//! let mut w = GgufWriter::new();
//! w.add("tokenizer.ggml.model", "gpt2").add("tokenizer.ggml.pre", "gpt-2");
//! w.add_strings("tokenizer.ggml.tokens", &tokens).add("tokenizer.ggml.token_type", types);
//! w.add_strings("tokenizer.ggml.merges", &["a b"]).add("tokenizer.ggml.eos_token_id", 257u32);
//! let tok = Tokenizer::from_gguf(&Gguf::from_bytes(w.to_bytes().unwrap()).unwrap()).unwrap();
//! let ids = tok.encode("abc<|end|>", true, true);
//! assert_eq!(ids, [256, u32::from(b'c'), 257]); // token b is byte b's character
//! assert_eq!(tok.decode(&ids, true), b"abc<|end|>");
//! assert!(tok.is_eog(257));
//! ```

pub mod bpe;
pub mod chat;
pub mod pre;
pub mod spm;
mod vocab;

use std::collections::BTreeSet;

pub use chat::{ChatMessage, ChatTemplate};
pub use pre::{PreKind, PreTokenizer};
pub use vocab::{TokenType, Vocab};

use crate::error::{Error, Result};
use crate::gguf::Gguf;

/// The tokenization algorithm.
#[derive(Debug)]
enum Model {
    Bpe(Box<bpe::Bpe>),
    Spm { add_space_prefix: bool },
}

/// Token texts that end generation wherever they appear (§6.1 step 9).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// Texts of end-of-turn tokens found when the file names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Fill-in-the-middle tokens that also end generation: pad, repo and file separator.
const FIM_EOG_TEXTS: &[&[&str]] = &[
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>"],
    &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"],
    &["<|file_sep|>"],
];

/// A tokenizer: vocabulary, algorithm and special-token settings.
#[derive(Debug)]
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// CONTROL, USER_DEFINED and UNKNOWN tokens, longest text first.
    specials: Vec<u32>,
    /// Special tokens that eat the whitespace before them (LSTRIP) or after them (RSTRIP).
    lstrip: BTreeSet<u32>,
    rstrip: BTreeSet<u32>,
    eog: BTreeSet<u32>,
    /// Each token's bytes with special tokens rendered.
    pieces: Vec<Vec<u8>>,
    chat_template: Option<String>,
}

/// A piece of the input during special-token partition.
enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF's `tokenizer.*` keys.
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer> {
        let model_name = g.get_str("tokenizer.ggml.model")?;
        let texts = g
            .get_str_array_opt("tokenizer.ggml.tokens")?
            .ok_or_else(|| Error::Model("missing tokenizer.ggml.tokens".into()))?
            .to_vec();
        let n = texts.len();
        let types = match g.get_int_array_opt("tokenizer.ggml.token_type")? {
            Some(t) => t.into_iter().map(TokenType::from_i64).collect(),
            None => Vec::new(),
        };
        let scores = g.get_f32_array_opt("tokenizer.ggml.scores")?.map(<[f32]>::to_vec).unwrap_or_default();
        if !types.is_empty() && types.len() != n {
            return Err(Error::Model(format!("{} token types for {n} tokens", types.len())));
        }
        if !scores.is_empty() && scores.len() != n {
            return Err(Error::Model(format!("{} token scores for {n} tokens", scores.len())));
        }
        let vocab = Vocab::new(texts, types, scores);

        // Per-model defaults (§6.1 step 7, §6.3).
        let (model, mut bos, mut eos, mut unk, mut add_bos) = match model_name {
            "gpt2" => {
                let kind = PreKind::from_name(g.get_str_opt("tokenizer.ggml.pre")?)?;
                let merges = g.get_str_array_opt("tokenizer.ggml.merges")?.unwrap_or_default();
                let bpe = bpe::Bpe::new(merges, PreTokenizer::new(kind)?);
                (Model::Bpe(Box::new(bpe)), Some(11), Some(11), None, kind.add_bos_default())
            }
            "llama" => {
                let add_space_prefix = g.get_bool_opt("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
                (Model::Spm { add_space_prefix }, Some(1), Some(2), Some(0), true)
            }
            other => return Err(Error::Model(format!("unsupported tokenizer model {other:?}"))),
        };
        let id_key = |key: &str| -> Result<Option<Option<u32>>> {
            // A stored -1 (as some converters write) means "none".
            match g.get_i64_opt(key)? {
                None => Ok(None),
                Some(v) if v < 0 => Ok(Some(None)),
                Some(v) => match u32::try_from(v).ok().filter(|&v| (v as usize) < n) {
                    Some(v) => Ok(Some(Some(v))),
                    None => Err(Error::Model(format!("{key} = {v} is outside the vocabulary of {n}"))),
                },
            }
        };
        if let Some(v) = id_key("tokenizer.ggml.bos_token_id")? {
            bos = v;
        }
        if let Some(v) = id_key("tokenizer.ggml.eos_token_id")? {
            eos = v;
        }
        if let Some(v) = id_key("tokenizer.ggml.unknown_token_id")? {
            unk = v;
        }
        let mut eot = id_key("tokenizer.ggml.eot_token_id")?.flatten();
        let eom = id_key("tokenizer.ggml.eom_token_id")?.flatten();
        add_bos = g.get_bool_opt("tokenizer.ggml.add_bos_token")?.unwrap_or(add_bos);
        let add_eos = g.get_bool_opt("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        // Defaults that point past a small vocabulary do not exist.
        let in_vocab = |v: Option<u32>| v.filter(|&v| (v as usize) < n);
        let (bos, eos, unk) = (in_vocab(bos), in_vocab(eos), in_vocab(unk));

        let mut tok = Tokenizer {
            vocab,
            model,
            bos,
            eos,
            eot: None,
            unk,
            add_bos,
            add_eos,
            specials: Vec::new(),
            lstrip: BTreeSet::new(),
            rstrip: BTreeSet::new(),
            eog: BTreeSet::new(),
            pieces: Vec::new(),
            chat_template: g.get_str_opt("tokenizer.chat_template")?.map(str::to_owned),
        };

        // Control-looking tokens found by text are treated as CONTROL and end generation.
        if eot.is_none() {
            eot = EOT_TEXTS.iter().filter_map(|t| tok.vocab.id_of(t)).min();
        }
        let mut eog: BTreeSet<u32> = BTreeSet::new();
        let mut force_control = Vec::new();
        for list in FIM_EOG_TEXTS {
            if let Some(id) = list.iter().filter_map(|t| tok.vocab.id_of(t)).min() {
                eog.insert(id);
                force_control.push(id);
            }
        }
        for t in EOG_TEXTS.iter().chain(EOT_TEXTS) {
            if let Some(id) = tok.vocab.id_of(t) {
                if EOG_TEXTS.contains(t) {
                    eog.insert(id);
                }
                force_control.push(id);
            }
        }
        for id in force_control {
            if tok.vocab.token_type(id) != Some(TokenType::Control) {
                tracing::warn!(
                    id,
                    text = tok.vocab.text(id),
                    "control-looking token is not CONTROL; treating it as CONTROL"
                );
                tok.vocab.set_type(id, TokenType::Control);
            }
        }
        eog.extend([tok.eos, eot, eom].into_iter().flatten());
        tok.eot = eot;
        tok.eog = eog;

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                matches!(
                    tok.vocab.token_type(id),
                    Some(TokenType::Control | TokenType::UserDefined | TokenType::Unknown)
                ) && tok.vocab.text(id).is_some_and(|t| !t.is_empty())
            })
            .collect();
        specials.sort_by_key(|&id| std::cmp::Reverse(tok.vocab.text(id).map_or(0, str::len)));
        tok.specials = specials;
        tok.set_strip_attributes(g)?;
        tok.pieces = (0..n as u32).map(|id| tok.render(id)).collect();
        Ok(tok)
    }

    /// LSTRIP/RSTRIP are not in the file: llama.cpp sets them from the model's name or
    /// pre-tokenizer, and so do we. Tokens the rules name but the vocabulary lacks are skipped.
    fn set_strip_attributes(&mut self, g: &Gguf) -> Result<()> {
        let name = g.get_str_opt("general.name")?.unwrap_or("").to_ascii_lowercase();
        let pre = g.get_str_opt("tokenizer.ggml.pre")?.unwrap_or("");
        let arch = g.get_str_opt("general.architecture")?.unwrap_or("");
        let has = |hay: &str, needles: &[&str]| needles.iter().any(|n| hay.contains(n));
        if has(pre, &["jina-v2-de", "jina-v2-es", "jina-v2-code"])
            || has(arch, &["nomic-bert-moe", "jina-bert-v3"])
        {
            self.lstrip.extend(self.vocab.id_of("<mask>"));
        } else if has(&name, &["phi-3", "phi3"]) {
            self.rstrip.extend(self.specials.iter().copied());
            self.rstrip.extend(self.vocab.id_of("</s>"));
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(id) = self.vocab.id_of(t) {
                    self.rstrip.remove(&id);
                }
            }
        } else if has(&name, &["modern-bert"]) {
            self.lstrip.extend(self.vocab.id_of("[MASK]"));
        }
        Ok(())
    }

    /// The vocabulary.
    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// Number of tokens.
    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    /// The BOS token.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The EOS token.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// The end-of-turn token, from the file or found by text. When the vocabulary holds several
    /// end-of-turn texts, this is the lowest id (llama.cpp's pick follows its hash-map order);
    /// all of them are in the end-of-generation set regardless.
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// True for tokens that end generation (EOS, EOT, EOM and the control-looking ones, §6.1 step 9).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// The end-of-generation set.
    pub fn eog_tokens(&self) -> impl Iterator<Item = u32> + '_ {
        self.eog.iter().copied()
    }

    /// The GGUF's `tokenizer.chat_template`, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Tokenizes `text`. With `add_special`, BOS/EOS are added as the model asks; with
    /// `parse_special`, CONTROL and UNKNOWN token texts in `text` become those tokens
    /// (USER_DEFINED ones always do).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        let fragments = self.partition(text, parse_special);
        match &self.model {
            Model::Bpe(bpe) => {
                for f in fragments {
                    match f {
                        Fragment::Text(t) => bpe.encode_fragment(&self.vocab, t, &mut out),
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            Model::Spm { add_space_prefix } => {
                // ref: §6.3: a space is prepended to a fragment that starts the text or follows a
                // special token.
                let mut prev_special = true;
                let mut buf = String::new();
                for f in fragments {
                    match f {
                        Fragment::Text(t) => {
                            buf.clear();
                            if *add_space_prefix && prev_special {
                                buf.push(' ');
                            }
                            buf.push_str(t);
                            spm::encode_fragment(&self.vocab, &buf, self.unk, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Splits `text` at occurrences of special-token texts, longest token first (§6.1 step 1).
    fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut frags = if text.is_empty() { Vec::new() } else { vec![Fragment::Text(text)] };
        for &id in &self.specials {
            let ty = self.vocab.token_type(id);
            if !parse_special && matches!(ty, Some(TokenType::Control | TokenType::Unknown)) {
                continue;
            }
            let Some(needle) = self.vocab.text(id) else { continue };
            if !frags.iter().any(|f| matches!(f, Fragment::Text(t) if t.contains(needle))) {
                continue;
            }
            let (lstrip, rstrip) = (self.lstrip.contains(&id), self.rstrip.contains(&id));
            // C's isspace: the strip attributes only eat ASCII whitespace.
            let c_space = |c: char| matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r');
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                match f {
                    Fragment::Text(mut t) => {
                        while let Some(pos) = t.find(needle) {
                            let mut left = &t[..pos];
                            if lstrip {
                                left = left.trim_end_matches(c_space);
                            }
                            if !left.is_empty() {
                                next.push(Fragment::Text(left));
                            }
                            next.push(Fragment::Token(id));
                            t = &t[pos + needle.len()..];
                            if rstrip {
                                t = t.trim_start_matches(c_space);
                            }
                        }
                        if !t.is_empty() {
                            next.push(Fragment::Text(t));
                        }
                    }
                    tok => next.push(tok),
                }
            }
            frags = next;
        }
        frags
    }

    /// How token `id` reads with special tokens rendered (llama.cpp's `token_to_piece`).
    fn render(&self, id: u32) -> Vec<u8> {
        let (Some(text), Some(ty)) = (self.vocab.text(id), self.vocab.token_type(id)) else {
            return Vec::new();
        };
        match ty {
            TokenType::Control | TokenType::Unknown | TokenType::UserDefined => text.as_bytes().to_vec(),
            TokenType::Normal => match &self.model {
                Model::Bpe(bpe) => bpe.decode_text(text),
                Model::Spm { .. } => text.replace(spm::SPACE_MARK, " ").into_bytes(),
            },
            TokenType::Byte => match self.model {
                Model::Spm { .. } => spm::parse_byte_token(text).map(|b| vec![b]).unwrap_or_default(),
                Model::Bpe(_) => Vec::new(),
            },
            TokenType::Undefined | TokenType::Unused => Vec::new(),
        }
    }

    /// The bytes of token `id`, special tokens rendered as their text. A UTF-8 character may be
    /// split across tokens. Unknown ids give no bytes.
    pub fn decode_token(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// The bytes of token `id`; CONTROL and UNKNOWN tokens give nothing unless `special`.
    pub fn decode_token_with(&self, id: u32, special: bool) -> &[u8] {
        if !special && matches!(self.vocab.token_type(id), Some(TokenType::Control | TokenType::Unknown)) {
            return &[];
        }
        self.decode_token(id)
    }

    /// The concatenated bytes of `ids` (see [`Tokenizer::decode_token_with`]).
    pub fn decode(&self, ids: &[u32], special: bool) -> Vec<u8> {
        ids.iter().flat_map(|&id| self.decode_token_with(id, special).iter().copied()).collect()
    }
}
