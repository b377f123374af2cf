//! The GGUF writer: builds v3 (or v2) files with metadata of every type and tensors of any
//! `ggml_type`, aligned as llama.cpp requires.
//!
//! ref: ggml-compute-semantics.md §5. Used by tests to make small models, and by anything that
//! needs to emit a GGUF.
//!
//! ```
//! use compute::gguf::{Gguf, GgufWriter};
//! use compute::GgmlType;
//! let mut w = GgufWriter::new();
//! w.add("general.architecture", "llama").add("llama.block_count", 2u32);
//! w.add_tensor("output_norm.weight", GgmlType::F32, &[4], vec![0u8; 16]).unwrap();
//! let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
//! assert_eq!(g.get_u32("llama.block_count").unwrap(), 2);
//! assert_eq!(g.tensor("output_norm.weight").unwrap().data.len(), 16);
//! ```

use std::io::Write;
use std::path::Path;

use super::reader::align;
use super::value::{Array, Value};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC, KEY_ALIGNMENT, MAX_NAME_LEN};
use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::tensor::MAX_DIMS;

fn bad(msg: impl Into<String>) -> Error {
    Error::Gguf(msg.into())
}

struct PendingTensor {
    name: String,
    dtype: GgmlType,
    ne: Vec<u64>,
    data: Vec<u8>,
}

/// A GGUF file under construction. Keys keep insertion order; adding a key twice replaces its
/// value in place.
pub struct GgufWriter {
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty version-3 file.
    pub fn new() -> Self {
        GgufWriter { version: 3, metadata: Vec::new(), tensors: Vec::new() }
    }

    /// Sets the version written in the header: 2 or 3 (the layouts are identical).
    pub fn version(&mut self, version: u32) -> Result<&mut Self> {
        if !(2..=3).contains(&version) {
            return Err(bad(format!("cannot write GGUF version {version}")));
        }
        self.version = version;
        Ok(self)
    }

    /// Sets `general.alignment` (must be a power of two).
    pub fn alignment(&mut self, alignment: u32) -> Result<&mut Self> {
        if !alignment.is_power_of_two() {
            return Err(bad(format!("alignment {alignment} is not a power of two")));
        }
        Ok(self.add(KEY_ALIGNMENT, alignment))
    }

    /// Adds (or replaces) a metadata pair.
    pub fn add(&mut self, key: &str, value: impl Into<Value>) -> &mut Self {
        let value = value.into();
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key.to_owned(), value)),
        }
        self
    }

    /// Adds an array of strings.
    pub fn add_strings<S: AsRef<str>>(&mut self, key: &str, values: &[S]) -> &mut Self {
        self.add(key, Array::String(values.iter().map(|s| s.as_ref().to_owned()).collect()))
    }

    /// Adds a tensor of shape `ne` (1 to 4 dimensions, ggml order) with its raw bytes.
    ///
    /// Fails if the name is too long or taken, the shape is not whole blocks, or `data` does
    /// not have exactly the tensor's size.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dtype: GgmlType,
        ne: &[u64],
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        if name.len() >= MAX_NAME_LEN {
            return Err(bad(format!("tensor name {name:?} is longer than {} bytes", MAX_NAME_LEN - 1)));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(bad(format!("duplicate tensor name {name:?}")));
        }
        if ne.is_empty() || ne.len() > MAX_DIMS {
            return Err(bad(format!("tensor {name:?} has {} dimensions", ne.len())));
        }
        let size = tensor_size(dtype, ne)
            .ok_or_else(|| bad(format!("tensor {name:?}: bad shape {ne:?} for {dtype}")))?;
        if size != data.len() as u64 {
            return Err(bad(format!(
                "tensor {name:?}: {} bytes given, shape {ne:?} {dtype} needs {size}",
                data.len()
            )));
        }
        self.tensors.push(PendingTensor { name: name.to_owned(), dtype, ne: ne.to_vec(), data });
        Ok(self)
    }

    /// Adds an F32 tensor from values.
    pub fn add_f32_tensor(&mut self, name: &str, ne: &[u64], values: &[f32]) -> Result<&mut Self> {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, GgmlType::F32, ne, data)
    }

    fn alignment_value(&self) -> Result<u64> {
        match self.metadata.iter().find(|(k, _)| k == KEY_ALIGNMENT).map(|(_, v)| v) {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(Value::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
            Some(v) => Err(bad(format!("{KEY_ALIGNMENT} must be a power-of-two u32, not {v}"))),
        }
    }

    /// Serializes the file into `w`, streaming the tensor data (the header is built in memory).
    pub fn write_to(&self, w: &mut impl Write) -> Result<()> {
        self.write_inner(w).map_err(|e| match e {
            WriteError::Gguf(e) => e,
            WriteError::Io(source) => Error::Io { path: "<gguf writer>".into(), source },
        })
    }

    /// Writes the file to `path` (created or truncated).
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let io = |source| Error::Io { path: path.display().to_string(), source };
        let file = std::fs::File::create(path).map_err(io)?;
        let mut w = std::io::BufWriter::new(file);
        self.write_inner(&mut w).and_then(|()| w.flush().map_err(WriteError::Io)).map_err(|e| match e {
            WriteError::Gguf(e) => e,
            WriteError::Io(source) => io(source),
        })
    }

    /// Serializes the file into memory.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }

    fn write_inner(&self, w: &mut impl Write) -> std::result::Result<(), WriteError> {
        let alignment = self.alignment_value()?;
        let mut out = Vec::new();
        out.extend_from_slice(GGUF_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as i64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as i64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for &n in &t.ne {
                out.extend_from_slice(&n.to_le_bytes());
            }
            out.extend_from_slice(&(t.dtype as u32).to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = align(offset.checked_add(t.data.len() as u64), alignment)
                .ok_or_else(|| bad("file too large"))?;
        }
        let data_start = align(Some(out.len() as u64), alignment).ok_or_else(|| bad("file too large"))?;
        out.resize(data_start as usize, 0);
        w.write_all(&out).map_err(WriteError::Io)?;
        // Each blob is padded to the alignment, the last one too, as ggml's writer does.
        let zeros = vec![0u8; alignment.min(1 << 16) as usize];
        for t in &self.tensors {
            w.write_all(&t.data).map_err(WriteError::Io)?;
            let len = t.data.len() as u64;
            let mut pad = align(Some(len), alignment).map_or(0, |a| a - len);
            while pad > 0 {
                let n = pad.min(zeros.len() as u64) as usize;
                w.write_all(&zeros[..n]).map_err(WriteError::Io)?;
                pad -= n as u64;
            }
        }
        Ok(())
    }
}

enum WriteError {
    Gguf(Error),
    Io(std::io::Error),
}

impl From<Error> for WriteError {
    fn from(e: Error) -> Self {
        WriteError::Gguf(e)
    }
}

/// Bytes of a contiguous tensor of shape `ne`, or `None` if `ne[0]` is not whole blocks or the
/// size overflows.
pub fn tensor_size(dtype: GgmlType, ne: &[u64]) -> Option<u64> {
    let (first, rest) = ne.split_first()?;
    rest.iter().try_fold(dtype.row_size(*first)?, |acc, &n| acc.checked_mul(n))
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(a) => {
            out.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            macro_rules! le {
                ($v:expr) => {
                    for x in $v {
                        out.extend_from_slice(&x.to_le_bytes());
                    }
                };
            }
            match a {
                Array::U8(v) => out.extend_from_slice(v),
                Array::I8(v) => le!(v),
                Array::U16(v) => le!(v),
                Array::I16(v) => le!(v),
                Array::U32(v) => le!(v),
                Array::I32(v) => le!(v),
                Array::F32(v) => le!(v),
                Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
                Array::String(v) => {
                    for s in v {
                        put_str(out, s);
                    }
                }
                Array::U64(v) => le!(v),
                Array::I64(v) => le!(v),
                Array::F64(v) => le!(v),
            }
        }
    }
}
