//! `llamactl models ls`: the models a daemon serves through its OpenAI API.

use std::io::Write;

use anyhow::Result;
use llamad_api::{ModelInfo, ModelList};

use crate::cli_admin::{ModelsVerb, Outcome};
use crate::client::Client;
use crate::output::{self, size, OutputMode, Table};

fn table(list: &ModelList, out: &mut dyn Write) -> Result<()> {
    if list.openai_listen.is_none() {
        writeln!(out, "the OpenAI API is off (llamad --openai-listen ADDR, or [openai] listen)")?;
        return Ok(());
    }
    let mut t =
        Table::new(&["NAME", "STATE", "WHERE", "SPLIT", "CTX", "SLOTS", "BUSY", "QUEUED", "MEMORY", "PATH"]);
    for m in &list.models {
        t.row(row(m));
    }
    t.write(out)?;
    for m in list.models.iter().filter(|m| m.error.is_some()) {
        writeln!(out, "{}: {}", m.name, m.error.as_deref().unwrap_or_default())?;
    }
    Ok(())
}

fn row(m: &ModelInfo) -> Vec<String> {
    let state =
        if m.state == "idle" && m.load_on_request { "idle (on request)".into() } else { m.state.clone() };
    let (place, split) = if m.workers.is_empty() {
        ("in-process".to_string(), "-".to_string())
    } else {
        (m.workers.join(","), m.split_mode.clone())
    };
    let memory = if m.memory_bytes == 0 { "-".into() } else { size(m.memory_bytes) };
    vec![
        m.name.clone(),
        state,
        place,
        split,
        m.ctx.to_string(),
        m.parallel.to_string(),
        m.busy.to_string(),
        m.queued.to_string(),
        memory,
        m.path.clone(),
    ]
}

/// Runs a `models` verb.
pub fn run(c: &Client, verb: &ModelsVerb, mode: OutputMode, out: &mut dyn Write) -> Result<Outcome> {
    match verb {
        ModelsVerb::Ls => {
            let l: ModelList = c.get("/v1/models")?;
            match mode {
                OutputMode::Json => output::json(out, &l)?,
                OutputMode::Table => table(&l, out)?,
            }
            // A failed model is a "no" a script can test.
            Ok(if l.models.iter().any(|m| m.state == "failed") {
                Outcome::Negative
            } else {
                Outcome::Success
            })
        }
    }
}
