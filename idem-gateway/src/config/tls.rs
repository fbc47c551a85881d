//! The TLS settings of an `https` upstream: the root certificates it is verified against, the
//! system's or those of `[upstream] ca_file`, in a rustls client configuration (the ring
//! provider) that offers HTTP/1.1 alone by ALPN. The certificate is always verified, against
//! the host of the upstream's URL (also the name sent by SNI); there is no setting to skip it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// How the gateway speaks TLS to an `https` upstream: which roots it trusts, and the rustls
/// client configuration made of them (shared by every serving thread's pool).
#[derive(Clone)]
pub struct UpstreamTls {
    /// The PEM file of the private CA whose certificates are the only roots trusted, or
    /// `None`: the system's root certificates.
    pub ca_file: Option<PathBuf>,
    client: Arc<rustls::ClientConfig>,
}

impl UpstreamTls {
    /// The roots of the system's trust store (as rustls-native-certs finds it: on Linux the
    /// distribution's CA bundle, or `SSL_CERT_FILE` / `SSL_CERT_DIR` when set).
    ///
    /// # Errors
    /// The system holds no root certificate rustls can use (a container image without its
    /// CA certificates, for one).
    pub(crate) fn system() -> Result<Self, String> {
        let found = rustls_native_certs::load_native_certs();
        let mut roots = RootCertStore::empty();
        let (added, _ignored) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            let why = found
                .errors
                .first()
                .map_or_else(String::new, |err| format!(" ({err})"));
            return Err(format!(
                "the upstream is https, and no root certificate was found on this system{why}: \
                 install the system's CA certificates (the ca-certificates package), or set \
                 [upstream] ca_file to the PEM file of the CA that signed the upstream's \
                 certificate"
            ));
        }
        Self::with_roots(roots, None)
    }

    /// The certificates of the PEM file at `path` as the only roots: a private CA.
    ///
    /// # Errors
    /// The file cannot be read, is not PEM, holds no certificate, or one of its certificates
    /// cannot be a root; the message names the file.
    pub(crate) fn ca_file(path: &Path) -> Result<Self, String> {
        let shown = path.display();
        let pem =
            std::fs::read(path).map_err(|err| format!("cannot read ca_file \"{shown}\": {err}"))?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| {
                format!("ca_file \"{shown}\" is not a PEM file of certificates: {err}")
            })?;
        if certs.is_empty() {
            return Err(format!(
                "ca_file \"{shown}\" holds no certificate: it should hold the CA's certificate \
                 in PEM (-----BEGIN CERTIFICATE-----)"
            ));
        }
        let mut roots = RootCertStore::empty();
        for (index, cert) in certs.into_iter().enumerate() {
            roots.add(cert).map_err(|err| {
                // rustls words its errors for a peer's certificate; the reason alone fits here.
                let reason = match err {
                    rustls::Error::InvalidCertificate(reason) => format!("{reason:?}"),
                    other => other.to_string(),
                };
                format!(
                    "ca_file \"{shown}\": certificate {} is not a valid certificate ({reason})",
                    index + 1
                )
            })?;
        }
        Self::with_roots(roots, Some(path.to_path_buf()))
    }

    /// The client configuration trusting `roots`: TLS 1.2 and 1.3 (rustls' safe defaults),
    /// the ring provider, ALPN `http/1.1`, no client certificate.
    ///
    /// # Errors
    /// rustls refuses the protocol versions for the provider (it supports both).
    fn with_roots(roots: RootCertStore, ca_file: Option<PathBuf>) -> Result<Self, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|err| format!("cannot set up TLS to the upstream: {err}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(UpstreamTls {
            ca_file,
            client: Arc::new(client),
        })
    }

    /// The rustls client configuration.
    pub(crate) fn client(&self) -> Arc<rustls::ClientConfig> {
        self.client.clone()
    }
}

impl PartialEq for UpstreamTls {
    /// The same source of roots: the same `ca_file`, or both the system's.
    fn eq(&self, other: &Self) -> bool {
        self.ca_file == other.ca_file
    }
}

impl Eq for UpstreamTls {}

impl fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("ca_file", &self.ca_file)
            .finish_non_exhaustive()
    }
}
