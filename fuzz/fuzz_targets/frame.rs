//! Message framing, end to end: the input is a raw request stream sent to a live llamad over
//! loopback TCP (HELLO handshake, headers, payload lengths, SET_TENSOR streaming, every command).
//! Oracles: the server never crashes, closes the connection when the stream ends or breaks a rule,
//! and holds no buffer memory once the connection is gone.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let server = llamad_fuzz::server();
    let _ = server.exchange(data);
    server.assert_baseline();
});
