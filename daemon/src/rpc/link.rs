//! Server-to-server TCP links, shared by llamad's split-mode-row extension ([`crate::rpc::ext`]) and
//! protocol 8.0.0's all-reduce ([`crate::rpc::comm`]): accepting one admitted peer before a
//! deadline, dialling with bounded retries, socket options, and a read that polls briefly before it
//! sleeps. Everything here blocks; callers run it off the async runtime.

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::error::{refuse, Error, Result};

/// How long a rank polls a link for a peer's small message before it sleeps in a blocking read. A
/// blocked reader is woken by an interrupt, which on a virtual machine whose vCPU went idle costs
/// tens of microseconds per exchange, twice per layer; polling (with a yield, so a thread the OS
/// put on the same core still runs) sees the bytes as soon as the peer's write lands.
pub const POLL_WAIT: Duration = Duration::from_millis(2);

/// Accepts connections on the non-blocking `listener` until `admit` takes one or `wait` has passed.
/// `admit` sees each accepted stream (blocking, with a read timeout of `wait`) and its peer address;
/// a stream it turns down (`Ok(false)`) is closed and the wait goes on. `what` names the link in
/// the error.
pub fn accept_one(
    listener: &TcpListener,
    wait: Duration,
    what: &str,
    mut admit: impl FnMut(&mut TcpStream, SocketAddr) -> Result<bool>,
) -> Result<TcpStream> {
    let deadline = Instant::now() + wait;
    loop {
        match listener.accept() {
            Ok((mut s, from)) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(wait))?;
                s.set_write_timeout(Some(wait))?;
                if admit(&mut s, from)? {
                    return Ok(s);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    refuse!("no peer connected to {what} within {wait:?}");
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Connects to `host:port`, trying every resolved address, up to `attempts` times `interval` apart,
/// all within `timeout`; returns the stream (with read and write timeouts of `timeout`) and the
/// address reached.
pub fn dial(
    host: &str,
    port: u16,
    attempts: u32,
    interval: Duration,
    timeout: Duration,
) -> Result<(TcpStream, SocketAddr)> {
    let deadline = Instant::now() + timeout;
    let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs()?.collect();
    if addrs.is_empty() {
        refuse!("link host {host} resolves to nothing");
    }
    let mut last = None;
    for attempt in 0..attempts.max(1) {
        if attempt > 0 {
            std::thread::sleep(interval);
        }
        for addr in &addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(addr, left) {
                Ok(s) => {
                    s.set_read_timeout(Some(timeout))?;
                    s.set_write_timeout(Some(timeout))?;
                    return Ok((s, *addr));
                }
                Err(e) => last = Some((*addr, e)),
            }
        }
    }
    match last {
        Some((addr, e)) => {
            Err(Error::Refused(format!("dialling the link to {addr}: {e} ({attempts} attempts)")))
        }
        None => refuse!("dialling the link to {host}:{port}: no attempt made"),
    }
}

/// Readies a link for its exchanges: no Nagle delay, and `timeout` on every read and write, so a
/// peer that vanished fails the exchange instead of hanging it.
pub fn prepare(s: TcpStream, timeout: Duration) -> Result<TcpStream> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

/// `read_exact` that first polls the (blocking) link without sleeping for up to [`POLL_WAIT`], then
/// falls back to a blocking read (with the link's read timeout).
pub fn read_exact_polling(mut s: &TcpStream, buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::ErrorKind;
    let deadline = Instant::now() + POLL_WAIT;
    let mut got = 0;
    s.set_nonblocking(true)?;
    let polled = loop {
        match s.read(&mut buf[got..]) {
            Ok(0) => break Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                got += n;
                if got == buf.len() {
                    break Ok(());
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    break Ok(());
                }
                std::thread::yield_now();
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    s.set_nonblocking(false)?;
    polled?;
    s.read_exact(&mut buf[got..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn polling_read_gathers_pieces_before_and_after_its_budget() {
        let (mut a, b) = pair();
        let writer = std::thread::spawn(move || {
            a.write_all(b"head").unwrap();
            // Past the polling budget: the rest comes through the blocking read.
            std::thread::sleep(POLL_WAIT * 3);
            a.write_all(b"-tail").unwrap();
            a
        });
        let mut buf = [0u8; 9];
        read_exact_polling(&b, &mut buf).unwrap();
        assert_eq!(&buf, b"head-tail");
        let mut a = writer.join().unwrap();
        // The link is blocking again: a plain read waits for the next bytes instead of failing.
        let w = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            a.write_all(b"x").unwrap();
        });
        let mut one = [0u8; 1];
        (&b).read_exact(&mut one).unwrap();
        assert_eq!(&one, b"x");
        w.join().unwrap();
    }

    #[test]
    fn polling_read_reports_a_peer_that_closed() {
        let (mut a, b) = pair();
        a.write_all(b"ab").unwrap();
        drop(a);
        let mut buf = [0u8; 4];
        let e = read_exact_polling(&b, &mut buf).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
