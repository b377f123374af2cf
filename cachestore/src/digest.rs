//! `Digest` (the BLAKE3 content address) and `WireHash` (an opaque secondary key supplied by the caller).

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// The BLAKE3-256 hash of an object's bytes: the object's name in the store.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// Hashes `bytes` with BLAKE3.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(*blake3::hash(bytes).as_bytes())
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
