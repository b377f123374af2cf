//! `llamactl cache ls|stat|rm|pin|unpin|verify|gc|import`.

use std::io::Write;

use anyhow::Result;
use llamad_api::{
    CacheAck, CacheList, CacheObject, CacheTotals, GcReport, ImportReport, ImportRequest, VerifyReport,
    VerifyRequest,
};

use crate::cli_admin::{CacheVerb, Outcome, SortArg};
use crate::client::{segment, Client};
use crate::output::{self, age, size, OutputMode, Table};

fn objects(items: &[CacheObject], out: &mut dyn Write) -> Result<()> {
    let now = output::now_ms();
    let mut t = Table::new(&["DIGEST", "SIZE", "HITS", "LAST USED", "CREATED", "PIN", "NAME"]);
    for o in items {
        t.row(vec![
            o.digest.get(..16).unwrap_or(&o.digest).to_string(),
            size(o.size),
            o.hits.to_string(),
            format!("{} ago", age(o.last_used_ms, now)),
            format!("{} ago", age(o.created_ms, now)),
            if o.pinned { "yes" } else { "" }.into(),
            o.label.clone().unwrap_or_default(),
        ]);
    }
    t.write(out)
}

fn ack(a: &CacheAck, what: &str, mode: OutputMode, out: &mut dyn Write) -> Result<Outcome> {
    match mode {
        OutputMode::Json => output::json(out, a)?,
        OutputMode::Table => writeln!(out, "{what} {}", a.digest)?,
    }
    Ok(Outcome::Success)
}

/// Runs a `cache` verb.
pub fn run(c: &Client, verb: &CacheVerb, mode: OutputMode, out: &mut dyn Write) -> Result<Outcome> {
    let json = mode == OutputMode::Json;
    match verb {
        CacheVerb::Ls { name, min_size, pinned, sort, asc, offset, limit } => {
            let mut q = vec![
                format!(
                    "sort={}",
                    match sort {
                        SortArg::Size => "size",
                        SortArg::LastUsed => "last-used",
                        SortArg::Hits => "hits",
                        SortArg::Created => "created",
                    }
                ),
                format!("asc={asc}"),
                format!("offset={offset}"),
                format!("limit={limit}"),
            ];
            if let Some(n) = name {
                q.push(format!("name={}", segment(n)));
            }
            if let Some(m) = min_size {
                q.push(format!("min_size={m}"));
            }
            if *pinned {
                q.push("pinned=true".into());
            }
            let l: CacheList = c.get(&format!("/v1/cache?{}", q.join("&")))?;
            if json {
                output::json(out, &l)?;
            } else {
                objects(&l.items, out)?;
                let t: CacheTotals = c.get("/v1/cache/totals")?;
                writeln!(
                    out,
                    "{} of {} shown; cache: {} objects, {} ({} pinned), hit rate {:.1}%, {} saved, {} evictions",
                    l.items.len(),
                    l.total,
                    t.count,
                    size(t.bytes),
                    size(t.pinned_bytes),
                    t.hit_rate * 100.0,
                    size(t.bytes_saved),
                    t.evictions
                )?;
            }
            Ok(Outcome::Success)
        }
        CacheVerb::Stat { digest } => {
            let o: CacheObject = c.get(&format!("/v1/cache/{}", segment(digest)))?;
            if json {
                output::json(out, &o)?;
            } else {
                let now = output::now_ms();
                let mut t = Table::new(&["FIELD", "VALUE"]);
                t.row(vec!["digest".into(), o.digest.clone()])
                    .row(vec!["size".into(), format!("{} ({} bytes)", size(o.size), o.size)])
                    .row(vec!["name".into(), o.label.clone().unwrap_or_else(|| "-".into())])
                    .row(vec!["wire hash".into(), o.wire_hash.clone().unwrap_or_else(|| "-".into())])
                    .row(vec!["hits".into(), o.hits.to_string()])
                    .row(vec!["last used".into(), format!("{} ago", age(o.last_used_ms, now))])
                    .row(vec!["created".into(), format!("{} ago", age(o.created_ms, now))])
                    .row(vec!["pinned".into(), o.pinned.to_string()]);
                t.write(out)?;
            }
            Ok(Outcome::Success)
        }
        CacheVerb::Rm { digest } => {
            ack(&c.delete(&format!("/v1/cache/{}", segment(digest)))?, "removed", mode, out)
        }
        CacheVerb::Pin { digest } => {
            ack(&c.post_empty(&format!("/v1/cache/{}/pin", segment(digest)))?, "pinned", mode, out)
        }
        CacheVerb::Unpin { digest } => {
            ack(&c.post_empty(&format!("/v1/cache/{}/unpin", segment(digest)))?, "unpinned", mode, out)
        }
        CacheVerb::Verify { digest } => {
            let r: VerifyReport = c.post("/v1/cache/verify", &VerifyRequest { digest: digest.clone() })?;
            if json {
                output::json(out, &r)?;
            } else {
                writeln!(out, "checked {} objects, {} corrupt", r.checked, r.corrupt.len())?;
                for d in &r.corrupt {
                    writeln!(out, "corrupt {d}")?;
                }
            }
            Ok(if r.corrupt.is_empty() { Outcome::Success } else { Outcome::Negative })
        }
        CacheVerb::Gc => {
            let r: GcReport = c.post_empty("/v1/cache/gc")?;
            if json {
                output::json(out, &r)?;
            } else {
                writeln!(
                    out,
                    "temp files removed {}, stale entries {}, wrong sizes {}, orphans indexed {}, quarantined {}, duplicates removed {}",
                    r.temp_removed, r.stale_entries, r.wrong_size, r.orphans_indexed, r.quarantined, r.duplicates_removed
                )?;
            }
            Ok(Outcome::Success)
        }
        CacheVerb::Import { path } => {
            let r: ImportReport = c.post("/v1/cache/import", &ImportRequest { path: path.clone() })?;
            if json {
                output::json(out, &r)?;
            } else {
                writeln!(out, "imported {} tensors ({}), {} new", r.tensors, size(r.bytes), r.new)?;
            }
            Ok(Outcome::Success)
        }
    }
}
