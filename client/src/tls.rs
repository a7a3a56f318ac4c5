//! TLS for the client (tokio-rustls, ring provider): which server
//! certificates to trust — a CA file, or nothing at all with the explicit
//! `insecure` switch — and an optional client certificate for servers that
//! require one (`server.tls_client_ca_file`).
//!
//! There is no built-in trust store on purpose: a ringkv server's
//! certificate is usually signed by a private CA, and trusting the system's
//! public CAs for it would only widen who can impersonate it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// How the client sets up TLS. Built with [`TlsOptions::new`] and the
/// `with_*` setters (fields added later do not break callers):
///
/// ```
/// use ringkv_client::TlsOptions;
/// let tls = TlsOptions::new().with_ca_file("/etc/ringkv/ca.pem");
/// assert!(!tls.insecure);
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct TlsOptions {
    /// PEM file of the CA certificate(s) that signed the server's certificate.
    pub ca_file: Option<PathBuf>,
    /// Accept any server certificate (encryption without authentication of
    /// the server): for self-signed test setups only.
    pub insecure: bool,
    /// The name to check the certificate against (and send as SNI); default:
    /// the host part of the address the client connects to.
    pub server_name: Option<String>,
    /// A client certificate chain and its key (PEM), for servers that
    /// require client certificates.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsSetupError {
    #[error("TLS needs a CA to check the server's certificate: give --ca FILE (or --insecure for a test setup)")]
    NoTrust,
    #[error("cannot read {what} {path}: {reason}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{path} holds no certificate")]
    NoCertificate { path: PathBuf },
    #[error("invalid TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("\"{name}\" is not a valid TLS server name")]
    ServerName { name: String },
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads every certificate of a PEM file.
pub fn load_certs(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsSetupError::Pem {
            what,
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsSetupError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// Reads the first private key of a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsSetupError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsSetupError::Pem {
        what: "private key",
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

impl TlsOptions {
    /// No CA, no client certificate: give one of [`TlsOptions::with_ca_file`]
    /// or [`TlsOptions::with_insecure`] before connecting.
    pub fn new() -> TlsOptions {
        TlsOptions::default()
    }

    /// Trust the CA certificate(s) in this PEM file.
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> TlsOptions {
        self.ca_file = Some(path.into());
        self
    }

    /// Accept any server certificate (a self-signed test server only).
    pub fn with_insecure(mut self, insecure: bool) -> TlsOptions {
        self.insecure = insecure;
        self
    }

    /// Check the certificate against this name (and send it as SNI).
    pub fn with_server_name(mut self, name: impl Into<String>) -> TlsOptions {
        self.server_name = Some(name.into());
        self
    }

    /// Present this certificate chain and key (PEM files).
    pub fn with_client_cert(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> TlsOptions {
        self.client_cert = Some((cert.into(), key.into()));
        self
    }

    /// The rustls client configuration these options describe.
    pub fn client_config(&self) -> Result<ClientConfig, TlsSetupError> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?;
        let builder = if self.insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyServerCert(provider())))
        } else {
            let Some(ca_file) = &self.ca_file else {
                return Err(TlsSetupError::NoTrust);
            };
            let mut roots = RootCertStore::empty();
            for cert in load_certs(ca_file, "CA file")? {
                roots.add(cert)?;
            }
            builder.with_root_certificates(roots)
        };
        let config = match &self.client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(load_certs(cert, "client certificate")?, load_key(key)?)?,
        };
        Ok(config)
    }

    /// The server name to verify: the configured one, or `host` (the host
    /// part of the address, an IP address or a DNS name).
    pub fn server_name(&self, host: &str) -> Result<ServerName<'static>, TlsSetupError> {
        let name = self.server_name.as_deref().unwrap_or(host);
        let name = name.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(name.to_string()).map_err(|_| TlsSetupError::ServerName {
            name: name.to_string(),
        })
    }
}

/// `--insecure`: any certificate is accepted, but the handshake signatures
/// are still checked (so the connection is encrypted to whoever holds the
/// key of the certificate presented — which may be anyone).
#[derive(Debug)]
struct AcceptAnyServerCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
