//! The crate's one error type.

/// Everything that can end a connection or stop the daemon.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The peer broke a protocol rule or a bound; the connection is closed.
    #[error("{0}")]
    Refused(String),
    /// A frame that does not decode.
    #[error(transparent)]
    Proto(#[from] llamad_proto::Error),
    /// The compute backend refused or failed a graph.
    #[error("compute: {0}")]
    Compute(#[from] compute::Error),
    /// A socket or file error.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// An invalid configuration.
    #[error("config: {0}")]
    Config(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Returns `Err(Error::Refused(format!(...)))` from the enclosing function.
macro_rules! refuse {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::Refused(format!($($arg)*)))
    };
}
pub(crate) use refuse;
