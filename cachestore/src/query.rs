//! Listing: filter, sort and page index entries for the admin API (`llamactl cache ls`).

use crate::index::ObjectMeta;

/// Sort order for [`crate::Store::list`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortKey {
    /// Largest first.
    Size,
    /// Most recently used first.
    #[default]
    LastUsed,
    /// Most hits first.
    Hits,
    /// Newest first.
    Created,
}

/// A filter, an order and a page.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// Keep entries whose label contains this substring (entries without a label never match).
    pub name_contains: Option<String>,
    /// Keep entries of at least this many bytes.
    pub min_size: Option<u64>,
    /// Keep only pinned (`Some(true)`) or only unpinned (`Some(false)`) entries.
    pub pinned: Option<bool>,
    /// The order; ties are broken by digest so pages are stable.
    pub sort: SortKey,
    /// Reverse the order (smallest / least recent / fewest / oldest first).
    pub ascending: bool,
    /// Entries to skip.
    pub offset: usize,
    /// Maximum entries to return (`None`: all).
    pub limit: Option<usize>,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// Number of entries matching the filter (before paging).
    pub total: usize,
    /// The entries of this page.
    pub items: Vec<ObjectMeta>,
}

/// Applies `q` to `entries`.
pub fn run(mut entries: Vec<ObjectMeta>, q: &ListQuery) -> ListPage {
    entries.retain(|m| {
        q.name_contains.as_deref().is_none_or(|s| m.label.as_deref().is_some_and(|l| l.contains(s)))
            && q.min_size.is_none_or(|min| m.size >= min)
            && q.pinned.is_none_or(|p| m.pinned == p)
    });
    let key = |m: &ObjectMeta| match q.sort {
        SortKey::Size => m.size,
        SortKey::LastUsed => m.last_used_us,
        SortKey::Hits => m.hits,
        SortKey::Created => m.created_us,
    };
    entries.sort_by(|a, b| {
        let ord = key(a).cmp(&key(b)).then_with(|| a.digest.cmp(&b.digest));
        if q.ascending {
            ord
        } else {
            ord.reverse()
        }
    });
    let total = entries.len();
    let items = entries.into_iter().skip(q.offset).take(q.limit.unwrap_or(usize::MAX)).collect();
    ListPage { total, items }
}
