//! Access control (`allow`), the connection limit and the socket timeouts: each case checks that the
//! offending peer is closed with the reason recorded, that a bystander is unaffected, that the daemon
//! keeps accepting, and that buffer memory returns to its baseline.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use llamad::config::Config;
use llamad::rpc::access::AllowList;
use llamad::Shared;
use llamad_proto::msg::Command;

use crate::common::*;

fn cfg() -> Config {
    Config { threads: 1, mem: Some(TEST_MEM), ..Config::default() }
}

/// Waits until the server has no open connection and no buffer memory, or panics after 5 s.
fn assert_baseline(s: &TestServer) {
    let t0 = Instant::now();
    while s.shared.stats.active.load(Ordering::SeqCst) != 0 || s.shared.memory.allocated() != 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "not back to baseline: {} connections, {} bytes",
            s.shared.stats.active.load(Ordering::SeqCst),
            s.shared.memory.allocated()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn hello_on(addr: SocketAddr) -> std::io::Result<[u8; 36]> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(&hello_frame())?;
    let mut r = [0u8; 36];
    s.read_exact(&mut r)?;
    Ok(r)
}

#[test]
fn a_peer_outside_the_allow_list_is_closed_at_accept() {
    let s = TestServer::with_config(Config { allow: AllowList::parse("10.0.0.0/8,::1").unwrap(), ..cfg() });
    let mut raw = s.raw();
    assert_closed(&mut raw);
    assert!(hello_on(s.addr).is_err(), "a refused peer got a HELLO reply");
    assert_eq!(s.shared.stats.denied.load(Ordering::SeqCst), 2);
    assert_eq!(s.shared.stats.connections.load(Ordering::SeqCst), 0, "a refused peer was served");
    assert_baseline(&s);
}

#[test]
fn loopback_is_allowed_by_default_and_listed_peers_are_served() {
    let s = TestServer::with_config(cfg());
    s.assert_alive();
    let s = TestServer::with_config(Config {
        allow: AllowList::parse("192.168.0.0/16, 127.0.0.1").unwrap(),
        ..cfg()
    });
    assert_eq!(hello_on(s.addr).unwrap(), hello_reply());
    assert_eq!(s.shared.stats.denied.load(Ordering::SeqCst), 0);
}

fn ipv6_loopback_available() -> bool {
    std::net::TcpListener::bind("[::1]:0").is_ok()
}

#[test]
fn ipv6_peers_are_matched() {
    if !ipv6_loopback_available() {
        eprintln!("skipped: no IPv6 loopback on this host");
        return;
    }
    // ::1 in the list: served. Only 127.0.0.0/8 in the list: an IPv6 loopback peer is refused.
    let s = TestServer::with_shared_on(Shared::new(cfg()), "[::1]:0");
    assert_eq!(hello_on(s.addr).unwrap(), hello_reply());
    let s = TestServer::with_shared_on(
        Shared::new(Config { allow: AllowList::parse("127.0.0.0/8").unwrap(), ..cfg() }),
        "[::1]:0",
    );
    assert!(hello_on(s.addr).is_err());
    assert_eq!(s.shared.stats.denied.load(Ordering::SeqCst), 1);
}

#[test]
fn v4_mapped_peers_of_a_dual_stack_listener_match_ipv4_networks() {
    if !ipv6_loopback_available() {
        eprintln!("skipped: no IPv6 on this host");
        return;
    }
    // On a `[::]` listener an IPv4 client appears as ::ffff:127.0.0.1.
    let v4 = |s: &TestServer| SocketAddr::from(([127, 0, 0, 1], s.addr.port()));
    let s = TestServer::with_shared_on(
        Shared::new(Config { allow: AllowList::parse("127.0.0.1").unwrap(), ..cfg() }),
        "[::]:0",
    );
    assert_eq!(hello_on(v4(&s)).unwrap(), hello_reply());
    let s = TestServer::with_shared_on(
        Shared::new(Config { allow: AllowList::parse("10.0.0.0/8").unwrap(), ..cfg() }),
        "[::]:0",
    );
    assert!(hello_on(v4(&s)).is_err());
    assert_eq!(s.shared.stats.denied.load(Ordering::SeqCst), 1);
}

#[test]
fn connections_over_the_limit_are_closed_and_slots_are_reused() {
    let s = TestServer::with_config(Config { max_connections: 2, ..cfg() });
    let mut a = s.client();
    let mut b = s.client();
    let (buf, _) = buffer(&mut a, 4096);
    assert!(hello_on(s.addr).is_err(), "a third connection was served");
    assert_eq!(s.shared.stats.over_limit.load(Ordering::SeqCst), 1);
    // Those already connected are unaffected.
    assert_eq!(a.device_count().unwrap(), 1);
    assert_eq!(b.device_count().unwrap(), 1);
    a.free_buffer(buf).unwrap();
    drop(a);
    drop(b);
    assert_baseline(&s);
    // The slots are free again.
    let mut c = s.client();
    let mut d = s.client();
    assert_eq!((c.device_count().unwrap(), d.device_count().unwrap()), (1, 1));
}

fn timeouts(idle: Option<u64>, frame: Option<u64>) -> TestServer {
    TestServer::with_config(Config {
        idle_timeout: idle.map(Duration::from_millis),
        frame_timeout: frame.map(Duration::from_millis),
        ..cfg()
    })
}

#[test]
fn a_peer_stalled_inside_a_frame_is_dropped_and_its_memory_freed() {
    let s = timeouts(None, Some(300));
    let mut by = s.client();
    let (bbuf, bbase) = buffer(&mut by, 64);
    let t = f32_tensor(9, bbuf, bbase, 4);
    by.set_tensor(&t, 0, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]), false).unwrap();
    let held = s.shared.memory.allocated();

    for (what, cut) in [("header", 4usize), ("payload", 9 + 100), ("tensor data", 9 + 305 + 8)] {
        let mut c = s.client();
        let (buf, base) = buffer(&mut c, 1 << 20);
        assert!(s.shared.memory.allocated() > held);
        // A SET_TENSOR of 64 bytes of data, cut after `cut` bytes; the peer then goes silent.
        let tensor = f32_tensor(1, buf, base, 16);
        let frame = Command::SetTensor(
            llamad_proto::msg::SetTensorHeader { tensor, cache_flag: 0, offset: 0 },
            &[0u8; 64],
        )
        .encode_frame();
        s.shared.stats.take_last_refusal();
        let t0 = Instant::now();
        c.stream().write_all(&frame[..cut]).unwrap();
        assert_closed(c.stream());
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(3), "{what}: {took:?}");
        let reason = s.shared.stats.take_last_refusal().unwrap_or_default();
        assert!(reason.contains("stalled"), "{what}: {reason}");
        // The stalled peer's buffer is released; the bystander still has its data.
        let t1 = Instant::now();
        while s.shared.memory.allocated() != held {
            assert!(t1.elapsed() < Duration::from_secs(5), "{what}: memory not released");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(bytes_f32(&by.get_tensor(&t, 0, 16).unwrap()), [1.0, 2.0, 3.0, 4.0]);
    }
    s.assert_alive();
}

#[test]
fn an_idle_master_is_kept_by_default() {
    // A frame timeout much shorter than the pause: silence between commands is not a stall.
    let s = timeouts(None, Some(200));
    let mut c = s.client();
    let (buf, base) = buffer(&mut c, 64);
    std::thread::sleep(Duration::from_millis(1200));
    let t = f32_tensor(1, buf, base, 4);
    c.set_tensor(&t, 0, &f32_bytes(&[5.0; 4]), false).unwrap();
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(bytes_f32(&c.get_tensor(&t, 0, 16).unwrap()), [5.0; 4]);
    assert_eq!(s.shared.stats.refused.load(Ordering::SeqCst), 0);
}

#[test]
fn a_configured_idle_timeout_closes_silent_connections() {
    let s = timeouts(Some(300), None);
    let mut by = s.client();
    let mut c = s.client();
    let _ = buffer(&mut c, 4096);
    // Activity resets the clock.
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(c.device_count().unwrap(), 1);
        assert_eq!(by.device_count().unwrap(), 1);
    }
    let t0 = Instant::now();
    assert_closed(c.stream());
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert!(s.shared.stats.take_last_refusal().unwrap_or_default().contains("idle for"));
    // The bystander went idle too and is closed alike; a new connection is served.
    assert_closed(by.stream());
    assert_baseline(&s);
    s.assert_alive();
}

#[test]
fn a_peer_that_never_reads_its_responses_is_dropped() {
    let s = timeouts(None, Some(500));
    let mut c = s.client();
    let n = 8u64 << 20;
    let (buf, base) = buffer(&mut c, n);
    let t = llamad_proto::RpcTensor {
        id: 1,
        dtype: 0,
        buffer: buf,
        ne: [(n / 4) as u32, 1, 1, 1],
        nb: [4, n as u32, n as u32, n as u32],
        data: base,
        ..Default::default()
    };
    // Ask for 8 MiB several times without reading: the socket buffers fill, the server's writes stall.
    let frame =
        Command::GetTensor(llamad_proto::msg::GetTensorReq { tensor: t, offset: 0, size: n }).encode_frame();
    for _ in 0..4 {
        let _ = c.stream().write_all(&frame);
    }
    let t0 = Instant::now();
    while s.shared.memory.allocated() != 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the stalled reader's connection was kept");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(s.shared.stats.take_last_refusal().unwrap_or_default().contains("reading a response"));
    s.assert_alive();
}
