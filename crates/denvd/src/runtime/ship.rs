//! Shipping a snapshot to another host through the control plane (`snapshot.send`,
//! `snapshot.receive`; `docs/reference/protocol.md`). The archive format and the rules
//! of unpacking are [`crate::storage::ship`]'s; this module moves the bytes over HTTP:
//! an upload (`PUT`, chunked, streamed from the storage backend as it reads) and a
//! download (`GET`, streamed into the backend as it unpacks). Neither holds the archive
//! in memory: at most [`CHANNEL_CHUNKS`] chunks of up to [`CHUNK_BYTES`] are in flight.

use super::{Runtime, RuntimeError};
use crate::storage::{ship, validate_name};
use bytes::Bytes;
use std::io::{Read, Write};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::sync::mpsc;

/// Size of the pieces the archive is cut into on its way to and from HTTP: 256 KiB.
pub const CHUNK_BYTES: usize = 256 << 10;

/// Pieces buffered between the storage thread and the HTTP connection: 16 (4 MiB).
pub const CHANNEL_CHUNKS: usize = 16;

/// What `snapshot.send` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendOutcome {
    /// Bytes of the archive uploaded.
    pub bytes: u64,
    /// SHA-256 of exactly those bytes, lower-case hex.
    pub sha256: String,
    /// Wall time of the whole upload, ms.
    pub took_ms: u64,
}

/// What `snapshot.receive` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiveOutcome {
    /// Bytes downloaded (0 when `cached`).
    pub bytes: u64,
    /// Wall time, ms.
    pub took_ms: u64,
    /// The snapshot was already on this host: nothing was downloaded.
    pub cached: bool,
}

/// A `Write` that hands fixed-size chunks to an async channel (blocking when full).
struct ChannelWriter {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    fn push(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(CHUNK_BYTES),
        ));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::other("the upload stopped"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let room = CHUNK_BYTES - self.buf.len();
        let n = room.min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK_BYTES {
            self.push()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.push()
    }
}

/// The request body of an upload: the chunks of a [`ChannelWriter`].
struct ChannelBody {
    rx: mpsc::Receiver<Result<Bytes, std::io::Error>>,
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(b))) => Poll::Ready(Some(Ok(http_body::Frame::data(b)))),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A `Read` over chunks arriving on an async channel (blocking while none is there).
struct ChannelReader {
    rx: mpsc::Receiver<Result<Bytes, std::io::Error>>,
    cur: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.cur = b,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.cur.len());
        out[..n].copy_from_slice(&self.cur.split_to(n));
        Ok(n)
    }
}

fn failed(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::Failed(msg.into())
}

/// `<status>: <body>` of an HTTP answer that is not a success (the body cut at 500
/// characters).
async fn http_error(what: &str, resp: reqwest::Response) -> RuntimeError {
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    let body: String = body.trim().chars().take(500).collect();
    failed(format!("{what}: HTTP {status}: {body}"))
}

fn check_names(env: &str, snap: &str, vols: &[String]) -> Result<(), RuntimeError> {
    validate_name("environment id", env)?;
    validate_name("snapshot name", snap)?;
    for v in vols {
        validate_name("volume", v)?;
    }
    Ok(())
}

impl Runtime {
    /// `snapshot.send`: streams the archive of volumes `vols` of snapshot `snap` of
    /// `env` ([`crate::storage::Storage::export_snapshot`]) to `url` with one chunked
    /// `PUT` carrying `Authorization: Bearer <token>`. Returns the archive's size and
    /// SHA-256 (of exactly the bytes sent) once the control plane answered 2xx.
    /// Errors: a missing snapshot or volume, a storage read error, the connection's
    /// error, or the control plane's answer (`upload: HTTP <status>: <body>`).
    pub async fn ship_send(
        &self,
        client: &reqwest::Client,
        env: &str,
        snap: &str,
        vols: &[String],
        url: &str,
        token: &str,
    ) -> Result<SendOutcome, RuntimeError> {
        check_names(env, snap, vols)?;
        let storage = self.inner.storage.clone();
        if !storage.has_snapshot(env, snap) {
            return Err(failed(format!("snapshot {snap:?} of {env} not found")));
        }
        let t0 = Instant::now();
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        let (e, s, v) = (env.to_string(), snap.to_string(), vols.to_vec());
        let producer = tokio::task::spawn_blocking(move || {
            let err_tx = tx.clone();
            let mut w = ship::HashingWriter::new(ChannelWriter {
                tx,
                buf: Vec::with_capacity(CHUNK_BYTES),
            });
            let r = storage
                .export_snapshot(&e, &s, &v, &mut w)
                .map_err(RuntimeError::from)
                .and_then(|()| {
                    w.finish()
                        .map_err(|e| failed(format!("writing the archive: {e}")))
                });
            if let Err(e) = &r {
                // Ends the upload with an error rather than a short, well-formed body.
                let _ = err_tx.blocking_send(Err(std::io::Error::other(e.to_string())));
            }
            r
        });
        let sent = client
            .put(url)
            .bearer_auth(token)
            .header("content-type", "application/x-tar")
            .body(reqwest::Body::wrap(ChannelBody { rx }))
            .send()
            .await;
        let made = producer
            .await
            .map_err(|e| failed(format!("archive task: {e}")))?;
        let resp = match sent {
            Ok(r) => r,
            Err(e) => {
                // The archive's own error, when it caused the failed upload, says more.
                made?;
                return Err(failed(format!("upload to the control plane: {e}")));
            }
        };
        if !resp.status().is_success() {
            return Err(http_error("upload", resp).await);
        }
        let shipped = made?;
        Ok(SendOutcome {
            bytes: shipped.bytes,
            sha256: shipped.sha256,
            took_ms: t0.elapsed().as_millis() as u64,
        })
    }

    /// `snapshot.receive`: makes snapshot `snap` of `env` on this host from the archive
    /// at `url` (`GET`, `Authorization: Bearer <token>`), unpacked as it arrives
    /// ([`crate::storage::Storage::import_snapshot`]: hostile content is refused, at most
    /// `want.bytes` read). The snapshot appears only when the stream's size and SHA-256
    /// are `want`'s; otherwise the error names both digests and nothing is left.
    /// Already present: answers at once with `cached`.
    #[allow(clippy::too_many_arguments)]
    pub async fn ship_receive(
        &self,
        client: &reqwest::Client,
        env: &str,
        snap: &str,
        vols: &[String],
        url: &str,
        token: &str,
        want: ship::Expected,
    ) -> Result<ReceiveOutcome, RuntimeError> {
        check_names(env, snap, vols)?;
        let t0 = Instant::now();
        let _held = self.lock_env(env).await;
        let storage = self.inner.storage.clone();
        if storage.has_snapshot(env, snap) {
            return Ok(ReceiveOutcome {
                bytes: 0,
                took_ms: t0.elapsed().as_millis() as u64,
                cached: true,
            });
        }
        let mut resp = client
            .get(url)
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| failed(format!("download from the control plane: {e}")))?;
        if !resp.status().is_success() {
            return Err(http_error("download", resp).await);
        }
        if let Some(n) = resp.content_length() {
            if n > want.bytes {
                return Err(failed(format!(
                    "download: the control plane offers {n} bytes, {} were announced",
                    want.bytes
                )));
            }
        }
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        let (e, s, v) = (env.to_string(), snap.to_string(), vols.to_vec());
        let consumer = tokio::task::spawn_blocking(move || {
            let mut r = ChannelReader {
                rx,
                cur: Bytes::new(),
            };
            storage.import_snapshot(&e, &s, &v, &mut r, &want)
        });
        let mut bytes = 0u64;
        loop {
            match resp.chunk().await {
                Ok(Some(c)) => {
                    bytes += c.len() as u64;
                    if tx.send(Ok(c)).await.is_err() {
                        break; // the unpacking ended (refused or done)
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = tx
                        .send(Err(std::io::Error::other(format!("download: {e}"))))
                        .await;
                    break;
                }
            }
        }
        drop(tx);
        consumer
            .await
            .map_err(|e| failed(format!("unpacking task: {e}")))??;
        Ok(ReceiveOutcome {
            bytes,
            took_ms: t0.elapsed().as_millis() as u64,
            cached: false,
        })
    }
}
