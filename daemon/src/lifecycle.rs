//! Process lifecycle: the shutdown signal (SIGTERM or SIGINT) and systemd readiness notifications.

use tracing::{info, warn};

/// Resolves on the first SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => info!("SIGTERM received, shutting down"),
                _ = i.recv() => info!("SIGINT received, shutting down"),
            }
        }
        _ => {
            warn!("cannot install signal handlers; falling back to ctrl-c");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    notify("STOPPING=1");
}

/// Sends `state` to systemd when `NOTIFY_SOCKET` names a path socket (no-op otherwise).
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let path = std::path::PathBuf::from(path);
    if path.as_os_str().as_encoded_bytes().first() == Some(&b'@') {
        warn!("abstract NOTIFY_SOCKET is not supported; not notifying systemd");
        return;
    }
    let sent = std::os::unix::net::UnixDatagram::unbound().and_then(|s| s.send_to(state.as_bytes(), &path));
    if let Err(e) = sent {
        warn!(error = %e, "sd_notify failed");
    }
}

/// Keeps systemd's watchdog fed: when `WATCHDOG_USEC` is set (a unit with `WatchdogSec=`), sends
/// `WATCHDOG=1` every half period until `stop` is cancelled. Returns at once otherwise.
pub async fn watchdog(stop: tokio_util::sync::CancellationToken) {
    let Some(usec) = std::env::var("WATCHDOG_USEC").ok().and_then(|v| v.parse::<u64>().ok()) else { return };
    if usec == 0 {
        return;
    }
    let period = std::time::Duration::from_micros(usec / 2).max(std::time::Duration::from_millis(100));
    info!(?period, "feeding the systemd watchdog");
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => notify("WATCHDOG=1"),
        }
    }
}

/// A stream of SIGHUPs (`None` if the handler cannot be installed).
pub fn hangups() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            warn!(error = %e, "cannot install the SIGHUP handler; reload disabled");
            None
        }
    }
}
