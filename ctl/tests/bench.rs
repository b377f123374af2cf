//! `llamactl bench` end to end on a tiny random model: the JSON shape (one object per test with
//! llama-bench's fields, in-process and over two in-process llamad workers), the markdown table,
//! `--mem-bandwidth`, and usage errors. The figures themselves are not asserted, only their
//! consistency (avg_ts is the mean of samples_ts, every sample is positive).

mod support;

use serde_json::Value;
use support::{llamactl, write_tiny_model, Worker};

fn bench_json(args: &[&str]) -> Vec<Value> {
    let mut full = vec!["bench"];
    full.extend_from_slice(args);
    let out = llamactl(&full);
    assert!(out.status.success(), "llamactl {full:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    v.as_array().expect("a JSON array").clone()
}

fn check_row(r: &Value, n_prompt: u64, n_gen: u64, reps: usize) {
    assert_eq!(r["n_prompt"], n_prompt, "{r}");
    assert_eq!(r["n_gen"], n_gen, "{r}");
    let ts: Vec<f64> = r["samples_ts"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert_eq!(ts.len(), reps, "{r}");
    assert!(ts.iter().all(|&x| x > 0.0 && x.is_finite()), "{r}");
    let mean = ts.iter().sum::<f64>() / ts.len() as f64;
    let avg = r["avg_ts"].as_f64().unwrap();
    assert!((avg - mean).abs() <= 1e-9 * mean, "avg_ts {avg} vs mean {mean}");
    assert!(r["stddev_ts"].as_f64().unwrap() >= 0.0);
    assert_eq!(r["samples_ns"].as_array().unwrap().len(), reps);
    assert!(["F32", "F16", "Q8_0"].contains(&r["type"].as_str().unwrap()), "{r}");
    assert!(r["model"].as_str().unwrap().ends_with("tiny.gguf"));
    assert!(r["model_size"].as_u64().unwrap() > 0 && r["model_bytes_per_token"].as_u64().unwrap() > 0);
}

#[test]
fn json_has_one_object_per_test_in_process_and_on_workers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, 2);
    let m = path.to_str().unwrap();

    let rows = bench_json(&["-m", m, "-p", "16,0,8", "-n", "4", "-r", "2", "-t", "1,2", "-o", "json"]);
    let got: Vec<(u64, u64, u64)> = rows
        .iter()
        .map(|r| {
            (r["n_threads"].as_u64().unwrap(), r["n_prompt"].as_u64().unwrap(), r["n_gen"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(got, [(1, 16, 0), (1, 8, 0), (1, 0, 4), (2, 16, 0), (2, 8, 0), (2, 0, 4)]);
    for r in &rows {
        check_row(r, r["n_prompt"].as_u64().unwrap(), r["n_gen"].as_u64().unwrap(), 2);
        assert_eq!(r["backend"], "CPU");
        assert_eq!(r["workers"], Value::Array(vec![]));
        assert_eq!(r["threads"], r["n_threads"]);
    }
    assert_eq!(rows[0]["test"], "pp16");
    assert_eq!(rows[2]["test"], "tg4");
    assert!(rows.iter().all(|r| r["n_depth"] == 0));

    // llama-bench's -d: each test again after that many untimed tokens (here past one 256-cell KV
    // extent, so the graphs at depth attend a longer cache).
    let rows =
        bench_json(&["-m", m, "-p", "8", "-n", "3", "-d", "0,300", "-r", "1", "-t", "1", "-o", "json"]);
    let names: Vec<&str> = rows.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(names, ["pp8", "tg3", "pp8 @ d300", "tg3 @ d300"]);
    let depths: Vec<u64> = rows.iter().map(|r| r["n_depth"].as_u64().unwrap()).collect();
    assert_eq!(depths, [0, 0, 300, 300]);
    for r in &rows {
        check_row(r, r["n_prompt"].as_u64().unwrap(), r["n_gen"].as_u64().unwrap(), 1);
    }

    let (w1, w2) = (Worker::start(256 << 20), Worker::start(256 << 20));
    let two = format!("{},{}", w1.addr, w2.addr);
    let rows =
        bench_json(&["-m", m, "-p", "8", "-n", "3", "-r", "1", "-t", "1", "-o", "json", "--workers", &two]);
    assert_eq!(rows.len(), 2);
    check_row(&rows[0], 8, 0, 1);
    check_row(&rows[1], 0, 3, 1);
    assert_eq!(rows[0]["backend"], "RPC");
    assert_eq!(rows[0]["workers"], serde_json::json!([w1.addr, w2.addr]));
}

#[test]
fn markdown_table_and_memory_bandwidth() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, 1);
    let out = llamactl(&["bench", "-m", path.to_str().unwrap(), "-p", "4", "-n", "2", "-r", "1", "-t", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(lines[0].contains("| test") || lines[0].contains("test |"), "{text}");
    assert!(lines[2].contains("pp4") && lines[3].contains("tg2") && lines[3].contains(" ± "), "{text}");

    let bw = bench_json(&["--mem-bandwidth", "8", "-r", "2", "-t", "1", "-o", "json"]);
    assert_eq!(bw.len(), 1);
    assert_eq!(bw[0]["test"], "mem_read");
    assert_eq!(bw[0]["bytes"], 8u64 << 20);
    assert!(bw[0]["avg_gbps"].as_f64().unwrap() > 0.0);
}

#[test]
fn usage_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, 1);
    let m = path.to_str().unwrap();
    for args in [
        vec!["bench", "-m", m, "-p", "0", "-n", "0"],
        vec!["bench", "-m", m, "-r", "0"],
        vec!["bench", "-m", m, "-t", "0"],
        vec!["bench", "-m", m, "-o", "xml"],
    ] {
        let out = llamactl(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // A missing model is an error, not a usage error.
    let out = llamactl(&["bench", "-m", "/nonexistent.gguf"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
}
