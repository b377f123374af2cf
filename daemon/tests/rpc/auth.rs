//! Optional shared-secret authentication (`server.secret_file`): HELLO-compatible, so with no secret
//! nothing changes for llama.cpp masters, and with one only peers that prove the secret are served.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use llamad::config::Config;
use llamad_proto::auth::{self, AuthKey};
use llamad_proto::RpcClient;

use crate::common::*;

const SECRET: &[u8] = b"0123456789abcdef-shared-secret\n";

fn key(s: &[u8]) -> AuthKey {
    AuthKey::from_secret(s).unwrap()
}

fn server() -> TestServer {
    TestServer::with_config(Config {
        threads: 1,
        mem: Some(TEST_MEM),
        auth: Some(key(SECRET)),
        ..Config::default()
    })
}

fn connect(s: &TestServer, k: Option<&AuthKey>) -> llamad_proto::Result<RpcClient> {
    let stream = TcpStream::connect(s.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    RpcClient::hello_auth(stream, k)
}

#[test]
fn a_peer_with_the_secret_is_served() {
    let s = server();
    let mut c = connect(&s, Some(&key(SECRET))).unwrap();
    assert!(auth::challenge_of(&c.server_version().caps).is_some());
    assert_eq!(c.device_count().unwrap(), 1);
    let (buf, base) = buffer(&mut c, 64);
    let t = f32_tensor(1, buf, base, 4);
    c.set_tensor(&t, 0, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]), false).unwrap();
    assert_eq!(bytes_f32(&c.get_tensor(&t, 0, 16).unwrap()), [1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn a_master_without_the_secret_is_closed_with_the_reason() {
    let s = server();
    let e = connect(&s, None).err().expect("served without a secret");
    assert!(matches!(e, llamad_proto::Error::Auth(_)), "{e}");
    // A llama.cpp-style master: HELLO, then DEVICE_COUNT right away.
    let mut raw = s.raw();
    raw.write_all(&hello_frame()).unwrap();
    let mut rsp = [0u8; 36];
    raw.read_exact(&mut rsp).unwrap();
    assert_eq!(&rsp[12..20], &auth::AUTH_MAGIC);
    s.shared.stats.take_last_refusal();
    raw.write_all(&frame(15, &[])).unwrap();
    assert_closed(&mut raw);
    let reason = s.shared.stats.take_last_refusal().unwrap_or_default();
    assert!(reason.contains("authentication required"), "{reason}");
}

#[test]
fn a_wrong_secret_or_a_replayed_proof_is_refused() {
    let s = server();
    let e = connect(&s, Some(&key(b"another secret of enough length"))).err().expect("wrong secret served");
    assert!(matches!(e, llamad_proto::Error::Auth(_)), "{e}");
    assert!(s.shared.stats.take_last_refusal().unwrap_or_default().contains("authentication failed"));
    // A proof made for another challenge (as a replay would be) fails too.
    let k = key(SECRET);
    let mut raw = s.raw();
    raw.write_all(&hello_frame()).unwrap();
    let mut rsp = [0u8; 36];
    raw.read_exact(&mut rsp).unwrap();
    let cn = [5u8; 16];
    raw.write_all(&auth::request_frame(&cn, &k.client_mac(&[0u8; 16], &cn))).unwrap();
    assert_closed(&mut raw);
    assert!(s.shared.stats.take_last_refusal().unwrap_or_default().contains("authentication failed"));
    s.assert_alive_with(&k);
}

#[test]
fn without_a_secret_hello_is_unchanged_and_clients_with_one_fall_back() {
    let s = TestServer::start();
    let mut raw = s.raw_hello(); // asserts the byte-exact reference reply (zero caps)
    raw.write_all(&frame(15, &[])).unwrap();
    let mut rsp = [0u8; 12];
    raw.read_exact(&mut rsp).unwrap();
    assert_eq!(rsp, [4, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
    let mut c = connect(&s, Some(&key(SECRET))).unwrap();
    assert_eq!(c.device_count().unwrap(), 1);
}

impl TestServer {
    fn assert_alive_with(&self, k: &AuthKey) {
        let mut c = connect(self, Some(k)).unwrap();
        assert_eq!(c.device_count().unwrap(), 1);
    }
}

#[test]
fn the_admin_probe_authenticates_with_the_daemons_secret() {
    let s = server();
    let addr = s.addr.to_string();
    let h = llamad::admin::workers::probe(&addr, Duration::from_secs(5), Some(&key(SECRET)));
    assert!(h.ok, "{:?}", h.error);
    assert_eq!((h.devices.len(), h.devices[0].total), (1, TEST_MEM));
    let h = llamad::admin::workers::probe(&addr, Duration::from_secs(5), None);
    assert!(!h.ok);
    assert!(h.error.unwrap_or_default().contains("requires a shared secret"));
}
