//! Which certificates a TLS server may present to throng's clients (the
//! Redis link, `https://` publishing, `hold`/`attack`'s `wss://` and
//! `https://`): a CA file, the system bundle, or (for trials) none checked.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use thiserror::Error;

use crate::redis::RedisUrl;

/// Where the system's CA bundle usually is (Debian/Ubuntu/Alpine, then
/// Fedora/RHEL): the default trust of every TLS client here (`rediss://`,
/// `https://` publishing, `hold`/`attack`) when no CA file is given.
pub const SYSTEM_CA_BUNDLES: [&str; 2] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
];

/// The first of [`SYSTEM_CA_BUNDLES`] that exists.
pub fn system_ca_bundle() -> Option<&'static str> {
    SYSTEM_CA_BUNDLES
        .into_iter()
        .find(|p| Path::new(p).is_file())
}

/// The certificates to trust: those in the PEM file `ca` (every one must be
/// usable as a CA: a file given by hand with a broken certificate is a
/// mistake to show), or, without one, the parsable ones of the system
/// bundle.
pub fn trust_roots(ca: Option<&Path>) -> Result<RootCertStore, TrustError> {
    let path = match ca {
        Some(p) => p,
        None => Path::new(system_ca_bundle().ok_or(TrustError::NoSystemBundle)?),
    };
    let ca_err = |why: String| TrustError::Ca {
        path: path.to_owned(),
        why,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| ca_err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ca_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(ca_err(
            "no certificate in the file (expected PEM '-----BEGIN CERTIFICATE-----' blocks)"
                .to_owned(),
        ));
    }
    let mut roots = RootCertStore::empty();
    if ca.is_some() {
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| ca_err(format!("not a usable CA certificate: {e}")))?;
        }
    } else {
        roots.add_parsable_certificates(certs);
        if roots.is_empty() {
            return Err(ca_err("no usable CA certificate in it".to_owned()));
        }
    }
    Ok(roots)
}

/// Which certificates a `rediss://` server may present.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trust {
    /// PEM file of the CA certificates to trust. `None`: the system bundle
    /// ([`system_ca_bundle`]).
    pub ca: Option<PathBuf>,
    /// Check nothing: any certificate, any name (trials only: anyone on the
    /// path can read and change the traffic).
    pub insecure: bool,
}

impl Trust {
    /// One line for start-up output.
    pub fn describe(&self) -> String {
        match (&self.ca, self.insecure) {
            (_, true) => "TLS, certificate NOT checked (insecure)".to_owned(),
            (Some(ca), false) => format!("TLS, CA {}", ca.display()),
            (None, false) => match system_ca_bundle() {
                Some(p) => format!("TLS, CA {p} (system)"),
                None => "TLS, no system CA bundle found".to_owned(),
            },
        }
    }

    /// The rustls configuration for `url`: `None` for `redis://`.
    pub fn client_config(&self, url: &RedisUrl) -> Result<Option<Arc<ClientConfig>>, TrustError> {
        if !url.tls {
            return Ok(None);
        }
        self.tls_config().map(Some)
    }

    /// The rustls configuration for a TLS client that trusts what `self`
    /// says (also used for `https://` publish endpoints).
    pub fn tls_config(&self) -> Result<Arc<ClientConfig>, TrustError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TrustError::Rustls(e.to_string()))?;
        let config = if self.insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate::new(
                    provider.signature_verification_algorithms,
                )))
                .with_no_client_auth()
        } else {
            builder
                .with_root_certificates(trust_roots(self.ca.as_deref())?)
                .with_no_client_auth()
        };
        Ok(Arc::new(config))
    }
}

/// Why a [`Trust`] could not be turned into a TLS configuration.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TrustError {
    /// No CA file given and no system bundle either.
    #[error(
        "no CA certificates to check the server with: none of {} exists; give the CA file \
         that signed the server's certificate, or skip the check for a trial",
        SYSTEM_CA_BUNDLES.join(", ")
    )]
    NoSystemBundle,
    /// The CA file could not be read or holds no usable certificate.
    #[error("CA file {path}: {why}")]
    Ca {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(String),
}

/// `--tls-insecure` and its kin: accepts any certificate for any name, but
/// still checks that the server signed the handshake with the key of the
/// certificate it sent (so the session keys are the server's). Shared by the
/// Redis link, the harness's publisher and its `wss://`/`https://` client.
///
/// [`AnyCertificate::unchecked`] checks no signature either: for the TLS
/// benchmarks only (`throng-bench`), which measure the server's crypto alone.
#[derive(Debug)]
pub struct AnyCertificate {
    /// The algorithms the handshake signature is checked with.
    algorithms: WebPkiSupportedAlgorithms,
    /// Whether the handshake signature is checked at all.
    signatures: bool,
}

impl AnyCertificate {
    /// Any certificate, with the handshake signed by its key (checked with
    /// `algorithms`).
    pub fn new(algorithms: WebPkiSupportedAlgorithms) -> Self {
        Self {
            algorithms,
            signatures: true,
        }
    }

    /// Any certificate, and no signature checked: so that a benchmark's
    /// client spends no CPU on the server's crypto. Never for traffic that
    /// matters: the session keys may be anyone's.
    pub fn unchecked(algorithms: WebPkiSupportedAlgorithms) -> Self {
        Self {
            algorithms,
            signatures: false,
        }
    }

    /// The handshake signature checked by `verify` with the algorithms, or
    /// (unchecked) taken as valid.
    fn signature(
        &self,
        verify: impl FnOnce(
            &WebPkiSupportedAlgorithms,
        ) -> Result<HandshakeSignatureValid, rustls::Error>,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        if !self.signatures {
            return Ok(HandshakeSignatureValid::assertion());
        }
        verify(&self.algorithms)
    }
}

impl ServerCertVerifier for AnyCertificate {
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
        self.signature(|algorithms| {
            rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
        })
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signature(|algorithms| {
            rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
        })
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust() {
        let plain: RedisUrl = "redis://h".parse().unwrap();
        assert!(Trust::default().client_config(&plain).unwrap().is_none());
        let tls: RedisUrl = "rediss://h".parse().unwrap();
        let insecure = Trust {
            ca: None,
            insecure: true,
        };
        assert!(insecure.client_config(&tls).unwrap().is_some());
        let missing = Trust {
            ca: Some("/nonexistent/ca.pem".into()),
            insecure: false,
        };
        let e = missing.client_config(&tls).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        // A file that is not PEM is refused by name, not taken as "trust nothing".
        let not_pem =
            std::env::temp_dir().join(format!("throng-client-notpem-{}", std::process::id()));
        std::fs::write(&not_pem, "hello\n").unwrap();
        let e = Trust {
            ca: Some(not_pem.clone()),
            insecure: false,
        }
        .client_config(&tls)
        .unwrap_err()
        .to_string();
        let _ = std::fs::remove_file(&not_pem);
        assert!(
            e.contains("no certificate in the file") && e.contains("BEGIN CERTIFICATE"),
            "{e}"
        );
        assert!(e.contains(not_pem.to_str().unwrap()), "{e}");
    }
}
