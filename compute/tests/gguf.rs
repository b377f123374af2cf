//! GGUF reader and writer: round trips of every value type and several tensor types, the facts
//! of the real SmolLM2 file (ref: ggml-compute-semantics.md §4.11), strict rejection of malformed
//! headers, and a seeded fuzz test that corrupts real and written files at field boundaries.

use compute::gguf::{Array, Gguf, GgufWriter, Value, ValueType};
use compute::GgmlType;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

mod peer_support;

fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("t.u8", Value::U8(0xAB)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(0xBEEF)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(0xDEAD_BEEF)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(-1.5e-7)),
        ("t.bool", Value::Bool(true)),
        ("t.bool2", Value::Bool(false)),
        ("t.str", Value::String("héllo, wörld 🦀\n".into())),
        ("t.empty", Value::String(String::new())),
        ("t.u64", Value::U64(u64::MAX - 7)),
        ("t.i64", Value::I64(i64::MIN + 3)),
        ("t.f64", Value::F64(std::f64::consts::PI)),
        ("a.u8", Value::Array(Array::U8(vec![0, 1, 255]))),
        ("a.i8", Value::Array(Array::I8(vec![-128, 0, 127]))),
        ("a.u16", Value::Array(Array::U16(vec![1, 65535]))),
        ("a.i16", Value::Array(Array::I16(vec![-32768, 32767]))),
        ("a.u32", Value::Array(Array::U32(vec![7; 5]))),
        ("a.i32", Value::Array(Array::I32(vec![-1, 2, -3]))),
        ("a.f32", Value::Array(Array::F32(vec![0.5, -0.25, f32::INFINITY]))),
        ("a.bool", Value::Array(Array::Bool(vec![true, false, true]))),
        ("a.str", Value::Array(Array::String(vec!["a".into(), String::new(), "日本語".into()]))),
        ("a.u64", Value::Array(Array::U64(vec![u64::MAX]))),
        ("a.i64", Value::Array(Array::I64(vec![i64::MIN, 0]))),
        ("a.f64", Value::Array(Array::F64(vec![1e300, -0.0]))),
        ("a.empty", Value::Array(Array::F32(vec![]))),
    ]
}

/// Deterministic pseudo-random bytes.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A small file with every value type and tensors of several types and ranks.
/// A tensor a sample file holds: name, type, shape and bytes.
type SampleTensor = (&'static str, GgmlType, Vec<u64>, Vec<u8>);

fn sample_writer(alignment: Option<u32>) -> (GgufWriter, Vec<SampleTensor>) {
    let mut w = GgufWriter::new();
    if let Some(a) = alignment {
        w.alignment(a).unwrap();
    }
    for (k, v) in every_value() {
        w.add(k, v);
    }
    let tensors: Vec<(&str, GgmlType, Vec<u64>)> = vec![
        ("f32.1d", GgmlType::F32, vec![7]),
        ("f16.2d", GgmlType::F16, vec![3, 5]),
        ("q4_0.2d", GgmlType::Q4_0, vec![64, 3]),
        ("q4_1.3d", GgmlType::Q4_1, vec![32, 2, 2]),
        ("q8_0.4d", GgmlType::Q8_0, vec![32, 1, 2, 3]),
        ("q4_K.2d", GgmlType::Q4_K, vec![256, 2]),
        ("q6_K.2d", GgmlType::Q6_K, vec![512, 1]),
        ("i32.1d", GgmlType::I32, vec![3]),
        ("empty", GgmlType::F32, vec![0, 4]),
    ];
    let mut out = Vec::new();
    for (i, (name, t, ne)) in tensors.into_iter().enumerate() {
        let size = compute::gguf::tensor_size(t, &ne).unwrap() as usize;
        let data = bytes(size, i as u64 + 1);
        w.add_tensor(name, t, &ne, data.clone()).unwrap();
        out.push((name, t, ne, data));
    }
    (w, out)
}

#[test]
fn round_trip_every_value_and_tensor_type() {
    for alignment in [None, Some(1), Some(64), Some(4096)] {
        for version in [2, 3] {
            let (mut w, tensors) = sample_writer(alignment);
            w.version(version).unwrap();
            let file = w.to_bytes().unwrap();
            let g = Gguf::from_bytes(file.clone()).unwrap();
            assert_eq!(g.version(), version);
            let align = u64::from(alignment.unwrap_or(32));
            assert_eq!(g.alignment(), align);
            assert_eq!(g.data_offset() % align, 0);
            let expected_kv = every_value().len() + usize::from(alignment.is_some());
            assert_eq!(g.metadata().len(), expected_kv);
            for (k, v) in every_value() {
                assert_eq!(g.get(k), Some(&v), "key {k}");
                assert_eq!(g.get(k).unwrap().value_type(), v.value_type());
            }
            assert_eq!(g.tensors().len(), tensors.len());
            let mut running = 0u64;
            for (ti, (name, t, ne, data)) in tensors.iter().enumerate() {
                let r = g.tensor(name).unwrap();
                assert_eq!(r.info.name, *name);
                assert_eq!(r.info.dtype(), *t);
                assert_eq!(r.info.shape(), ne.as_slice());
                assert_eq!(r.data, data.as_slice(), "tensor {name}");
                assert_eq!(r.info.offset, running, "tensor {ti} offset");
                assert_eq!(r.info.offset % align, 0);
                let mut full = [1u64; 4];
                full[..ne.len()].copy_from_slice(ne);
                assert_eq!(r.info.layout.ne, full);
                assert_eq!(r.info.layout.nb[0], t.type_size() as u64);
                assert_eq!(r.info.layout.nb[1], t.row_size(ne[0]).unwrap());
                running = (running + data.len() as u64).div_ceil(align) * align;
            }
            // The same bytes through a file and the memory map.
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("x.gguf");
            w.write_file(&p).unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), file);
            // SAFETY: the temporary file is not modified while mapped.
            let m = unsafe { Gguf::open(&p) }.unwrap();
            assert_eq!(m.metadata(), g.metadata());
            assert_eq!(m.tensor("q4_K.2d").unwrap().data, g.tensor("q4_K.2d").unwrap().data);
            // And through a private copy in anonymous memory (llamactl's in-process runs).
            let r = Gguf::load_resident(&p).unwrap();
            assert_eq!(r.bytes(), &file[..]);
            assert_eq!(r.metadata(), g.metadata());
            for t in g.tensors() {
                assert_eq!(r.tensor(&t.name).unwrap().data, g.tensor(&t.name).unwrap().data, "{}", t.name);
            }
        }
    }
}

#[test]
fn header_bytes_match_the_spec() {
    // A file written by hand from §5, compared with what the writer emits.
    let mut w = GgufWriter::new();
    w.add("k", 5u32);
    w.add_f32_tensor("t", &[2], &[1.0, 2.0]).unwrap();
    let got = w.to_bytes().unwrap();
    let mut want = Vec::new();
    want.extend_from_slice(b"GGUF");
    want.extend_from_slice(&3u32.to_le_bytes());
    want.extend_from_slice(&1i64.to_le_bytes()); // n_tensors
    want.extend_from_slice(&1i64.to_le_bytes()); // n_kv
    want.extend_from_slice(&1u64.to_le_bytes());
    want.push(b'k');
    want.extend_from_slice(&4u32.to_le_bytes()); // UINT32
    want.extend_from_slice(&5u32.to_le_bytes());
    want.extend_from_slice(&1u64.to_le_bytes());
    want.push(b't');
    want.extend_from_slice(&1u32.to_le_bytes()); // n_dims
    want.extend_from_slice(&2u64.to_le_bytes()); // ne0
    want.extend_from_slice(&0u32.to_le_bytes()); // F32
    want.extend_from_slice(&0u64.to_le_bytes()); // offset
    want.resize(want.len().div_ceil(32) * 32, 0);
    want.extend_from_slice(&1.0f32.to_le_bytes());
    want.extend_from_slice(&2.0f32.to_le_bytes());
    want.resize(want.len().div_ceil(32) * 32, 0);
    assert_eq!(got, want);
}

#[test]
fn typed_getters() {
    let mut w = GgufWriter::new();
    w.add("u32", 7u32).add("u8", 200u8).add("i32neg", -1i32).add("f", 0.5f32).add("s", "x").add("b", true);
    w.add("per_layer", vec![1u32, 2, 3]).add("names", vec!["a", "b"]);
    let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(g.get_u32("u32").unwrap(), 7);
    assert_eq!(g.get_u32("u8").unwrap(), 200);
    assert!(g.get_u32("i32neg").is_err());
    assert_eq!(g.get_i64_opt("i32neg").unwrap(), Some(-1));
    assert!(g.get_u32("missing").unwrap_err().to_string().contains("missing key"));
    assert_eq!(g.get_u32_opt("missing").unwrap(), None);
    assert!(g.get_u32("s").unwrap_err().to_string().contains("has type str"));
    assert_eq!(g.get_f32("f").unwrap(), 0.5);
    assert_eq!(g.get_str("s").unwrap(), "x");
    assert_eq!(g.get_bool_opt("b").unwrap(), Some(true));
    assert_eq!(g.get_str_array_opt("names").unwrap().unwrap(), ["a", "b"]);
    assert_eq!(g.get_u32_per_layer_opt("per_layer", 3).unwrap().unwrap(), [1, 2, 3]);
    assert!(g.get_u32_per_layer_opt("per_layer", 4).is_err());
    assert_eq!(g.get_u32_per_layer_opt("u32", 2).unwrap().unwrap(), [7, 7]);
    assert!(g.tensor("nope").is_err());
}

fn err_of(bytes: Vec<u8>) -> String {
    match Gguf::from_bytes(bytes) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn rejects_malformed_headers() {
    let (w, _) = sample_writer(None);
    let good = w.to_bytes().unwrap();
    Gguf::from_bytes(good.clone()).unwrap();

    let mut v1 = good.clone();
    v1[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(err_of(v1).contains("version 1"));

    let mut be = good.clone();
    be[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(err_of(be).contains("big-endian"));

    let mut v4 = good.clone();
    v4[4..8].copy_from_slice(&4u32.to_le_bytes());
    assert!(err_of(v4).contains("unsupported GGUF version 4"));

    let mut magic = good.clone();
    magic[0] = b'X';
    assert!(err_of(magic).contains("magic"));

    let mut huge_kv = good.clone();
    huge_kv[16..24].copy_from_slice(&(1i64 << 40).to_le_bytes());
    assert!(err_of(huge_kv).contains("cannot fit"));

    let mut neg = good.clone();
    neg[8..16].copy_from_slice(&(-1i64).to_le_bytes());
    assert!(err_of(neg).contains("negative"));

    // A huge key length.
    let mut key_len = good.clone();
    key_len[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err_of(key_len).contains("string length"));

    assert!(err_of(good[..good.len() - 64].to_vec()).contains("beyond the end"));
    assert!(err_of(good[..10].to_vec()).contains("end of file"));
    assert!(err_of(Vec::new()).contains("too short"));

    // general.alignment written by hand, since the writer refuses bad ones.
    let with_alignment = |ty: u32, value: &[u8]| {
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0i64.to_le_bytes());
        b.extend_from_slice(&1i64.to_le_bytes());
        b.extend_from_slice(&17u64.to_le_bytes());
        b.extend_from_slice(b"general.alignment");
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(value);
        b
    };
    Gguf::from_bytes(with_alignment(4, &64u32.to_le_bytes())).unwrap();
    for a in [0u32, 3, 48] {
        assert!(err_of(with_alignment(4, &a.to_le_bytes())).contains("power of two"), "alignment {a}");
    }
    assert!(err_of(with_alignment(10, &32u64.to_le_bytes())).contains("expected u32"));
    assert!(GgufWriter::new().alignment(48).is_err());

    // Tensor infos that break the rules.
    let one_tensor = |name: &str, n_dims: u32, ne: &[i64], ty: u32, offset: u64, data: usize| {
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&1i64.to_le_bytes());
        b.extend_from_slice(&0i64.to_le_bytes());
        b.extend_from_slice(&(name.len() as u64).to_le_bytes());
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&n_dims.to_le_bytes());
        for n in ne {
            b.extend_from_slice(&n.to_le_bytes());
        }
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(&offset.to_le_bytes());
        b.resize(b.len().div_ceil(32) * 32 + data, 0);
        b
    };
    Gguf::from_bytes(one_tensor("t", 2, &[32, 2], 2, 0, 36)).unwrap();
    assert!(err_of(one_tensor("t", 2, &[32, 2], 2, 0, 35)).contains("beyond the end"));
    assert!(err_of(one_tensor("t", 2, &[32, 2], 2, 32, 100)).contains("running sum"));
    assert!(err_of(one_tensor("t", 2, &[31, 2], 2, 0, 100)).contains("block size"));
    assert!(err_of(one_tensor("t", 2, &[32, -2], 2, 0, 100)).contains("negative"));
    assert!(err_of(one_tensor("t", 2, &[32, 2], 4, 0, 100)).contains("unknown ggml_type 4"));
    assert!(err_of(one_tensor("t", 5, &[1, 1, 1, 1, 1], 0, 0, 100)).contains("dimensions"));
    assert!(err_of(one_tensor("t", 0, &[], 0, 0, 100)).contains("dimensions"));
    assert!(err_of(one_tensor(&"n".repeat(64), 1, &[1], 0, 0, 100)).contains("limit"));
    Gguf::from_bytes(one_tensor(&"n".repeat(63), 1, &[1], 0, 0, 100)).unwrap();
    let big = 1i64 << 32;
    assert!(err_of(one_tensor("t", 3, &[big, big, big], 0, 0, 100)).contains("overflows"));
    assert!(err_of(one_tensor("t", 2, &[1 << 40, 1 << 20], 0, 0, 100)).contains("beyond the end"));
    // Duplicate keys and tensor names, written by hand.
    let mut dup = Vec::new();
    dup.extend_from_slice(b"GGUF");
    dup.extend_from_slice(&3u32.to_le_bytes());
    dup.extend_from_slice(&0i64.to_le_bytes());
    dup.extend_from_slice(&2i64.to_le_bytes());
    for _ in 0..2 {
        dup.extend_from_slice(&1u64.to_le_bytes());
        dup.push(b'k');
        dup.extend_from_slice(&7u32.to_le_bytes());
        dup.push(1);
    }
    assert!(err_of(dup).contains("duplicate key"));
    let mut w = GgufWriter::new();
    w.add_f32_tensor("a", &[8], &[0.0; 8]).unwrap().add_f32_tensor("b", &[8], &[0.0; 8]).unwrap();
    let mut two = w.to_bytes().unwrap();
    let at = two.windows(9).position(|x| x == b"\x01\0\0\0\0\0\0\0b").unwrap();
    two[at + 8] = b'a';
    assert!(err_of(two).contains("duplicate tensor name"));
    // Nested arrays and unknown value types.
    let mut nested = Vec::new();
    nested.extend_from_slice(b"GGUF");
    nested.extend_from_slice(&3u32.to_le_bytes());
    nested.extend_from_slice(&0i64.to_le_bytes());
    nested.extend_from_slice(&1i64.to_le_bytes());
    nested.extend_from_slice(&1u64.to_le_bytes());
    nested.push(b'k');
    nested.extend_from_slice(&9u32.to_le_bytes());
    nested.extend_from_slice(&9u32.to_le_bytes());
    nested.extend_from_slice(&0u64.to_le_bytes());
    assert!(err_of(nested.clone()).contains("nested arrays"));
    let n = nested.len();
    nested[n - 12..n - 8].copy_from_slice(&13u32.to_le_bytes());
    assert!(err_of(nested.clone()).contains("unknown array element type 13"));
    nested[n - 16..n - 12].copy_from_slice(&13u32.to_le_bytes());
    assert!(err_of(nested).contains("unknown value type 13"));
    let mut bool2 = with_alignment(4, &64u32.to_le_bytes());
    bool2.truncate(bool2.len() - 8);
    bool2.extend_from_slice(&7u32.to_le_bytes());
    bool2.push(2);
    assert!(err_of(bool2).contains("neither 0 nor 1"));

    let mut w = GgufWriter::new();
    w.add_f32_tensor("t", &[1], &[1.0]).unwrap();
    assert!(w.add_f32_tensor("t", &[1], &[1.0]).is_err());
    assert!(w.add_f32_tensor("u", &[2], &[1.0]).is_err());
}

/// Byte positions of the fields a hostile file would lie about.
#[derive(Clone, Copy, Debug)]
enum Field {
    Count(usize),
    StrLen(usize),
    Type(usize),
    NDims(usize),
    Ne(usize),
    Offset(usize),
}

/// An independent walk over a well-formed file that records where each field is.
fn fields_of(b: &[u8]) -> Vec<Field> {
    let u32_at = |p: usize| u32::from_le_bytes(b[p..p + 4].try_into().unwrap());
    let u64_at = |p: usize| u64::from_le_bytes(b[p..p + 8].try_into().unwrap());
    let mut f = vec![Field::Count(8), Field::Count(16)];
    let n_tensors = u64_at(8);
    let n_kv = u64_at(16);
    let mut p = 24usize;
    let string = |p: &mut usize, f: &mut Vec<Field>| {
        f.push(Field::StrLen(*p));
        *p += 8 + u64_at(*p) as usize;
    };
    fn fixed(t: u32) -> usize {
        match t {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            _ => 8,
        }
    }
    for _ in 0..n_kv {
        string(&mut p, &mut f);
        f.push(Field::Type(p));
        let t = u32_at(p);
        p += 4;
        match t {
            8 => string(&mut p, &mut f),
            9 => {
                f.push(Field::Type(p));
                let et = u32_at(p);
                f.push(Field::Count(p + 4));
                let n = u64_at(p + 4) as usize;
                p += 12;
                if et == 8 {
                    // Only the first few string lengths of big arrays, to keep the list short.
                    for i in 0..n {
                        if i < 4 {
                            string(&mut p, &mut f);
                        } else {
                            p += 8 + u64_at(p) as usize;
                        }
                    }
                } else {
                    p += n * fixed(et);
                }
            }
            t => p += fixed(t),
        }
    }
    for _ in 0..n_tensors {
        string(&mut p, &mut f);
        f.push(Field::NDims(p));
        let nd = u32_at(p) as usize;
        p += 4;
        for _ in 0..nd {
            f.push(Field::Ne(p));
            p += 8;
        }
        f.push(Field::Type(p));
        p += 4;
        f.push(Field::Offset(p));
        p += 8;
    }
    f
}

#[derive(Clone, Debug)]
enum Corruption {
    Truncate(f64),
    FlipByte(f64, u8),
    Field(usize, u64),
}

fn hostile_values() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(i64::MAX as u64),
        Just(1 << 32),
        Just(1 << 40),
        Just(13),
        Just(9),
        Just(5),
        any::<u64>(),
        0u64..1000,
    ]
}

fn corruption() -> impl Strategy<Value = Corruption> {
    prop_oneof![
        (0.0f64..1.0).prop_map(Corruption::Truncate),
        (0.0f64..1.0, any::<u8>()).prop_map(|(p, b)| Corruption::FlipByte(p, b)),
        (any::<usize>(), hostile_values()).prop_map(|(i, v)| Corruption::Field(i, v)),
        (any::<usize>(), hostile_values()).prop_map(|(i, v)| Corruption::Field(i, v)),
    ]
}

/// Applies `c` to `b` (within `header_len` for positional corruptions) and parses the result:
/// it must be an error or a parse whose tensors all lie inside the file.
fn check_corrupted(mut b: Vec<u8>, header_len: usize, fields: &[Field], c: &Corruption) {
    match *c {
        Corruption::Truncate(at) => b.truncate((at * b.len() as f64) as usize),
        Corruption::FlipByte(at, x) => {
            let p = (at * header_len as f64) as usize;
            b[p] ^= x | 1;
        }
        Corruption::Field(i, v) => {
            let put = |b: &mut Vec<u8>, p: usize, bytes: &[u8]| b[p..p + bytes.len()].copy_from_slice(bytes);
            match fields[i % fields.len()] {
                Field::Count(p) | Field::StrLen(p) | Field::Ne(p) | Field::Offset(p) => {
                    put(&mut b, p, &v.to_le_bytes())
                }
                Field::Type(p) | Field::NDims(p) => put(&mut b, p, &(v as u32).to_le_bytes()),
            }
        }
    }
    let len = b.len() as u64;
    if let Ok(g) = Gguf::from_bytes(b) {
        for t in g.tensors() {
            let data = g.tensor(&t.name).unwrap().data;
            assert_eq!(data.len() as u64, t.size);
            assert!(g.data_offset() + t.offset + t.size <= len);
        }
        for (_, v) in g.metadata() {
            let _ = v.to_string();
        }
    }
}

#[test]
fn fuzz_written_files() {
    let (w, _) = sample_writer(Some(64));
    let file = w.to_bytes().unwrap();
    let header_len = Gguf::from_bytes(file.clone()).unwrap().data_offset() as usize;
    let fields = fields_of(&file);
    assert!(fields.len() > 100, "field walk found {} fields", fields.len());
    let mut runner = TestRunner::new_with_rng(
        Config { cases: 3000, failure_persistence: None, ..Config::default() },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    runner
        .run(&corruption(), |c| {
            check_corrupted(file.clone(), header_len, &fields, &c);
            Ok(())
        })
        .unwrap();
}

#[test]
fn fuzz_real_file() {
    let Some(path) = peer_support::model("fuzz_real_file") else { return };
    let file = std::fs::read(&path).unwrap();
    let header_len = Gguf::from_bytes(file.clone()).unwrap().data_offset() as usize;
    let fields = fields_of(&file);
    let mut runner = TestRunner::new_with_rng(
        Config { cases: 48, failure_persistence: None, ..Config::default() },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[11; 32]),
    );
    runner
        .run(&corruption(), |c| {
            check_corrupted(file.clone(), header_len, &fields, &c);
            Ok(())
        })
        .unwrap();
}

#[test]
fn smollm2_facts() {
    let Some(path) = peer_support::model("smollm2_facts") else { return };
    // SAFETY: the model file is not modified while the test runs.
    let g = unsafe { Gguf::open(&path) }.unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(g.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(g.get_u32(&g.arch_key("block_count").unwrap()).unwrap(), 30);
    assert_eq!(g.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(g.get_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(g.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(g.get_u32("llama.feed_forward_length").unwrap(), 1536);
    assert_eq!(g.get_f32("llama.rope.freq_base").unwrap(), 1e5);
    assert_eq!(g.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap(), 1e-5);
    assert_eq!(g.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(g.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    let tokens = g.get_str_array_opt("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens[1], "<|im_start|>");
    assert_eq!(tokens[2], "<|im_end|>");
    assert_eq!(tokens[19556], "Hello");
    assert_eq!(tokens[905], "Ġworld");
    assert_eq!(g.get_array("tokenizer.ggml.token_type").unwrap().elem_type(), ValueType::I32);
    assert_eq!(g.get_u32("tokenizer.ggml.bos_token_id").unwrap(), 1);
    assert_eq!(g.get_u32("tokenizer.ggml.eos_token_id").unwrap(), 2);
    assert_eq!(g.get_bool_opt("tokenizer.ggml.add_bos_token").unwrap(), Some(false));

    let count = |t: GgmlType| g.tensors().iter().filter(|x| x.dtype() == t).count();
    assert_eq!(count(GgmlType::Q4_1), 210);
    assert_eq!(count(GgmlType::F32), 61);
    assert_eq!(count(GgmlType::Q8_0), 1);
    assert_eq!(g.tensors().len(), 272);
    assert!(g.tensor_info("output.weight").is_none(), "embeddings are tied");

    let emb = g.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.info.dtype(), GgmlType::Q8_0);
    assert_eq!(emb.info.shape(), [576, 49152]);
    assert_eq!(emb.data.len(), 576 / 32 * 34 * 49152);
    let q = g.tensor("blk.29.attn_k.weight").unwrap();
    assert_eq!(q.info.shape(), [576, 192]);
    assert_eq!(q.info.dtype(), GgmlType::Q4_1);
    let norm = g.tensor("output_norm.weight").unwrap();
    assert_eq!(norm.info.shape(), [576]);
    // RMS-norm weights are finite and not all zero.
    let w: Vec<f32> = norm.data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert!(w.iter().all(|x| x.is_finite()) && w.iter().any(|&x| x != 0.0));

    // Rewriting every tensor and key through the writer reproduces the same parse.
    let mut wr = GgufWriter::new();
    for (k, v) in g.metadata() {
        wr.add(k, v.clone());
    }
    for t in g.tensors() {
        wr.add_tensor(&t.name, t.dtype(), t.shape(), g.tensor(&t.name).unwrap().data.to_vec()).unwrap();
    }
    let again = wr.to_bytes().unwrap();
    assert_eq!(again.len(), std::fs::metadata(&path).unwrap().len() as usize);
    assert_eq!(again, std::fs::read(&path).unwrap(), "writer reproduces the file byte for byte");
}
