//! `/v1/models`: the models this daemon serves through its OpenAI API (`[[models]]`, `--model`).

use serde::{Deserialize, Serialize};

/// One served model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelInfo {
    /// The name clients ask for.
    pub name: String,
    /// The GGUF file.
    pub path: String,
    /// `idle` (loads on its first request), `loading`, `ready` or `failed`.
    pub state: String,
    /// Why it failed, when it did.
    pub error: Option<String>,
    /// Workers it runs on; empty = in the daemon's process.
    pub workers: Vec<String>,
    /// `layer`, `row` or `auto`.
    pub split_mode: String,
    /// KV cells per slot.
    pub ctx: u64,
    /// Slots: requests decoded together.
    pub parallel: u64,
    /// Requests in slots now.
    pub busy: u64,
    /// Requests waiting for a slot.
    pub queued: u64,
    /// Bytes held in the daemon's process: weights (the file) and KV cache; 0 until loaded.
    pub memory_bytes: u64,
    /// Loaded on its first request rather than at start.
    pub load_on_request: bool,
}

/// `GET /v1/models`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelList {
    /// The OpenAI API's address, when it is on.
    pub openai_listen: Option<String>,
    /// The models, in declaration order.
    pub models: Vec<ModelInfo>,
}
