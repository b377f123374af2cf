//! `GET /v1/status` lists each open RPC connection with its live counters, and `/metrics` carries the
//! RPC graph latency histogram: checked against a real client's traffic on an in-process RPC server.

use std::time::Duration;

use axum::http::StatusCode;
use llamad_proto::RpcClient;

use crate::common::{metric, rpc_shared, Api};
use crate::rpc_common::{add_graph, buffer, bytes_f32, f32_bytes};

#[tokio::test]
async fn status_lists_open_connections_and_metrics_time_graphs() {
    let dir = tempfile::tempdir().unwrap();
    let shared = rpc_shared();
    let (addr, stop) = crate::common::rpc_server(shared.clone()).await;
    let api = Api::open(dir.path(), None, shared.clone());
    let (s, v) = api.call("GET", "/v1/status", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["rpc"]["connections"], serde_json::json!([]));

    // A client that allocates, uploads, computes `a + b` twice and reads the result, then stays open.
    let (mut c, local) = tokio::task::spawn_blocking(move || {
        let mut c = RpcClient::connect(addr).unwrap();
        let local = c.socket().local_addr().unwrap();
        let (buf, base) = buffer(&mut c, 1024);
        let (graph, [a, b, out]) = add_graph(buf, base, 4);
        c.set_tensor(&a, 0, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]), false).unwrap();
        c.set_tensor(&b, 0, &f32_bytes(&[10.0, 20.0, 30.0, 40.0]), false).unwrap();
        c.graph_compute(&graph).unwrap();
        c.graph_compute(&graph).unwrap();
        assert_eq!(bytes_f32(&c.get_tensor(&out, 0, 16).unwrap()), vec![11.0, 22.0, 33.0, 44.0]);
        (c, local)
    })
    .await
    .unwrap();

    let (s, v) = api.call("GET", "/v1/status", None).await;
    assert_eq!(s, StatusCode::OK);
    let conns = v["rpc"]["connections"].as_array().unwrap();
    assert_eq!(conns.len(), 1, "{v}");
    let conn = &conns[0];
    assert_eq!(conn["peer"], local.to_string());
    // HELLO, ALLOC_BUFFER, BUFFER_GET_BASE, 2 × SET_TENSOR, 2 × GRAPH_COMPUTE, GET_TENSOR.
    assert_eq!(conn["commands"], 8, "{conn}");
    assert_eq!(conn["graphs"], 2, "{conn}");
    let totals = &v["rpc"];
    assert_eq!(conn["bytes_in"], totals["bytes_in"], "one connection carried all traffic");
    assert_eq!(conn["bytes_out"], totals["bytes_out"]);
    assert!(conn["bytes_out"].as_u64().unwrap() >= 16 + 8, "{conn}");

    let m = api.metrics().await;
    let name = "llamad_graph_compute_seconds_count{source=\"rpc\"}";
    assert_eq!(metric(&m, name), Some(2.0), "{m}");
    assert_eq!(metric(&m, "llamad_graph_compute_seconds_bucket{source=\"rpc\",le=\"+Inf\"}"), Some(2.0));

    // Closed connections leave the table.
    drop(c.stream().shutdown(std::net::Shutdown::Both));
    drop(c);
    let mut left = usize::MAX;
    for _ in 0..100 {
        let (_, v) = api.call("GET", "/v1/status", None).await;
        left = v["rpc"]["connections"].as_array().unwrap().len();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(left, 0);
    let _ = stop.send(());
}
