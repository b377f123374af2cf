//! Dequantization of hand-built blocks against hand-computed values, one test per type.

use super::{dequantize, scalar_table};
use crate::dtype::GgmlType;

fn deq(t: GgmlType, bytes: &[u8]) -> Vec<f32> {
    assert_eq!(bytes.len(), t.type_size());
    dequantize(&scalar_table(), t, bytes, t.blck_size())
}

/// f16 bytes of a few exact values.
const H_HALF: [u8; 2] = [0x00, 0x38];
const H_ONE: [u8; 2] = [0x00, 0x3c];
const H_TWO: [u8; 2] = [0x00, 0x40];
const H_QUARTER: [u8; 2] = [0x00, 0x34];
const H_MINUS_ONE: [u8; 2] = [0x00, 0xbc];

#[test]
fn q4_0() {
    let mut b = [0u8; 18];
    b[..2].copy_from_slice(&H_HALF);
    b[2] = 0x1F;
    b[2 + 15] = 0x80;
    let y = deq(GgmlType::Q4_0, &b);
    assert_eq!((y[0], y[16], y[15], y[31], y[1]), (3.5, -3.5, -4.0, 0.0, -4.0));
}

#[test]
fn q4_1() {
    let mut b = [0u8; 20];
    b[..2].copy_from_slice(&H_HALF);
    b[2..4].copy_from_slice(&H_ONE);
    b[4 + 3] = 0xA5;
    let y = deq(GgmlType::Q4_1, &b);
    assert_eq!((y[3], y[19], y[0]), (3.5, 6.0, 1.0));
}

#[test]
fn q5_0() {
    let mut b = [0u8; 22];
    b[..2].copy_from_slice(&H_ONE);
    b[2..6].copy_from_slice(&((1u32 << 2) | (1 << 18)).to_le_bytes());
    b[6 + 2] = 0x31;
    let y = deq(GgmlType::Q5_0, &b);
    assert_eq!((y[2], y[18], y[0], y[16]), (1.0, 3.0, -16.0, -16.0));
}

#[test]
fn q5_1() {
    let mut b = [0u8; 24];
    b[..2].copy_from_slice(&H_TWO);
    b[2..4].copy_from_slice(&H_MINUS_ONE);
    b[4..8].copy_from_slice(&(1u32 << 31).to_le_bytes());
    b[8 + 15] = 0xF0;
    let y = deq(GgmlType::Q5_1, &b);
    assert_eq!((y[31], y[15], y[30]), (61.0, -1.0, -1.0));
}

#[test]
fn q8_0_and_q8_1() {
    let mut b = [0u8; 34];
    b[..2].copy_from_slice(&H_QUARTER);
    b[2 + 5] = (-7i8) as u8;
    b[2 + 31] = 127;
    let y = deq(GgmlType::Q8_0, &b);
    assert_eq!((y[5], y[31], y[0]), (-1.75, 31.75, 0.0));
    let mut b1 = [0u8; 36];
    b1[..2].copy_from_slice(&H_QUARTER);
    b1[2..4].copy_from_slice(&H_TWO); // s is not used by dequantization
    b1[4..].copy_from_slice(&b[2..]);
    assert_eq!(deq(GgmlType::Q8_1, &b1), y);
}

#[test]
fn iq4_nl() {
    let mut b = [0u8; 18];
    b[..2].copy_from_slice(&H_HALF);
    b[2] = 0x0F;
    let y = deq(GgmlType::IQ4_NL, &b);
    assert_eq!((y[0], y[16], y[1]), (56.5, -63.5, -63.5));
}

#[test]
fn mxfp4() {
    let mut b = [0u8; 17];
    b[0] = 130; // 2^(130-128) = 4
    b[1 + 1] = 0x97;
    let y = deq(GgmlType::MXFP4, &b);
    assert_eq!((y[1], y[17], y[0]), (48.0, -4.0, 0.0));
}

#[test]
fn q2_k() {
    let mut b = [0u8; 84];
    let (scales, rest) = b.split_at_mut(16);
    scales[0] = 0x21;
    scales[1] = 0x03;
    scales[2] = 0x10;
    scales[15] = 0x4F;
    let qs = &mut rest[..64];
    qs[0] = 0xE7;
    qs[16] = 2;
    qs[53] = 0x80;
    b[80..82].copy_from_slice(&H_ONE);
    b[82..84].copy_from_slice(&H_HALF);
    let y = deq(GgmlType::Q2_K, &b);
    assert_eq!((y[0], y[32], y[16], y[245]), (2.0, -0.5 + 0.0 * 1.0, 6.0, 28.0));
}

#[test]
fn q3_k() {
    let mut b = [0u8; 110];
    b[0] = 1; // hmask[0] bit 0: element 0 has quant 0
    b[32] = 0b0100; // qs[0]: element 32 (j = 1) has low bits 1
    b[96 + 2] = 5; // scales: sc[2] = 5 - 32 = -27
    b[108..110].copy_from_slice(&H_ONE);
    let y = deq(GgmlType::Q3_K, &b);
    // Element 1: scale -32, quant 0 - 4 → 128; element 32: -27 · (1 - 4) = 81.
    assert_eq!((y[0], y[1], y[32]), (0.0, 128.0, 81.0));
}

#[test]
fn q4_k() {
    let mut b = [0u8; 144];
    b[..2].copy_from_slice(&H_ONE);
    b[2..4].copy_from_slice(&H_ONE);
    let s = &mut b[4..16];
    s[0] = 2;
    s[4] = 3;
    s[1] = 4;
    s[5] = 1;
    s[3] = 0xC0;
    s[11] = 0x21;
    b[16] = 0x5A;
    b[16 + 127] = 0x30;
    let y = deq(GgmlType::Q4_K, &b);
    assert_eq!((y[0], y[32], y[255]), (17.0, 19.0, 145.0));
}

#[test]
fn q5_k() {
    let mut b = [0u8; 176];
    b[..2].copy_from_slice(&H_HALF);
    let s = &mut b[4..16];
    s[0] = 2;
    s[1] = 3;
    s[2] = 1;
    b[16] = 0b11; // qh[0]
    b[48] = 0x0F; // qs[0]
    b[48 + 32] = 0x07; // qs[32]
    let y = deq(GgmlType::Q5_K, &b);
    assert_eq!((y[0], y[32], y[64]), (31.0, 24.0, 3.5));
}

#[test]
fn q6_k() {
    let mut b = [0u8; 210];
    b[0] = 0x21; // ql[0]
    b[32] = 0x05; // ql[32]
    b[127] = 0xF0; // ql[127]
    b[128] = 0b0000_1001; // qh[0]
    b[128 + 63] = 0xC0; // qh[63]
    let sc = &mut b[192..208];
    sc[0] = 2;
    sc[2] = (-1i8) as u8;
    sc[4] = 3;
    sc[15] = (-4i8) as u8;
    b[208..210].copy_from_slice(&H_HALF);
    let y = deq(GgmlType::Q6_K, &b);
    assert_eq!((y[0], y[32], y[64], y[255]), (-15.0, -2.5, -45.0, -62.0));
}

#[test]
fn q8_k() {
    let mut b = [0u8; 292];
    b[..4].copy_from_slice(&0.5f32.to_le_bytes());
    b[4 + 7] = (-3i8) as u8;
    let y = deq(GgmlType::Q8_K, &b);
    assert_eq!((y[7], y[0]), (-1.5, 0.0));
}

#[test]
fn iq4_xs() {
    let mut b = [0u8; 136];
    b[..2].copy_from_slice(&H_ONE);
    let h: u16 = 2 | (1 << 2) | (3 << 14);
    b[2..4].copy_from_slice(&h.to_le_bytes());
    b[4] = 0x13; // scales_l[0]: sub-block 0 low 3, sub-block 1 low 1
    b[8] = 0x8F; // qs[0]
    b[8 + 7 * 16] = 0x07;
    let y = deq(GgmlType::IQ4_XS, &b);
    // ls0 = 3 | 2<<4 = 35 → 3; ls1 = 1 | 1<<4 = 17 → -15; ls7 = 0 | 3<<4 = 48 → 16.
    assert_eq!((y[0], y[16], y[32], y[224]), (339.0, 3.0, 1905.0, -160.0));
}

#[test]
fn q1_0() {
    let mut b = [0u8; 18];
    b[..2].copy_from_slice(&H_TWO);
    b[2] = 0b101;
    b[2 + 15] = 0x80;
    let y = deq(GgmlType::Q1_0, &b);
    assert_eq!((y[0], y[1], y[2], y[127], y[126]), (2.0, -2.0, 2.0, 2.0, -2.0));
}

#[test]
fn q2_0() {
    let mut b = [0u8; 18];
    b[..2].copy_from_slice(&H_HALF);
    b[2] = 0xE4;
    let y = deq(GgmlType::Q2_0, &b);
    assert_eq!(&y[..5], &[-0.5, 0.0, 0.5, 1.0, -0.5]);
}

#[test]
fn nvfp4() {
    let mut b = [0u8; 36];
    b[..4].copy_from_slice(&[0x38, 0x08, 0x01, 0x7F]);
    b[4] = 0x71;
    b[4 + 8] = 0x0F;
    b[4 + 16] = 0x07;
    b[4 + 24] = 0x07;
    let y = deq(GgmlType::NVFP4, &b);
    assert_eq!((y[0], y[8], y[16], y[32], y[48]), (0.5, 6.0, -12.0 / 128.0, 12.0 / 1024.0, 0.0));
}

#[test]
fn tq2_0() {
    let mut b = [0u8; 66];
    b[0] = 0x92;
    b[33] = 0x03;
    b[64..66].copy_from_slice(&H_ONE);
    let y = deq(GgmlType::TQ2_0, &b);
    assert_eq!((y[0], y[32], y[64], y[96], y[129], y[1]), (1.0, -1.0, 0.0, 1.0, 2.0, -1.0));
}

#[test]
fn floats() {
    let y = deq(GgmlType::F16, &[0x00, 0xc0]);
    assert_eq!(y, [-2.0]);
    let y = deq(GgmlType::BF16, &[0xc0, 0x3f]);
    assert_eq!(y, [1.5]);
    let y = deq(GgmlType::F32, &0.1f32.to_le_bytes());
    assert_eq!(y, [0.1]);
}
