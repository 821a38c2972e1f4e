//! Moving a version's data between hosts, host to host (`snapshot.send`,
//! `snapshot.receive`, `image.send`, `image.receive`; `docs/reference/protocol.md`).
//! The source host offers what it holds on its data port ([`crate::dataport`]); the
//! destination host fetches it from there with the one-time token the control plane
//! minted, streaming it into the storage backend or the Engine as it arrives. The
//! archive format and the rules of unpacking are [`crate::storage::ship`]'s. Nothing is
//! held in memory: at most [`CHANNEL_CHUNKS`] chunks of up to [`CHUNK_BYTES`] are in
//! flight.

use super::{Runtime, RuntimeError};
use crate::storage::{ship, validate_name};
use bytes::Bytes;
use futures::StreamExt;
use std::io::{Read, Write};
use std::time::Instant;
use tokio::sync::mpsc;

/// Size of the pieces the archive is cut into on its way to and from HTTP: 256 KiB.
pub const CHUNK_BYTES: usize = 256 << 10;

/// Pieces buffered between the storage thread and the HTTP connection: 16 (4 MiB).
pub const CHANNEL_CHUNKS: usize = 16;

/// What `snapshot.receive` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiveOutcome {
    /// Bytes of archive downloaded (0 when `cached`).
    pub bytes: u64,
    /// SHA-256 of the archive, lower-case hex (`""` when `cached`).
    pub sha256: String,
    /// Wall time, ms.
    pub took_ms: u64,
    /// The snapshot was already on this host: nothing was downloaded.
    pub cached: bool,
}

/// What `image.receive` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagesOutcome {
    /// The image ids that were missing and were loaded, in the order asked.
    pub loaded: Vec<String>,
    /// Bytes of `docker save` archive downloaded (0 when nothing was missing).
    pub bytes: u64,
    /// Wall time, ms.
    pub took_ms: u64,
}

/// A `Write` that hands fixed-size chunks to an async channel (blocking when full).
pub(crate) struct ChannelWriter {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    /// A writer feeding `tx`.
    pub(crate) fn new(tx: mpsc::Sender<Result<Bytes, std::io::Error>>) -> Self {
        ChannelWriter {
            tx,
            buf: Vec::with_capacity(CHUNK_BYTES),
        }
    }

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
            .map_err(|_| std::io::Error::other("the receiver stopped reading"))
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
    /// The archive of volumes `vols` of snapshot `snap` of `env`, followed by its
    /// trailer ([`ship::trailer`]), as chunks on a channel: written by a blocking task
    /// from the storage backend as the receiver reads. An error of the backend ends the
    /// stream with that error (never with a short, well-formed archive). Errors at once:
    /// a bad name, or no such snapshot.
    pub fn snapshot_stream(
        &self,
        env: &str,
        snap: &str,
        vols: &[String],
    ) -> Result<mpsc::Receiver<Result<Bytes, std::io::Error>>, RuntimeError> {
        self.check_snapshot(env, snap, vols)?;
        let storage = self.inner.storage.clone();
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        let (e, s, v) = (env.to_string(), snap.to_string(), vols.to_vec());
        tokio::task::spawn_blocking(move || {
            let err_tx = tx.clone();
            let t0 = Instant::now();
            let mut w = ship::HashingWriter::new(ChannelWriter::new(tx));
            let r = storage
                .export_snapshot(&e, &s, &v, &mut w)
                .map_err(|e| e.to_string())
                .and_then(|()| w.finish_with_trailer().map_err(|e| e.to_string()));
            match r {
                Ok(shipped) => tracing::info!(env = %e, snapshot = %s, bytes = shipped.bytes,
                    sha256 = %shipped.sha256, took_ms = t0.elapsed().as_millis() as u64, "snapshot sent"),
                Err(msg) => {
                    tracing::warn!(env = %e, snapshot = %s, error = %msg, "sending a snapshot failed");
                    let _ = err_tx.blocking_send(Err(std::io::Error::other(msg)));
                }
            }
        });
        Ok(rx)
    }

    /// Whether snapshot `snap` of `env` can be sent: the names are valid and the
    /// snapshot is on this host (nothing is read). Errors: a bad name, `snapshot "<snap>"
    /// of <env> not found`.
    pub fn check_snapshot(
        &self,
        env: &str,
        snap: &str,
        vols: &[String],
    ) -> Result<(), RuntimeError> {
        check_names(env, snap, vols)?;
        if !self.inner.storage.has_snapshot(env, snap) {
            return Err(RuntimeError::NotFound(format!(
                "snapshot {snap:?} of {env} not found"
            )));
        }
        Ok(())
    }

    /// `snapshot.receive`: makes snapshot `snap` of `env` on this host from the archive
    /// at `url` on another host's data port (`GET`, `Authorization: Bearer <token>`),
    /// unpacked as it arrives ([`crate::storage::Storage::import_snapshot`]: hostile
    /// content is refused, at most `limit` bytes of archive read). The snapshot appears
    /// only when the archive's size and SHA-256 are those of the trailer the sender
    /// wrote after it; otherwise the error names both digests and nothing is left.
    /// Already present: answers at once with `cached`. With an empty `url` (a check of
    /// a recorded copy), a missing snapshot is an error.
    #[allow(clippy::too_many_arguments)]
    pub async fn ship_receive(
        &self,
        client: &reqwest::Client,
        env: &str,
        snap: &str,
        vols: &[String],
        url: &str,
        token: &str,
        limit: u64,
    ) -> Result<ReceiveOutcome, RuntimeError> {
        check_names(env, snap, vols)?;
        let t0 = Instant::now();
        let _held = self.lock_env(env).await;
        let storage = self.inner.storage.clone();
        if storage.has_snapshot(env, snap) {
            return Ok(ReceiveOutcome {
                bytes: 0,
                sha256: String::new(),
                took_ms: t0.elapsed().as_millis() as u64,
                cached: true,
            });
        }
        if url.is_empty() {
            return Err(RuntimeError::NotFound(format!(
                "snapshot {snap:?} of {env} is not on this host and no source was given"
            )));
        }
        let mut resp = fetch(client, url, token).await?;
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        let (e, s, v) = (env.to_string(), snap.to_string(), vols.to_vec());
        let consumer = tokio::task::spawn_blocking(move || {
            let mut r = ChannelReader {
                rx,
                cur: Bytes::new(),
            };
            storage.import_snapshot(&e, &s, &v, &mut r, limit)
        });
        if let (_, Some(e)) = pump(&mut resp, &tx, Ok).await {
            let _ = tx
                .send(Err(std::io::Error::other(format!("download: {e}"))))
                .await;
        }
        drop(tx);
        let got = consumer
            .await
            .map_err(|e| failed(format!("unpacking task: {e}")))??;
        Ok(ReceiveOutcome {
            bytes: got.bytes,
            sha256: got.sha256,
            took_ms: t0.elapsed().as_millis() as u64,
            cached: false,
        })
    }

    /// The ids of `ids` this host's Engine does not hold (by exact image id).
    pub async fn missing_images(&self, ids: &[String]) -> Result<Vec<String>, RuntimeError> {
        let mut missing = Vec::new();
        for id in ids {
            check_image_id(id)?;
            match self.inner.docker.inspect_image(id).await {
                Ok(i) if i.id.as_deref() == Some(id.as_str()) => {}
                Ok(_)
                | Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => missing.push(id.clone()),
                Err(e) => return Err(RuntimeError::docker(format!("inspect image {id}"), e)),
            }
        }
        Ok(missing)
    }

    /// `docker save` of `ids` (exact image ids, none of them tagged in the archive), as
    /// the Engine streams it.
    pub fn images_stream(
        &self,
        ids: &[String],
    ) -> impl futures::Stream<Item = Result<Bytes, bollard::errors::Error>> {
        let names: Vec<&str> = ids.iter().map(String::as_str).collect();
        self.inner.docker.export_images(&names)
    }

    /// `image.receive`: makes every image of `ids` (exact ids, `sha256:<64 hex>`)
    /// present in this host's Engine. The missing ones are fetched from `url` on
    /// another host's data port (`GET <url>?ids=<id>,…`, `Authorization: Bearer
    /// <token>`) as one `docker save` archive streamed into `docker load`; each must
    /// then be present under exactly its id (the Engine checks every layer against the
    /// image's config, whose digest is the id), else the error names it. No tag is set
    /// or moved. Nothing missing: answers at once, nothing fetched. Errors: a bad id,
    /// missing images and no `url`, the transfer's or the Engine's error.
    pub async fn receive_images(
        &self,
        client: &reqwest::Client,
        ids: &[String],
        url: &str,
        token: &str,
    ) -> Result<ImagesOutcome, RuntimeError> {
        let t0 = Instant::now();
        let missing = self.missing_images(ids).await?;
        if missing.is_empty() {
            return Ok(ImagesOutcome {
                loaded: vec![],
                bytes: 0,
                took_ms: t0.elapsed().as_millis() as u64,
            });
        }
        if url.is_empty() {
            return Err(RuntimeError::NotFound(format!(
                "images {} are not on this host and no source was given",
                missing.join(", ")
            )));
        }
        let mut u = reqwest::Url::parse(url)
            .map_err(|e| RuntimeError::Invalid(format!("image url {url:?}: {e}")))?;
        u.query_pairs_mut().append_pair("ids", &missing.join(","));
        let mut resp = fetch(client, u.as_str(), token).await?;
        let (tx, rx) = mpsc::channel::<Bytes>(CHANNEL_CHUNKS);
        let body = tokio_stream::wrappers::ReceiverStream::new(rx);
        let docker = self.inner.docker.clone();
        let load = tokio::spawn(async move {
            let mut out = docker.import_image_stream(
                bollard::image::ImportImageOptions { quiet: true },
                body,
                None,
            );
            while let Some(item) = out.next().await {
                item.map_err(|e| RuntimeError::docker("docker load", e))?;
            }
            Ok::<(), RuntimeError>(())
        });
        // A transfer cut short ends the archive early: the Engine refuses it, and the
        // transfer's own error is the one reported.
        let (bytes, cut) = pump(&mut resp, &tx, |c| c).await;
        drop(tx);
        let cut = cut.map(|e| failed(format!("download from {url}: {e}")));
        let loaded = load
            .await
            .map_err(|e| failed(format!("docker load task: {e}")))?;
        if let Some(e) = cut {
            return Err(e);
        }
        loaded?;
        let still = self.missing_images(&missing).await?;
        if !still.is_empty() {
            return Err(failed(format!(
                "images {} were not in the archive {url} sent (after docker load they are still missing)",
                still.join(", ")
            )));
        }
        Ok(ImagesOutcome {
            loaded: missing,
            bytes,
            took_ms: t0.elapsed().as_millis() as u64,
        })
    }
}

/// Whether `id` is an exact image id, `sha256:<64 hex>`.
pub fn is_image_id(id: &str) -> bool {
    let hex = id.strip_prefix("sha256:").unwrap_or_default();
    hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `sha256:<64 hex>` ([`is_image_id`]), or an error naming the id.
pub fn check_image_id(id: &str) -> Result<(), RuntimeError> {
    if !is_image_id(id) {
        return Err(RuntimeError::Invalid(format!(
            "image id {id:?} is not sha256:<64 hex digits>"
        )));
    }
    Ok(())
}

/// `GET url` with the bearer token; an answer that is not 2xx is an error.
async fn fetch(
    client: &reqwest::Client,
    url: &str,
    token: &str,
) -> Result<reqwest::Response, RuntimeError> {
    let resp = client
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .map_err(|e| failed(format!("download from {url}: {e}")))?;
    if !resp.status().is_success() {
        return Err(http_error("download", resp).await);
    }
    Ok(resp)
}

/// Moves the response's chunks onto `tx`, each made an item by `item`, until the
/// response ends, the reader stops, or the transfer fails: the bytes moved and the
/// transfer's error, if any.
async fn pump<T>(
    resp: &mut reqwest::Response,
    tx: &mpsc::Sender<T>,
    item: impl Fn(Bytes) -> T,
) -> (u64, Option<String>) {
    let mut bytes = 0u64;
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                bytes += c.len() as u64;
                if tx.send(item(c)).await.is_err() {
                    return (bytes, None); // the reader ended (refused or done)
                }
            }
            Ok(None) => return (bytes, None),
            Err(e) => return (bytes, Some(e.to_string())),
        }
    }
}
