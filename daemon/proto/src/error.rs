//! The crate's one error type: decoding failures (`Incomplete`, `Invalid`) and client failures.

/// Everything that can go wrong while decoding or speaking the protocol.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The input ends before the structure does; `needed` more bytes are required.
    #[error("incomplete {what}: {needed} more bytes needed")]
    Incomplete {
        /// What was being decoded.
        what: &'static str,
        /// How many bytes are missing.
        needed: usize,
    },
    /// The input can never be valid (wrong length, bad value, count larger than the payload).
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// What was being decoded.
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// The peer answered with a frame length other than the one the command requires.
    #[error("unexpected response length for {cmd}: got {got}, expected {expected}")]
    ResponseLength {
        /// The command.
        cmd: &'static str,
        /// Length received.
        got: u64,
        /// Length expected.
        expected: u64,
    },
    /// The server's protocol version is none this client speaks (8.0.x, 7.0.x).
    #[error(
        "server protocol version {major}.{minor}.{patch} is not supported (this client speaks 8.0.0 and 7.0.0)"
    )]
    Version {
        /// Major.
        major: u8,
        /// Minor.
        minor: u8,
        /// Patch.
        patch: u8,
    },
    /// Shared-secret authentication failed or was required without a secret (see [`crate::auth`]).
    #[error("authentication: {0}")]
    Auth(String),
    /// TLS setup or handshake failed (see [`crate::tls`]); the text says what to check.
    #[error("TLS: {0}")]
    Tls(String),
    /// A socket error.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    pub(crate) fn invalid(what: &'static str, detail: impl Into<String>) -> Error {
        Error::Invalid { what, detail: detail.into() }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
