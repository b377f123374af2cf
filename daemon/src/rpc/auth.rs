//! The server side of the optional shared-secret authentication (`server.secret_file`); the
//! exchange itself is specified in `llamad_proto::auth`. With no secret configured nothing here
//! runs and HELLO is answered with zero caps, exactly as llama.cpp's server does.

use llamad_proto::auth::{AuthKey, AUTH_REQUEST_SIZE, CMD_AUTH, MAC_SIZE, NONCE_SIZE};

use crate::error::{refuse, Result};

/// A fresh server nonce for one connection's challenge.
pub fn challenge() -> [u8; NONCE_SIZE] {
    rand::random()
}

/// Whether a frame header is the AUTH request.
pub fn is_request(cmd: u8, len: u64) -> bool {
    cmd == CMD_AUTH && len == AUTH_REQUEST_SIZE as u64
}

/// Why a connection that did not authenticate is closed.
pub fn missing(cmd: u8) -> String {
    if cmd == CMD_AUTH {
        "malformed AUTH request".into()
    } else {
        format!(
            "authentication required (server.secret_file is set) but the peer sent command byte {cmd}; \
             llama.cpp masters cannot authenticate: use llamactl --secret-file, or unset the secret"
        )
    }
}

/// Checks the peer's proof; returns ours.
pub fn verify(key: &AuthKey, nonce: &[u8; NONCE_SIZE], payload: &[u8]) -> Result<[u8; MAC_SIZE]> {
    match key.verify_client(nonce, payload) {
        Some(proof) => Ok(proof),
        None => refuse!("authentication failed: the peer does not know the shared secret"),
    }
}
