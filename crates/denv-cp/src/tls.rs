//! TLS on the one port (`-tls-cert`/`DENV_TLS_CERT`, `-tls-key`/`DENV_TLS_KEY`; see
//! [`crate::config`]).
//!
//! [`load`] reads the PEM certificate chain and key once at start (rustls with ring,
//! TLS 1.2 and 1.3, ALPN `h2` and `http/1.1`); [`serve`] then accepts connections on the
//! same listener the plain server would use and serves the same router on each:
//! gRPC over h2, the REST gateway over HTTP/1.1 or h2, gRPC-web, the host stream. A
//! handshake has 10 s; one that fails (a client that does not trust the certificate) is
//! logged at debug and costs nothing else. A client speaking plain HTTP to the port gets
//! `400 {"error": "this port speaks TLS: use https://"}`. The certificate is read once:
//! a renewed one is served after a restart.

use crate::config::TlsFiles;
use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;
use tracing::debug;

/// How long a client has to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The server side of TLS, ready to accept with.
#[derive(Clone)]
pub struct ServerTls {
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

/// Reads the certificate chain and the key. Errors name the file and what is wrong:
/// unreadable, no certificate, no key, or a key that does not fit the certificate.
pub fn load(files: &TlsFiles) -> Result<ServerTls, String> {
    let cert_name = format!("tls certificate {}", files.cert.display());
    let key_name = format!("tls key {}", files.key.display());
    let cert_pem = std::fs::read(&files.cert).map_err(|e| format!("{cert_name}: {e}"))?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{cert_name}: {e}"))?;
    if chain.is_empty() {
        return Err(format!(
            "{cert_name}: no PEM certificate in it (want -----BEGIN CERTIFICATE-----)"
        ));
    }
    let key_pem = std::fs::read(&files.key).map_err(|e| format!("{key_name}: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        format!("{key_name}: no private key in it (want PEM: PKCS#8, PKCS#1 or SEC1): {e}")
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("{cert_name} with {key_name}: {e}", e = key_error_words(&e)))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(ServerTls {
        acceptor: TlsAcceptor::from(Arc::new(config)),
    })
}

/// rustls' reasons, the common one in words.
fn key_error_words(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InconsistentKeys(_) => "the key is not the certificate's".into(),
        other => other.to_string(),
    }
}

/// Serves `app` over TLS on `listener` until `shutdown` completes; then stops accepting,
/// asks every open connection to finish (HTTP/2 GOAWAY, HTTP/1.1 close after the
/// response in flight) and returns once they have. Handlers see the client's address as
/// `ConnectInfo<SocketAddr>`, as they do on the plain port.
pub async fn serve(
    listener: TcpListener,
    tls: ServerTls,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors and the like: wait instead of spinning (what
                    // axum::serve does on the plain port).
                    debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = tls.acceptor.clone();
        let app = app.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            // A TLS connection opens with a handshake record (0x16); anything else is a
            // client speaking plain HTTP to this port: told so, as a REST error.
            let mut first = [0u8; 1];
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, tcp.peek(&mut first)).await {
                Ok(Ok(1)) if first[0] != TLS_HANDSHAKE => {
                    debug!(%peer, "plain http on the tls port");
                    refuse_plain(tcp).await;
                    return;
                }
                Ok(Ok(_)) => {}
                Ok(Err(_)) | Err(_) => return,
            }
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    debug!(%peer, error = %e, "tls handshake failed");
                    return;
                }
                Err(_) => {
                    debug!(%peer, "tls handshake timed out");
                    return;
                }
            };
            let svc = app.map_request(move |mut req: http::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                req.map(axum::body::Body::new)
            });
            let builder = Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(
                TokioIo::new(stream),
                TowerToHyperService::new(svc),
            );
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The first byte of a TLS connection: a handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// What a plain-HTTP client gets on the TLS port (the REST API's error shape).
pub const PLAIN_HTTP_REFUSAL: &str = "this port speaks TLS: use https://";

/// Answers a client speaking plain HTTP on the TLS port and closes: HTTP/1.x gets
/// `400 {"error": "this port speaks TLS: use https://"}`, cleartext HTTP/2 (h2c, as
/// `denv`, `denvd` and the Python package speak to an `http://` URL) a GOAWAY
/// (`REFUSED_STREAM`, which gRPC clients read as `UNAVAILABLE`, not as a refusal of
/// their credentials) carrying the same words. What the client sent is read first
/// (until it pauses, at most a second and 16 KiB) and after the answer (until it
/// closes, at most a second), so that closing does not reset the connection under it.
async fn refuse_plain(mut tcp: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    let mut got = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    while got < buf.len() {
        let pause = (tokio::time::Instant::now() + Duration::from_millis(100)).min(deadline);
        match tokio::time::timeout_at(pause, tcp.read(&mut buf[got..])).await {
            Ok(Ok(n)) if n > 0 => got += n,
            _ => break,
        }
    }
    let answer = if buf[..got].starts_with(b"PRI * HTTP/2.0") {
        h2_goaway(PLAIN_HTTP_REFUSAL)
    } else {
        let body = serde_json::json!({ "error": PLAIN_HTTP_REFUSAL }).to_string();
        format!(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    };
    let _ = tcp.write_all(&answer).await;
    let _ = tcp.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while matches!(tcp.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// A server's HTTP/2 preface (an empty SETTINGS frame) and a GOAWAY frame
/// (last stream 0, `REFUSED_STREAM`) with `debug` as its debug data (RFC 9113 §6.5,
/// §6.8).
fn h2_goaway(debug: &str) -> Vec<u8> {
    const SETTINGS: u8 = 0x4;
    const GOAWAY: u8 = 0x7;
    const REFUSED_STREAM: u32 = 0x7;
    let frame = |kind: u8, payload: &[u8]| {
        let len = u32::try_from(payload.len()).unwrap_or(0).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, 0, 0, 0, 0, 0];
        f.extend_from_slice(payload);
        f
    };
    let mut goaway = 0u32.to_be_bytes().to_vec();
    goaway.extend_from_slice(&REFUSED_STREAM.to_be_bytes());
    goaway.extend_from_slice(debug.as_bytes());
    let mut out = frame(SETTINGS, &[]);
    out.extend(frame(GOAWAY, &goaway));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &std::path::Path, cert: &str, key: &str) -> TlsFiles {
        let f = TlsFiles {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        };
        std::fs::write(&f.cert, cert).unwrap();
        std::fs::write(&f.key, key).unwrap();
        f
    }

    #[test]
    fn bad_files_are_named_with_what_is_wrong() {
        let d = tempfile::tempdir().unwrap();
        let missing = TlsFiles {
            cert: d.path().join("nope.pem"),
            key: d.path().join("key.pem"),
        };
        let e = load(&missing).unwrap_err();
        assert!(
            e.starts_with(&format!("tls certificate {}: ", missing.cert.display())),
            "{e}"
        );
        let f = files(d.path(), "not pem\n", "");
        let e = load(&f).unwrap_err();
        assert_eq!(
            e,
            format!(
                "tls certificate {}: no PEM certificate in it (want -----BEGIN CERTIFICATE-----)",
                f.cert.display()
            )
        );
    }
}
