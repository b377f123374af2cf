//! llamad's extension commands for split mode `row`: worker-to-worker links and a whole-ubatch
//! tensor-parallel run, so the partial sums of each layer phase go straight from worker to worker
//! instead of through the master (one master round trip per ubatch instead of `2 × layers + 1`).
//!
//! Negotiation costs llama.cpp peers nothing:
//! * a master that wants the extension sends HELLO caps `EXT_MAGIC ‖ 0…` instead of 24 zero bytes.
//!   A TCP-only reference server ignores the peer's caps and answers zeros (ref:
//!   ggml-rpc-protocol.md §6), so the master knows it must keep to the plain protocol;
//! * llamad answers such a master with `EXT_MAGIC ‖ u32 EXT_VERSION ‖ 0…` (or with its
//!   authentication challenge, which only llamad sends and which implies the extension), and answers
//!   a master that sent zeros with zeros, byte for byte as the reference does.
//!
//! Extension command bytes lie above the reference's range (it closes the connection on any byte
//! ≥ 19), and llamad refuses them on a connection that did not negotiate the extension. Frames are
//! framed as every command: `u8 cmd, u64 len, payload`; answers are `u64 len, payload`.
//!
//! | byte | command | payload | answer |
//! |---|---|---|---|
//! | 0xA1 | LINK_OFFER | `token[32]` | `u16 port`: a one-shot listener on the address the master reached |
//! | 0xA2 | LINK_DIAL | `u32 peer_rank, token[32], u16 port, host (UTF-8, rest)` | `u8 1` once the peer accepted |
//! | 0xA3 | LINK_ACCEPT | `u32 peer_rank, token[32]` | `u8 1` once a dialer presented the token |
//! | 0xA4 | GRAPH_STORE | `u32 slot, rpc_tensor input, rpc_tensor output, graph blob` | none |
//! | 0xA5 | TP_RUN | `u32 rank, u32 n_ranks, u32 n_tokens, u32 n_outputs, u32 n_embd, u32 n_slots, u32 slots[n], f32 x[n_tokens × n_embd]` | the last slot's output |
//! | 0xA6 | TP_RUN_STREAMS (version 2) | `u32 n_streams, n_streams × (u64 len, TP_RUN payload)` | each stream's last slot output, in stream order |
//!
//! TP_RUN runs the stored slots in order. Before slot `k` the residual stream (`x`, or its last
//! `n_outputs` rows from slot `n − 2` on) is written to the slot's input; after it, every rank
//! sends its output (the partial sum) to every other rank over the links, and each rank adds all
//! partials to the residual in rank order, so every rank holds the same bits as a master that
//! relayed the sums would. After slot `n − 3` (the last layer's attention) only the last
//! `n_outputs` rows go on. The last slot's output (a slice of the logits) is the answer.
//!
//! TP_RUN_STREAMS runs several TP_RUNs of one group (consecutive micro-batches of a prompt, each
//! with its own stored slots) interleaved phase by phase: slot `k` of stream 0, of stream 1, …, then
//! slot `k + 1` of each. A rank sends a stream's partial as soon as it has it and adds the peers'
//! partials of that stream only when the stream's next slot is due, so it computes the other
//! streams while the partials travel and while a slower peer catches up. Partials are tagged
//! `k × n_streams + stream`. Each stream computes what its TP_RUN alone would, in the same order.

use crate::error::{Error, Result};
use crate::graph::GraphBlob;
use crate::msg::Limits;
use crate::tensor::{RpcTensor, RPC_TENSOR_SIZE};
use crate::wire::{Put, Reader};

/// First 8 bytes of HELLO caps that ask for (master) or grant (server) the extension.
pub const EXT_MAGIC: [u8; 8] = *b"LLMDEXT1";
/// Version of the extension commands (2 added TP_RUN_STREAMS).
pub const EXT_VERSION: u32 = 2;
/// LINK_OFFER command byte.
pub const CMD_LINK_OFFER: u8 = 0xA1;
/// LINK_DIAL command byte.
pub const CMD_LINK_DIAL: u8 = 0xA2;
/// LINK_ACCEPT command byte.
pub const CMD_LINK_ACCEPT: u8 = 0xA3;
/// GRAPH_STORE command byte.
pub const CMD_GRAPH_STORE: u8 = 0xA4;
/// TP_RUN command byte.
pub const CMD_TP_RUN: u8 = 0xA5;
/// TP_RUN_STREAMS command byte (extension version 2).
pub const CMD_TP_RUN_STREAMS: u8 = 0xA6;
/// Most streams in one TP_RUN_STREAMS.
pub const MAX_STREAMS: u32 = 8;
/// Link token size.
pub const TOKEN_SIZE: usize = 32;
/// Most ranks in one tensor-parallel group.
pub const MAX_RANKS: u32 = 64;
/// Most stored slots per connection.
pub const MAX_SLOTS: u32 = 4096;

/// Whether `byte` is an extension command.
pub fn is_ext(byte: u8) -> bool {
    (CMD_LINK_OFFER..=CMD_TP_RUN_STREAMS).contains(&byte)
}

/// The name of an extension command (for logs).
pub fn name(byte: u8) -> &'static str {
    match byte {
        CMD_LINK_OFFER => "EXT_LINK_OFFER",
        CMD_LINK_DIAL => "EXT_LINK_DIAL",
        CMD_LINK_ACCEPT => "EXT_LINK_ACCEPT",
        CMD_GRAPH_STORE => "EXT_GRAPH_STORE",
        CMD_TP_RUN => "EXT_TP_RUN",
        CMD_TP_RUN_STREAMS => "EXT_TP_RUN_STREAMS",
        _ => "EXT_UNKNOWN",
    }
}

/// The caps a master sends to ask for the extension.
pub fn request_caps() -> [u8; crate::cmd::CONN_CAPS_SIZE] {
    let mut caps = [0u8; crate::cmd::CONN_CAPS_SIZE];
    caps[..8].copy_from_slice(&EXT_MAGIC);
    caps
}

/// The caps llamad answers with when the master asked.
pub fn grant_caps() -> [u8; crate::cmd::CONN_CAPS_SIZE] {
    let mut caps = request_caps();
    caps[8..12].copy_from_slice(&EXT_VERSION.to_le_bytes());
    caps
}

/// Whether HELLO caps carry the magic (a request, or a grant).
pub fn has_magic(caps: &[u8; crate::cmd::CONN_CAPS_SIZE]) -> bool {
    caps[..8] == EXT_MAGIC
}

/// The extension version a server's caps grant, if any.
pub fn granted(caps: &[u8; crate::cmd::CONN_CAPS_SIZE]) -> Option<u32> {
    has_magic(caps).then(|| u32::from_le_bytes([caps[8], caps[9], caps[10], caps[11]]))
}

fn frame(cmd: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + payload.len());
    v.push(cmd);
    v.put_u64(payload.len() as u64);
    v.extend_from_slice(payload);
    v
}

/// LINK_DIAL's request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkDial {
    /// The rank of the worker dialled.
    pub peer_rank: u32,
    /// The token it expects.
    pub token: [u8; TOKEN_SIZE],
    /// Its one-shot listener's port.
    pub port: u16,
    /// Its host (as the master reached it).
    pub host: String,
}

impl LinkDial {
    /// The whole frame.
    pub fn encode_frame(&self) -> Vec<u8> {
        let mut p = Vec::new();
        p.put_u32(self.peer_rank);
        p.extend_from_slice(&self.token);
        p.extend_from_slice(&self.port.to_le_bytes());
        p.extend_from_slice(self.host.as_bytes());
        frame(CMD_LINK_DIAL, &p)
    }

    /// Decodes a payload.
    pub fn decode(b: &[u8]) -> Result<LinkDial> {
        let mut r = Reader::new(b, "EXT_LINK_DIAL");
        let peer_rank = r.u32()?;
        let token = r.array()?;
        let port = u16::from_le_bytes(r.array()?);
        let host = std::str::from_utf8(r.bytes(r.remaining())?)
            .map_err(|_| Error::invalid("EXT_LINK_DIAL", "host is not UTF-8"))?
            .to_string();
        if host.is_empty() || host.len() > 255 {
            return Err(Error::invalid("EXT_LINK_DIAL", format!("host of {} bytes", host.len())));
        }
        Ok(LinkDial { peer_rank, token, port, host })
    }
}

/// LINK_OFFER's frame.
pub fn link_offer_frame(token: &[u8; TOKEN_SIZE]) -> Vec<u8> {
    frame(CMD_LINK_OFFER, token)
}

/// Decodes LINK_OFFER's payload.
pub fn decode_link_offer(b: &[u8]) -> Result<[u8; TOKEN_SIZE]> {
    let mut r = Reader::new(b, "EXT_LINK_OFFER");
    let t = r.array()?;
    r.finish()?;
    Ok(t)
}

/// LINK_ACCEPT's frame.
pub fn link_accept_frame(peer_rank: u32, token: &[u8; TOKEN_SIZE]) -> Vec<u8> {
    let mut p = Vec::new();
    p.put_u32(peer_rank);
    p.extend_from_slice(token);
    frame(CMD_LINK_ACCEPT, &p)
}

/// Decodes LINK_ACCEPT's payload: `(peer_rank, token)`.
pub fn decode_link_accept(b: &[u8]) -> Result<(u32, [u8; TOKEN_SIZE])> {
    let mut r = Reader::new(b, "EXT_LINK_ACCEPT");
    let rank = r.u32()?;
    let t = r.array()?;
    r.finish()?;
    Ok((rank, t))
}

/// GRAPH_STORE's request.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphStore {
    /// Slot number.
    pub slot: u32,
    /// Where TP_RUN writes the residual stream before the graph runs.
    pub input: RpcTensor,
    /// Where TP_RUN reads the graph's result.
    pub output: RpcTensor,
    /// The graph.
    pub blob: GraphBlob,
}

/// GRAPH_STORE's frame.
pub fn graph_store_frame(slot: u32, input: &RpcTensor, output: &RpcTensor, blob: &GraphBlob) -> Vec<u8> {
    let mut p = Vec::with_capacity(4 + 2 * RPC_TENSOR_SIZE + blob.encoded_len());
    p.put_u32(slot);
    input.encode_into(&mut p);
    output.encode_into(&mut p);
    blob.encode_into(&mut p);
    frame(CMD_GRAPH_STORE, &p)
}

impl GraphStore {
    /// Decodes a payload (the blob under `limits`).
    pub fn decode(b: &[u8], limits: &Limits) -> Result<GraphStore> {
        let mut r = Reader::new(b, "EXT_GRAPH_STORE");
        let slot = r.u32()?;
        if slot >= MAX_SLOTS {
            return Err(Error::invalid("EXT_GRAPH_STORE", format!("slot {slot} ≥ {MAX_SLOTS}")));
        }
        let input = RpcTensor::read(&mut r)?;
        let output = RpcTensor::read(&mut r)?;
        let blob = GraphBlob::decode(r.bytes(r.remaining())?, limits)?;
        Ok(GraphStore { slot, input, output, blob })
    }
}

/// TP_RUN's request (the residual stream borrowed from the payload).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TpRun<'a> {
    /// This worker's rank.
    pub rank: u32,
    /// Ranks in the group.
    pub n_ranks: u32,
    /// Tokens of the ubatch.
    pub n_tokens: u32,
    /// Rows whose logits are wanted (the last `n_outputs` tokens).
    pub n_outputs: u32,
    /// Embedding width.
    pub n_embd: u32,
    /// Slots to run, in order.
    pub slots: Vec<u32>,
    /// The residual stream, `n_tokens × n_embd` little-endian f32.
    pub x: &'a [u8],
}

impl TpRun<'_> {
    /// The whole frame.
    pub fn encode_frame(&self) -> Vec<u8> {
        frame(CMD_TP_RUN, &self.encode_payload())
    }

    fn encode_payload(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(24 + 4 * self.slots.len() + self.x.len());
        for v in
            [self.rank, self.n_ranks, self.n_tokens, self.n_outputs, self.n_embd, self.slots.len() as u32]
        {
            p.put_u32(v);
        }
        for &s in &self.slots {
            p.put_u32(s);
        }
        p.extend_from_slice(self.x);
        p
    }
}

/// The frame of a TP_RUN_STREAMS of `streams`.
pub fn tp_run_streams_frame(streams: &[TpRun<'_>]) -> Vec<u8> {
    let mut p = Vec::new();
    p.put_u32(streams.len() as u32);
    for s in streams {
        let body = s.encode_payload();
        p.put_u64(body.len() as u64);
        p.extend_from_slice(&body);
    }
    frame(CMD_TP_RUN_STREAMS, &p)
}

/// Decodes and checks a TP_RUN_STREAMS payload: each stream is a valid TP_RUN, and all are of
/// one rank of one group, with the same embedding width and number of slots.
pub fn decode_tp_run_streams(b: &[u8]) -> Result<Vec<TpRun<'_>>> {
    let what = "EXT_TP_RUN_STREAMS";
    let mut r = Reader::new(b, what);
    let n = r.u32()?;
    if !(1..=MAX_STREAMS).contains(&n) {
        return Err(Error::invalid(what, format!("{n} streams (1 to {MAX_STREAMS})")));
    }
    let mut out: Vec<TpRun<'_>> = Vec::with_capacity(n as usize);
    for i in 0..n {
        let len = r.u64()?;
        let body = usize::try_from(len).ok().filter(|&l| l <= r.remaining()).ok_or_else(|| {
            Error::invalid(what, format!("stream {i}: {len} bytes, {} left", r.remaining()))
        })?;
        let run = TpRun::decode(r.bytes(body)?)?;
        if let Some(first) = out.first() {
            if (run.rank, run.n_ranks, run.n_embd, run.slots.len())
                != (first.rank, first.n_ranks, first.n_embd, first.slots.len())
            {
                return Err(Error::invalid(
                    what,
                    format!("stream {i} is not of the first stream's rank, group, width and slot count"),
                ));
            }
        }
        out.push(run);
    }
    r.finish()?;
    Ok(out)
}

impl<'a> TpRun<'a> {
    /// Decodes and checks a payload: ranks, sizes and the residual's length agree.
    pub fn decode(b: &'a [u8]) -> Result<TpRun<'a>> {
        let what = "EXT_TP_RUN";
        let mut r = Reader::new(b, what);
        let (rank, n_ranks, n_tokens, n_outputs, n_embd, n_slots) =
            (r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?);
        if n_ranks == 0 || n_ranks > MAX_RANKS || rank >= n_ranks {
            return Err(Error::invalid(what, format!("rank {rank} of {n_ranks}")));
        }
        if n_tokens == 0 || n_outputs == 0 || n_outputs > n_tokens || n_embd == 0 {
            return Err(Error::invalid(
                what,
                format!("{n_tokens} tokens, {n_outputs} outputs, width {n_embd}"),
            ));
        }
        if !(3..=MAX_SLOTS).contains(&n_slots) {
            return Err(Error::invalid(what, format!("{n_slots} slots")));
        }
        let mut slots = Vec::with_capacity(n_slots as usize);
        for _ in 0..n_slots {
            slots.push(r.u32()?);
        }
        let want = u64::from(n_tokens) * u64::from(n_embd) * 4;
        if r.remaining() as u64 != want {
            return Err(Error::invalid(what, format!("{} residual bytes, expected {want}", r.remaining())));
        }
        let x = r.bytes(r.remaining())?;
        Ok(TpRun { rank, n_ranks, n_tokens, n_outputs, n_embd, slots, x })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let d = LinkDial { peer_rank: 3, token: [7; TOKEN_SIZE], port: 4242, host: "10.0.0.2".into() };
        let f = d.encode_frame();
        assert_eq!(f[0], CMD_LINK_DIAL);
        assert_eq!(LinkDial::decode(&f[9..]).unwrap(), d);
        let x: Vec<u8> = (0..2 * 4 * 4).map(|i| i as u8).collect();
        let run =
            TpRun { rank: 1, n_ranks: 2, n_tokens: 2, n_outputs: 1, n_embd: 4, slots: vec![0, 1, 2], x: &x };
        let f = run.encode_frame();
        assert_eq!(u64::from_le_bytes(f[1..9].try_into().unwrap()) as usize, f.len() - 9);
        assert_eq!(TpRun::decode(&f[9..]).unwrap(), run);
        assert_eq!(decode_link_accept(&link_accept_frame(5, &[1; 32])[9..]).unwrap(), (5, [1; 32]));
        assert_eq!(decode_link_offer(&link_offer_frame(&[9; 32])[9..]).unwrap(), [9; 32]);
    }

    #[test]
    fn bad_payloads_are_refused() {
        let x = [0u8; 16];
        let good =
            TpRun { rank: 0, n_ranks: 2, n_tokens: 1, n_outputs: 1, n_embd: 4, slots: vec![0, 1, 2], x: &x };
        let f = good.encode_frame();
        assert!(TpRun::decode(&f[9..f.len() - 1]).is_err(), "short residual");
        for bad in [
            TpRun { rank: 2, ..good.clone() },
            TpRun { n_ranks: 0, rank: 0, ..good.clone() },
            TpRun { n_outputs: 2, ..good.clone() },
            TpRun { slots: vec![0, 1], ..good.clone() },
        ] {
            assert!(TpRun::decode(&bad.encode_frame()[9..]).is_err(), "{bad:?}");
        }
        assert!(LinkDial::decode(&[0; 10]).is_err());
        let empty_host = LinkDial { peer_rank: 0, token: [0; 32], port: 1, host: String::new() };
        assert!(LinkDial::decode(&empty_host.encode_frame()[9..]).is_err());
        assert!(decode_link_offer(&[0; 31]).is_err());
        assert!(decode_link_offer(&[0; 33]).is_err());
    }

    #[test]
    fn streams_round_trip_and_must_agree() {
        let (xa, xb) = ([1u8; 3 * 16], [2u8; 16]);
        let a =
            TpRun { rank: 1, n_ranks: 2, n_tokens: 3, n_outputs: 1, n_embd: 4, slots: vec![0, 1, 2], x: &xa };
        let b = TpRun { n_tokens: 1, slots: vec![3, 4, 5], x: &xb, ..a.clone() };
        let f = tp_run_streams_frame(&[a.clone(), b.clone()]);
        assert_eq!(f[0], CMD_TP_RUN_STREAMS);
        assert_eq!(u64::from_le_bytes(f[1..9].try_into().unwrap()) as usize, f.len() - 9);
        assert_eq!(decode_tp_run_streams(&f[9..]).unwrap(), vec![a.clone(), b.clone()]);
        assert!(decode_tp_run_streams(&f[9..f.len() - 1]).is_err(), "short last stream");
        let mut long = f[9..].to_vec();
        long.push(0);
        assert!(decode_tp_run_streams(&long).is_err(), "trailing byte");
        for bad in [
            TpRun { rank: 0, ..b.clone() },
            TpRun { n_embd: 2, x: &xb[..8], ..b.clone() },
            TpRun { slots: vec![3, 4, 5, 6], ..b.clone() },
        ] {
            let f = tp_run_streams_frame(&[a.clone(), bad.clone()]);
            assert!(decode_tp_run_streams(&f[9..]).is_err(), "{bad:?}");
        }
        assert!(decode_tp_run_streams(&tp_run_streams_frame(&[])[9..]).is_err(), "no stream");
        let nine = vec![a.clone(); 9];
        assert!(decode_tp_run_streams(&tp_run_streams_frame(&nine)[9..]).is_err(), "too many streams");
        let mut huge = 1u32.to_le_bytes().to_vec();
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_tp_run_streams(&huge).is_err(), "length past the payload");
    }

    #[test]
    fn caps() {
        assert_eq!(granted(&grant_caps()), Some(EXT_VERSION));
        assert_eq!(granted(&[0; 24]), None);
        assert!(has_magic(&request_caps()));
        assert!((0..=18).all(|b| !is_ext(b)));
    }
}
