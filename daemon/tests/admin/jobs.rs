//! Jobs on a tiny GGUF model: submit → done with the same tokens and text as running
//! `compute::model::Session` directly, streamed over SSE; the same job on two RPC workers named by a
//! registry label (layer and row split), and a dead worker failing a job with `worker-failed`; cancel;
//! restart turns `running` into `interrupted` and requeues `queued`; `/metrics` moves.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use compute::gguf::Gguf;
use compute::model::{Model, Session, SessionConfig};
use compute::sample::{Sampler, SamplerParams};
use compute::tokenizer::Tokenizer;
use serde_json::{json, Value};

use crate::common::{metric, parse_sse, write_tiny_model, Api};

/// Greedy generation run directly on the engine: the tokens and their concatenated text.
fn direct(model: &Path, prompt: &str, n_predict: usize) -> (Vec<u32>, String) {
    let g = Arc::new(Gguf::read(model).unwrap());
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let p = tok.encode(prompt, tok.add_bos(), true);
    let m = Model::new(g.clone()).unwrap();
    let cfg = SessionConfig { n_ctx: (p.len() + n_predict) as u64, n_threads: 1, ..SessionConfig::default() };
    let mut s = Session::new(m, cfg).unwrap();
    let mut sampler = Sampler::new(SamplerParams { temp: 0.0, ..SamplerParams::default() });
    let ids = s.generate(&p, &mut sampler, n_predict, |t| tok.is_eog(t), |_| true).unwrap();
    let bytes: Vec<u8> = ids.iter().flat_map(|&t| tok.decode(&[t], false)).collect();
    (ids, String::from_utf8_lossy(&bytes).into_owned())
}

async fn wait_final(api: &Api, id: &str) -> Value {
    for _ in 0..600 {
        let (_, v) = api.call("GET", &format!("/v1/jobs/{id}"), None).await;
        if !["queued", "running"].contains(&v["state"].as_str().unwrap()) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("job {id} did not finish");
}

#[tokio::test]
async fn submit_stream_done_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    write_tiny_model(&model);
    let (want_ids, want_text) = direct(&model, "abc", 12);
    assert!(!want_ids.is_empty());

    let api = Api::new(&dir.path().join("state"));
    let m0 = api.metrics().await;
    assert_eq!(metric(&m0, "llamad_tokens_generated_total"), Some(0.0));
    let req = json!({ "model": model, "prompt": "abc", "n_predict": 12, "sampling": { "temp": 0.0 } });
    let (s, v) = api.call("POST", "/v1/jobs", Some(req)).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let id = v["id"].as_str().unwrap().to_string();

    // The event stream, from the start, until `end`.
    let (s, body) = api.raw("GET", &format!("/v1/jobs/{id}/events"), Some(&api.token), None).await;
    assert_eq!(s, StatusCode::OK);
    let events = parse_sse(std::str::from_utf8(&body).unwrap());
    let ids: Vec<u32> =
        events.iter().filter(|(e, _)| e == "token").map(|(_, d)| d["id"].as_u64().unwrap() as u32).collect();
    assert_eq!(ids, want_ids);
    let indexes: Vec<u64> =
        events.iter().filter(|(e, _)| e == "token").map(|(_, d)| d["index"].as_u64().unwrap()).collect();
    assert_eq!(indexes, (0..want_ids.len() as u64).collect::<Vec<_>>(), "no token repeated or lost");
    let text: String =
        events.iter().filter(|(e, _)| e == "token").map(|(_, d)| d["text"].as_str().unwrap()).collect();
    let (last_ev, last) = events.last().unwrap();
    assert_eq!(last_ev, "end");
    assert_eq!(last["job"]["state"], "done");
    assert!(events.iter().any(|(e, d)| e == "state" && d["state"] == "done"));

    let job = wait_final(&api, &id).await;
    assert_eq!(job["state"], "done");
    assert_eq!(job["output"], want_text.as_str());
    assert!(want_text.starts_with(&text) || text == want_text);
    assert_eq!(job["generated_tokens"].as_u64(), Some(want_ids.len() as u64));
    assert_eq!(job["prompt_tokens"], 3, "<s> ▁ abc");
    assert!(job["finished_ms"].as_u64().unwrap() >= job["started_ms"].as_u64().unwrap());
    if want_ids.len() > 1 {
        assert!(job["tokens_per_sec"].as_f64().unwrap() > 0.0);
    }
    // A late subscriber gets the whole story too.
    let (_, body) = api.raw("GET", &format!("/v1/jobs/{id}/events"), Some(&api.token), None).await;
    let again = parse_sse(std::str::from_utf8(&body).unwrap());
    assert_eq!(again.iter().filter(|(e, _)| e == "token").count(), want_ids.len());
    assert_eq!(again.last().unwrap().0, "end");

    let (_, list) = api.call("GET", "/v1/jobs", None).await;
    assert_eq!(list["jobs"][0]["id"], id.as_str());
    let m = api.metrics().await;
    assert_eq!(metric(&m, "llamad_tokens_generated_total"), Some(want_ids.len() as f64));
    assert_eq!(metric(&m, "llamad_jobs{state=\"done\"}"), Some(1.0));
    assert_eq!(metric(&m, "llamad_graph_compute_seconds_count{source=\"job\"}"), Some(want_ids.len() as f64));

    // Bad requests are refused up front: a worker that is neither registered, a label nor host:port.
    let (s, v) = api
        .call(
            "POST",
            "/v1/jobs",
            Some(json!({ "model": model, "prompt": "a", "n_predict": 1, "workers": ["no-such-label"] })),
        )
        .await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::BAD_REQUEST, Some("bad-request")), "{v}");
    assert!(v["message"].as_str().unwrap().contains("no-such-label"), "{v}");
    let (s, _) =
        api.call("POST", "/v1/jobs", Some(json!({ "model": model, "prompt": "a", "n_predict": 0 }))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // A model that does not exist fails the job, with a reason.
    let (_, v) = api
        .call(
            "POST",
            "/v1/jobs",
            Some(json!({ "model": dir.path().join("none.gguf"), "prompt": "a", "n_predict": 1 })),
        )
        .await;
    let job = wait_final(&api, v["id"].as_str().unwrap()).await;
    assert_eq!(job["state"], "failed");
    assert_eq!(job["error"]["code"], "bad-request");
    assert!(job["error"]["message"].as_str().unwrap().contains("none.gguf"), "{job}");
}

#[tokio::test]
async fn cancel_running_and_queued() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    write_tiny_model(&model);
    let api = Api::new(&dir.path().join("state"));
    let long = json!({ "model": model, "prompt": "abc", "n_predict": 3000, "sampling": { "temp": 1.0, "seed": 1, "top_k": 0, "top_p": 1.0, "min_p": 0.0 } });
    let (_, v) = api.call("POST", "/v1/jobs", Some(long.clone())).await;
    let first = v["id"].as_str().unwrap().to_string();
    let (_, v) = api.call("POST", "/v1/jobs", Some(long)).await;
    let second = v["id"].as_str().unwrap().to_string();
    // Wait for the first to produce tokens.
    for _ in 0..600 {
        let (_, v) = api.call("GET", &format!("/v1/jobs/{first}"), None).await;
        if v["generated_tokens"].as_u64().unwrap() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The queued one is cancelled at once.
    let (s, v) = api.call("POST", &format!("/v1/jobs/{second}/cancel"), None).await;
    assert_eq!((s, v["state"].as_str()), (StatusCode::OK, Some("cancelled")));
    let (s, v) = api.call("POST", &format!("/v1/jobs/{second}/cancel"), None).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::CONFLICT, Some("job-finished")));
    // The running one stops after its current token.
    let (s, _) = api.call("POST", &format!("/v1/jobs/{first}/cancel"), None).await;
    assert_eq!(s, StatusCode::OK);
    let job = wait_final(&api, &first).await;
    assert_eq!(job["state"], "cancelled");
    let n = job["generated_tokens"].as_u64().unwrap();
    assert!(n > 0 && n < 3000, "{n}");
    let (s, v) = api.call("GET", "/v1/jobs/nope", None).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::NOT_FOUND, Some("job-not-found")));
}

#[tokio::test]
async fn restart_interrupts_running_and_requeues_queued() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    write_tiny_model(&model);
    let state = dir.path().join("state");
    let api = Api::new(&state);
    let (_, v) = api
        .call(
            "POST",
            "/v1/jobs",
            Some(json!({ "model": model, "prompt": "ab", "n_predict": 4, "sampling": { "temp": 0.0 } })),
        )
        .await;
    let done_id = v["id"].as_str().unwrap().to_string();
    let done = wait_final(&api, &done_id).await;
    assert_eq!(done["state"], "done");
    drop(api);

    // Fake what a killed daemon leaves behind: one job `running`, one `queued`.
    let mut running = done.clone();
    running["id"] = json!("00000000000100000001");
    running["state"] = json!("running");
    running["finished_ms"] = Value::Null;
    let mut queued = done.clone();
    queued["id"] = json!("00000000000200000002");
    queued["state"] = json!("queued");
    queued["output"] = json!("");
    queued["generated_tokens"] = json!(0);
    for j in [&running, &queued] {
        std::fs::write(state.join("jobs").join(format!("{}.json", j["id"].as_str().unwrap())), j.to_string())
            .unwrap();
    }

    let api = Api::new(&state);
    let (_, v) = api.call("GET", "/v1/jobs/00000000000100000001", None).await;
    assert_eq!(v["state"], "interrupted");
    let on_disk: Value =
        serde_json::from_slice(&std::fs::read(state.join("jobs/00000000000100000001.json")).unwrap())
            .unwrap();
    assert_eq!(on_disk["state"], "interrupted");
    let requeued = wait_final(&api, "00000000000200000002").await;
    assert_eq!(requeued["state"], "done");
    assert_eq!(requeued["output"], done["output"], "same request, greedy: same text");
    let (_, v) = api.call("GET", &format!("/v1/jobs/{done_id}"), None).await;
    assert_eq!((v["state"].as_str(), &v["output"]), (Some("done"), &done["output"]));
    let m = api.metrics().await;
    assert_eq!(metric(&m, "llamad_jobs{state=\"interrupted\"}"), Some(1.0));
    assert_eq!(metric(&m, "llamad_jobs{state=\"done\"}"), Some(2.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_interrupts_the_running_job_and_closes_streams() {
    use std::io::{Read, Write};

    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    write_tiny_model(&model);
    let state = llamad::admin::AdminState::new(
        crate::common::config(&dir.path().join("state")),
        crate::common::rpc_shared(),
        None,
        None,
    )
    .unwrap();
    let token = state.token().expose().to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(llamad::admin::serve(listener, state.clone(), async move {
        let _ = stopped.await;
    }));
    let req: llamad_api::JobSubmit = serde_json::from_value(json!({
        "model": model, "prompt": "abc", "n_predict": 100000, "n_ctx": 100010,
        "sampling": { "temp": 1.0, "seed": 3, "top_k": 0, "top_p": 1.0, "min_p": 0.0 }
    }))
    .unwrap();
    let id = state.jobs().submit(req, state.workers()).unwrap().id;
    // An SSE client over a real socket, reading until the server closes the stream. It says when
    // the stream has delivered a token, so the shutdown below cannot come before it connected.
    let (live_tx, live_rx) = tokio::sync::oneshot::channel::<()>();
    let reader = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(s, "GET /v1/jobs/{id}/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n")
            .unwrap();
        let mut buf = Vec::new();
        let mut live = Some(live_tx);
        let mut chunk = [0u8; 4096];
        loop {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            if live.is_some() && String::from_utf8_lossy(&buf).contains("event: token") {
                let _ = live.take().map(|t| t.send(()));
            }
        }
        String::from_utf8_lossy(&buf).into_owned()
    });
    let id = state.jobs().list()[0].id.clone();
    tokio::time::timeout(Duration::from_secs(20), live_rx)
        .await
        .expect("the stream delivers a token")
        .unwrap();
    assert!(state.jobs().get(&id).unwrap().generated_tokens > 0);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(20), server).await.expect("serve drains").unwrap().unwrap();
    let body = tokio::time::timeout(Duration::from_secs(20), reader).await.unwrap().unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains("event: token"), "the stream was live");
    for _ in 0..600 {
        if state.jobs().get(&id).unwrap().state != llamad_api::JobState::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let job = state.jobs().get(&id).unwrap();
    assert_eq!(job.state, llamad_api::JobState::Interrupted);
    assert!(job.generated_tokens > 0 && job.generated_tokens < 100000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_on_workers_by_label_match_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    crate::common::write_tiny_model_with(&model, 3, 2);
    let (want_ids, want_text) = direct(&model, "abc", 10);

    let (w1, w2) = (crate::common::rpc_shared(), crate::common::rpc_shared());
    let (a1, stop1) = crate::common::rpc_server(w1.clone()).await;
    let (a2, _stop2) = crate::common::rpc_server(w2.clone()).await;
    let api = Api::new(&dir.path().join("state"));
    for a in [a1, a2] {
        let (s, v) = api
            .call("POST", "/v1/workers", Some(json!({ "address": a.to_string(), "labels": ["pool"] })))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }

    for mode in ["layer", "row"] {
        let req = json!({ "model": model, "prompt": "abc", "n_predict": 10, "sampling": { "temp": 0.0 },
            "workers": ["pool"], "split_mode": mode, "hash_threshold": 0 });
        let (s, v) = api.call("POST", "/v1/jobs", Some(req)).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{v}");
        let id = v["id"].as_str().unwrap().to_string();
        let (_, body) = api.raw("GET", &format!("/v1/jobs/{id}/events"), Some(&api.token), None).await;
        let events = parse_sse(std::str::from_utf8(&body).unwrap());
        let ids: Vec<u32> = events
            .iter()
            .filter(|(e, _)| e == "token")
            .map(|(_, d)| d["id"].as_u64().unwrap() as u32)
            .collect();
        let job = wait_final(&api, &id).await;
        assert_eq!(job["state"], "done", "{mode}: {job}");
        if mode == "layer" {
            // Layer split is the in-process computation, moved: the same tokens.
            assert_eq!(ids, want_ids, "{mode}");
            assert_eq!(job["output"], want_text.as_str(), "{mode}");
        } else {
            // Row split adds the partial sums in another order: as many tokens, maybe others.
            assert_eq!(ids.len(), job["generated_tokens"].as_u64().unwrap() as usize, "{mode}");
            assert!(!ids.is_empty(), "{mode}");
        }
        // The label resolved to both workers, in address order, and both got weights.
        let mut want_addrs = vec![a1.to_string(), a2.to_string()];
        want_addrs.sort();
        let got: Vec<&str> =
            job["workers"].as_array().unwrap().iter().map(|w| w["address"].as_str().unwrap()).collect();
        assert_eq!(got, want_addrs, "{mode}");
        for w in job["workers"].as_array().unwrap() {
            assert!(w["holds"].as_str().unwrap().starts_with("layers "), "{mode}: {w}");
            assert!(w["bytes_sent"].as_u64().unwrap() > 0, "{mode}: {w}");
        }
    }
    // Both workers computed graphs for the jobs.
    for w in [&w1, &w2] {
        assert!(w.stats.graphs_computed.load(std::sync::atomic::Ordering::Relaxed) > 0);
    }

    // A worker that is gone fails the job, naming it, rather than hanging.
    stop1.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let req = json!({ "model": model, "prompt": "abc", "n_predict": 4, "workers": [a2.to_string(), a1.to_string()] });
    let (_, v) = api.call("POST", "/v1/jobs", Some(req)).await;
    let job = wait_final(&api, v["id"].as_str().unwrap()).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["error"]["code"], "worker-failed", "{job}");
    let msg = job["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&a1.to_string()) && msg.contains("unreachable"), "{msg}");
    let m = api.metrics().await;
    assert_eq!(metric(&m, "llamad_jobs{state=\"done\"}"), Some(2.0));
    assert_eq!(metric(&m, "llamad_jobs{state=\"failed\"}"), Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_authenticate_to_workers_with_the_daemons_secret() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    write_tiny_model(&model);
    let (want_ids, _) = direct(&model, "abc", 4);
    let key = llamad_proto::auth::AuthKey::from_secret(b"a shared secret of the cluster").unwrap();
    let with_key = |auth| {
        llamad::Shared::new(llamad::Config {
            threads: 1,
            mem: Some(16 << 20),
            auth,
            ..llamad::Config::default()
        })
    };
    let (worker, _stop) = crate::common::rpc_server(with_key(Some(key.clone()))).await;
    let req = json!({ "model": model, "prompt": "abc", "n_predict": 4, "sampling": { "temp": 0.0 },
        "workers": [worker.to_string()] });

    // A daemon with the same secret: the job runs and gives the in-process tokens.
    let api = Api::open(&dir.path().join("a"), None, with_key(Some(key)));
    let (_, v) = api.call("POST", "/v1/jobs", Some(req.clone())).await;
    let id = v["id"].as_str().unwrap().to_string();
    let (_, body) = api.raw("GET", &format!("/v1/jobs/{id}/events"), Some(&api.token), None).await;
    let ids: Vec<u32> = parse_sse(std::str::from_utf8(&body).unwrap())
        .iter()
        .filter(|(e, _)| e == "token")
        .map(|(_, d)| d["id"].as_u64().unwrap() as u32)
        .collect();
    assert_eq!(wait_final(&api, &id).await["state"], "done");
    assert_eq!(ids, want_ids);

    // A daemon without it: refused by the worker, and the job says so.
    let api = Api::open(&dir.path().join("b"), None, with_key(None));
    let (_, v) = api.call("POST", "/v1/jobs", Some(req)).await;
    let job = wait_final(&api, v["id"].as_str().unwrap()).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["error"]["code"], "worker-failed", "{job}");
    assert!(job["error"]["message"].as_str().unwrap().contains(&worker.to_string()), "{job}");
}
