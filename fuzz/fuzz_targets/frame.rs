//! Message framing, end to end: the input is a raw request stream sent to a live llamad over
//! loopback TCP (HELLO handshake, headers, payload lengths, SET_TENSOR and SET_TENSOR_2D streaming,
//! every command), once to a server announcing 7.0.0 and once to one announcing 8.0.0.
//! Oracles: the server never crashes, closes the connection when the stream ends or breaks a rule,
//! and holds no buffer memory once the connection is gone.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for server in [llamad_fuzz::server(), llamad_fuzz::server_v8()] {
        let _ = server.exchange(data);
        server.assert_baseline();
    }
});
