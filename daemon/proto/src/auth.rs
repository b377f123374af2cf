//! Optional shared-secret authentication, an llamad extension negotiated inside HELLO so that it
//! costs llama.cpp masters nothing when it is off.
//!
//! * A server that requires authentication answers HELLO with caps `AUTH_MAGIC ‖ server_nonce[16]`
//!   instead of 24 zero bytes (a TCP-only reference server always answers zeros, ref:
//!   ggml-rpc-protocol.md §6). With authentication off llamad answers zeros, byte for byte as before.
//! * A client that sees the magic sends one AUTH frame (command byte [`CMD_AUTH`], outside the
//!   reference's command range, 48 bytes): `client_nonce[16] ‖ client_mac[32]`; the server answers
//!   `server_mac[32]` and the connection continues as usual. Anything else is refused and closed.
//! * MACs are keyed BLAKE3 over a role label and both nonces, with the key derived from the secret;
//!   each side proves knowledge of the secret to the other, and nonces make every proof single-use.
//! * A client holding a secret that meets a server without the magic (llama.cpp's rpc-server, or
//!   llamad with authentication off) simply proceeds: the server did not ask.
//!
//! This authenticates peers; it does not encrypt or integrity-protect the stream that follows.

/// First 8 bytes of the server's HELLO caps when it requires authentication.
pub const AUTH_MAGIC: [u8; 8] = *b"LLMDAUT1";
/// The AUTH command byte (the reference closes the connection on any byte ≥ 19).
pub const CMD_AUTH: u8 = 0xA0;
/// Nonce size.
pub const NONCE_SIZE: usize = 16;
/// MAC size.
pub const MAC_SIZE: usize = 32;
/// AUTH request payload size.
pub const AUTH_REQUEST_SIZE: usize = NONCE_SIZE + MAC_SIZE;
/// Shortest accepted secret.
pub const MIN_SECRET_LEN: usize = 16;

const KEY_CONTEXT: &str = "llamad rpc shared-secret authentication v1";

/// A key derived from a shared secret. Its `Debug` output never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthKey([u8; 32]);

impl std::fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthKey(..)")
    }
}

impl AuthKey {
    /// Derives the key from the secret's bytes (surrounding white space, e.g. a trailing newline
    /// in a file, is ignored). `None` when fewer than [`MIN_SECRET_LEN`] bytes remain.
    pub fn from_secret(secret: &[u8]) -> Option<AuthKey> {
        let s = secret.trim_ascii();
        (s.len() >= MIN_SECRET_LEN).then(|| AuthKey(blake3::derive_key(KEY_CONTEXT, s)))
    }

    fn mac(
        &self,
        role: &[u8],
        server_nonce: &[u8; NONCE_SIZE],
        client_nonce: &[u8; NONCE_SIZE],
    ) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(role);
        h.update(server_nonce);
        h.update(client_nonce);
        h.finalize()
    }

    /// The client's proof.
    pub fn client_mac(
        &self,
        server_nonce: &[u8; NONCE_SIZE],
        client_nonce: &[u8; NONCE_SIZE],
    ) -> [u8; MAC_SIZE] {
        *self.mac(b"client", server_nonce, client_nonce).as_bytes()
    }

    /// The server's proof.
    pub fn server_mac(
        &self,
        server_nonce: &[u8; NONCE_SIZE],
        client_nonce: &[u8; NONCE_SIZE],
    ) -> [u8; MAC_SIZE] {
        *self.mac(b"server", server_nonce, client_nonce).as_bytes()
    }

    /// Checks a client's AUTH payload (in constant time); returns the server's proof when it is right.
    pub fn verify_client(&self, server_nonce: &[u8; NONCE_SIZE], payload: &[u8]) -> Option<[u8; MAC_SIZE]> {
        let (nonce, mac) = parse_request(payload)?;
        let want = self.mac(b"client", server_nonce, &nonce);
        (want == blake3::Hash::from_bytes(mac)).then(|| self.server_mac(server_nonce, &nonce))
    }

    /// Checks the server's proof (in constant time).
    pub fn verify_server(
        &self,
        server_nonce: &[u8; NONCE_SIZE],
        client_nonce: &[u8; NONCE_SIZE],
        mac: &[u8; MAC_SIZE],
    ) -> bool {
        self.mac(b"server", server_nonce, client_nonce) == blake3::Hash::from_bytes(*mac)
    }
}

/// HELLO caps announcing that authentication is required, with the server's nonce.
pub fn challenge_caps(server_nonce: &[u8; NONCE_SIZE]) -> [u8; crate::cmd::CONN_CAPS_SIZE] {
    let mut caps = [0u8; crate::cmd::CONN_CAPS_SIZE];
    caps[..8].copy_from_slice(&AUTH_MAGIC);
    caps[8..].copy_from_slice(server_nonce);
    caps
}

/// The server's nonce, when its HELLO caps ask for authentication.
pub fn challenge_of(caps: &[u8; crate::cmd::CONN_CAPS_SIZE]) -> Option<[u8; NONCE_SIZE]> {
    if caps[..8] != AUTH_MAGIC {
        return None;
    }
    let mut n = [0u8; NONCE_SIZE];
    n.copy_from_slice(&caps[8..]);
    Some(n)
}

/// The AUTH request frame (`u8 cmd, u64 len, payload`).
pub fn request_frame(client_nonce: &[u8; NONCE_SIZE], mac: &[u8; MAC_SIZE]) -> Vec<u8> {
    let mut v = vec![CMD_AUTH];
    v.extend_from_slice(&(AUTH_REQUEST_SIZE as u64).to_le_bytes());
    v.extend_from_slice(client_nonce);
    v.extend_from_slice(mac);
    v
}

fn parse_request(payload: &[u8]) -> Option<([u8; NONCE_SIZE], [u8; MAC_SIZE])> {
    if payload.len() != AUTH_REQUEST_SIZE {
        return None;
    }
    let mut nonce = [0u8; NONCE_SIZE];
    let mut mac = [0u8; MAC_SIZE];
    nonce.copy_from_slice(&payload[..NONCE_SIZE]);
    mac.copy_from_slice(&payload[NONCE_SIZE..]);
    Some((nonce, mac))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_verify_only_with_the_same_secret_and_nonces() {
        let k = AuthKey::from_secret(b"correct horse battery staple\n").unwrap();
        let other = AuthKey::from_secret(b"correct horse battery stapler").unwrap();
        let (sn, cn) = ([1u8; 16], [2u8; 16]);
        let mut payload = cn.to_vec();
        payload.extend_from_slice(&k.client_mac(&sn, &cn));
        let server = k.verify_client(&sn, &payload).unwrap();
        assert!(k.verify_server(&sn, &cn, &server));
        assert!(!other.verify_server(&sn, &cn, &server));
        assert!(other.verify_client(&sn, &payload).is_none());
        assert!(k.verify_client(&[3u8; 16], &payload).is_none(), "replayed under another server nonce");
        assert!(k.verify_client(&sn, &payload[..47]).is_none());
        // The client's and the server's proofs differ (no reflection).
        assert_ne!(k.client_mac(&sn, &cn), k.server_mac(&sn, &cn));
        // Independent value: keyed BLAKE3 as specified in the module docs.
        let key = blake3::derive_key(KEY_CONTEXT, b"correct horse battery staple");
        let mut h = blake3::Hasher::new_keyed(&key);
        h.update(b"client");
        h.update(&sn);
        h.update(&cn);
        assert_eq!(*h.finalize().as_bytes(), k.client_mac(&sn, &cn));
    }

    #[test]
    fn short_secrets_are_refused_and_keys_stay_hidden() {
        assert!(AuthKey::from_secret(b"  short secret \n").is_none());
        let k = AuthKey::from_secret(b"0123456789abcdef").unwrap();
        assert_eq!(format!("{k:?}"), "AuthKey(..)");
    }

    #[test]
    fn caps_carry_the_challenge() {
        let caps = challenge_caps(&[9u8; 16]);
        assert_eq!(challenge_of(&caps), Some([9u8; 16]));
        assert_eq!(challenge_of(&[0u8; 24]), None);
        let f = request_frame(&[1; 16], &[2; 32]);
        assert_eq!((f[0], f.len()), (CMD_AUTH, 9 + 48));
    }
}
