//! TLS on the RPC port, server side (`[tls]`, `--tls-cert`, `--tls-key`): the certificate and key
//! loaded and checked once, and the acceptor every TLS connection goes through.
//!
//! One port serves both kinds of peer: [`crate::rpc::conn`] peeks at the first byte, a TLS
//! ClientHello opens with `0x16` (a handshake record) and a llama.cpp HELLO with `0x0e` (command
//! 14), so no byte of the plain protocol changes. With `tls.require` (the default once a certificate
//! is configured) a plain peer is closed with a log line saying so; with `require = false`
//! llama.cpp masters keep working in plain TCP next to llamactl over TLS.
//! Only TLS 1.3 is offered, with rustls' `ring` provider (see the workspace `Cargo.toml`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use tokio_rustls::TlsAcceptor;

use crate::error::{Error, Result};

/// The validated TLS settings and the acceptor built from them.
#[derive(Clone)]
pub struct TlsSettings {
    /// PEM certificate chain, the server's certificate first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Refuse peers that do not start a TLS handshake.
    pub require: bool,
    acceptor: TlsAcceptor,
}

impl PartialEq for TlsSettings {
    fn eq(&self, o: &TlsSettings) -> bool {
        (&self.cert, &self.key, self.require) == (&o.cert, &o.key, o.require)
    }
}

impl Eq for TlsSettings {}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("require", &self.require)
            .finish_non_exhaustive()
    }
}

impl TlsSettings {
    /// Reads and checks the certificate chain and key (the key must belong to the first
    /// certificate), and builds the acceptor.
    pub fn load(cert: &Path, key: &Path, require: bool) -> Result<TlsSettings> {
        let read = |p: &Path, what: &str| {
            std::fs::read(p).map_err(|e| Error::Config(format!("tls.{what} {}: {e}", p.display())))
        };
        let chain = llamad_proto::tls::certificates_from_pem(
            &read(cert, "cert")?,
            &format!("tls.cert {}", cert.display()),
        )
        .map_err(|e| Error::Config(e.to_string()))?;
        let secret = PrivateKeyDer::from_pem_slice(&read(key, "key")?).map_err(|e| {
            Error::Config(format!("tls.key {}: no PEM private key found: {e}", key.display()))
        })?;
        let provider = llamad_proto::tls::provider();
        let signing = provider
            .key_provider
            .load_private_key(secret.clone_key())
            .map_err(|e| Error::Config(format!("tls.key {}: unusable key: {e}", key.display())))?;
        rustls::sign::CertifiedKey::new(chain.clone(), signing).keys_match().map_err(|e| {
            Error::Config(format!(
                "tls.key {} does not belong to the certificate in {}: {e}",
                key.display(),
                cert.display()
            ))
        })?;
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| Error::Config(format!("tls: {e}")))?
            .with_no_client_auth()
            .with_single_cert(chain, secret)
            .map_err(|e| Error::Config(format!("tls.cert {}: {e}", cert.display())))?;
        Ok(TlsSettings {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            require,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// The acceptor for incoming handshakes.
    pub fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }
}
