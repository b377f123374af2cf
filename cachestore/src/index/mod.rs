//! The index: per-object metadata behind a small trait, so the store runs on redb in production and on a
//! `HashMap` in tests (garage's `IDb` pattern).
//!
//! The index is a cache of facts about the object files, never the truth: every entry can be recomputed from
//! the files except usage statistics, pins, wire hashes and labels (see `Store::rebuild_index`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::digest::{Digest, WireHash};
use crate::error::{Error, Result};

pub mod mem;
pub mod redb;

/// What the index knows about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// BLAKE3 of the content, and the file name.
    pub digest: Digest,
    /// Length of the content in bytes.
    pub size: u64,
    /// When the object was first stored, microseconds since the Unix epoch.
    pub created_us: u64,
    /// When the object was last stored or served, microseconds since the Unix epoch.
    pub last_used_us: u64,
    /// How many times `get` served it.
    pub hits: u64,
    /// Pinned objects are never evicted.
    pub pinned: bool,
    /// The caller's secondary key (llamad: llama.cpp's FNV-1a-64 of the same bytes).
    pub wire_hash: Option<WireHash>,
    /// A free-form name for filtering (llamad: the tensor name of an import).
    pub label: Option<String>,
}

impl ObjectMeta {
    /// `created_us` as a `SystemTime`.
    pub fn created(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(self.created_us)
    }

    /// `last_used_us` as a `SystemTime`.
    pub fn last_used(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(self.last_used_us)
    }
}

/// One change, applied with others in a single transaction by [`Index::apply`].
#[derive(Debug, Clone)]
pub enum IndexOp {
    /// Inserts or replaces the entry (and its wire-hash mapping).
    Put(ObjectMeta),
    /// Removes the entry if present.
    Remove(Digest),
    /// Records uses: sets `last_used_us` to the maximum of both and adds `hits`; ignored for a missing entry.
    Touch {
        /// The object used.
        digest: Digest,
        /// Time of the latest use.
        last_used_us: u64,
        /// Number of hits to add.
        hits: u64,
    },
}

/// Storage of [`ObjectMeta`] keyed by digest, with a secondary key on the wire hash.
pub trait Index: Send + Sync {
    /// The entry for `digest`.
    fn get(&self, digest: &Digest) -> Result<Option<ObjectMeta>>;
    /// Digests of all entries carrying this wire hash, in digest order.
    fn by_wire_hash(&self, hash: WireHash) -> Result<Vec<Digest>>;
    /// Every entry, in digest order.
    fn scan(&self) -> Result<Vec<ObjectMeta>>;
    /// Applies `ops` atomically, in order. With `durable` false the commit may be lost in a crash
    /// (used for usage statistics only).
    fn apply(&self, ops: &[IndexOp], durable: bool) -> Result<()>;
    /// Removes every entry.
    fn clear(&self) -> Result<()>;
}

const RECORD_VERSION: u8 = 1;
const FIXED_LEN: usize = 1 + 8 * 4 + 1 + 8 + 4;
const FLAG_PINNED: u8 = 1;
const FLAG_WIRE: u8 = 2;

/// Encodes everything but the digest (the key) as a little-endian record.
pub(crate) fn encode_record(m: &ObjectMeta) -> Vec<u8> {
    let label = m.label.as_deref().unwrap_or("").as_bytes();
    let mut out = Vec::with_capacity(FIXED_LEN + label.len());
    out.push(RECORD_VERSION);
    for v in [m.size, m.created_us, m.last_used_us, m.hits] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let mut flags = 0u8;
    if m.pinned {
        flags |= FLAG_PINNED;
    }
    if m.wire_hash.is_some() {
        flags |= FLAG_WIRE;
    }
    out.push(flags);
    out.extend_from_slice(&m.wire_hash.map_or(0, |w| w.0).to_le_bytes());
    // A label longer than u32::MAX cannot come from a `String` the store accepted (see `Store::put`).
    let len = u32::try_from(label.len()).unwrap_or(0);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&label[..len as usize]);
    out
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Decodes a record written by [`encode_record`], checking every length.
pub(crate) fn decode_record(digest: Digest, b: &[u8]) -> Result<ObjectMeta> {
    let bad = |reason| Error::CorruptRecord { digest, reason };
    if b.len() < FIXED_LEN {
        return Err(bad("record too short"));
    }
    if b[0] != RECORD_VERSION {
        return Err(bad("unknown record version"));
    }
    let flags = b[33];
    let mut l = [0u8; 4];
    l.copy_from_slice(&b[42..46]);
    let label_len = u32::from_le_bytes(l) as usize;
    if b.len() != FIXED_LEN + label_len {
        return Err(bad("label length does not match record length"));
    }
    let label = if label_len == 0 {
        None
    } else {
        Some(String::from_utf8(b[FIXED_LEN..].to_vec()).map_err(|_| bad("label is not utf-8"))?)
    };
    Ok(ObjectMeta {
        digest,
        size: u64_at(b, 1),
        created_us: u64_at(b, 9),
        last_used_us: u64_at(b, 17),
        hits: u64_at(b, 25),
        pinned: flags & FLAG_PINNED != 0,
        wire_hash: (flags & FLAG_WIRE != 0).then(|| WireHash(u64_at(b, 34))),
        label,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_truncation() {
        let m = ObjectMeta {
            digest: Digest::of(b"a"),
            size: 12345,
            created_us: 1,
            last_used_us: u64::MAX,
            hits: 7,
            pinned: true,
            wire_hash: Some(WireHash(0xdead_beef_0000_0001)),
            label: Some("blk.0.attn_q.weight".into()),
        };
        let enc = encode_record(&m);
        assert_eq!(decode_record(m.digest, &enc).unwrap(), m);
        for cut in 0..enc.len() {
            assert!(decode_record(m.digest, &enc[..cut]).is_err(), "cut {cut}");
        }
        let plain = ObjectMeta { pinned: false, wire_hash: None, label: None, ..m };
        assert_eq!(decode_record(plain.digest, &encode_record(&plain)).unwrap(), plain);
    }
}
