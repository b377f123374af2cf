//! `llamactl status`: version, uptime, memory and RPC traffic of a daemon.

use std::io::Write;

use anyhow::Result;
use llamad_api::Status;

use crate::cli_admin::Outcome;
use crate::client::Client;
use crate::output::{self, size, OutputMode, Table};

/// Runs `status`.
pub fn run(c: &Client, mode: OutputMode, out: &mut dyn Write) -> Result<Outcome> {
    let s: Status = c.get("/v1/status")?;
    if mode == OutputMode::Json {
        output::json(out, &s)?;
        return Ok(Outcome::Success);
    }
    let devices: Vec<String> = s.devices.iter().map(|d| format!("{}:{}", d.index, d.name)).collect();
    let mut t = Table::new(&["FIELD", "VALUE"]);
    t.row(vec!["version".into(), s.version.clone()])
        .row(vec![
            "protocol".into(),
            if s.protocols.len() > 1 {
                let v: Vec<String> =
                    s.protocols.iter().map(|p| format!("{} (port {})", p.version, p.port)).collect();
                v.join(", ")
            } else {
                s.protocol_version.clone()
            },
        ])
        .row(vec!["uptime".into(), output::duration(s.uptime_secs)])
        .row(vec!["rpc address".into(), s.rpc_addr.clone().unwrap_or_else(|| "-".into())])
        .row(vec!["devices".into(), devices.join(", ")])
        .row(vec!["threads".into(), s.threads.to_string()])
        .row(vec!["numerics".into(), format!("{} (kernels {})", s.numerics, s.kernels)])
        .row(vec![
            "memory".into(),
            format!(
                "{} free of {}, {} held by RPC buffers ({} of it interleaved weight copies)",
                size(s.memory.free),
                size(s.memory.total),
                size(s.memory.allocated_rpc),
                size(s.memory.interleaved)
            ),
        ])
        .row(vec![
            "connections".into(),
            format!(
                "{} open, {} total, {} refused",
                s.rpc.open_connections, s.rpc.connections_total, s.rpc.connections_refused
            ),
        ])
        .row(vec![
            "graphs computed".into(),
            format!(
                "{} ({} replayed from the graph store by uid, {} stored, {} store clears)",
                s.rpc.graphs_computed,
                s.rpc.graph_store_hits,
                s.rpc.graph_store_inserts,
                s.rpc.graph_store_clears
            ),
        ])
        .row(vec!["all-reduces".into(), s.rpc.allreduces.to_string()])
        .row(vec![
            "rpc traffic".into(),
            format!("{} in, {} out", size(s.rpc.bytes_in), size(s.rpc.bytes_out)),
        ])
        .row(vec!["cache".into(), if s.cache_enabled { "enabled" } else { "disabled" }.into()]);
    t.write(out)?;
    if !s.rpc.commands.is_empty() {
        writeln!(out)?;
        let mut t = Table::new(&["COMMAND", "COUNT", "IN", "OUT"]);
        for c in &s.rpc.commands {
            t.row(vec![c.command.clone(), c.count.to_string(), size(c.bytes_in), size(c.bytes_out)]);
        }
        t.write(out)?;
    }
    if !s.rpc.connections.is_empty() {
        writeln!(out)?;
        let mut t = Table::new(&["CONN", "PEER", "AGE", "COMMANDS", "IN", "OUT", "GRAPHS"]);
        for c in &s.rpc.connections {
            t.row(vec![
                c.id.to_string(),
                c.peer.clone(),
                output::duration(c.connected_secs),
                c.commands.to_string(),
                size(c.bytes_in),
                size(c.bytes_out),
                c.graphs.to_string(),
            ]);
        }
        t.write(out)?;
    }
    Ok(Outcome::Success)
}
