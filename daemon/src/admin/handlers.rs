//! Route handlers. Blocking work (the cache, worker probes, model loading) runs on blocking threads;
//! every handler answers JSON or an [`ApiError`]. The `#[utoipa::path]` attributes are the source of
//! the OpenAPI description ([`crate::admin::openapi`]).

use std::convert::Infallible;
use std::sync::atomic::Ordering;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use llamad_api::*;
use tokio::sync::broadcast;

use crate::admin::error::{ApiError, ApiResult};
use crate::admin::{metrics, openapi, AdminState};

/// `GET /v1/health`.
#[utoipa::path(get, path = "/v1/health", tag = "status", responses((status = 200, body = Health)))]
pub async fn health() -> Json<Health> {
    Json(Health { status: "ok".into() })
}

/// `GET /v1/status`.
#[utoipa::path(get, path = "/v1/status", tag = "status", responses((status = 200, body = Status)))]
pub async fn status(State(st): State<AdminState>) -> Json<Status> {
    let rpc = st.rpc();
    let s = &rpc.stats;
    let mem = rpc.memory.report();
    let mut commands = Vec::new();
    let (mut bytes_in, mut bytes_out) = (0u64, 0u64);
    for c in s.snapshot() {
        bytes_in += c.bytes_in;
        bytes_out += c.bytes_out;
        if let (Some(cmd), true) = (c.cmd, c.count > 0) {
            commands.push(CommandStats {
                command: cmd.name().to_string(),
                count: c.count,
                bytes_in: c.bytes_in,
                bytes_out: c.bytes_out,
            });
        }
    }
    Json(Status {
        version: env!("CARGO_PKG_VERSION").to_string(),
        protocol_version: rpc.cfg.protocol.name(),
        protocols: rpc
            .cfg
            .listeners()
            .iter()
            .map(|(port, p)| ProtocolListener { port: *port, version: p.name() })
            .collect(),
        uptime_secs: st.uptime().as_secs(),
        rpc_addr: st.rpc_addr().map(str::to_string),
        devices: rpc
            .cfg
            .devices
            .iter()
            .enumerate()
            .map(|(i, n)| DeviceStatus { index: i as u32, name: n.clone() })
            .collect(),
        memory: MemoryStatus {
            total: mem.total,
            free: mem.free,
            allocated_rpc: rpc.memory.allocated(),
            interleaved: rpc.memory.interleaved(),
        },
        threads: rpc.cfg.threads as u64,
        numerics: compute::numerics::active().name().to_string(),
        kernels: compute::quant::active_isa().to_string(),
        rpc: RpcStatus {
            open_connections: s.active.load(Ordering::Relaxed),
            connections_total: s.connections.load(Ordering::Relaxed),
            connections_refused: s.refused.load(Ordering::Relaxed),
            graphs_computed: s.graphs_computed.load(Ordering::Relaxed),
            graph_store_hits: s.graph_store_hits.load(Ordering::Relaxed),
            graph_store_inserts: s.graph_store_inserts.load(Ordering::Relaxed),
            graph_store_clears: s.graph_store_clears.load(Ordering::Relaxed),
            allreduces: s.allreduces.load(Ordering::Relaxed),
            bytes_in,
            bytes_out,
            commands,
            connections: s
                .live
                .snapshot()
                .iter()
                .map(|c| ConnectionStatus {
                    id: c.id,
                    peer: c.peer.to_string(),
                    connected_secs: c.since.elapsed().as_secs(),
                    commands: c.commands.load(Ordering::Relaxed),
                    bytes_in: c.bytes_in.load(Ordering::Relaxed),
                    bytes_out: c.bytes_out.load(Ordering::Relaxed),
                    graphs: c.graphs.load(Ordering::Relaxed),
                })
                .collect(),
        },
        cache_enabled: st.cache().is_some(),
    })
}

/// `GET /metrics`.
#[utoipa::path(get, path = "/metrics", tag = "status", responses((status = 200, description = "Prometheus text format 0.0.4", content_type = "text/plain")))]
pub async fn metrics(State(st): State<AdminState>) -> Response {
    let body = metrics::render(&st);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

/// `GET /v1/openapi.json`.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "status", responses((status = 200, description = "this description")))]
pub async fn openapi_json() -> Response {
    match openapi::document().to_json() {
        Ok(s) => ([(header::CONTENT_TYPE, "application/json")], s).into_response(),
        Err(e) => ApiError::internal(format!("openapi: {e}")).into_response(),
    }
}

// ---- cache ----

fn store(st: &AdminState) -> ApiResult<std::sync::Arc<cachestore::Store>> {
    st.cache().cloned().ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            code::CACHE_DISABLED,
            "the tensor cache is not enabled (server.cache)",
        )
    })
}

fn digest(s: &str) -> ApiResult<cachestore::Digest> {
    s.parse().map_err(|_| ApiError::bad_request(format!("`{s}` is not a 64-digit hex digest")))
}

fn object(m: &cachestore::ObjectMeta) -> CacheObject {
    CacheObject {
        digest: m.digest.to_hex(),
        size: m.size,
        created_ms: m.created_us / 1000,
        last_used_ms: m.last_used_us / 1000,
        hits: m.hits,
        pinned: m.pinned,
        wire_hash: m.wire_hash.map(|h| format!("{:016x}", h.0)),
        label: m.label.clone(),
    }
}

fn object_missing(d: &str) -> ApiError {
    ApiError::not_found(code::CACHE_OBJECT_NOT_FOUND, format!("no cache object {d}"))
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> ApiResult<T> + Send + 'static) -> ApiResult<T> {
    tokio::task::spawn_blocking(f).await?
}

/// Largest page of `GET /v1/cache`.
pub const MAX_PAGE: u64 = 10_000;

/// `GET /v1/cache`.
#[utoipa::path(get, path = "/v1/cache", tag = "cache", params(CacheListQuery), responses((status = 200, body = CacheList), (status = 409, body = ErrorBody)))]
pub async fn cache_list(
    State(st): State<AdminState>,
    q: Result<Query<CacheListQuery>, QueryRejection>,
) -> ApiResult<Json<CacheList>> {
    let Query(q) = q?;
    let store = store(&st)?;
    let lq = cachestore::ListQuery {
        name_contains: q.name,
        min_size: q.min_size,
        pinned: q.pinned,
        sort: match q.sort.unwrap_or_default() {
            CacheSort::Size => cachestore::SortKey::Size,
            CacheSort::LastUsed => cachestore::SortKey::LastUsed,
            CacheSort::Hits => cachestore::SortKey::Hits,
            CacheSort::Created => cachestore::SortKey::Created,
        },
        ascending: q.asc.unwrap_or(false),
        offset: q.offset.unwrap_or(0) as usize,
        limit: Some(q.limit.unwrap_or(100).min(MAX_PAGE) as usize),
    };
    let page = blocking(move || Ok(store.list(&lq)?)).await?;
    Ok(Json(CacheList { total: page.total as u64, items: page.items.iter().map(object).collect() }))
}

/// `GET /v1/cache/totals`.
#[utoipa::path(get, path = "/v1/cache/totals", tag = "cache", responses((status = 200, body = CacheTotals), (status = 409, body = ErrorBody)))]
pub async fn cache_totals(State(st): State<AdminState>) -> ApiResult<Json<CacheTotals>> {
    let store = store(&st)?;
    let (t, s) = (store.totals(), store.stats());
    Ok(Json(CacheTotals {
        count: t.count,
        bytes: t.bytes,
        pinned_count: t.pinned_count,
        pinned_bytes: t.pinned_bytes,
        max_size: t.max_size,
        hits: s.hits,
        misses: s.misses,
        hit_rate: t.hit_rate,
        bytes_saved: s.bytes_served,
        evictions: s.evictions,
    }))
}

/// `GET /v1/cache/{digest}`.
#[utoipa::path(get, path = "/v1/cache/{digest}", tag = "cache", params(("digest" = String, Path, description = "BLAKE3 digest, hex")), responses((status = 200, body = CacheObject), (status = 404, body = ErrorBody)))]
pub async fn cache_stat(State(st): State<AdminState>, Path(d): Path<String>) -> ApiResult<Json<CacheObject>> {
    let (store, dg) = (store(&st)?, digest(&d)?);
    let m = blocking(move || Ok(store.stat(&dg)?)).await?;
    m.map(|m| Json(object(&m))).ok_or_else(|| object_missing(&d))
}

/// `DELETE /v1/cache/{digest}`.
#[utoipa::path(delete, path = "/v1/cache/{digest}", tag = "cache", params(("digest" = String, Path, description = "BLAKE3 digest, hex")), responses((status = 200, body = CacheAck), (status = 404, body = ErrorBody)))]
pub async fn cache_remove(State(st): State<AdminState>, Path(d): Path<String>) -> ApiResult<Json<CacheAck>> {
    let (store, dg) = (store(&st)?, digest(&d)?);
    if blocking(move || Ok(store.remove(&dg)?)).await? {
        Ok(Json(CacheAck { digest: d, pinned: false, exists: false }))
    } else {
        Err(object_missing(&d))
    }
}

async fn set_pin(st: AdminState, d: String, pin: bool) -> ApiResult<Json<CacheAck>> {
    let (store, dg) = (store(&st)?, digest(&d)?);
    let found = blocking(move || {
        if store.stat(&dg)?.is_none() {
            return Ok(false);
        }
        if pin {
            store.pin(&dg)?;
        } else {
            store.unpin(&dg)?;
        }
        Ok(true)
    })
    .await?;
    if found {
        Ok(Json(CacheAck { digest: d, pinned: pin, exists: true }))
    } else {
        Err(object_missing(&d))
    }
}

/// `POST /v1/cache/{digest}/pin`.
#[utoipa::path(post, path = "/v1/cache/{digest}/pin", tag = "cache", params(("digest" = String, Path, description = "BLAKE3 digest, hex")), responses((status = 200, body = CacheAck), (status = 404, body = ErrorBody)))]
pub async fn cache_pin(State(st): State<AdminState>, Path(d): Path<String>) -> ApiResult<Json<CacheAck>> {
    set_pin(st, d, true).await
}

/// `POST /v1/cache/{digest}/unpin`.
#[utoipa::path(post, path = "/v1/cache/{digest}/unpin", tag = "cache", params(("digest" = String, Path, description = "BLAKE3 digest, hex")), responses((status = 200, body = CacheAck), (status = 404, body = ErrorBody)))]
pub async fn cache_unpin(State(st): State<AdminState>, Path(d): Path<String>) -> ApiResult<Json<CacheAck>> {
    set_pin(st, d, false).await
}

/// `POST /v1/cache/verify`.
#[utoipa::path(post, path = "/v1/cache/verify", tag = "cache", request_body = VerifyRequest, responses((status = 200, body = VerifyReport)))]
pub async fn cache_verify(
    State(st): State<AdminState>,
    body: Result<Json<VerifyRequest>, JsonRejection>,
) -> ApiResult<Json<VerifyReport>> {
    let Json(req) = body?;
    let store = store(&st)?;
    let one = req.digest.as_deref().map(digest).transpose()?;
    if let Some(d) = one {
        let s2 = store.clone();
        if blocking(move || Ok(s2.stat(&d)?)).await?.is_none() {
            return Err(object_missing(&d.to_hex()));
        }
    }
    let r = blocking(move || Ok(store.verify(one.as_ref())?)).await?;
    Ok(Json(VerifyReport { checked: r.checked, corrupt: r.corrupt.iter().map(|d| d.to_hex()).collect() }))
}

/// `POST /v1/cache/gc`.
#[utoipa::path(post, path = "/v1/cache/gc", tag = "cache", responses((status = 200, body = GcReport)))]
pub async fn cache_gc(State(st): State<AdminState>) -> ApiResult<Json<GcReport>> {
    let store = store(&st)?;
    let r = blocking(move || Ok(store.gc()?)).await?;
    Ok(Json(GcReport {
        temp_removed: r.temp_removed,
        stale_entries: r.stale_entries,
        wrong_size: r.wrong_size,
        orphans_indexed: r.orphans_indexed,
        quarantined: r.quarantined,
        duplicates_removed: r.duplicates_removed,
    }))
}

/// `POST /v1/cache/import`: every tensor of a GGUF file, labelled with its name and keyed by llama.cpp's
/// wire hash, so that a master's SET_TENSOR_HASH hits.
#[utoipa::path(post, path = "/v1/cache/import", tag = "cache", request_body = ImportRequest, responses((status = 200, body = ImportReport), (status = 400, body = ErrorBody)))]
pub async fn cache_import(
    State(st): State<AdminState>,
    body: Result<Json<ImportRequest>, JsonRejection>,
) -> ApiResult<Json<ImportReport>> {
    let Json(req) = body?;
    let store = store(&st)?;
    let r = blocking(move || {
        let failed = |e: compute::Error| {
            ApiError::new(StatusCode::BAD_REQUEST, code::CACHE_IMPORT_FAILED, format!("{}: {e}", req.path))
        };
        // Read, not mapped: a file changed on disk during the import cannot fault the daemon.
        let g = compute::gguf::Gguf::read(&req.path).map_err(failed)?;
        let mut rep = ImportReport { tensors: 0, new: 0, bytes: 0 };
        for info in g.tensors() {
            let data = g.tensor_data(info).map_err(failed)?;
            let known = store.stat(&cachestore::Digest::of(data))?.is_some();
            let wire = cachestore::WireHash(llamad_proto::WireHash::of(data).0);
            store.put(data, Some(wire), Some(&info.name))?;
            rep.tensors += 1;
            rep.bytes += data.len() as u64;
            rep.new += u64::from(!known);
        }
        tracing::info!(path = %req.path, tensors = rep.tensors, new = rep.new, bytes = rep.bytes, "cache import");
        Ok(rep)
    })
    .await?;
    Ok(Json(r))
}

// ---- workers ----

/// `GET /v1/workers`.
#[utoipa::path(get, path = "/v1/workers", tag = "workers", responses((status = 200, body = WorkerList)))]
pub async fn workers_list(State(st): State<AdminState>) -> Json<WorkerList> {
    Json(WorkerList { workers: st.workers().list() })
}

/// `POST /v1/workers`.
#[utoipa::path(post, path = "/v1/workers", tag = "workers", request_body = WorkerAdd, responses((status = 201, body = Worker), (status = 409, body = ErrorBody)))]
pub async fn workers_add(
    State(st): State<AdminState>,
    body: Result<Json<WorkerAdd>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<Worker>)> {
    let Json(req) = body?;
    Ok((StatusCode::CREATED, Json(st.workers().add(req)?)))
}

/// `GET /v1/workers/{address}`.
#[utoipa::path(get, path = "/v1/workers/{address}", tag = "workers", params(("address" = String, Path, description = "host:port")), responses((status = 200, body = Worker), (status = 404, body = ErrorBody)))]
pub async fn workers_get(State(st): State<AdminState>, Path(a): Path<String>) -> ApiResult<Json<Worker>> {
    st.workers()
        .get(&a)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(code::WORKER_NOT_FOUND, format!("no worker {a}")))
}

/// `DELETE /v1/workers/{address}`.
#[utoipa::path(delete, path = "/v1/workers/{address}", tag = "workers", params(("address" = String, Path, description = "host:port")), responses((status = 200, body = Worker), (status = 404, body = ErrorBody)))]
pub async fn workers_remove(State(st): State<AdminState>, Path(a): Path<String>) -> ApiResult<Json<Worker>> {
    Ok(Json(st.workers().remove(&a)?))
}

/// `POST /v1/workers/{address}/probe`.
#[utoipa::path(post, path = "/v1/workers/{address}/probe", tag = "workers", params(("address" = String, Path, description = "host:port")), responses((status = 200, body = Worker), (status = 404, body = ErrorBody)))]
pub async fn workers_probe(State(st): State<AdminState>, Path(a): Path<String>) -> ApiResult<Json<Worker>> {
    Ok(Json(st.workers().probe(&a).await?))
}

// ---- jobs ----

/// `GET /v1/jobs`.
#[utoipa::path(get, path = "/v1/jobs", tag = "jobs", responses((status = 200, body = JobList)))]
pub async fn jobs_list(State(st): State<AdminState>) -> Json<JobList> {
    Json(JobList { jobs: st.jobs().list() })
}

/// `POST /v1/jobs`.
#[utoipa::path(post, path = "/v1/jobs", tag = "jobs", request_body = JobSubmit, responses((status = 202, body = JobCreated), (status = 400, body = ErrorBody)))]
pub async fn jobs_submit(
    State(st): State<AdminState>,
    body: Result<Json<JobSubmit>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<JobCreated>)> {
    let Json(req) = body?;
    Ok((StatusCode::ACCEPTED, Json(st.jobs().submit(req, st.workers())?)))
}

/// `GET /v1/jobs/{id}`.
#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = String, Path, description = "job id")), responses((status = 200, body = Job), (status = 404, body = ErrorBody)))]
pub async fn jobs_show(State(st): State<AdminState>, Path(id): Path<String>) -> ApiResult<Json<Job>> {
    Ok(Json(st.jobs().get(&id)?))
}

/// `POST /v1/jobs/{id}/cancel`.
#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", tag = "jobs", params(("id" = String, Path, description = "job id")), responses((status = 200, body = Job), (status = 409, body = ErrorBody)))]
pub async fn jobs_cancel(State(st): State<AdminState>, Path(id): Path<String>) -> ApiResult<Json<Job>> {
    Ok(Json(st.jobs().cancel(&id)?))
}

fn sse_event(ev: &JobEvent) -> Event {
    Event::default().event(ev.name()).json_data(ev).unwrap_or_else(|_| Event::default().event("error"))
}

/// `GET /v1/jobs/{id}/events`: server-sent events (`state`, `token`, `end`), from the start of the job;
/// the stream closes after `end`.
#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "jobs", params(("id" = String, Path, description = "job id")), responses((status = 200, description = "text/event-stream of JobEvent", body = JobEvent, content_type = "text/event-stream"), (status = 404, body = ErrorBody)))]
pub async fn jobs_events(
    State(st): State<AdminState>,
    Path(id): Path<String>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let (replay, rx) = st.jobs().subscribe(&id)?;
    let seen_tokens = replay.iter().filter(|e| matches!(e, JobEvent::Token { .. })).count() as u64;
    let head = stream::iter(replay.into_iter().map(|e| Ok(sse_event(&e))));
    let live = stream::unfold((rx, false), move |(rx, done)| async move {
        let mut rx = match (rx, done) {
            (Some(rx), false) => rx,
            _ => return None,
        };
        loop {
            match rx.recv().await {
                Ok(JobEvent::Token { index, .. }) if index < seen_tokens => continue,
                Ok(ev) => {
                    let end = matches!(ev, JobEvent::End { .. });
                    return Some((Ok(sse_event(&ev)), (Some(rx), end)));
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(skipped = n, "job event subscriber lagged");
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    let stop = st.stopping().clone().cancelled_owned();
    Ok(Sse::new(head.chain(live).take_until(stop)).keep_alive(KeepAlive::default()))
}

// ---- models ----

/// `GET /v1/models`: the models of the OpenAI API, their state, slots and memory (none when the
/// API is off).
#[utoipa::path(get, path = "/v1/models", tag = "models", responses((status = 200, body = ModelList)))]
pub async fn models_list() -> Json<ModelList> {
    let Some(svc) = crate::openai::service() else { return Json(ModelList::default()) };
    let models = svc
        .models()
        .iter()
        .map(|m| {
            let state = m.state();
            ModelInfo {
                name: m.cfg.name.clone(),
                path: m.cfg.path.display().to_string(),
                state: state.name().to_string(),
                error: match state {
                    crate::openai::engine::State::Failed(e) => Some(e),
                    _ => None,
                },
                workers: m.cfg.workers.clone(),
                split_mode: m.cfg.split_mode.name().to_string(),
                ctx: m.cfg.ctx,
                parallel: m.cfg.parallel as u64,
                busy: m.active.load(Ordering::Relaxed),
                queued: m.queued.load(Ordering::Relaxed),
                memory_bytes: m.memory_bytes.load(Ordering::Relaxed),
                load_on_request: m.cfg.load_on_request,
            }
        })
        .collect();
    Json(ModelList { openai_listen: Some(svc.local_addr.to_string()), models })
}

/// Any other path: 404 in the JSON error shape.
pub async fn fallback() -> ApiError {
    ApiError::not_found(code::NOT_FOUND, "no such route")
}
