//! The GGUF reader: parses the header, metadata and tensor infos of a v2/v3 file and hands out
//! tensor data as slices borrowed from the (memory-mapped) file.
//!
//! ref: ggml-compute-semantics.md §5. Every count and length read from the file is checked against
//! the bytes that remain before anything is allocated, so a hostile file costs at most a small
//! multiple of its own size in memory and never makes the parser panic or read out of bounds.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::value::{Array, Value, ValueType};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC, KEY_ALIGNMENT, MAX_NAME_LEN};
use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::tensor::{Layout, MAX_DIMS};

fn bad(msg: impl Into<String>) -> Error {
    Error::Gguf(msg.into())
}

/// What a tensor info in the file says about one tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name (unique, shorter than 64 bytes).
    pub name: String,
    /// Number of dimensions the file gave (1..=4); the missing ones are 1 in the layout.
    pub n_dims: u32,
    /// The contiguous layout: type, `ne` and default `nb`.
    pub layout: Layout,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes (`row_size(type, ne0) * ne1 * ne2 * ne3`).
    pub size: u64,
}

impl TensorInfo {
    /// The element type.
    pub fn dtype(&self) -> GgmlType {
        self.layout.dtype
    }

    /// The element counts of the dimensions the file gave.
    pub fn shape(&self) -> &[u64] {
        &self.layout.ne[..self.n_dims as usize]
    }
}

/// A tensor of a GGUF file: its info and its bytes, borrowed from the file.
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    /// The tensor info.
    pub info: &'a TensorInfo,
    /// The tensor's bytes (`info.size` of them).
    pub data: &'a [u8],
}

enum Backing {
    Mmap(Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file.
pub struct Gguf {
    backing: Backing,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, Value)>,
    kv_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl Gguf {
    /// Maps the file at `path` and parses it.
    ///
    /// # Safety
    ///
    /// The file must not be truncated or rewritten while the returned value (or any slice borrowed
    /// from it) is alive: the data is read through a shared memory map.
    pub unsafe fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref();
        let io = |source| Error::Io { path: path.display().to_string(), source };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the caller promises the file is not modified while mapped (this function's
        // contract); the map is only ever read.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(Backing::Mmap(mmap)).map_err(|e| ctx(e, &path.display().to_string()))
    }

    /// Reads the whole file at `path` into anonymous memory with transparent huge pages requested,
    /// and parses it (no file mapping, so no contract). Generation streams every weight once per
    /// token; from 2 MiB pages it reads them faster than from the page cache's 4 KiB pages (the
    /// hardware prefetcher stops at every page and the TLB misses less), at the cost of a private
    /// copy of the file.
    pub fn load_resident(path: impl AsRef<Path>) -> Result<Gguf> {
        use std::io::Read;
        let path = path.as_ref();
        let io = |source| Error::Io { path: path.display().to_string(), source };
        let mut file = File::open(path).map_err(io)?;
        let len = usize::try_from(file.metadata().map_err(io)?.len())
            .map_err(|_| Error::Gguf(format!("{}: too large for this machine", path.display())))?;
        let mut map = memmap2::MmapMut::map_anon(len.max(1)).map_err(io)?;
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::HugePage);
        file.read_exact(&mut map[..len]).map_err(io)?;
        let map = map.make_read_only().map_err(io)?;
        Self::parse(Backing::Mmap(map)).map_err(|e| ctx(e, &path.display().to_string()))
    }

    /// Reads the whole file at `path` into memory and parses it (no mapping, so no contract).
    pub fn read(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
        Self::from_bytes(bytes)
    }

    /// Parses a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf> {
        Self::parse(Backing::Owned(bytes))
    }

    fn parse(backing: Backing) -> Result<Gguf> {
        let bytes = backing.bytes();
        let file_len = bytes.len() as u64;
        let mut r = Cursor { buf: bytes, pos: 0 };

        let magic = r.take(4).map_err(|_| bad("file too short for the magic"))?;
        if magic != GGUF_MAGIC {
            return Err(bad(format!("bad magic {magic:02x?}, expected \"GGUF\"")));
        }
        let version = r.u32()?;
        if version != 0 && version & 0xFFFF == 0 {
            return Err(bad(format!(
                "version field 0x{version:08x} looks byte-swapped: big-endian GGUF files are not supported"
            )));
        }
        match version {
            1 => return Err(bad("GGUF version 1 is not supported (only 2 and 3)")),
            2 | 3 => {}
            v => return Err(bad(format!("unsupported GGUF version {v} (only 2 and 3)"))),
        }
        let n_tensors = r.i64()?;
        let n_kv = r.i64()?;
        if n_tensors < 0 || n_kv < 0 {
            return Err(bad(format!("negative counts: n_tensors {n_tensors}, n_kv {n_kv}")));
        }
        let (n_tensors, n_kv) = (n_tensors as u64, n_kv as u64);
        // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at
        // least 8 (name length) + 4 (n_dims) + 8 (ne0) + 4 (type) + 8 (offset).
        r.check_count(n_kv, 13, "metadata pairs")?;
        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut kv_index = HashMap::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let key = r.string().map_err(|e| ctx(e, &format!("key of pair {i}")))?;
            let ty = r.u32()?;
            let ty = ValueType::from_u32(ty)
                .ok_or_else(|| bad(format!("key {key:?}: unknown value type {ty}")))?;
            let value = r.value(ty).map_err(|e| ctx(e, &format!("value of key {key:?}")))?;
            if kv_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(bad(format!("duplicate key {key:?}")));
            }
            metadata.push((key, value));
        }

        let alignment = match kv_index.get(KEY_ALIGNMENT).map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) if *a != 0 && a.is_power_of_two() => u64::from(*a),
            Some(Value::U32(a)) => return Err(bad(format!("{KEY_ALIGNMENT} = {a} is not a power of two"))),
            Some(v) => return Err(bad(format!("{KEY_ALIGNMENT} has type {}, expected u32", v.value_type()))),
        };

        r.check_count(n_tensors, 32, "tensor infos")?;
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
        let mut expected_offset = 0u64;
        for i in 0..n_tensors {
            let info = r.tensor_info().map_err(|e| ctx(e, &format!("tensor info {i}")))?;
            if info.offset != expected_offset {
                return Err(bad(format!(
                    "tensor {:?} has offset {}, expected {expected_offset} (the aligned running sum)",
                    info.name, info.offset
                )));
            }
            expected_offset = align(info.offset.checked_add(info.size), alignment)
                .ok_or_else(|| bad(format!("tensor {:?}: data offsets overflow", info.name)))?;
            if tensor_index.insert(info.name.clone(), tensors.len()).is_some() {
                return Err(bad(format!("duplicate tensor name {:?}", info.name)));
            }
            tensors.push(info);
        }

        let data_offset = align(Some(r.pos as u64), alignment).ok_or_else(|| bad("data offset overflows"))?;
        for t in &tensors {
            let end = data_offset.checked_add(t.offset).and_then(|o| o.checked_add(t.size));
            match end {
                Some(end) if end <= file_len => {}
                _ => {
                    return Err(bad(format!(
                    "tensor {:?} data ({} bytes at {}+{}) lies beyond the end of the file ({file_len} bytes)",
                    t.name, t.size, data_offset, t.offset
                )))
                }
            }
        }

        Ok(Gguf { backing, version, alignment, data_offset, metadata, kv_index, tensors, tensor_index })
    }

    /// The file's version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment (`general.alignment`, else 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Offset of the data section from the start of the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// All metadata pairs, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kv_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| bad(format!("missing key {key:?}")))
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        want: &str,
        f: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| {
                bad(format!("key {key:?} has type {} (value {v}), expected {want}", v.value_type()))
            }),
        }
    }

    /// `general.architecture` (`llama`, `qwen2`, ...).
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    /// The key `{architecture}.{suffix}`, for the per-architecture hyper-parameters of §5.1
    /// (`g.get_u32(&g.arch_key("block_count")?)`).
    pub fn arch_key(&self, suffix: &str) -> Result<String> {
        Ok(format!("{}.{suffix}", self.architecture()?))
    }

    /// An integer value that fits in `u32`; an error if missing or of another type.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.require(key)?;
        self.get_u32_opt(key)?.ok_or_else(|| bad(format!("missing key {key:?}")))
    }

    /// An integer value that fits in `u32`, `None` if missing; an error if of another type.
    pub fn get_u32_opt(&self, key: &str) -> Result<Option<u32>> {
        self.typed(key, "an integer fitting u32", Value::as_u32)
    }

    /// An integer value that fits in `u64`; an error if missing or of another type.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.require(key)?;
        self.get_u64_opt(key)?.ok_or_else(|| bad(format!("missing key {key:?}")))
    }

    /// An integer value that fits in `u64`, `None` if missing.
    pub fn get_u64_opt(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, "an integer fitting u64", Value::as_u64)
    }

    /// An integer value that fits in `i64`, `None` if missing.
    pub fn get_i64_opt(&self, key: &str) -> Result<Option<i64>> {
        self.typed(key, "an integer fitting i64", Value::as_i64)
    }

    /// A float value (`f32`, or `f64` narrowed); an error if missing or of another type.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.require(key)?;
        self.get_f32_opt(key)?.ok_or_else(|| bad(format!("missing key {key:?}")))
    }

    /// A float value, `None` if missing.
    pub fn get_f32_opt(&self, key: &str) -> Result<Option<f32>> {
        self.typed(key, "a float", Value::as_f32)
    }

    /// A bool value, `None` if missing.
    pub fn get_bool_opt(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "bool", Value::as_bool)
    }

    /// A string value; an error if missing or of another type.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.require(key)?;
        self.get_str_opt(key)?.ok_or_else(|| bad(format!("missing key {key:?}")))
    }

    /// A string value, `None` if missing.
    pub fn get_str_opt(&self, key: &str) -> Result<Option<&str>> {
        self.typed(key, "str", Value::as_str)
    }

    /// An array value, `None` if missing.
    pub fn get_array_opt(&self, key: &str) -> Result<Option<&Array>> {
        self.typed(key, "arr", Value::as_array)
    }

    /// An array value; an error if missing or not an array.
    pub fn get_array(&self, key: &str) -> Result<&Array> {
        self.require(key)?;
        self.get_array_opt(key)?.ok_or_else(|| bad(format!("missing key {key:?}")))
    }

    /// An array of strings, `None` if missing.
    pub fn get_str_array_opt(&self, key: &str) -> Result<Option<&[String]>> {
        self.typed(key, "arr[str]", |v| match v.as_array()? {
            Array::String(s) => Some(s.as_slice()),
            _ => None,
        })
    }

    /// An array of `f32`, `None` if missing.
    pub fn get_f32_array_opt(&self, key: &str) -> Result<Option<&[f32]>> {
        self.typed(key, "arr[f32]", |v| match v.as_array()? {
            Array::F32(s) => Some(s.as_slice()),
            _ => None,
        })
    }

    /// An array of any integer type as `i64`s, `None` if missing.
    pub fn get_int_array_opt(&self, key: &str) -> Result<Option<Vec<i64>>> {
        self.typed(key, "arr[int]", |v| v.as_array()?.to_i64_vec())
    }

    /// A per-layer `u32` hyper-parameter: a scalar repeated `n_layer` times, or an array of
    /// exactly `n_layer` integers. `None` if missing.
    pub fn get_u32_per_layer_opt(&self, key: &str, n_layer: usize) -> Result<Option<Vec<u32>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => {
                let v = a
                    .to_i64_vec()
                    .and_then(|v| v.into_iter().map(|x| u32::try_from(x).ok()).collect::<Option<Vec<u32>>>())
                    .ok_or_else(|| bad(format!("key {key:?}: expected an array of u32")))?;
                if v.len() != n_layer {
                    return Err(bad(format!("key {key:?} has {} entries, expected {n_layer}", v.len())));
                }
                Ok(Some(v))
            }
            Some(_) => Ok(Some(vec![self.get_u32(key)?; n_layer])),
        }
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of tensor `name`, if present.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// Tensor `name` with its bytes, borrowed from the file.
    pub fn tensor(&self, name: &str) -> Result<TensorRef<'_>> {
        let info = self.tensor_info(name).ok_or_else(|| bad(format!("no tensor named {name:?}")))?;
        Ok(TensorRef { info, data: self.tensor_data(info)? })
    }

    /// The bytes of the tensor `info` (which must come from this file).
    pub fn tensor_data(&self, info: &TensorInfo) -> Result<&[u8]> {
        let start = self.data_offset.checked_add(info.offset);
        let end = start.and_then(|s| s.checked_add(info.size));
        match (start, end) {
            (Some(s), Some(e)) => usize::try_from(s)
                .ok()
                .zip(usize::try_from(e).ok())
                .and_then(|(s, e)| self.bytes().get(s..e))
                .ok_or_else(|| bad(format!("tensor {:?} data out of bounds", info.name))),
            _ => Err(bad(format!("tensor {:?} data offset overflows", info.name))),
        }
    }
}

fn ctx(e: Error, what: &str) -> Error {
    match e {
        Error::Gguf(m) => Error::Gguf(format!("{what}: {m}")),
        e => e,
    }
}

/// `v` rounded up to a multiple of `alignment` (a power of two); `None` on overflow.
pub(crate) fn align(v: Option<u64>, alignment: u64) -> Option<u64> {
    let v = v?;
    v.checked_add(alignment - 1).map(|x| x & !(alignment - 1))
}

/// A bounds-checked little-endian reader over the file's bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

macro_rules! read_le {
    ($($name:ident: $t:ty;)*) => {
        $(
            fn $name(&mut self) -> Result<$t> {
                let b = self.take(std::mem::size_of::<$t>())?;
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                Ok(<$t>::from_le_bytes(a))
            }
        )*
    };
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| {
            bad(format!(
                "unexpected end of file: need {n} bytes at offset {}, file has {}",
                self.pos,
                self.buf.len()
            ))
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// Fails unless `count` items of at least `min_size` bytes each can fit in what remains.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<()> {
        match count.checked_mul(min_size) {
            Some(n) if n <= self.remaining() => Ok(()),
            _ => Err(bad(format!(
                "{count} {what} cannot fit in the {} bytes left in the file",
                self.remaining()
            ))),
        }
    }

    read_le! {
        u8: u8;
        i8: i8;
        u16: u16;
        i16: i16;
        u32: u32;
        i32: i32;
        f32: f32;
        u64: u64;
        i64: i64;
        f64: f64;
    }

    fn string(&mut self) -> Result<String> {
        let len = self.u64()?;
        if len > self.remaining() {
            return Err(bad(format!("string length {len} exceeds the {} bytes left", self.remaining())));
        }
        let b = self.take(len as usize)?;
        Ok(match std::str::from_utf8(b) {
            Ok(s) => s.to_owned(),
            Err(_) => {
                tracing::warn!(len, "gguf string is not valid UTF-8; replacing bad bytes");
                String::from_utf8_lossy(b).into_owned()
            }
        })
    }

    fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(bad(format!("bool byte {b} is neither 0 nor 1"))),
        }
    }

    fn value(&mut self, ty: ValueType) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8()?),
            ValueType::I8 => Value::I8(self.i8()?),
            ValueType::U16 => Value::U16(self.u16()?),
            ValueType::I16 => Value::I16(self.i16()?),
            ValueType::U32 => Value::U32(self.u32()?),
            ValueType::I32 => Value::I32(self.i32()?),
            ValueType::F32 => Value::F32(self.f32()?),
            ValueType::Bool => Value::Bool(self.bool()?),
            ValueType::String => Value::String(self.string()?),
            ValueType::U64 => Value::U64(self.u64()?),
            ValueType::I64 => Value::I64(self.i64()?),
            ValueType::F64 => Value::F64(self.f64()?),
            ValueType::Array => {
                let et = self.u32()?;
                let et =
                    ValueType::from_u32(et).ok_or_else(|| bad(format!("unknown array element type {et}")))?;
                let n = self.u64()?;
                self.check_count(n, et.min_size(), &format!("{et} array elements"))?;
                let n = n as usize;
                Value::Array(match et {
                    ValueType::Array => return Err(bad("nested arrays are not supported")),
                    ValueType::U8 => Array::U8(self.take(n)?.to_vec()),
                    ValueType::I8 => Array::I8(self.take(n)?.iter().map(|&b| b as i8).collect()),
                    ValueType::U16 => Array::U16(self.vec(n, Self::u16)?),
                    ValueType::I16 => Array::I16(self.vec(n, Self::i16)?),
                    ValueType::U32 => Array::U32(self.vec(n, Self::u32)?),
                    ValueType::I32 => Array::I32(self.vec(n, Self::i32)?),
                    ValueType::F32 => Array::F32(self.vec(n, Self::f32)?),
                    ValueType::Bool => Array::Bool(self.vec(n, Self::bool)?),
                    ValueType::String => Array::String(self.vec(n, Self::string)?),
                    ValueType::U64 => Array::U64(self.vec(n, Self::u64)?),
                    ValueType::I64 => Array::I64(self.vec(n, Self::i64)?),
                    ValueType::F64 => Array::F64(self.vec(n, Self::f64)?),
                })
            }
        })
    }

    /// Reads `n` items; the caller has checked that `n` minimum-size items fit in the file.
    fn vec<T>(&mut self, n: usize, f: fn(&mut Self) -> Result<T>) -> Result<Vec<T>> {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(f(self)?);
        }
        Ok(v)
    }

    fn tensor_info(&mut self) -> Result<TensorInfo> {
        let name = self.string()?;
        if name.len() >= MAX_NAME_LEN {
            return Err(bad(format!(
                "tensor name {name:?} is {} bytes, the limit is {}",
                name.len(),
                MAX_NAME_LEN - 1
            )));
        }
        let n_dims = self.u32()?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(bad(format!("tensor {name:?} has {n_dims} dimensions, expected 1..={MAX_DIMS}")));
        }
        let mut ne = [1u64; MAX_DIMS];
        for d in ne.iter_mut().take(n_dims as usize) {
            let v = self.i64()?;
            *d = u64::try_from(v).map_err(|_| bad(format!("tensor {name:?} has negative dimension {v}")))?;
        }
        // ggml keeps element counts in int64_t: the product must fit.
        let nel = ne.iter().try_fold(1u64, |a, &n| a.checked_mul(n));
        if nel.is_none_or(|n| n > i64::MAX as u64) {
            return Err(bad(format!("tensor {name:?}: element count of {ne:?} overflows")));
        }
        let ty = self.u32()?;
        let dtype = GgmlType::from_u32(ty)
            .ok_or_else(|| bad(format!("tensor {name:?} has unknown ggml_type {ty}")))?;
        let blck = dtype.blck_size() as u64;
        if ne[0] % blck != 0 {
            return Err(bad(format!(
                "tensor {name:?}: ne0 = {} is not a multiple of the {dtype} block size {blck}",
                ne[0]
            )));
        }
        let layout = Layout::contiguous(dtype, ne).map_err(|e| bad(format!("tensor {name:?}: {e}")))?;
        let size = dtype
            .row_size(ne[0])
            .and_then(|r| r.checked_mul(ne[1]))
            .and_then(|r| r.checked_mul(ne[2]))
            .and_then(|r| r.checked_mul(ne[3]))
            .ok_or_else(|| bad(format!("tensor {name:?}: size overflows")))?;
        let offset = self.u64()?;
        Ok(TensorInfo { name, n_dims, layout, offset, size })
    }
}
