//! A throwaway certificate authority and a server certificate it signed, as PEM files:
//! what a test needs to start `denv-cp` with TLS ([`crate::Start::tls`]) and to trust it.

use std::path::{Path, PathBuf};

/// A fresh CA (`ca.pem`) and a certificate it signed for `127.0.0.1`, `::1` and
/// `localhost` (`cert.pem`, the server's certificate then the CA's, with its key in
/// `key.pem`), in a temp dir removed on drop. Every value is a new CA: another
/// `TestTls`'s `ca.pem` is a wrong CA for this one's server.
pub struct TestTls {
    dir: tempfile::TempDir,
    ca_pem: String,
}

impl TestTls {
    /// Generates the CA, the server's key and its certificate (ECDSA P-256).
    pub fn new() -> TestTls {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
            KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate().expect("ca key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // A name of its own: a client holding another TestTls's CA finds no issuer of
        // this name (UnknownIssuer), rather than one whose signature fails.
        ca.distinguished_name.push(
            DnType::CommonName,
            format!("denv test CA {}", ulid::Ulid::new()),
        );
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).expect("self-signed ca");

        let key = KeyPair::generate().expect("server key");
        let mut server = CertificateParams::new(vec![
            "127.0.0.1".to_string(),
            "::1".to_string(),
            "localhost".to_string(),
        ])
        .expect("server params");
        server
            .distinguished_name
            .push(DnType::CommonName, "denv test server");
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = server
            .signed_by(&key, &ca_cert, &ca_key)
            .expect("server certificate");

        let dir = tempfile::tempdir().expect("temp dir");
        let ca_pem = ca_cert.pem();
        std::fs::write(dir.path().join("ca.pem"), &ca_pem).unwrap();
        std::fs::write(
            dir.path().join("cert.pem"),
            format!("{}{}", cert.pem(), ca_pem),
        )
        .unwrap();
        std::fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();
        TestTls { dir, ca_pem }
    }

    /// The CA's certificate (PEM file): what clients are given to trust the server.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The server's certificate chain (PEM file): `-tls-cert`.
    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("cert.pem")
    }

    /// The server's private key (PEM file): `-tls-key`.
    pub fn key(&self) -> PathBuf {
        self.dir.path().join("key.pem")
    }

    /// The CA's certificate as PEM text.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The dir the files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Default for TestTls {
    fn default() -> Self {
        TestTls::new()
    }
}
