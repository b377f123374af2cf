//! TLS for llamad ↔ llamactl RPC traffic, client side: a [`TlsClient`] built from the CA that signed
//! the workers' certificates, and [`Transport`], the byte stream an [`crate::RpcClient`] speaks over
//! (plain TCP or TLS over TCP).
//!
//! TLS is an llamad extension, off unless the worker is given a certificate (`--tls-cert`,
//! `--tls-key`). The worker tells a TLS ClientHello (first byte `0x16`, a handshake record) from a
//! plain HELLO frame (first byte `0x0e`, command 14) on the same port, so llama.cpp masters keep
//! working in plain TCP unless the worker sets `tls.require`. Inside TLS the protocol is unchanged,
//! byte for byte, including the optional shared-secret authentication ([`crate::auth`]), which then
//! runs encrypted.
//!
//! Only TLS 1.3 with rustls' `ring` provider is offered. The server's certificate is verified
//! against the given CA and the name the client dialled (a DNS name or an IP address, which must be
//! in the certificate's subject alternative names).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::error::{Error, Result};

/// The first byte of a TLS record carrying a handshake message (a ClientHello opens with it).
pub const TLS_HANDSHAKE_BYTE: u8 = 0x16;

/// The crypto provider every TLS config of llamad uses (see the workspace `Cargo.toml` for why ring).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads every certificate of a PEM file (or PEM bytes); at least one is required.
pub fn certificates_from_pem(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Tls(format!("{what}: not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(Error::Tls(format!("{what}: no PEM certificate (-----BEGIN CERTIFICATE-----) found")));
    }
    Ok(certs)
}

/// Client TLS settings: the trusted CA(s) and, optionally, the name to expect in the server's
/// certificate instead of the host dialled.
#[derive(Clone)]
pub struct TlsClient {
    config: Arc<rustls::ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient").field("server_name", &self.server_name).finish_non_exhaustive()
    }
}

impl TlsClient {
    /// Trusts the CA certificate(s) in the PEM file `path` (llamactl `--tls-ca`).
    pub fn from_ca_file(path: &Path) -> Result<TlsClient> {
        let pem = std::fs::read(path).map_err(|e| Error::Tls(format!("CA file {}: {e}", path.display())))?;
        TlsClient::from_ca_pem(&pem, &format!("CA file {}", path.display()))
    }

    /// Trusts the CA certificate(s) in `pem`; `what` names the source in errors.
    pub fn from_ca_pem(pem: &[u8], what: &str) -> Result<TlsClient> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in certificates_from_pem(pem, what)? {
            roots.add(cert).map_err(|e| Error::Tls(format!("{what}: unusable CA certificate: {e}")))?;
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| Error::Tls(format!("TLS configuration: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(TlsClient { config: Arc::new(config), server_name: None })
    }

    /// Expects `name` (a DNS name or an IP address) in the server's certificate, whatever host
    /// was dialled (for workers reached through an address their certificate does not list).
    pub fn with_server_name(mut self, name: &str) -> Result<TlsClient> {
        let n = ServerName::try_from(name.to_string())
            .map_err(|e| Error::Tls(format!("server name `{name}`: {e}")))?;
        self.server_name = Some(n);
        Ok(self)
    }

    /// Runs the TLS handshake over `stream`, connected to `addr` (`host:port`, `[v6]:port` or a
    /// bare host), and returns the encrypted transport. The certificate is checked here, so a
    /// wrong CA or name fails now, with an [`Error::Tls`] that says which.
    pub fn handshake(&self, stream: TcpStream, addr: &str) -> Result<Transport> {
        let name = match &self.server_name {
            Some(n) => n.clone(),
            None => {
                let host = host_of(addr);
                ServerName::try_from(host.to_string())
                    .map_err(|e| Error::Tls(format!("`{host}` is not a valid TLS server name: {e}")))?
            }
        };
        let shown = format!("{name:?}");
        let conn = rustls::ClientConnection::new(self.config.clone(), name)
            .map_err(|e| Error::Tls(format!("TLS setup: {e}")))?;
        let mut tls = rustls::StreamOwned::new(conn, stream);
        while tls.conn.is_handshaking() {
            if let Err(e) = tls.conn.complete_io(&mut tls.sock) {
                return Err(handshake_error(e, &shown));
            }
        }
        Ok(Transport::Tls(Box::new(tls)))
    }
}

/// Explains a failed handshake in the operator's terms.
fn handshake_error(e: std::io::Error, name: &str) -> Error {
    use rustls::{CertificateError, Error as T};
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<T>());
    let why = match inner {
        Some(T::InvalidCertificate(CertificateError::UnknownIssuer)) => format!(
            "the server's certificate is not signed by a trusted CA (check --tls-ca): {}",
            T::InvalidCertificate(CertificateError::UnknownIssuer)
        ),
        Some(T::InvalidCertificate(c @ CertificateError::NotValidForName))
        | Some(T::InvalidCertificate(c @ CertificateError::NotValidForNameContext { .. })) => format!(
            "the server's certificate is not valid for {name} (its subject alternative names must list \
             the address dialled, or pass the name it has): {c:?}"
        ),
        Some(other) => format!("handshake with {name} failed: {other}"),
        None if e.kind() == std::io::ErrorKind::UnexpectedEof
            || e.kind() == std::io::ErrorKind::ConnectionReset =>
        {
            "the server closed the connection during the TLS handshake (is TLS enabled on it: \
             llamad --tls-cert/--tls-key? llama.cpp's rpc-server does not speak TLS)"
                .to_string()
        }
        None => format!("handshake with {name} failed: {e}"),
    };
    Error::Tls(why)
}

/// The host part of `host:port`, `[v6]:port`, `v6` or `host`.
pub fn host_of(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match addr.rsplit_once(':') {
        // A bare IPv6 literal has several colons and no port.
        Some((host, port)) if !host.contains(':') && port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => addr,
    }
}

/// The stream under an [`crate::RpcClient`]: plain TCP, or TLS over TCP.
pub enum Transport {
    /// Plain TCP, as llama.cpp speaks it.
    Plain(TcpStream),
    /// TLS 1.3 over TCP.
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Plain(s) => f.debug_tuple("Plain").field(s).finish(),
            Transport::Tls(s) => f.debug_tuple("Tls").field(&s.sock).finish(),
        }
    }
}

impl Transport {
    /// The TCP socket underneath (for socket options and addresses).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Transport::Plain(s) => s,
            Transport::Tls(s) => &s.sock,
        }
    }

    /// Whether the stream is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self, Transport::Tls(_))
    }

    /// Shuts the TCP socket down (no TLS close_notify: for tests and abrupt exits).
    pub fn shutdown(&self, how: std::net::Shutdown) -> std::io::Result<()> {
        self.tcp().shutdown(how)
    }

    /// Sets the read timeout of the TCP socket.
    pub fn set_read_timeout(&self, t: Option<std::time::Duration>) -> std::io::Result<()> {
        self.tcp().set_read_timeout(t)
    }
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Transport::Plain(s) => s.read(buf),
            Transport::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Transport::Plain(s) => s.write(buf),
            Transport::Tls(s) => s.write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Transport::Plain(s) => s.write_all(buf),
            Transport::Tls(s) => s.write_all(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Transport::Plain(s) => s.flush(),
            Transport::Tls(s) => s.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_of_every_address_form() {
        assert_eq!(host_of("127.0.0.1:50052"), "127.0.0.1");
        assert_eq!(host_of("worker-1.lan:50052"), "worker-1.lan");
        assert_eq!(host_of("[::1]:50052"), "::1");
        assert_eq!(host_of("::1"), "::1");
        assert_eq!(host_of("localhost"), "localhost");
    }

    #[test]
    fn bad_ca_files_are_named() {
        let e = TlsClient::from_ca_pem(b"not pem at all", "CA file x.pem").unwrap_err().to_string();
        assert!(e.contains("CA file x.pem") && e.contains("no PEM certificate"), "{e}");
        let e = TlsClient::from_ca_file(Path::new("/nonexistent/ca.pem")).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }
}
