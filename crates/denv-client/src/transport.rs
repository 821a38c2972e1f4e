//! How a client reaches the control plane, and what it says when it cannot.
//!
//! `http://host:port` is cleartext HTTP/2 (h2c); `https://host:port` is HTTP/2 over TLS
//! (rustls with ring; ALPN `h2`), the server's name (or IP address) checked against its
//! certificate. Used by [`crate::Client`] (so the CLI and the Python package) and by
//! `denvd`'s host stream, so that all three trust the same certificates and word a
//! failure the same way ([`describe`]).
//!
//! Which certificates are trusted ([`Trust`]):
//!
//! | setting | the server's chain must end in |
//! |---|---|
//! | none | one of the Mozilla roots built in (`webpki-roots`) or of the system's store (`/etc/ssl/certs` and the like, when it holds any) |
//! | a CA file (`DENV_CA_FILE`, `--ca-file`, Python `ca_file=`) | one of the certificates of that PEM file, and only those |

use std::error::Error as StdError;
use std::path::{Path, PathBuf};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

/// A server URL or a CA file a client cannot start with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The server URL is not `http://…` or `https://…`, or does not parse.
    #[error("invalid server url {url:?}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// The CA file cannot be read, or holds no certificate.
    #[error("ca file {}: {reason}", .path.display())]
    CaFile {
        /// The file.
        path: PathBuf,
        /// Why it cannot be used.
        reason: String,
    },
}

/// Which certificates an `https://` server's chain must end in (see the module docs).
/// Cheap to clone.
#[derive(Clone, Default)]
pub struct Trust {
    /// The CA file and its text (holding at least one certificate).
    ca: Option<(PathBuf, Vec<u8>)>,
}

impl std::fmt::Debug for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trust")
            .field("ca_file", &self.ca_file())
            .finish()
    }
}

impl Trust {
    /// The built-in roots and the system's store.
    pub fn default_roots() -> Trust {
        Trust::default()
    }

    /// The certificates of the PEM file at `path`, and only those. Errors when the file
    /// cannot be read or holds no PEM certificate.
    pub fn from_ca_file(path: &Path) -> Result<Trust, TransportError> {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        let err = |reason: String| TransportError::CaFile {
            path: path.to_path_buf(),
            reason,
        };
        let pem = std::fs::read(path).map_err(|e| err(lower_first(&e.to_string())))?;
        let mut n = 0;
        for c in CertificateDer::pem_slice_iter(&pem) {
            c.map_err(|e| err(format!("not a PEM certificate file: {e}")))?;
            n += 1;
        }
        if n == 0 {
            return Err(err(
                "no certificate in it (want the CA's certificate in PEM, -----BEGIN CERTIFICATE-----)"
                    .into(),
            ));
        }
        Ok(Trust {
            ca: Some((path.to_path_buf(), pem)),
        })
    }

    /// [`Trust::from_ca_file`] when a file is named, else [`Trust::default_roots`].
    pub fn load(ca_file: Option<&Path>) -> Result<Trust, TransportError> {
        match ca_file {
            Some(p) => Trust::from_ca_file(p),
            None => Ok(Trust::default_roots()),
        }
    }

    /// The CA file, when one is trusted instead of the default roots.
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca.as_ref().map(|(p, _)| p.as_path())
    }

    /// An endpoint for `server` (`http://host:port` or `https://host:port`; surrounding
    /// space and a trailing `/` are dropped), TLS set up for `https://`. Timeouts and
    /// keep-alives are the caller's. Nothing is connected yet.
    pub fn endpoint(&self, server: &str) -> Result<Endpoint, TransportError> {
        let url = server.trim().trim_end_matches('/');
        let bad = |reason: String| TransportError::BadUrl {
            url: url.to_string(),
            reason,
        };
        let https = url.starts_with("https://");
        if !https && !url.starts_with("http://") {
            return Err(bad("want http://host:port or https://host:port".into()));
        }
        let endpoint = Endpoint::from_shared(url.to_string()).map_err(|e| bad(describe(&e)))?;
        if !https {
            return Ok(endpoint);
        }
        // The name checked against the certificate: the URL's host, an IPv6 address
        // without its brackets.
        let host = endpoint.uri().host().unwrap_or_default();
        let tls =
            ClientTlsConfig::new().domain_name(host.trim_start_matches('[').trim_end_matches(']'));
        match &self.ca {
            Some((path, pem)) => endpoint
                .tls_config(tls.ca_certificate(Certificate::from_pem(pem)))
                .map_err(|e| TransportError::CaFile {
                    path: path.clone(),
                    reason: describe(&e),
                }),
            None => {
                // tonic refuses an empty system store; the built-in roots then stand alone.
                let tls = tls.with_webpki_roots();
                match endpoint.clone().tls_config(tls.clone().with_native_roots()) {
                    Ok(e) => Ok(e),
                    Err(_) => endpoint.tls_config(tls).map_err(|e| bad(describe(&e))),
                }
            }
        }
    }
}

/// The innermost cause of a failed connect or call, worded for a person: a TLS failure
/// reads `tls: <rustls' message>`, with what to do when the server's certificate has an
/// unknown issuer or the server does not speak TLS at all; anything else is the
/// innermost error's message, its first letter in lower case (`connection refused`).
pub fn describe(err: &(dyn StdError + 'static)) -> String {
    let mut root = err;
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(t) = tls_error(e) {
            return tls_words(t);
        }
        root = e;
        cur = e.source();
    }
    lower_first(&root.to_string())
}

/// A rustls error, as itself or inside an I/O error (how tokio-rustls returns it).
fn tls_error<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    if let Some(t) = e.downcast_ref::<rustls::Error>() {
        return Some(t);
    }
    e.downcast_ref::<std::io::Error>()?
        .get_ref()?
        .downcast_ref::<rustls::Error>()
}

fn tls_words(e: &rustls::Error) -> String {
    use rustls::{CertificateError, Error};
    let hint = match e {
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            " (the server's certificate is not signed by a CA this client trusts: pass the CA's certificate with --ca-file or DENV_CA_FILE)"
        }
        Error::InvalidCertificate(CertificateError::BadSignature) => {
            " (the trusted CA of the issuer's name did not sign it: is the CA file the one that signed the server's certificate?)"
        }
        Error::InvalidMessage(_) => " (the server does not speak TLS here: is it plain http://?)",
        _ => "",
    };
    format!("tls: {e}{hint}")
}

fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_other_than_http_and_https_are_refused() {
        for url in ["127.0.0.1:8080", "ftp://x", "", "grpc://h:1"] {
            let e = Trust::default_roots().endpoint(url).unwrap_err();
            assert!(matches!(e, TransportError::BadUrl { .. }), "{url}: {e}");
            assert!(
                e.to_string()
                    .ends_with("want http://host:port or https://host:port"),
                "{e}"
            );
        }
        let e = Trust::default_roots()
            .endpoint("http://127.0.0.1:1/")
            .unwrap();
        assert_eq!(e.uri().to_string(), "http://127.0.0.1:1/");
    }

    #[tokio::test]
    async fn https_endpoints_are_made_with_the_default_roots_and_with_a_ca_file() {
        Trust::default_roots()
            .endpoint("https://denv.example:8443")
            .unwrap();
        Trust::default_roots()
            .endpoint("https://[::1]:8443")
            .unwrap();
        let d = tempfile::tempdir().unwrap();
        let ca = d.path().join("ca.pem");
        std::fs::write(&ca, TEST_CA).unwrap();
        let t = Trust::from_ca_file(&ca).unwrap();
        assert_eq!(t.ca_file(), Some(ca.as_path()));
        t.endpoint("https://127.0.0.1:8443").unwrap();
    }

    #[test]
    fn a_missing_or_certificate_less_ca_file_is_named() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("nope.pem");
        let e = Trust::from_ca_file(&missing).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "ca file {}: no such file or directory (os error 2)",
                missing.display()
            )
        );
        let key_only = d.path().join("key.pem");
        std::fs::write(
            &key_only,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let e = Trust::load(Some(&key_only)).unwrap_err();
        assert!(
            e.to_string().starts_with(&format!(
                "ca file {}: no certificate in it",
                key_only.display()
            )),
            "{e}"
        );
        assert!(Trust::load(None).unwrap().ca_file().is_none());
    }

    #[test]
    fn tls_causes_are_worded_with_what_to_do() {
        let io = |t: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, t);
        let e = io(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        ));
        let m = describe(&e);
        assert!(
            m.starts_with("tls: invalid peer certificate: UnknownIssuer (the server's certificate is not signed by a CA this client trusts"),
            "{m}"
        );
        assert!(m.contains("--ca-file or DENV_CA_FILE"), "{m}");
        let m = describe(&io(rustls::Error::InvalidCertificate(
            rustls::CertificateError::BadSignature,
        )));
        assert!(
            m.starts_with("tls: invalid peer certificate: BadSignature (the trusted CA"),
            "{m}"
        );
        let e = io(rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType,
        ));
        assert_eq!(
            describe(&e),
            "tls: received corrupt message of type InvalidContentType (the server does not speak TLS here: is it plain http://?)"
        );
        let e = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        assert_eq!(describe(&e), "connection refused");
    }

    /// A self-signed CA certificate (`openssl req -x509 -newkey ec …`; its key was
    /// thrown away: only parsed, never used to verify anything). Shared with the CLI's
    /// tests.
    const TEST_CA: &str = include_str!("../testdata/test-ca.pem");
}
