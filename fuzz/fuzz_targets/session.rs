//! Graph deserialization and validation through the daemon's session path, and every command's
//! semantics, llamad's extension commands included: the input is a request stream (`u8 cmd, u64 len, payload` frames, as captured from a
//! real master), decoded and handled in one `Session` like a connection would, with graphs built
//! by `exec::build` (→ `compute::graph::Graph::new`) and run on the executor.
//! Every input runs twice: as a 7.0.0 connection and as an 8.0.0 one (graph uids and the graph
//! store, SET_TENSOR_2D/GET_TENSOR_2D, the COMM commands; link jobs are dropped, never run).
//! Oracles: no panic, no out-of-bounds access (ASan), and the memory account back at zero once the
//! session is dropped.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llamad::rpc::session::{Reply, Session};
use llamad::Shared;
use llamad_proto::cmd::Cmd;
use llamad_proto::msg::Command;
use llamad_proto::Protocol;

fuzz_target!(|data: &[u8]| {
    for proto in llamad_proto::version::SUPPORTED {
        run(proto, data);
    }
});

fn run(proto: &'static Protocol, data: &[u8]) {
    // A fresh server state per input, so buffer handles and base addresses are the ones a fresh
    // llamad hands out (the seeds use them) and every input starts from an empty account.
    let shared = Shared::new(llamad_fuzz::fuzz_config());
    {
        let mut session = Session::new(shared.clone(), proto, Some(std::net::Ipv4Addr::LOCALHOST.into()));
        // With llamad's extension granted, as for a master that asks for it.
        session.grant_ext(std::net::Ipv4Addr::LOCALHOST.into());
        for f in llamad_fuzz::frames(data) {
            if llamad_proto::ext::is_ext(f.cmd) {
                if f.len != f.payload.len() as u64 || f.len > shared.max_frame {
                    break;
                }
                let Ok(reply) = session.handle_ext(f.cmd, f.payload) else { break };
                // TP_RUN and TP_RUN_STREAMS compute (a run is only handed out when its links exist,
                // so here with one rank); link jobs would wait for a peer or dial a fuzzed host, so
                // they are dropped.
                let runs = [llamad_proto::ext::CMD_TP_RUN, llamad_proto::ext::CMD_TP_RUN_STREAMS];
                if let Reply::Blocking(job) = reply {
                    if runs.contains(&f.cmd) && job().is_err() {
                        break;
                    }
                }
                continue;
            }
            // What conn.rs checks before decoding (HELLO is handled by the connection, not here).
            let Some(spec) = proto.spec(f.cmd) else { break };
            if spec.cmd == Cmd::Hello {
                continue;
            }
            if !spec.request.accepts(f.len) || f.len != f.payload.len() as u64 || f.len > shared.max_frame {
                break;
            }
            let Ok(c) = Command::decode(proto, f.cmd, f.payload, &shared.limits) else { break };
            let Ok(reply) = session.handle(c) else { break };
            match reply {
                Reply::Nothing | Reply::Bytes(_) => {}
                Reply::Region(_b, r) => {
                    // SAFETY: the session validated `r` inside the live buffer `_b`.
                    let s = unsafe { r.as_slice() };
                    std::hint::black_box(s.iter().fold(0u8, |a, &b| a ^ b));
                }
                Reply::Rows(b, rows) => {
                    for i in 0..rows.n {
                        let Some(r) = rows.row(&b, i) else { break };
                        // SAFETY: the session validated every row inside the live buffer `b`.
                        let s = unsafe { r.as_slice() };
                        std::hint::black_box(s.iter().fold(0u8, |a, &b| a ^ b));
                    }
                }
                Reply::Job(job, _) => job.run(),
                Reply::Compute(g) => {
                    if g.run_blocking(&shared.executor).is_err() {
                        break;
                    }
                }
                Reply::CacheLoad(..) | Reply::Blocking(_) => {}
            }
        }
    }
    assert_eq!(shared.memory.allocated(), 0, "buffer memory held after the session ended at {proto}");
}
