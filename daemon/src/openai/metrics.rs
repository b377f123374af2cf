//! The OpenAI service's counters and histograms, rendered into the admin API's `/metrics`
//! ([`render`]) beside the RPC server's.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

use crate::rpc::stats::Histogram;

/// The service's metrics (one per process: the service has one listener).
#[derive(Debug, Default)]
pub struct OpenAiMetrics {
    /// Requests answered, by HTTP status class.
    pub requests_ok: AtomicU64,
    /// Requests refused with 4xx (429 excluded).
    pub requests_client_error: AtomicU64,
    /// Requests refused with 429 (queue full).
    pub requests_rejected: AtomicU64,
    /// Requests that failed with 5xx.
    pub requests_server_error: AtomicU64,
    /// Sequences cancelled because their client went away.
    pub cancelled: AtomicU64,
    /// Requests past their deadline.
    pub timed_out: AtomicU64,
    /// Prompt tokens decoded.
    pub prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub completion_tokens: AtomicU64,
    /// Ubatches run.
    pub ubatches: AtomicU64,
    /// Tokens in those ubatches.
    pub ubatch_tokens: AtomicU64,
    /// Time from the request's arrival to its first token.
    pub ttft: Histogram,
    /// Time between two tokens of a request.
    pub token_latency: Histogram,
    /// Time waiting for a slot.
    pub queue_wait: Histogram,
    /// Time of one ubatch.
    pub ubatch_latency: Histogram,
}

/// The process's OpenAI metrics.
pub static METRICS: LazyLock<OpenAiMetrics> = LazyLock::new(OpenAiMetrics::default);

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Appends the metrics (and each model's queue depth and slot use) to `out`.
pub fn render(out: &mut String) {
    let Some(svc) = crate::openai::service() else { return };
    let m = &*METRICS;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    header(out, "llamad_openai_requests_total", "counter", "OpenAI API requests, by outcome.");
    for (outcome, v) in [
        ("ok", &m.requests_ok),
        ("client_error", &m.requests_client_error),
        ("rejected", &m.requests_rejected),
        ("server_error", &m.requests_server_error),
        ("cancelled", &m.cancelled),
        ("timed_out", &m.timed_out),
    ] {
        let _ = writeln!(out, "llamad_openai_requests_total{{outcome=\"{outcome}\"}} {}", load(v));
    }
    header(
        out,
        "llamad_openai_tokens_total",
        "counter",
        "Tokens decoded from prompts (in) and generated (out).",
    );
    let _ = writeln!(out, "llamad_openai_tokens_total{{direction=\"in\"}} {}", load(&m.prompt_tokens));
    let _ = writeln!(out, "llamad_openai_tokens_total{{direction=\"out\"}} {}", load(&m.completion_tokens));
    header(out, "llamad_openai_ubatches_total", "counter", "Ubatches run for OpenAI requests.");
    let _ = writeln!(out, "llamad_openai_ubatches_total {}", load(&m.ubatches));
    header(out, "llamad_openai_ubatch_tokens_total", "counter", "Tokens in those ubatches (all sequences).");
    let _ = writeln!(out, "llamad_openai_ubatch_tokens_total {}", load(&m.ubatch_tokens));
    header(out, "llamad_openai_queue_depth", "gauge", "Requests waiting for a slot, by model.");
    for h in svc.models() {
        let _ = writeln!(out, "llamad_openai_queue_depth{{model=\"{}\"}} {}", h.cfg.name, load(&h.queued));
    }
    header(out, "llamad_openai_slots_busy", "gauge", "Slots holding a request, by model.");
    for h in svc.models() {
        let _ = writeln!(out, "llamad_openai_slots_busy{{model=\"{}\"}} {}", h.cfg.name, load(&h.active));
    }
    for (name, h, help) in [
        (
            "llamad_openai_time_to_first_token_seconds",
            &m.ttft,
            "From a request's arrival to its first token.",
        ),
        (
            "llamad_openai_token_latency_seconds",
            &m.token_latency,
            "Between two generated tokens of a request.",
        ),
        ("llamad_openai_queue_wait_seconds", &m.queue_wait, "Time a request waited for a slot."),
        ("llamad_openai_ubatch_seconds", &m.ubatch_latency, "Time of one batched ubatch."),
    ] {
        header(out, name, "histogram", help);
        h.write_prometheus(out, name, "service=\"openai\"");
    }
}
