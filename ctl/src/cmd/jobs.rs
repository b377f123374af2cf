//! `llamactl jobs ls|show|logs [-f]|cancel|submit`.

use std::io::Write;

use anyhow::{Context, Result};
use llamad_api::{Job, JobCreated, JobEvent, JobList, JobState, JobSubmit, Sampling};

use crate::cli_admin::{JobsVerb, Outcome};
use crate::client::{segment, Client};
use crate::output::{self, age, OutputMode, Table};

fn outcome(state: JobState) -> Outcome {
    match state {
        JobState::Failed | JobState::Interrupted => Outcome::Negative,
        _ => Outcome::Success,
    }
}

fn show(j: &Job, out: &mut dyn Write) -> Result<()> {
    let now = output::now_ms();
    let mut t = Table::new(&["FIELD", "VALUE"]);
    t.row(vec!["id".into(), j.id.clone()])
        .row(vec!["state".into(), j.state.to_string()])
        .row(vec!["model".into(), j.request.model.clone()])
        .row(vec!["created".into(), format!("{} ago", age(j.created_ms, now))])
        .row(vec![
            "progress".into(),
            format!("{:.0}% ({} of {} tokens)", j.progress * 100.0, j.generated_tokens, j.request.n_predict),
        ])
        .row(vec!["prompt tokens".into(), j.prompt_tokens.to_string()])
        .row(vec!["generated tokens".into(), j.generated_tokens.to_string()])
        .row(vec![
            "tokens/s".into(),
            j.tokens_per_sec.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into()),
        ]);
    for w in &j.workers {
        t.row(vec![
            format!("worker {}", w.address),
            format!(
                "{}, {} sent, {} from its cache",
                if w.holds.is_empty() { "-" } else { w.holds.as_str() },
                output::size(w.bytes_sent),
                output::size(w.bytes_cached)
            ),
        ]);
    }
    if let Some(e) = &j.error {
        t.row(vec!["error".into(), e.to_string()]);
    }
    t.write(out)
}

/// Streams job `id`'s events: token texts to `out` as they come (or every event as a JSON line with
/// `json`), then the rest of the output and a newline. Returns the final job, or `None` when the
/// stream ended without one (the server stopped).
pub fn follow(c: &Client, id: &str, json: bool, out: &mut dyn Write) -> Result<Option<Job>> {
    let mut printed = String::new();
    let mut end: Option<Job> = None;
    c.events(&format!("/v1/jobs/{}/events", segment(id)), |_, data| {
        let ev: JobEvent = serde_json::from_str(data).context("event")?;
        if json {
            serde_json::to_writer(&mut *out, &ev)?;
            writeln!(out)?;
        }
        match ev {
            JobEvent::Token { text, .. } => {
                if !json {
                    write!(out, "{text}")?;
                    out.flush()?;
                }
                printed.push_str(&text);
            }
            JobEvent::State { .. } => {}
            JobEvent::End { job } => {
                // The output may go on past the streamed tokens: a trailing incomplete UTF-8
                // sequence (rendered at the end), or all of it for a job from before a restart.
                if !json {
                    write!(out, "{}", job.output.strip_prefix(printed.as_str()).unwrap_or(""))?;
                    writeln!(out)?;
                    out.flush()?;
                }
                end = Some(*job);
                return Ok(false);
            }
        }
        Ok(true)
    })?;
    Ok(end)
}

/// Runs a `jobs` verb.
pub fn run(c: &Client, verb: &JobsVerb, mode: OutputMode, out: &mut dyn Write) -> Result<Outcome> {
    let json = mode == OutputMode::Json;
    match verb {
        JobsVerb::Ls => {
            let l: JobList = c.get("/v1/jobs")?;
            if json {
                output::json(out, &l)?;
            } else {
                let now = output::now_ms();
                let mut t = Table::new(&["ID", "STATE", "TOKENS", "TOK/S", "CREATED", "MODEL"]);
                for j in &l.jobs {
                    t.row(vec![
                        j.id.clone(),
                        j.state.to_string(),
                        j.generated_tokens.to_string(),
                        j.tokens_per_sec.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into()),
                        format!("{} ago", age(j.created_ms, now)),
                        j.model.clone(),
                    ]);
                }
                t.write(out)?;
            }
            Ok(Outcome::Success)
        }
        JobsVerb::Show { id } => {
            let j: Job = c.get(&format!("/v1/jobs/{}", segment(id)))?;
            if json {
                output::json(out, &j)?;
            } else {
                show(&j, out)?;
            }
            Ok(outcome(j.state))
        }
        JobsVerb::Cancel { id } => {
            let j: Job = c.post_empty(&format!("/v1/jobs/{}/cancel", segment(id)))?;
            if json {
                output::json(out, &j)?;
            } else if j.state == JobState::Cancelled {
                writeln!(out, "cancelled {}", j.id)?;
            } else {
                writeln!(out, "cancelling {} (it stops after its current token)", j.id)?;
            }
            Ok(Outcome::Success)
        }
        JobsVerb::Logs { id, follow: live } => {
            if !live {
                let j: Job = c.get(&format!("/v1/jobs/{}", segment(id)))?;
                if json {
                    output::json(out, &j.output)?;
                } else {
                    write!(out, "{}", j.output)?;
                    if !j.output.ends_with('\n') {
                        writeln!(out)?;
                    }
                }
                return Ok(outcome(j.state));
            }
            let end = follow(c, id, json, out)?;
            Ok(end.map(|j| outcome(j.state)).unwrap_or(Outcome::Negative))
        }
        JobsVerb::Submit {
            model,
            prompt,
            n_predict,
            temp,
            seed,
            workers,
            ctx_size,
            split_mode,
            hash_threshold,
        } => {
            let req = JobSubmit {
                model: model.clone(),
                prompt: prompt.clone(),
                n_predict: *n_predict,
                n_ctx: *ctx_size,
                sampling: Sampling { temp: *temp, seed: *seed, ..Sampling::default() },
                workers: workers.clone(),
                split_mode: match split_mode {
                    crate::master::SplitMode::Layer => llamad_api::SplitMode::Layer,
                    crate::master::SplitMode::Row => llamad_api::SplitMode::Row,
                    crate::master::SplitMode::Auto => llamad_api::SplitMode::Auto,
                },
                hash_threshold: *hash_threshold,
            };
            let r: JobCreated = c.post("/v1/jobs", &req)?;
            if json {
                output::json(out, &r)?;
            } else {
                writeln!(out, "{}", r.id)?;
            }
            Ok(Outcome::Success)
        }
    }
}
