//! Time limits on a connection's socket: a peer that stops in the middle of a frame (or stops
//! reading a response) is dropped after `frame_timeout`; a peer idle between commands is dropped
//! after `idle_timeout` only when one is configured (llama.cpp masters keep connections open and
//! idle between tokens for as long as a user thinks, so it is off by default).
//!
//! [`Timed`] wraps either half of the socket. The deadline is reset by every byte of progress, so
//! a large but steady upload is never cut; only silence counts.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// What a read is waiting for, which picks the timeout that applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Between frames: the idle timeout (if any).
    Idle,
    /// Inside a frame (or writing a response): the frame timeout.
    Frame,
}

/// A socket half with progress timeouts.
pub struct Timed<T> {
    inner: T,
    idle: Option<Duration>,
    frame: Option<Duration>,
    phase: Phase,
    /// True while the inner IO is pending: the clock runs from the first pending poll since the last
    /// progress, so time spent elsewhere (computing a graph) never counts against the peer.
    waiting: bool,
    sleep: Pin<Box<Sleep>>,
}

impl<T> Timed<T> {
    /// Wraps `inner`; `None` disables a timeout. Starts in [`Phase::Frame`].
    pub fn new(inner: T, idle: Option<Duration>, frame: Option<Duration>) -> Timed<T> {
        Timed {
            inner,
            idle,
            frame,
            phase: Phase::Frame,
            waiting: false,
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
        }
    }

    /// Enters `phase` and restarts its clock.
    pub fn set_phase(&mut self, phase: Phase) {
        self.phase = phase;
        self.waiting = false;
    }

    fn limit(&self) -> Option<Duration> {
        match self.phase {
            Phase::Idle => self.idle,
            Phase::Frame => self.frame,
        }
    }

    /// Called when the inner IO is pending: starts the clock if it is not running, and fails once
    /// the current limit has passed in silence.
    fn expired(&mut self, cx: &mut Context<'_>, what: &str) -> Option<io::Error> {
        let limit = self.limit()?;
        if !self.waiting {
            self.waiting = true;
            self.sleep.as_mut().reset(Instant::now() + limit);
        }
        if self.sleep.as_mut().poll(cx).is_pending() {
            return None;
        }
        let msg = match self.phase {
            Phase::Idle => {
                format!("idle for {}s between commands (limits.idle_timeout_secs)", limit.as_secs())
            }
            Phase::Frame => {
                format!("peer stalled for {}s while {what} (limits.frame_timeout_secs)", limit.as_secs_f32())
            }
        };
        Some(io::Error::new(io::ErrorKind::TimedOut, msg))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Timed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                // Progress (or end of stream, or an error): the clock stops.
                this.waiting = false;
                Poll::Ready(r)
            }
            Poll::Pending => match this.expired(cx, "sending a frame") {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Timed<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(r) => {
                this.waiting = false;
                Poll::Ready(r)
            }
            Poll::Pending => match this.expired(cx, "reading a response") {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Ready(r) => {
                this.waiting = false;
                Poll::Ready(r)
            }
            Poll::Pending => match this.expired(cx, "reading a response") {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn silence_inside_a_frame_times_out_progress_does_not() {
        let (mut a, b) = tokio::io::duplex(64);
        let mut t = Timed::new(b, None, Some(Duration::from_secs(5)));
        // Steady progress over 20 s in total never trips the 5 s limit.
        let writer = tokio::spawn(async move {
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_secs(2)).await;
                a.write_all(&[1]).await.unwrap();
            }
            a
        });
        let mut buf = [0u8; 10];
        t.read_exact(&mut buf).await.unwrap();
        let _a = writer.await.unwrap();
        // Then silence: fails after the limit with a clear message.
        let start = Instant::now();
        let e = t.read_exact(&mut buf[..1]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("stalled for 5s"), "{e}");
        assert_eq!(start.elapsed().as_secs(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_phase_has_no_limit_unless_configured() {
        let (mut a, b) = tokio::io::duplex(64);
        let mut t = Timed::new(b, None, Some(Duration::from_secs(1)));
        t.set_phase(Phase::Idle);
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            a.write_all(&[7]).await.unwrap();
            a
        });
        let mut one = [0u8; 1];
        t.read_exact(&mut one).await.unwrap();
        assert_eq!(one, [7]);
        let mut a = writer.await.unwrap();

        let (_keep, b) = tokio::io::duplex(64);
        let mut t = Timed::new(b, Some(Duration::from_secs(30)), None);
        t.set_phase(Phase::Idle);
        let e = t.read_exact(&mut one).await.unwrap_err();
        assert!(e.to_string().contains("idle for 30s"), "{e}");
        a.shutdown().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_does_not_read_stalls_the_writer() {
        let (_a, b) = tokio::io::duplex(16);
        let mut t = Timed::new(b, None, Some(Duration::from_secs(2)));
        let e = t.write_all(&[0u8; 1024]).await.unwrap_err();
        assert!(e.to_string().contains("reading a response"), "{e}");
    }
}
