//! Mutation testing of the live server: valid command streams with random byte flips, truncations and
//! length changes. Whatever the bytes, the server must answer or close, never crash or hang, and a
//! bystander's data must stay intact.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::Duration;

use llamad_proto::msg::{Command, GetTensorReq, MemsetTensorReq, SetTensorHeader};

use crate::common::*;

/// xorshift64*: a seeded generator, enough for picking mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn valid_stream(buf: u64, base: u64) -> Vec<u8> {
    let (g, [a, b, out]) = add_graph(buf, base, 8);
    let mut v = Vec::new();
    v.extend(
        Command::SetTensor(SetTensorHeader { tensor: a, cache_flag: 0, offset: 0 }, &f32_bytes(&[1.0; 8]))
            .encode_frame(),
    );
    v.extend(
        Command::SetTensor(SetTensorHeader { tensor: b, cache_flag: 0, offset: 4 }, &f32_bytes(&[2.0; 7]))
            .encode_frame(),
    );
    v.extend(Command::GraphCompute(g, None).encode_frame());
    v.extend(Command::GraphRecompute { device: 0, uid: None }.encode_frame());
    v.extend(Command::GetTensor(GetTensorReq { tensor: out, offset: 0, size: 32 }).encode_frame());
    v.extend(Command::CopyTensor { src: a, dst: b }.encode_frame());
    v.extend(
        Command::MemsetTensor(MemsetTensorReq { tensor: out, offset: 4, size: 8, value: 1 }).encode_frame(),
    );
    v.extend(Command::InitTensor(out).encode_frame());
    v.extend(Command::BufferClear { remote_ptr: buf, value: 3 }.encode_frame());
    v.extend(Command::GetDeviceMemory { device: 0 }.encode_frame());
    v.extend(Command::FreeBuffer { remote_ptr: buf }.encode_frame());
    v.extend(Command::GraphRecompute { device: 0, uid: None }.encode_frame());
    v
}

#[test]
fn mutated_streams_never_crash_the_server() {
    let s = TestServer::start();
    let mut by = s.client();
    let (bbuf, bbase) = buffer(&mut by, 64);
    let t = f32_tensor(9, bbuf, bbase, 16);
    by.set_tensor(&t, 0, &[0x42; 64], false).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let iterations = if std::env::var_os("LLAMAD_SLOW_TESTS").is_some() { 20_000 } else { 1000 };
    for _ in 0..iterations {
        let mut c = s.client();
        let (buf, base) = buffer(&mut c, 256);
        let mut bytes = valid_stream(buf, base);
        match rng.below(4) {
            0 => {
                // Flip a few bytes anywhere.
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(bytes.len() as u64) as usize;
                    bytes[i] ^= 1 << rng.below(8);
                }
            }
            1 => {
                // Overwrite an aligned word with an extreme value.
                let i = rng.below(bytes.len() as u64 - 8) as usize;
                let w = [0u64, 1, u64::MAX, u64::MAX / 2 + 1, base, base + 255, rng.next()]
                    [rng.below(7) as usize];
                bytes[i..i + 8].copy_from_slice(&w.to_le_bytes());
            }
            2 => {
                // Truncate.
                bytes.truncate(rng.below(bytes.len() as u64) as usize);
            }
            _ => {
                // Insert random bytes.
                let i = rng.below(bytes.len() as u64) as usize;
                let junk: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.next() as u8).collect();
                bytes.splice(i..i, junk);
            }
        }
        let stream = c.stream();
        let _ = stream.write_all(&bytes);
        let _ = stream.shutdown(Shutdown::Write);
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut sink = [0u8; 4096];
        loop {
            match stream.read(&mut sink) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("server neither answered nor closed: {e}"),
            }
        }
    }
    let st = &s.shared.stats;
    let graphs = st.graphs_computed.load(std::sync::atomic::Ordering::Relaxed);
    let refused = st.refused.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{iterations} mutated streams: {graphs} graphs computed, {refused} connections refused");
    // The unmutated stream ends in a refused GRAPH_RECOMPUTE after FREE_BUFFER, so nearly every
    // connection is refused; what matters is that many mutated streams still got as far as computing.
    assert!(graphs > iterations / 4, "only {graphs} graphs computed");
    s.assert_alive();
    assert_eq!(by.get_tensor(&t, 0, 64).unwrap(), vec![0x42; 64]);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while s.shared.memory.allocated() != 64 {
        assert!(std::time::Instant::now() < deadline, "buffers of closed connections not released");
        std::thread::sleep(Duration::from_millis(10));
    }
}
