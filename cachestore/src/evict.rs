//! LRU eviction planning: which unpinned objects to drop so that the store fits under `max_size`.
//!
//! The plan is a pure function of the index entries, so it is tested without touching the disk; the store
//! applies it (index first, then the files).

use crate::digest::Digest;
use crate::index::ObjectMeta;

/// Picks the least recently used unpinned objects (ties: older `created`, then digest) to remove so that
/// `total_bytes - freed + incoming <= max_size`. `keep` is never chosen (the object being stored).
///
/// Returns the victims in eviction order, or `None` if even evicting every candidate is not enough.
pub fn plan(
    entries: &[ObjectMeta],
    total_bytes: u64,
    incoming: u64,
    max_size: u64,
    keep: Option<&Digest>,
) -> Option<Vec<Digest>> {
    let mut need = total_bytes.saturating_add(incoming).saturating_sub(max_size);
    if need == 0 {
        return Some(Vec::new());
    }
    let mut candidates: Vec<&ObjectMeta> =
        entries.iter().filter(|m| !m.pinned && Some(&m.digest) != keep).collect();
    candidates.sort_by_key(|m| (m.last_used_us, m.created_us, m.digest));
    let mut victims = Vec::new();
    for m in candidates {
        victims.push(m.digest);
        need = need.saturating_sub(m.size);
        if need == 0 {
            return Some(victims);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(n: u8, size: u64, last: u64, pinned: bool) -> ObjectMeta {
        ObjectMeta {
            digest: Digest([n; 32]),
            size,
            created_us: 0,
            last_used_us: last,
            hits: 0,
            pinned,
            wire_hash: None,
            label: None,
        }
    }

    #[test]
    fn evicts_oldest_unpinned_first() {
        let e = [meta(1, 10, 5, false), meta(2, 10, 1, true), meta(3, 10, 3, false), meta(4, 10, 9, false)];
        // 40 bytes stored, 15 incoming, limit 40: need 15 → the two oldest unpinned (3 then 1).
        assert_eq!(plan(&e, 40, 15, 40, None), Some(vec![Digest([3; 32]), Digest([1; 32])]));
        assert_eq!(plan(&e, 40, 0, 40, None), Some(vec![]));
        // Need 35 but only 30 bytes are unpinned.
        assert_eq!(plan(&e, 40, 35, 40, None), None);
        // The kept object is skipped even when it is the oldest.
        assert_eq!(plan(&e, 40, 0, 35, Some(&Digest([3; 32]))), Some(vec![Digest([1; 32])]));
    }
}
