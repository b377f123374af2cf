//! llama.cpp's cache key: 64-bit FNV-1a over the bytes of a write.
//!
//! ref: ggml-rpc-protocol.md §9 (hash), §15 item 25 (test vectors).

use std::fmt;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// A 64-bit FNV-1a value as llama.cpp computes it for SET_TENSOR_HASH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WireHash(pub u64);

impl WireHash {
    /// The hash of `data`.
    pub fn of(data: &[u8]) -> WireHash {
        let mut h = Fnv1a::new();
        h.update(data);
        h.finish()
    }

    /// The cache file name llama.cpp uses: 16 lower-case hex digits.
    pub fn file_name(self) -> String {
        format!("{:016x}", self.0)
    }
}

impl fmt::Display for WireHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// An incremental FNV-1a-64 hasher (for data that arrives in pieces).
#[derive(Clone, Debug)]
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a::new()
    }
}

impl Fnv1a {
    /// A fresh hasher.
    pub fn new() -> Fnv1a {
        Fnv1a(FNV_OFFSET)
    }

    /// Feeds bytes.
    pub fn update(&mut self, data: &[u8]) {
        let mut h = self.0;
        for &b in data {
            h ^= u64::from(b);
            h = h.wrapping_mul(FNV_PRIME);
        }
        self.0 = h;
    }

    /// The hash of everything fed so far.
    pub fn finish(&self) -> WireHash {
        WireHash(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_vectors() {
        // ref: ggml-rpc-protocol.md §15 item 25.
        assert_eq!(WireHash::of(b"").0, 0xcbf29ce484222325);
        assert_eq!(WireHash::of(b"a").0, 0xaf63dc4c8601ec8c);
        assert_eq!(WireHash::of(b"a").file_name(), "af63dc4c8601ec8c");
        // Published FNV-1a-64 test vector for "foobar".
        assert_eq!(WireHash::of(b"foobar").0, 0x85944171f73967e8);
    }

    #[test]
    fn incremental_equals_one_shot() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut h = Fnv1a::new();
        for chunk in data.chunks(33) {
            h.update(chunk);
        }
        assert_eq!(h.finish(), WireHash::of(&data));
    }
}
