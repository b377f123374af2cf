//! [`WeightSource`] over a parsed GGUF file: metadata converted on demand, weights borrowed
//! zero-copy from the file's bytes (its mmap when opened with `Gguf::open`).

use crate::gguf::{Array, Gguf, Value};
use crate::model::weights::{MetaValue, WeightSource, WeightView};

fn convert(v: &Value) -> MetaValue {
    match v {
        Value::Bool(b) => MetaValue::Bool(*b),
        Value::String(s) => MetaValue::Str(s.clone()),
        Value::F32(x) => MetaValue::Float(f64::from(*x)),
        Value::F64(x) => MetaValue::Float(*x),
        Value::Array(a) => match a {
            Array::String(s) => MetaValue::Array(s.len()),
            Array::F32(x) => MetaValue::FloatArray(x.iter().map(|&f| f64::from(f)).collect()),
            Array::F64(x) => MetaValue::FloatArray(x.clone()),
            Array::Bool(b) => MetaValue::IntArray(b.iter().map(|&b| i64::from(b)).collect()),
            other => match other.to_i64_vec() {
                Some(v) => MetaValue::IntArray(v),
                None => MetaValue::Array(other.len()),
            },
        },
        other => match other.as_i64() {
            Some(i) => MetaValue::Int(i),
            // A u64 beyond i64::MAX: keep the length-free marker rather than a wrong number.
            None => MetaValue::Array(0),
        },
    }
}

impl WeightSource for Gguf {
    fn meta(&self, key: &str) -> Option<MetaValue> {
        self.get(key).map(convert)
    }

    fn tensor(&self, name: &str) -> Option<WeightView<'_>> {
        let t = Gguf::tensor(self, name).ok()?;
        Some(WeightView { dtype: t.info.dtype(), ne: t.info.layout.ne, data: t.data })
    }

    fn weight_bytes(&self) -> Option<u64> {
        (self.bytes().len() as u64).checked_sub(self.data_offset())
    }
}
