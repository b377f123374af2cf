//! GET_ROWS, SET_ROWS and CPY/CONT/DUP, including the malformed shapes of
//! ggml-rpc-protocol.md §14 items 7–11.

use compute::{Error, GgmlOp, GgmlType};

use crate::harness::*;

const TABLE_TYPES: [GgmlType; 9] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
];

#[test]
fn get_rows_every_table_type_3d() {
    for (ti, t) in TABLE_TYPES.into_iter().filter(|t| has_codec(*t)).enumerate() {
        let (n0, rows, ne2) = (256u64, 7u64, 2u64);
        let mut r = rng(200 + ti as u64);
        let table = T::from_f32(t, [n0, rows, ne2, 1], &randv(&mut r, (n0 * rows * ne2) as usize, 1.0));
        let idx_v = [3, 0, 6, 6, 1, 2];
        let idx = T::i32s([3, ne2, 1, 1], &idx_v);
        let dst = T::new(GgmlType::F32, [n0, 3, ne2, 1]);
        run(vec![node(GgmlOp::GetRows, dst.t(), &[table.t(), idx.t()])], 2).unwrap();
        let mut want = Vec::new();
        for i2 in 0..ne2 as usize {
            for i in 0..3 {
                want.extend(row(&table.t(), idx_v[i2 * 3 + i] as usize, i2, 0));
            }
        }
        // Dequantization is exact against the scalar to_f32.
        assert_eq!(dst.values(), want, "get_rows {t}");
    }
}

#[test]
fn get_rows_i32_table_and_strided_source() {
    let table = T::i32s([3, 4, 1, 1], &(0..12).map(|v| v * 1_000_003).collect::<Vec<_>>());
    let idx = T::i32s([2, 1, 1, 1], &[3, 1]);
    let dst = T::new(GgmlType::I32, [3, 2, 1, 1]);
    run(vec![node(GgmlOp::GetRows, dst.t(), &[table.t(), idx.t()])], 1).unwrap();
    let want: Vec<f64> = [9, 10, 11, 3, 4, 5].iter().map(|v| (*v as i64 * 1_000_003) as f64).collect();
    assert_eq!(dst.values(), want);

    // Rows of a hidden state picked through a strided view (last-layer out_ids selection).
    let h = T::from_f32(GgmlType::F32, [8, 6, 1, 1], &(0..48).map(|v| v as f32).collect::<Vec<_>>());
    let v = h.view([4, 3, 1, 1], [4, 64, 192, 192], 16);
    let idx = T::i32s([2, 1, 1, 1], &[2, 0]);
    let dst = T::new(GgmlType::F32, [4, 2, 1, 1]);
    run(vec![node(GgmlOp::GetRows, dst.t(), &[v, idx.t()])], 2).unwrap();
    assert_eq!(dst.values(), vec![36.0, 37.0, 38.0, 39.0, 4.0, 5.0, 6.0, 7.0]);
}

#[test]
fn get_rows_refuses_mismatch_and_reports_bad_ids() {
    // §14 item 10: src0.ne[2] != src1.ne[1] (the kernel would read past src0).
    let table = T::new(GgmlType::F32, [4, 5, 1, 1]);
    let idx = T::i32s([2, 3, 1, 1], &[0; 6]);
    let dst = T::new(GgmlType::F32, [4, 2, 3, 1]);
    let r = validate(vec![node(GgmlOp::GetRows, dst.t(), &[table.t(), idx.t()])]);
    assert!(matches!(r, Err(Error::Shape { .. })), "{r:?}");
    // dst with too many rows.
    let idx = T::i32s([2, 1, 1, 1], &[0, 1]);
    let dst = T::new(GgmlType::F32, [4, 3, 1, 1]);
    assert!(validate(vec![node(GgmlOp::GetRows, dst.t(), &[table.t(), idx.t()])]).is_err());
    // Out-of-range and negative ids: skipped, reported after the graph.
    for bad in [5, -1, i32::MAX] {
        let table = T::from_f32(GgmlType::F32, [4, 5, 1, 1], &[1.0; 20]);
        let idx = T::i32s([2, 1, 1, 1], &[bad, 4]);
        let dst = T::new(GgmlType::F32, [4, 2, 1, 1]);
        let r = run(vec![node(GgmlOp::GetRows, dst.t(), &[table.t(), idx.t()])], 2);
        assert!(matches!(r, Err(Error::IndexOutOfRange { .. })), "{r:?}");
        assert_eq!(dst.values(), [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
    }
}

#[test]
fn set_rows_kv_store_types() {
    let dsts = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
    ];
    for (ti, t) in dsts.into_iter().filter(|t| has_codec(*t)).enumerate() {
        for i64_idx in [true, false] {
            let (n0, cells, n) = (64u64, 10u64, 4u64);
            let mut r = rng(300 + ti as u64);
            let cache = T::new(t, [n0, cells, 1, 1]);
            let src_v = randv(&mut r, (n0 * n) as usize, 1.0);
            let src = T::from_f32(GgmlType::F32, [n0, n, 1, 1], &src_v);
            let idx_v = [7i64, 2, 9, 0];
            let idx = if i64_idx {
                T::i64s([n, 1, 1, 1], &idx_v)
            } else {
                T::i32s([n, 1, 1, 1], &idx_v.map(|v| v as i32))
            };
            run(vec![node(GgmlOp::SetRows, cache.t(), &[src.t(), idx.t(), cache.t()])], 2).unwrap();
            let got = cache.values();
            for (i, &c) in idx_v.iter().enumerate() {
                // The stored row equals the destination quantizer applied to the source row.
                let mut enc = vec![0u8; t.row_size(n0).unwrap() as usize];
                encode_row(t, &src_v[i * n0 as usize..(i + 1) * n0 as usize], &mut enc);
                let want = decode_row(t, &enc, n0 as usize);
                assert_eq!(
                    &got[c as usize * n0 as usize..(c as usize + 1) * n0 as usize],
                    &want[..],
                    "{t} row {c}"
                );
            }
            // Untouched rows stay zero.
            assert!(got[n0 as usize..2 * n0 as usize].iter().all(|v| *v == 0.0));
        }
    }
}

#[test]
fn set_rows_transposed_v_cache_elementwise() {
    // ref: §4.4: FA off stores V one element per "row" into a [1, N] view.
    let (d, t, kv) = (4u64, 3u64, 8u64);
    let cache = T::new(GgmlType::F16, [1, d * kv, 1, 1]);
    let src_v: Vec<f32> = (0..d * t).map(|v| v as f32).collect();
    let src = T::from_f32(GgmlType::F32, [1, d * t, 1, 1], &src_v);
    // token j, channel c -> c * kv + (j + 2)
    let idx_v: Vec<i64> = (0..t).flat_map(|j| (0..d).map(move |c| (c * kv + j + 2) as i64)).collect();
    let idx = T::i64s([d * t, 1, 1, 1], &idx_v);
    run(vec![node(GgmlOp::SetRows, cache.t(), &[src.t(), idx.t(), cache.t()])], 3).unwrap();
    let got = cache.values();
    for (i, &p) in idx_v.iter().enumerate() {
        assert_eq!(got[p as usize], src_v[i] as f64);
    }
}

#[test]
fn set_rows_many_indices_increasing_duplicated_and_out_of_range() {
    // Enough indices for several check units: increasing indices take the split by source rows,
    // a duplicate or an unordered pair the split by destination rows (last write wins).
    let (n, cells) = (5000usize, 12000u64);
    let src_v: Vec<f32> = (0..2 * n).map(|v| v as f32).collect();
    let src = T::from_f32(GgmlType::F32, [1, n as u64, 2, 1], &src_v);
    let increasing: Vec<i64> = (0..n as i64).map(|i| 2 * i + 1).collect();
    let mut duplicated = increasing.clone();
    duplicated[n - 1] = duplicated[10];
    let mut unordered = increasing.clone();
    unordered.swap(100, 4000);
    for (name, ids) in [("increasing", &increasing), ("duplicated", &duplicated), ("unordered", &unordered)] {
        for threads in [1, 3] {
            let cache = T::new(GgmlType::F16, [1, cells, 2, 1]);
            let idx = T::i64s([n as u64, 1, 1, 1], ids);
            run(vec![node(GgmlOp::SetRows, cache.t(), &[src.t(), idx.t(), cache.t()])], threads).unwrap();
            let got = cache.values();
            let mut want = vec![0.0f64; 2 * cells as usize];
            for plane in 0..2 {
                for (i, &c) in ids.iter().enumerate() {
                    // f16 holds these integers exactly up to 2048, then rounds to even steps.
                    want[plane * cells as usize + c as usize] =
                        half::f16::from_f32(src_v[plane * n + i]).to_f64();
                }
            }
            assert_eq!(got, want, "{name}, {threads} threads");
        }
    }
    // An index past the end among increasing ones is reported, and the others are written.
    let mut bad = increasing.clone();
    bad[n - 1] = cells as i64;
    let cache = T::new(GgmlType::F16, [1, cells, 2, 1]);
    let idx = T::i64s([n as u64, 1, 1, 1], &bad);
    let r = run(vec![node(GgmlOp::SetRows, cache.t(), &[src.t(), idx.t(), cache.t()])], 2);
    assert!(matches!(r, Err(Error::IndexOutOfRange { .. })), "{r:?}");
    assert_eq!(cache.values()[bad[7] as usize], 7.0);
}

#[test]
fn set_rows_refuses_escaping_strides_and_reports_bad_ids() {
    // §14 item 10: dst.ne[2] = 1 with a huge nb[2] while the rows claim ne2 = 4.
    let cache = T::new(GgmlType::F32, [8, 4, 1, 1]);
    let bad_dst = cache.view([8, 4, 1, 1], [4, 32, 1 << 40, 1 << 40], 0);
    let src = T::new(GgmlType::F32, [8, 2, 4, 1]);
    let idx = T::i64s([2, 4, 1, 1], &[0; 8]);
    let r = validate(vec![node(GgmlOp::SetRows, bad_dst, &[src.t(), idx.t(), cache.t()])]);
    assert!(matches!(r, Err(Error::Shape { .. })), "{r:?}");
    // Index tensor of the wrong type.
    let idx_f = T::new(GgmlType::F32, [2, 1, 1, 1]);
    let src = T::new(GgmlType::F32, [8, 2, 1, 1]);
    assert!(matches!(
        validate(vec![node(GgmlOp::SetRows, cache.t(), &[src.t(), idx_f.t(), cache.t()])]),
        Err(Error::UnsupportedTypes { .. })
    ));
    // Out of range at run time.
    let idx = T::i64s([2, 1, 1, 1], &[1, 4]);
    let src = T::from_f32(GgmlType::F32, [8, 2, 1, 1], &[2.0; 16]);
    let r = run(vec![node(GgmlOp::SetRows, cache.t(), &[src.t(), idx.t(), cache.t()])], 2);
    assert!(matches!(r, Err(Error::IndexOutOfRange { .. })), "{r:?}");
    let got = cache.values();
    assert!(got[8..16].iter().all(|v| *v == 2.0));
    assert!(got[16..].iter().all(|v| *v == 0.0));
}

#[test]
fn cont_of_permuted_and_flat_order_copies() {
    let mut r = rng(400);
    let (d, h, t) = (8u64, 3u64, 5u64);
    let x = T::from_f32(GgmlType::F32, [d, t, h, 1], &randv(&mut r, (d * h * t) as usize, 1.0));
    let p = x.permuted([0, 2, 1, 3]); // [D, H, T]
    let want = read_all(&p);
    for (op, dt) in
        [(GgmlOp::Cont, GgmlType::F32), (GgmlOp::Dup, GgmlType::F32), (GgmlOp::Cpy, GgmlType::F16)]
    {
        let dst = T::new(dt, [d * h, t, 1, 1]);
        let srcs = if op == GgmlOp::Cpy { vec![p, dst.t()] } else { vec![p] };
        run(vec![node(op, dst.t(), &srcs)], 2).unwrap();
        let bound = if dt == GgmlType::F16 { 1e-6 } else { 0.0 };
        check(&format!("{op:?} -> {dt}"), &dst.values(), &want, bound);
    }
    // Different row lengths: flat logical order, with a transposed (strided element) source.
    let y = T::from_f32(GgmlType::F32, [6, 4, 1, 1], &(0..24).map(|v| v as f32).collect::<Vec<_>>());
    let yt = compute::graph::Tensor { layout: y.l.transpose(), data: y.ptr };
    let want = read_all(&yt);
    let dst = T::new(GgmlType::F32, [8, 3, 1, 1]);
    run(vec![node(GgmlOp::Cont, dst.t(), &[yt])], 3).unwrap();
    assert_eq!(dst.values(), want);
    // F16 -> F32 and F32 -> BF16 -> F32 round trips.
    let h16 =
        T::from_f32(GgmlType::F16, [5, 2, 1, 1], &[0.5, -1.25, 3.0, 1e-3, 7.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let out = T::new(GgmlType::F32, [10, 1, 1, 1]);
    run(vec![node(GgmlOp::Cpy, out.t(), &[h16.t(), out.t()])], 1).unwrap();
    assert_eq!(out.values(), h16.values());
}

#[test]
fn cpy_quantized_both_ways() {
    for t in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K].into_iter().filter(|t| has_codec(*t)) {
        let mut r = rng(410);
        let v = randv(&mut r, 512, 1.0);
        let src = T::from_f32(GgmlType::F32, [256, 2, 1, 1], &v);
        let q = T::new(t, [256, 2, 1, 1]);
        run(vec![node(GgmlOp::Cpy, q.t(), &[src.t(), q.t()])], 2).unwrap();
        let want = T::from_f32(t, [256, 2, 1, 1], &v);
        assert_eq!(q.values(), want.values(), "{t} quantize");
        let back = T::new(GgmlType::F32, [256, 2, 1, 1]);
        run(vec![node(GgmlOp::Cpy, back.t(), &[q.t(), back.t()])], 2).unwrap();
        assert_eq!(back.values(), want.values(), "{t} dequantize");
        let same = T::new(t, [256, 2, 1, 1]);
        run(vec![node(GgmlOp::Cont, same.t(), &[q.t()])], 2).unwrap();
        assert_eq!(same.values(), want.values(), "{t} byte copy");
    }
}
