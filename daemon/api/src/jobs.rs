//! `/v1/jobs`: text generation jobs run by the daemon.

use serde::{Deserialize, Deserializer, Serialize};

/// An optional f32 that must be finite: JSON numbers beyond f32's range would otherwise become
/// infinities, which a sampler cannot use and which serialize as `null` (found by the `admin_body`
/// fuzz target).
fn finite_f32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f32>, D::Error> {
    match Option::<f64>::deserialize(d)? {
        None => Ok(None),
        Some(x) if (x as f32).is_finite() => Ok(Some(x as f32)),
        Some(x) => Err(serde::de::Error::custom(format!("{x} is not a finite 32-bit number"))),
    }
}

/// Sampling options; every field left out takes the model's recommendation, else llama.cpp's default.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Sampling {
    /// RNG seed.
    pub seed: Option<u32>,
    /// Temperature (≤ 0: greedy).
    #[serde(default, deserialize_with = "finite_f32")]
    pub temp: Option<f32>,
    /// top_k (≤ 0 disables).
    pub top_k: Option<i32>,
    /// top_p (≥ 1 disables).
    #[serde(default, deserialize_with = "finite_f32")]
    pub top_p: Option<f32>,
    /// min_p (≤ 0 disables).
    #[serde(default, deserialize_with = "finite_f32")]
    pub min_p: Option<f32>,
    /// Repetition penalty (1 = off).
    #[serde(default, deserialize_with = "finite_f32")]
    pub repeat_penalty: Option<f32>,
    /// Tokens of history the penalties look at.
    pub repeat_last_n: Option<i32>,
}

/// `POST /v1/jobs` body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobSubmit {
    /// A GGUF model file readable by the daemon.
    pub model: String,
    /// The prompt text.
    pub prompt: String,
    /// Tokens to generate at most.
    pub n_predict: u32,
    /// Context size (default: prompt + n_predict, at most the model's context).
    #[serde(default)]
    pub n_ctx: Option<u32>,
    /// Sampling options.
    #[serde(default)]
    pub sampling: Sampling,
    /// Workers to put layers on, each a registered worker's address, a label of registered workers
    /// (all of them, by address), or any other `host:port`; empty runs on this machine.
    #[serde(default)]
    pub workers: Vec<String>,
    /// How the model is split across the workers.
    #[serde(default)]
    pub split_mode: SplitMode,
    /// Weight writes larger than this many bytes (a write is one weight, or a run of small
    /// neighbouring weights of one layer) are offered to the workers' tensor caches first
    /// (SET_TENSOR_HASH) and uploaded with the cache flag on a miss [default: 1 MiB, as llamactl's].
    #[serde(default)]
    pub hash_threshold: Option<u64>,
}

/// How a job's model is split across its workers (llama.cpp's `--split-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum SplitMode {
    /// Whole layers per worker, run in turn (token-identical to llama.cpp).
    #[default]
    Layer,
    /// Every layer split across the workers, which compute each phase together.
    Row,
    /// `row` or `layer`, whichever the round trips measured when the job connects make faster.
    Auto,
}

/// Where a job's weights went: one entry per worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobWorker {
    /// `host:port`.
    pub address: String,
    /// What it holds (`layers 0..30`, or its row-split share).
    pub holds: String,
    /// Weight bytes uploaded with SET_TENSOR.
    pub bytes_sent: u64,
    /// Weight bytes the worker's cache already had (SET_TENSOR_HASH hits).
    pub bytes_cached: u64,
}

/// A job's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum JobState {
    /// Waiting for the runner.
    Queued,
    /// Generating.
    Running,
    /// Finished normally.
    Done,
    /// Stopped by an error.
    Failed,
    /// Stopped on request.
    Cancelled,
    /// Found running when the daemon started (the daemon stopped under it).
    Interrupted,
}

impl JobState {
    /// Every state, in lifecycle order.
    pub const ALL: [JobState; 6] = [
        JobState::Queued,
        JobState::Running,
        JobState::Done,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Interrupted,
    ];

    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Interrupted => "interrupted",
        }
    }

    /// Whether the job can change no more.
    pub fn is_final(self) -> bool {
        !matches!(self, JobState::Queued | JobState::Running)
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A job as `GET /v1/jobs/{id}` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Job {
    /// Job id.
    pub id: String,
    /// State.
    pub state: JobState,
    /// The request.
    pub request: JobSubmit,
    /// Submitted (ms since the epoch).
    pub created_ms: u64,
    /// Started running.
    pub started_ms: Option<u64>,
    /// Reached a final state.
    pub finished_ms: Option<u64>,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Tokens generated so far.
    pub generated_tokens: u64,
    /// `generated_tokens / n_predict`, 1 when done.
    pub progress: f64,
    /// Generation speed, tokens per second (after the prompt).
    pub tokens_per_sec: Option<f64>,
    /// The text generated so far.
    pub output: String,
    /// Why it failed.
    pub error: Option<crate::ErrorBody>,
    /// The workers it ran on (resolved from the request's addresses and labels) and their uploads;
    /// empty for a job run on the daemon's machine.
    #[serde(default)]
    pub workers: Vec<JobWorker>,
}

/// A job in a list (no output text).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobSummary {
    /// Job id.
    pub id: String,
    /// State.
    pub state: JobState,
    /// Model path.
    pub model: String,
    /// Submitted (ms since the epoch).
    pub created_ms: u64,
    /// Tokens generated so far.
    pub generated_tokens: u64,
    /// Generation speed.
    pub tokens_per_sec: Option<f64>,
}

/// `GET /v1/jobs`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobList {
    /// Jobs, newest first.
    pub jobs: Vec<JobSummary>,
}

/// `POST /v1/jobs` answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobCreated {
    /// The new job's id.
    pub id: String,
    /// Its state (`queued`).
    pub state: JobState,
}

/// One server-sent event of `GET /v1/jobs/{id}/events`. The SSE `event:` field is `token`, `state` or
/// `end`; `data:` is this type as JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum JobEvent {
    /// Text produced by one token (may be empty when a character spans tokens).
    Token {
        /// Index of the token among the generated ones.
        index: u64,
        /// The token id.
        id: u32,
        /// Its text.
        text: String,
    },
    /// The job changed state.
    State {
        /// The new state.
        state: JobState,
    },
    /// The stream ends: the job is final. Its `output` is the token texts joined, plus a trailing
    /// incomplete UTF-8 sequence (as U+FFFD) that no token event carried; a job from before a restart
    /// has no token events at all.
    End {
        /// The final job.
        job: Box<Job>,
    },
}

impl JobEvent {
    /// The SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            JobEvent::Token { .. } => "token",
            JobEvent::State { .. } => "state",
            JobEvent::End { .. } => "end",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `admin_body` fuzz target's finding: a temperature of 1e89 parsed as +inf (and came back
    /// as `null`). Out-of-range and non-finite sampling values are now refused with a clear error.
    #[test]
    fn sampling_values_beyond_f32_are_refused() {
        let body = r#"{"model": "m.gguf", "prompt": "x", "n_predict": 4, "sampling": {"temp": 99999999999999999999999999999999999999999999999999999999999999999999999999999999999999990.8}}"#;
        let e = serde_json::from_str::<JobSubmit>(body).unwrap_err().to_string();
        assert!(e.contains("not a finite 32-bit number"), "{e}");
        for field in ["top_p", "min_p", "repeat_penalty"] {
            let body = format!(
                r#"{{"model": "m", "prompt": "x", "n_predict": 1, "sampling": {{"{field}": -1e39}}}}"#
            );
            assert!(serde_json::from_str::<JobSubmit>(&body).is_err(), "{field}");
        }
        // In range: parsed, and a round trip keeps the value.
        let ok = r#"{"model": "m", "prompt": "x", "n_predict": 1, "sampling": {"temp": 0.7, "min_p": 3e38}}"#;
        let v: JobSubmit = serde_json::from_str(ok).unwrap();
        assert_eq!(v.sampling.temp, Some(0.7));
        assert_eq!(v.sampling.top_p, None);
        let back: JobSubmit = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
        assert_eq!(back, v);
    }
}
