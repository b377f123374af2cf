//! TLS on the RPC port (`[tls]`, `--tls-cert`, `--tls-key`), with certificates made at test time
//! (rcgen): the handshake and a computed graph over it, a wrong CA or name refused with a clear
//! error, plain peers refused when TLS is required and served (byte for byte as before) when it is
//! optional, a TLS client meeting a plain server told so, TLS with the shared secret, and the
//! configuration checks.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use llamad::config::{Config, Overrides, RawConfig};
use llamad::rpc::tls::TlsSettings;
use llamad_proto::auth::AuthKey;
use llamad_proto::{ConnectOptions, RpcClient, TlsClient};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};

use crate::common::*;

/// A CA, a server certificate it signed for `localhost` and 127.0.0.1, and an unrelated CA.
pub struct Pki {
    _dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub other_ca: PathBuf,
    /// A key that belongs to no certificate here.
    pub stray_key: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let issuer = ca("llamad test CA");
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        p.distinguished_name.push(DnType::CommonName, "llamad test worker");
        let cert = p.signed_by(&key, &issuer).unwrap();
        let write = |name: &str, text: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        Pki {
            ca: write("ca.pem", issuer.pem()),
            cert: write("cert.pem", cert.pem()),
            key: write("key.pem", key.serialize_pem()),
            other_ca: write("other-ca.pem", ca("someone else's CA").pem()),
            stray_key: write("stray-key.pem", KeyPair::generate().unwrap().serialize_pem()),
            _dir: dir,
        }
    }
}

fn tls_server(pki: &Pki, require: bool, auth: Option<AuthKey>) -> TestServer {
    TestServer::with_config(Config {
        threads: 1,
        mem: Some(TEST_MEM),
        auth,
        tls: Some(TlsSettings::load(&pki.cert, &pki.key, require).unwrap()),
        ..Config::default()
    })
}

fn tls_opts(ca: &Path) -> ConnectOptions {
    ConnectOptions {
        tls: Some(TlsClient::from_ca_file(ca).unwrap()),
        auth: None,
        timeout: Some(Duration::from_secs(10)),
    }
}

/// The server's next refusal reason, waiting for it (the server logs after the client sees the end).
fn next_refusal(s: &TestServer) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(r) = s.shared.stats.take_last_refusal() {
            return r;
        }
        assert!(Instant::now() < deadline, "no refusal recorded");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `out = a + b` computed over `c`, checked against the sums worked out here.
fn add_over(c: &mut RpcClient) {
    let (buf, base) = buffer(c, 48);
    let (g, [a, b, out]) = add_graph(buf, base, 4);
    c.set_tensor(&a, 0, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]), false).unwrap();
    c.set_tensor(&b, 0, &f32_bytes(&[0.5, -2.0, 10.0, 0.25]), false).unwrap();
    c.graph_compute(&g).unwrap();
    assert_eq!(bytes_f32(&c.get_tensor(&out, 0, 16).unwrap()), [1.5, 0.0, 13.0, 4.25]);
    c.free_buffer(buf).unwrap();
}

#[test]
fn tls_handshake_then_the_protocol_unchanged() {
    let pki = Pki::new();
    let s = tls_server(&pki, true, None);
    for addr in [s.addr.to_string(), format!("localhost:{}", s.addr.port())] {
        let mut c = RpcClient::connect_to(&addr, &tls_opts(&pki.ca)).unwrap();
        assert!(c.is_tls());
        assert_eq!(c.server_version().caps, [0; 24]);
        add_over(&mut c);
        // A 1 MiB upload and read-back crosses many TLS records.
        let (buf, base) = buffer(&mut c, 1 << 20);
        let t = f32_tensor(9, buf, base, 1 << 18);
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 251) as u8).collect();
        c.set_tensor(&t, 0, &data, false).unwrap();
        assert!(c.get_tensor(&t, 0, 1 << 20).unwrap() == data);
    }
}

#[test]
fn a_wrong_ca_or_name_is_refused_with_a_clear_error() {
    let pki = Pki::new();
    let s = tls_server(&pki, true, None);
    let e = RpcClient::connect_to(&s.addr.to_string(), &tls_opts(&pki.other_ca)).err().expect("served");
    let msg = e.to_string();
    assert!(matches!(e, llamad_proto::Error::Tls(_)), "{msg}");
    assert!(msg.contains("not signed by a trusted CA") && msg.contains("--tls-ca"), "{msg}");
    assert!(next_refusal(&s).contains("TLS handshake failed"));

    let mut opts = tls_opts(&pki.ca);
    opts.tls = Some(opts.tls.unwrap().with_server_name("elsewhere.example").unwrap());
    let msg = RpcClient::connect_to(&s.addr.to_string(), &opts).err().expect("served").to_string();
    assert!(msg.contains("not valid for") && msg.contains("elsewhere.example"), "{msg}");
    assert!(next_refusal(&s).contains("TLS handshake failed"));

    let mut c = RpcClient::connect_to(&s.addr.to_string(), &tls_opts(&pki.ca)).unwrap();
    assert_eq!(c.device_count().unwrap(), 1);
}

#[test]
fn plain_peers_are_refused_when_tls_is_required() {
    let pki = Pki::new();
    let s = tls_server(&pki, true, None);
    let mut good = RpcClient::connect_to(&s.addr.to_string(), &tls_opts(&pki.ca)).unwrap();
    let (_, _) = buffer(&mut good, 64);
    let baseline = s.shared.memory.allocated();
    // A llama.cpp master's HELLO.
    let mut raw = s.raw();
    raw.write_all(&hello_frame()).unwrap();
    assert_closed(&mut raw);
    let reason = next_refusal(&s);
    assert!(reason.contains("TLS is required") && reason.contains("tls.require = false"), "{reason}");
    let e = RpcClient::connect(s.addr).err().expect("a plain client was served").to_string();
    assert!(e.contains("may require TLS"), "{e}");
    assert_memory_back(&s, baseline);
    assert_eq!(good.device_count().unwrap(), 1);
}

#[test]
fn plain_llama_cpp_peers_are_still_served_when_tls_is_optional() {
    let pki = Pki::new();
    let s = tls_server(&pki, false, None);
    // The reference's exact bytes, in plain TCP on the TLS port.
    let mut raw = s.raw_hello();
    raw.write_all(&frame(15, &[])).unwrap();
    let mut rsp = [0u8; 12];
    raw.read_exact(&mut rsp).unwrap();
    assert_eq!(rsp, [4, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
    let mut plain = s.client();
    assert!(!plain.is_tls());
    add_over(&mut plain);
    let mut tls = RpcClient::connect_to(&s.addr.to_string(), &tls_opts(&pki.ca)).unwrap();
    assert!(tls.is_tls());
    add_over(&mut tls);
}

#[test]
fn a_tls_client_meeting_a_plain_server_is_told() {
    let pki = Pki::new();
    let s = TestServer::start();
    let msg =
        RpcClient::connect_to(&s.addr.to_string(), &tls_opts(&pki.ca)).err().expect("served").to_string();
    assert!(msg.contains("closed the connection during the TLS handshake"), "{msg}");
    assert!(next_refusal(&s).contains("TLS is not configured here"));
    s.assert_alive();
}

#[test]
fn tls_and_the_shared_secret_together() {
    let pki = Pki::new();
    let secret = AuthKey::from_secret(b"a shared secret for both layers").unwrap();
    let s = tls_server(&pki, true, Some(secret.clone()));
    let mut opts = tls_opts(&pki.ca);
    let e = RpcClient::connect_to(&s.addr.to_string(), &opts).err().expect("served without the secret");
    assert!(matches!(e, llamad_proto::Error::Auth(_)), "{e}");
    opts.auth = Some(secret);
    let mut c = RpcClient::connect_to(&s.addr.to_string(), &opts).unwrap();
    assert!(c.is_tls() && llamad_proto::auth::challenge_of(&c.server_version().caps).is_some());
    add_over(&mut c);
}

#[test]
fn configuration_checks_the_certificate_and_key() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("llamad.toml");
    let load = |toml: String, flags: &Overrides| {
        std::fs::write(&file, toml).unwrap();
        Config::load(Some(&file), Vec::new(), flags)
    };
    let c =
        load(format!("[tls]\ncert = {:?}\nkey = {:?}\n", pki.cert, pki.key), &Overrides::default()).unwrap();
    assert!(c.tls.as_ref().unwrap().require);
    let optional = Overrides { tls_optional: true, ..Overrides::default() };
    let c = load(format!("[tls]\ncert = {:?}\nkey = {:?}\n", pki.cert, pki.key), &optional).unwrap();
    assert!(!c.tls.unwrap().require);
    let e = load(format!("[tls]\ncert = {:?}\nkey = {:?}\n", pki.cert, pki.stray_key), &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not belong to the certificate"), "{e}");
    let e = load(format!("[tls]\ncert = {:?}\nkey = {:?}\n", pki.key, pki.key), &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no PEM certificate"), "{e}");
    let e = load(format!("[tls]\ncert = {:?}\n", pki.cert), &Overrides::default()).unwrap_err().to_string();
    assert!(e.contains("tls.key is not"), "{e}");
    let e = load("[tls]\nrequire = true\n".into(), &Overrides::default()).unwrap_err().to_string();
    assert!(e.contains("needs tls.cert"), "{e}");
    let missing = Overrides {
        tls_cert: Some(pki.cert.clone()),
        tls_key: Some(dir.path().join("absent.pem")),
        ..Overrides::default()
    };
    let e = Config::from_raw(RawConfig::default(), &missing).unwrap_err().to_string();
    assert!(e.contains("absent.pem"), "{e}");
}

#[test]
fn check_config_validates_the_tls_files() {
    let pki = Pki::new();
    let run = |key: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_llamad"))
            .env_remove("RUST_LOG")
            .args(["check-config", "--tls-cert"])
            .arg(&pki.cert)
            .arg("--tls-key")
            .arg(key)
            .output()
            .unwrap()
    };
    let ok = run(&pki.key);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let bad = run(&pki.stray_key);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("does not belong to the certificate"));
}

/// A raw TCP connection to a TLS port that sends the first bytes of a ClientHello and then stalls
/// is cut at the HELLO timeout, like a silent plain peer.
#[test]
fn a_stalled_tls_handshake_is_cut() {
    let pki = Pki::new();
    let s = TestServer::with_config(Config {
        threads: 1,
        mem: Some(TEST_MEM),
        hello_timeout: Duration::from_millis(300),
        tls: Some(TlsSettings::load(&pki.cert, &pki.key, true).unwrap()),
        ..Config::default()
    });
    let mut raw = TcpStream::connect(s.addr).unwrap();
    raw.write_all(&[0x16, 0x03, 0x01]).unwrap();
    assert_closed(&mut raw);
    assert!(next_refusal(&s).contains("TLS handshake not finished"));
    let mut c = RpcClient::connect_to(&s.addr.to_string(), &tls_opts(&pki.ca)).unwrap();
    assert_eq!(c.device_count().unwrap(), 1);
}
