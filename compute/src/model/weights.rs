//! Where a model's metadata and weights come from: the [`WeightSource`] trait and an in-memory
//! implementation ([`MemWeights`]) for tests and synthetic models.
//!
//! A GGUF file (zero-copy over its mmap) implements the same trait, so the graph builders and the
//! local backend never care which one they read.

use std::collections::HashMap;

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::tensor::MAX_DIMS;

/// One metadata value, reduced to what the model engine reads (ref: ggml-compute-semantics.md §5).
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// Any integer type.
    Int(i64),
    /// f32 or f64.
    Float(f64),
    /// A bool.
    Bool(bool),
    /// A string.
    Str(String),
    /// An array of integers (or bools, as 0/1).
    IntArray(Vec<i64>),
    /// An array of floats.
    FloatArray(Vec<f64>),
    /// Any other array; only its length is kept.
    Array(usize),
}

/// A weight: type, shape and its bytes (contiguous, GGUF layout).
#[derive(Clone, Copy, Debug)]
pub struct WeightView<'a> {
    /// Element type.
    pub dtype: GgmlType,
    /// Shape, missing dims 1.
    pub ne: [u64; MAX_DIMS],
    /// The tensor's bytes, exactly `row_size(dtype, ne0) * ne1 * ne2 * ne3` long.
    pub data: &'a [u8],
}

/// Metadata and weights of one model.
pub trait WeightSource: Send + Sync {
    /// The metadata value under `key`.
    fn meta(&self, key: &str) -> Option<MetaValue>;
    /// The weight named `name`.
    fn tensor(&self, name: &str) -> Option<WeightView<'_>>;
    /// Bytes of all weights, where the source knows it cheaply (split mode `auto` weighs compute
    /// against round trips with it).
    fn weight_bytes(&self) -> Option<u64> {
        None
    }
}

/// Typed metadata accessors over a [`WeightSource`].
pub trait MetaExt {
    /// Integer value (an integer array yields its first element only when all elements agree).
    fn meta_u64(&self, key: &str) -> Result<Option<u64>>;
    /// Float value (integers are accepted).
    fn meta_f32(&self, key: &str) -> Result<Option<f32>>;
    /// String value.
    fn meta_str(&self, key: &str) -> Result<Option<String>>;
    /// Bool value.
    fn meta_bool(&self, key: &str) -> Result<Option<bool>>;
}

impl<T: WeightSource + ?Sized> MetaExt for T {
    fn meta_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.meta(key) {
            None => Ok(None),
            Some(MetaValue::Int(v)) if v >= 0 => Ok(Some(v as u64)),
            Some(MetaValue::IntArray(a)) if !a.is_empty() && a.iter().all(|&x| x == a[0] && x >= 0) => {
                Ok(Some(a[0] as u64))
            }
            Some(other) => {
                Err(Error::Model(format!("metadata {key}: expected a non-negative integer, got {other:?}")))
            }
        }
    }

    fn meta_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.meta(key) {
            None => Ok(None),
            Some(MetaValue::Float(v)) => Ok(Some(v as f32)),
            Some(MetaValue::Int(v)) => Ok(Some(v as f32)),
            Some(other) => Err(Error::Model(format!("metadata {key}: expected a float, got {other:?}"))),
        }
    }

    fn meta_str(&self, key: &str) -> Result<Option<String>> {
        match self.meta(key) {
            None => Ok(None),
            Some(MetaValue::Str(s)) => Ok(Some(s)),
            Some(other) => Err(Error::Model(format!("metadata {key}: expected a string, got {other:?}"))),
        }
    }

    fn meta_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.meta(key) {
            None => Ok(None),
            Some(MetaValue::Bool(b)) => Ok(Some(b)),
            Some(MetaValue::Int(v)) => Ok(Some(v != 0)),
            Some(other) => Err(Error::Model(format!("metadata {key}: expected a bool, got {other:?}"))),
        }
    }
}

/// An in-memory model: metadata map plus owned weight bytes.
#[derive(Clone, Debug, Default)]
pub struct MemWeights {
    meta: HashMap<String, MetaValue>,
    tensors: HashMap<String, (GgmlType, [u64; MAX_DIMS], Vec<u8>)>,
}

impl MemWeights {
    /// An empty model.
    pub fn new() -> MemWeights {
        MemWeights::default()
    }

    /// Sets a metadata value.
    pub fn set_meta(&mut self, key: &str, v: MetaValue) {
        self.meta.insert(key.to_string(), v);
    }

    /// Adds a weight; fails if the byte length does not match the type and shape.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dtype: GgmlType,
        ne: [u64; MAX_DIMS],
        data: Vec<u8>,
    ) -> Result<()> {
        let row =
            dtype.row_size(ne[0]).ok_or_else(|| Error::Model(format!("{name}: bad row of {}", ne[0])))?;
        let want = ne[1..].iter().try_fold(row, |a, &n| a.checked_mul(n));
        if want != Some(data.len() as u64) {
            return Err(Error::Model(format!("{name}: {} bytes for {dtype} {ne:?}", data.len())));
        }
        self.tensors.insert(name.to_string(), (dtype, ne, data));
        Ok(())
    }

    /// Every metadata entry (unordered).
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.meta.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Every weight (unordered).
    pub fn tensors(&self) -> impl Iterator<Item = (&str, WeightView<'_>)> {
        self.tensors
            .iter()
            .map(|(k, (dtype, ne, data))| (k.as_str(), WeightView { dtype: *dtype, ne: *ne, data }))
    }

    /// Adds an F32 weight from values.
    pub fn add_f32(&mut self, name: &str, ne: [u64; MAX_DIMS], values: &[f32]) -> Result<()> {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, GgmlType::F32, ne, bytes)
    }
}

impl WeightSource for MemWeights {
    fn meta(&self, key: &str) -> Option<MetaValue> {
        self.meta.get(key).cloned()
    }

    fn tensor(&self, name: &str) -> Option<WeightView<'_>> {
        self.tensors.get(name).map(|(dtype, ne, data)| WeightView { dtype: *dtype, ne: *ne, data })
    }

    fn weight_bytes(&self) -> Option<u64> {
        Some(self.tensors.values().map(|(_, _, data)| data.len() as u64).sum())
    }
}

/// Looks up weights by GGUF name and checks their shapes.
pub struct Weights<'a> {
    src: &'a dyn WeightSource,
}

impl<'a> Weights<'a> {
    /// A lookup over `src`.
    pub fn new(src: &'a dyn WeightSource) -> Weights<'a> {
        Weights { src }
    }

    /// The weight `name` with shape `ne` (missing dims 1), or an error naming what is wrong.
    pub fn require(&self, name: &str, ne: [u64; MAX_DIMS]) -> Result<WeightView<'a>> {
        let w = self.src.tensor(name).ok_or_else(|| Error::Model(format!("missing tensor {name}")))?;
        if w.ne != ne {
            return Err(Error::Model(format!("tensor {name}: shape {:?}, expected {ne:?}", w.ne)));
        }
        Ok(w)
    }

    /// The weight `name` if present, with its shape checked.
    pub fn optional(&self, name: &str, ne: [u64; MAX_DIMS]) -> Result<Option<WeightView<'a>>> {
        match self.src.tensor(name) {
            None => Ok(None),
            Some(_) => self.require(name, ne).map(Some),
        }
    }

    /// The LM head: `output.weight`, or `token_embd.weight` when the model ties embeddings
    /// (ref: ggml-compute-semantics.md §8 item 16). Returns the name used.
    pub fn lm_head_name(&self) -> &'static str {
        if self.src.tensor("output.weight").is_some() {
            "output.weight"
        } else {
            "token_embd.weight"
        }
    }
}
