//! The master's error type: what went wrong (a worker unreachable or gone, a model that does not fit,
//! a protocol or compute failure) with the context a reader needs, as a chain of causes.
//!
//! [`Context`] adds a layer of context to a fallible call (`.with_context(|| format!("worker {addr}"))`),
//! and the crate-private macros `bail!` and `err!` build a message error, so the engine reads as
//! it did under `anyhow` while staying a typed library error. [`Error::chain`] renders the whole
//! chain on one line (`context: cause: root cause`) for callers that do not print with `anyhow`'s `{:#}`.

/// Errors of the master engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A condition the engine checked: bad options, a model that does not fit, a worker's refusal.
    #[error("{0}")]
    Msg(String),
    /// `source` happened while doing `context` (the worker, the phase, the tensor).
    #[error("{context}")]
    Context {
        /// What was being done.
        context: String,
        /// Why it failed.
        #[source]
        source: Box<Error>,
    },
    /// The RPC exchange with a worker failed (connection closed, bad answer, version).
    #[error(transparent)]
    Proto(#[from] llamad_proto::Error),
    /// Building or running a graph locally failed.
    #[error(transparent)]
    Compute(#[from] compute::Error),
    /// Socket or file I/O.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Result of the master engine.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Wraps `self` in a layer of context.
    pub fn context(self, context: impl std::fmt::Display) -> Error {
        Error::Context { context: context.to_string(), source: Box::new(self) }
    }

    /// The whole chain on one line: `context: cause: root cause`.
    pub fn chain(&self) -> String {
        let mut s = self.to_string();
        let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(self);
        while let Some(e) = cur {
            let msg = e.to_string();
            // Transparent variants repeat their source's message; print it once.
            if !s.ends_with(&msg) {
                s.push_str(": ");
                s.push_str(&msg);
            }
            cur = e.source();
        }
        s
    }

    /// Whether a worker's I/O timeout (`SplitOptions::io_timeout`) ended the call.
    pub fn is_timeout(&self) -> bool {
        self.is_io(std::io::ErrorKind::WouldBlock) || self.is_io(std::io::ErrorKind::TimedOut)
    }

    /// Whether any error in the chain is an I/O error of `kind`.
    pub fn is_io(&self, kind: std::io::ErrorKind) -> bool {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cur {
            // A transparent `Io` variant hands out its io::Error's source, not the io::Error itself.
            // (`Context` hands out its boxed source as a `Box<Error>`.)
            let ours = e.downcast_ref::<Error>().or(e.downcast_ref::<Box<Error>>().map(|b| b.as_ref()));
            let io = e.downcast_ref::<std::io::Error>().or(match ours {
                Some(Error::Io(io)) => Some(io),
                _ => None,
            });
            if io.is_some_and(|io| io.kind() == kind) {
                return true;
            }
            cur = e.source();
        }
        false
    }
}

/// Context for fallible calls, as `anyhow::Context` does for `anyhow::Error`.
pub trait Context<T> {
    /// Adds `context` to the error.
    fn context(self, context: impl std::fmt::Display) -> Result<T>;
    /// Adds the context `f` returns to the error (computed only on failure).
    fn with_context<C: std::fmt::Display>(self, f: impl FnOnce() -> C) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context(self, context: impl std::fmt::Display) -> Result<T> {
        self.map_err(|e| e.into().context(context))
    }

    fn with_context<C: std::fmt::Display>(self, f: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| e.into().context(f()))
    }
}

/// A message error from a format string.
macro_rules! err {
    ($($arg:tt)*) => {
        $crate::error::Error::Msg(format!($($arg)*))
    };
}

/// Returns a message error from the enclosing function.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::err!($($arg)*))
    };
}

pub(crate) use {bail, err};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_prints_every_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed");
        let e: Result<()> = Err(Error::from(llamad_proto::Error::Io(io)));
        let e = e.context("GET_TENSOR").with_context(|| "worker 127.0.0.1:1 failed").unwrap_err();
        assert_eq!(e.to_string(), "worker 127.0.0.1:1 failed");
        let chain = e.chain();
        assert!(chain.starts_with("worker 127.0.0.1:1 failed: GET_TENSOR: "), "{chain}");
        assert!(chain.ends_with("connection closed"), "{chain}");
        assert_eq!(chain.matches("connection closed").count(), 1, "{chain}");
        assert!(e.is_io(std::io::ErrorKind::UnexpectedEof));
        assert!(!e.is_io(std::io::ErrorKind::BrokenPipe));
        assert!(!e.is_timeout());
        let t = Error::from(std::io::Error::from(std::io::ErrorKind::WouldBlock)).context("GET_TENSOR");
        assert!(t.is_timeout());
    }
}
