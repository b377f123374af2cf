//! `llamactl workers ls|add|rm|probe`.

use std::io::Write;

use anyhow::Result;
use llamad_api::{Worker, WorkerAdd, WorkerList};

use crate::cli_admin::{Outcome, WorkersVerb};
use crate::client::{segment, Client};
use crate::output::{self, age, size, OutputMode, Table};

fn table(workers: &[Worker], out: &mut dyn Write) -> Result<()> {
    let now = output::now_ms();
    let mut t =
        Table::new(&["ADDRESS", "LABELS", "HEALTH", "PROTOCOL", "FREE/TOTAL", "RTT", "PROBED", "ERROR"]);
    for w in workers {
        let labels = if w.labels.is_empty() { "-".into() } else { w.labels.join(",") };
        let row = match &w.health {
            None => vec![
                w.address.clone(),
                labels,
                "unknown".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "never".into(),
                "".into(),
            ],
            Some(h) => {
                let (free, total) =
                    h.devices.iter().fold((0u64, 0u64), |(f, t), d| (f + d.free, t + d.total));
                vec![
                    w.address.clone(),
                    labels,
                    if h.ok { "ok" } else { "down" }.into(),
                    h.protocol_version.clone().unwrap_or_else(|| "-".into()),
                    if h.devices.is_empty() { "-".into() } else { format!("{}/{}", size(free), size(total)) },
                    h.rtt_us.map(|r| format!("{:.1} ms", r as f64 / 1000.0)).unwrap_or_else(|| "-".into()),
                    format!("{} ago", age(h.probed_ms, now)),
                    h.error.clone().unwrap_or_default(),
                ]
            }
        };
        t.row(row);
    }
    t.write(out)
}

/// Runs a `workers` verb.
pub fn run(c: &Client, verb: &WorkersVerb, mode: OutputMode, out: &mut dyn Write) -> Result<Outcome> {
    let one = |w: &Worker, out: &mut dyn Write| -> Result<()> {
        match mode {
            OutputMode::Json => output::json(out, w),
            OutputMode::Table => table(std::slice::from_ref(w), out),
        }
    };
    match verb {
        WorkersVerb::Ls => {
            let l: WorkerList = c.get("/v1/workers")?;
            match mode {
                OutputMode::Json => output::json(out, &l)?,
                OutputMode::Table => table(&l.workers, out)?,
            }
            Ok(Outcome::Success)
        }
        WorkersVerb::Add { address, labels } => {
            let w: Worker =
                c.post("/v1/workers", &WorkerAdd { address: address.clone(), labels: labels.clone() })?;
            one(&w, out)?;
            Ok(Outcome::Success)
        }
        WorkersVerb::Rm { address } => {
            let w: Worker = c.delete(&format!("/v1/workers/{}", segment(address)))?;
            match mode {
                OutputMode::Json => output::json(out, &w)?,
                OutputMode::Table => writeln!(out, "removed {}", w.address)?,
            }
            Ok(Outcome::Success)
        }
        WorkersVerb::Probe { address } => {
            let w: Worker = c.post_empty(&format!("/v1/workers/{}/probe", segment(address)))?;
            one(&w, out)?;
            Ok(if w.health.as_ref().is_some_and(|h| h.ok) { Outcome::Success } else { Outcome::Negative })
        }
    }
}
