//! `Digest` (the BLAKE3 content address) and `WireHash` (an opaque secondary key supplied by the caller).

use std::fmt;
use std::str::FromStr;

use blake3::hazmat;

use crate::error::Error;

/// The BLAKE3-256 hash of an object's bytes: the object's name in the store.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// Hashes `bytes` with BLAKE3; inputs of at least [`PARALLEL_MIN`] bytes on up to
    /// [`PARALLEL_DEPTH`] levels of threads (the same hash: BLAKE3 is a tree, whose subtrees are
    /// hashed apart and merged).
    pub fn of(bytes: &[u8]) -> Digest {
        if bytes.len() < PARALLEL_MIN || hash_threads() < 2 {
            return Digest(*blake3::hash(bytes).as_bytes());
        }
        Digest::of_split(bytes, PARALLEL_DEPTH)
    }

    /// BLAKE3 of `bytes` (more than one chunk) with its tree split `depth` ≥ 1 levels between threads.
    fn of_split(bytes: &[u8], depth: u32) -> Digest {
        let (left, right) = bytes.split_at(hazmat::left_subtree_len(bytes.len() as u64) as usize);
        let (l, r) = subtrees(left, right, 0, depth - 1);
        Digest(*hazmat::merge_subtrees_root(&l, &r, hazmat::Mode::Hash).as_bytes())
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        self.to_string()
    }
}

/// Inputs at least this long are hashed on several threads: below it, starting a thread costs more
/// than it saves (BLAKE3 hashes about 4.5 GB/s on one AVX-512 core, a megabyte in some 220 µs).
pub const PARALLEL_MIN: usize = 8 << 20;

/// Levels of the tree split between threads: up to `2^PARALLEL_DEPTH` pieces, so that the
/// power-of-two cut of BLAKE3's tree (2 MiB + 0.2 MiB for a 2.2 MB input) still keeps two cores busy.
const PARALLEL_DEPTH: u32 = 2;

/// Cores this process may run on (at least 1), read once.
fn hash_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The chaining values of two neighbouring subtrees, `left` starting at byte `offset` of the input,
/// `right` right after it: `left` on a thread of its own.
fn subtrees(
    left: &[u8],
    right: &[u8],
    offset: u64,
    depth: u32,
) -> (hazmat::ChainingValue, hazmat::ChainingValue) {
    std::thread::scope(|s| {
        let l = s.spawn(|| subtree(left, offset, depth));
        let r = subtree(right, offset + left.len() as u64, depth);
        // Hashing does not panic; if a thread ever did, its panic goes on here.
        (l.join().unwrap_or_else(|p| std::panic::resume_unwind(p)), r)
    })
}

/// The chaining value of the subtree `data` starting at byte `offset` of the input (a subtree
/// boundary), split `depth` more levels between threads while pieces stay at least [`PARALLEL_MIN`] / 2.
fn subtree(data: &[u8], offset: u64, depth: u32) -> hazmat::ChainingValue {
    use hazmat::HasherExt;
    if depth == 0 || data.len() < PARALLEL_MIN / 2 || data.len() <= blake3::CHUNK_LEN {
        return blake3::Hasher::new().set_input_offset(offset).update(data).finalize_non_root();
    }
    let (left, right) = data.split_at(hazmat::left_subtree_len(data.len() as u64) as usize);
    let (l, r) = subtrees(left, right, offset, depth - 1);
    hazmat::merge_subtrees_non_root(&l, &r, hazmat::Mode::Hash)
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl FromStr for Digest {
    type Err = Error;

    /// Parses 64 hex digits (either case).
    fn from_str(s: &str) -> Result<Digest, Error> {
        let invalid = || Error::InvalidDigest { input: s.chars().take(80).collect() };
        let b = s.as_bytes();
        if b.len() != 64 {
            return Err(invalid());
        }
        let mut out = [0u8; 32];
        for (i, pair) in b.chunks_exact(2).enumerate() {
            let hi = hex_val(pair[0]).ok_or_else(invalid)?;
            let lo = hex_val(pair[1]).ok_or_else(invalid)?;
            out[i] = (hi << 4) | lo;
        }
        Ok(Digest(out))
    }
}

/// An opaque 64-bit key chosen by the caller for the same bytes.
///
/// llamad stores llama.cpp's FNV-1a-64 of the tensor data here (ref: ggml-rpc-protocol.md §9), because
/// SET_TENSOR_HASH names content by that hash only. `cachestore` never computes or checks it; it is not
/// collision resistant, so lookups by it return candidates that the caller must confirm (size, and if it
/// matters, recomputing the wire hash on the returned bytes).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WireHash(pub u64);

impl fmt::Display for WireHash {
    /// 16 lower-case hex digits, zero-padded: the same spelling as llama.cpp's cache file names.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for WireHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WireHash({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_known_vector() {
        // BLAKE3 of the empty input, from the BLAKE3 specification's test vectors.
        let d = Digest::of(b"");
        assert_eq!(d.to_string(), "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262");
        let parsed: Digest = d.to_string().parse().unwrap();
        assert_eq!(parsed, d);
        let upper: Digest = d.to_string().to_uppercase().parse().unwrap();
        assert_eq!(upper, d);
    }

    #[test]
    fn the_split_tree_gives_blake3s_hash() {
        let data: Vec<u8> =
            (0..4 * PARALLEL_MIN as u32 + 77).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        let chunk = blake3::CHUNK_LEN;
        // Around chunk counts that are powers of two (where the left subtree's size jumps), odd tails,
        // pieces below and above the split minimum, and 2.2 MB (a SmolLM2 layer).
        let lens = [
            chunk + 1,
            2 * chunk,
            3 * chunk - 1,
            PARALLEL_MIN - 1,
            PARALLEL_MIN,
            PARALLEL_MIN + 1,
            2 * PARALLEL_MIN - chunk,
            2 * PARALLEL_MIN + chunk + 5,
            2_216_448,
            4 * PARALLEL_MIN,
            data.len(),
        ];
        for len in lens {
            let want = Digest(*blake3::hash(&data[..len]).as_bytes());
            for depth in 1..=3 {
                assert_eq!(Digest::of_split(&data[..len], depth), want, "len {len} depth {depth}");
            }
            assert_eq!(Digest::of(&data[..len]), want, "len {len}");
        }
    }

    #[test]
    fn rejects_bad_hex() {
        assert!("abc".parse::<Digest>().is_err());
        assert!("g".repeat(64).parse::<Digest>().is_err());
        assert!("é".repeat(32).parse::<Digest>().is_err());
        assert!("0".repeat(65).parse::<Digest>().is_err());
    }

    #[test]
    fn wire_hash_display_is_16_hex_digits() {
        assert_eq!(WireHash(0x9ebd4ca7a79e5ddd).to_string(), "9ebd4ca7a79e5ddd");
        assert_eq!(WireHash(1).to_string(), "0000000000000001");
    }
}
