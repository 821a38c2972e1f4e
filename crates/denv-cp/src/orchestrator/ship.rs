//! Shipping a version's snapshot to the host a fork was placed on
//! (`docs/reference/targets.md`, "Forks on any host"; host commands `snapshot.send` and
//! `snapshot.receive` in `docs/reference/protocol.md`).
//!
//! The bytes pass through this control plane: the source host uploads the archive with
//! `PUT /v1/ship/{id}` into a file of the ship directory (`DENV_SHIP_DIR`), the
//! destination host downloads it with `GET /v1/ship/{id}`. Each direction has its own
//! random one-time token (`dsh_…`, 256 bits); only its SHA-256 is kept, compared in
//! constant time. The upload is refused past the slot's limit (`413`); the download is
//! offered only once the upload completed, with its size. The file is removed when the
//! shipment ends, either way.
//!
//! Integrity is checked three times: the sender reports the SHA-256 of the bytes it
//! sent, the control plane compares it with what it received, and the receiver unpacks
//! only what hashes to it. A recorded copy ([`crate::store::snapshot_copies`]) is
//! confirmed with a `snapshot.receive` that the host answers `cached` without a
//! download; a copy the host no longer has is forgotten and shipped again.
//!
//! Shipments of one version to one host are serialised (one ships, the others find the
//! copy): a group of forks landing on a new host ships once.

use super::link::Addr;
use super::Orchestrator;
use crate::hub::{hash_secret, new_secret};
use crate::ids::ct_eq;
use crate::store::snapshot_copies;
use denv_proto::v1;
use futures::StreamExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// How long one `snapshot.send` or `snapshot.receive` may take: the phase's own bound,
/// 15 min ([`denv_proto::contract::PHASE_TIMEOUT`]).
pub const SHIP_TIMEOUT: Duration = denv_proto::contract::PHASE_TIMEOUT;

/// Where shipments stage their archives and how hosts reach this control plane.
#[derive(Debug)]
pub struct Shipping {
    dir: PathBuf,
    public_url: String,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    inflight: Mutex<HashMap<(String, String), Lane>>,
}

/// The lock one (version, host) pair's shipments take turns on.
type Lane = Arc<tokio::sync::Mutex<()>>;

/// One shipment's archive on this control plane.
#[derive(Debug)]
pub struct Slot {
    /// `shp_<ulid>`.
    pub id: String,
    /// The staged archive (`<ship dir>/<id>.tar`).
    pub path: PathBuf,
    /// Most bytes the upload may carry.
    pub max_bytes: u64,
    put_hash: String,
    get_hash: String,
    state: Mutex<SlotState>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum SlotState {
    Waiting,
    Uploading,
    Uploaded { bytes: u64, sha256: String },
    Downloading,
    Failed,
}

/// The URLs and tokens of a new slot, handed to the two hosts.
#[derive(Debug, Clone)]
pub struct Tickets {
    /// The slot's id.
    pub id: String,
    /// `<base>/v1/ship/<id>`: PUT by the source, GET by the destination.
    pub url: String,
    /// The upload's bearer token.
    pub put_token: String,
    /// The download's bearer token.
    pub get_token: String,
}

/// A refusal of the ship routes: HTTP status and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// 401, 404, 409 or 413.
    pub status: u16,
    /// Why.
    pub message: String,
}

fn refused(status: u16, message: impl Into<String>) -> Refused {
    Refused {
        status,
        message: message.into(),
    }
}

impl Shipping {
    /// Shipments staged in `dir` (created when first used), the hosts told to reach
    /// this control plane at `public_url` (no trailing slash).
    pub fn new(dir: impl Into<PathBuf>, public_url: &str) -> Self {
        Shipping {
            dir: dir.into(),
            public_url: public_url.trim_end_matches('/').to_string(),
            slots: Mutex::new(HashMap::new()),
            inflight: Mutex::new(HashMap::new()),
        }
    }

    /// The ship directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The base URL the hosts reach the ship routes at: the public URL (the one place
    /// it is decided).
    pub fn base_url(&self) -> String {
        self.public_url.clone()
    }

    /// Opens a slot accepting an upload of at most `max_bytes`.
    pub fn open(&self, max_bytes: u64) -> std::io::Result<Tickets> {
        std::fs::create_dir_all(&self.dir)?;
        let id = crate::ids::new_id("shp");
        let (put_token, get_token) = (new_secret("dsh"), new_secret("dsh"));
        let slot = Slot {
            id: id.clone(),
            path: self.dir.join(format!("{id}.tar")),
            max_bytes,
            put_hash: hash_secret(&put_token),
            get_hash: hash_secret(&get_token),
            state: Mutex::new(SlotState::Waiting),
        };
        self.slots
            .lock()
            .expect("slots")
            .insert(id.clone(), Arc::new(slot));
        Ok(Tickets {
            url: format!("{}/v1/ship/{id}", self.base_url()),
            id,
            put_token,
            get_token,
        })
    }

    /// Closes a slot: its file is removed, its tokens stop working.
    pub fn close(&self, id: &str) {
        if let Some(s) = self.slots.lock().expect("slots").remove(id) {
            let _ = std::fs::remove_file(&s.path);
        }
    }

    /// What the upload delivered: `(bytes, sha256)` once it completed.
    pub fn uploaded(&self, id: &str) -> Option<(u64, String)> {
        let s = self.slots.lock().expect("slots").get(id).cloned()?;
        let st = s.state.lock().expect("slot").clone();
        match st {
            SlotState::Uploaded { bytes, sha256 } => Some((bytes, sha256)),
            _ => None,
        }
    }

    /// The slot `id` when `authorization` (`Bearer <token>`) is its token for
    /// `direction` and the slot is in the state that direction needs; the state moves
    /// on, so each token works once. 404: no such slot; 401: wrong token; 409: used.
    fn take(&self, id: &str, authorization: Option<&str>, put: bool) -> Result<Arc<Slot>, Refused> {
        let slot = self
            .slots
            .lock()
            .expect("slots")
            .get(id)
            .cloned()
            .ok_or_else(|| refused(404, format!("no shipment {id}")))?;
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .unwrap_or("");
        let want = if put { &slot.put_hash } else { &slot.get_hash };
        if !ct_eq(&hash_secret(token), want) {
            return Err(refused(401, "invalid ship token"));
        }
        let mut st = slot.state.lock().expect("slot");
        match (&*st, put) {
            (SlotState::Waiting, true) => *st = SlotState::Uploading,
            (SlotState::Uploaded { .. }, false) => *st = SlotState::Downloading,
            (s, _) => {
                let what = if put { "upload" } else { "download" };
                return Err(refused(
                    409,
                    format!("shipment {id}: the {what} token was used or the shipment is not ready ({s:?})"),
                ));
            }
        }
        drop(st);
        Ok(slot)
    }

    /// `PUT /v1/ship/{id}`: writes the body to the slot's file, at most its limit
    /// (413 past it, the file removed). Returns `(bytes, sha256)` of what was received.
    pub async fn upload(
        &self,
        id: &str,
        authorization: Option<&str>,
        body: axum::body::Body,
    ) -> Result<(u64, String), Refused> {
        let slot = self.take(id, authorization, true)?;
        let result = async {
            let mut f = tokio::fs::File::create(&slot.path)
                .await
                .map_err(|e| refused(500, format!("{}: {e}", slot.path.display())))?;
            let mut hash = Sha256::new();
            let mut bytes = 0u64;
            let mut stream = body.into_data_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| refused(400, format!("reading the upload: {e}")))?;
                bytes += chunk.len() as u64;
                if bytes > slot.max_bytes {
                    return Err(refused(
                        413,
                        format!(
                            "the snapshot archive is larger than the {} bytes allowed",
                            slot.max_bytes
                        ),
                    ));
                }
                hash.update(&chunk);
                f.write_all(&chunk)
                    .await
                    .map_err(|e| refused(500, format!("{}: {e}", slot.path.display())))?;
            }
            f.flush()
                .await
                .map_err(|e| refused(500, format!("{}: {e}", slot.path.display())))?;
            Ok((bytes, hex::encode(hash.finalize())))
        }
        .await;
        let mut st = slot.state.lock().expect("slot");
        match &result {
            Ok((bytes, sha256)) => {
                *st = SlotState::Uploaded {
                    bytes: *bytes,
                    sha256: sha256.clone(),
                }
            }
            Err(_) => {
                *st = SlotState::Failed;
                let _ = std::fs::remove_file(&slot.path);
            }
        }
        result
    }

    /// `GET /v1/ship/{id}`: the slot's file and its size, once.
    pub async fn download(
        &self,
        id: &str,
        authorization: Option<&str>,
    ) -> Result<(tokio::fs::File, u64), Refused> {
        let slot = self.take(id, authorization, false)?;
        let f = tokio::fs::File::open(&slot.path)
            .await
            .map_err(|e| refused(500, format!("{}: {e}", slot.path.display())))?;
        let len = f
            .metadata()
            .await
            .map_err(|e| refused(500, format!("{}: {e}", slot.path.display())))?
            .len();
        Ok((f, len))
    }

    /// The lock that serialises shipments of `version` to `host`.
    fn lane(&self, version: &str, host: &str) -> Lane {
        self.inflight
            .lock()
            .expect("inflight")
            .entry((version.to_string(), host.to_string()))
            .or_default()
            .clone()
    }
}

/// Where a fork's data came from: the `ship` object of the `place` phase's evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShipEvidence {
    /// The host the archive came from.
    pub from_host: String,
    /// The host it went to (the fork's).
    pub to_host: String,
    /// Size of the archive, bytes (of the earlier shipment when `cached`).
    pub bytes: u64,
    /// Its SHA-256, lower-case hex.
    pub sha256: String,
    /// How long this fork waited for the data, ms.
    pub took_ms: u64,
    /// The host already had a copy: nothing was shipped.
    pub cached: bool,
}

impl ShipEvidence {
    /// `{from_host, to_host, bytes, sha256, took_ms, cached}`.
    pub fn to_json(&self) -> Value {
        json!({
            "from_host": self.from_host, "to_host": self.to_host, "bytes": self.bytes,
            "sha256": self.sha256, "took_ms": self.took_ms, "cached": self.cached,
        })
    }
}

/// The most a snapshot archive of a spec may weigh: the environment's disk quota
/// (`x-denv.disk`, else 10240 MiB) plus an eighth and 64 MiB for the archive's headers.
pub fn archive_limit(spec: &denv_compose::Spec) -> u64 {
    let disk_mb = if spec.disk_mb == 0 {
        denv_compose::DEFAULT_DISK_MB
    } else {
        spec.disk_mb
    };
    let b = disk_mb << 20;
    b + b / 8 + (64 << 20)
}

impl Orchestrator {
    /// Removes the copies other hosts hold of the snapshots of `env_id` (destroyed and
    /// torn down on its own host, so no fork can use them any more): an `env.destroy`
    /// of `env_id` to each connected host that holds one (the host removes its received
    /// snapshots of it; it runs nothing of it), then the `snapshot_copies` rows. A host
    /// that is away or fails keeps its copy and its rows (logged). Returns the hosts
    /// cleared.
    pub(crate) async fn drop_copies(&self, team_id: &str, env_id: &str) -> usize {
        let db = self.db();
        let versions = match super::repo::versions_of(db, env_id).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(env = %env_id, error = %e, "listing versions to drop their copies");
                return 0;
            }
        };
        let mut by_host: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for v in &versions {
            match snapshot_copies::of_version(db, &v.id).await {
                Ok(cs) => {
                    for c in cs {
                        by_host.entry(c.host_id).or_default().push(v.id.clone());
                    }
                }
                Err(e) => {
                    tracing::warn!(version = %v.id, error = %e, "listing the copies of a version")
                }
            }
        }
        let mut cleared = 0;
        for (host, versions) in by_host {
            if !self.link().is_connected_now(&host).await {
                tracing::warn!(env = %env_id, host_id = %host, "host away: its copies of the environment's snapshots stay");
                continue;
            }
            let to = Addr::new(team_id, &host, env_id);
            if let Err(e) = self
                .link()
                .destroy(&to, v1::EnvDestroy {}, SHIP_TIMEOUT)
                .await
            {
                tracing::warn!(env = %env_id, host_id = %host, error = %e, "removing copies of the environment's snapshots failed");
                continue;
            }
            for v in versions {
                if let Err(e) = snapshot_copies::forget(db, &v, &host).await {
                    tracing::warn!(version = %v, host_id = %host, error = %e, "forgetting a removed copy");
                }
            }
            tracing::info!(env = %env_id, host_id = %host, "removed the host's copies of the environment's snapshots");
            cleared += 1;
        }
        cleared
    }

    /// The shipping of this control plane.
    pub fn shipping(&self) -> Arc<Shipping> {
        self.inner.shipping.read().expect("shipping").clone()
    }

    /// Makes snapshot `version.snapshot` of `owner_env` (taken on `owner_host`) present on
    /// `to_host` (see the module docs). `Ok(None)` when `to_host` is the owner's host.
    /// Errors: no connected host holds the snapshot, or the sidecars' or the store's
    /// error, prefixed by the step (`snapshot.send on <host>: …`).
    pub async fn ship_version(
        &self,
        team_id: &str,
        version: &crate::domain::Version,
        owner_host: &str,
        to_host: &str,
    ) -> Result<Option<ShipEvidence>, String> {
        if to_host == owner_host {
            return Ok(None);
        }
        let t0 = Instant::now();
        let shipping = self.shipping();
        let lane = shipping.lane(&version.id, to_host);
        let _one = lane.lock().await;
        let link = self.link();
        let vols = version.spec.volumes.clone();
        let dest = Addr::new(team_id, to_host, &version.env_id);
        let recorded = snapshot_copies::get(self.db(), &version.id, to_host)
            .await
            .map_err(|e| format!("store: {e}"))?;
        if let Some(copy) = recorded {
            // Confirmed by the host: answered `cached` at once, or an error (no URL to
            // download from) when the copy is gone.
            let check = v1::SnapshotReceive {
                snapshot: version.snapshot.clone(),
                volumes: vols.clone(),
                url: String::new(),
                token: String::new(),
                sha256: copy.sha256.clone(),
                bytes: copy.bytes as u64,
            };
            match link.receive_snapshot(&dest, check, SHIP_TIMEOUT).await {
                Ok(r) if r.cached => {
                    return Ok(Some(ShipEvidence {
                        from_host: copy.from_host_id,
                        to_host: to_host.to_string(),
                        bytes: copy.bytes as u64,
                        sha256: copy.sha256,
                        took_ms: t0.elapsed().as_millis() as u64,
                        cached: true,
                    }))
                }
                Ok(_) | Err(_) => {
                    tracing::warn!(version = %version.id, host = %to_host, "recorded snapshot copy is gone; shipping it again");
                    let _ = snapshot_copies::forget(self.db(), &version.id, to_host).await;
                }
            }
        }
        // The source: the owner's host, else a host holding a copy, connected.
        let mut sources = vec![owner_host.to_string()];
        for c in snapshot_copies::of_version(self.db(), &version.id)
            .await
            .map_err(|e| format!("store: {e}"))?
        {
            if c.host_id != to_host {
                sources.push(c.host_id);
            }
        }
        let Some(from_host) = sources.into_iter().find(|h| link.is_connected(h)) else {
            return Err(format!(
                "no connected host holds snapshot {} of version {} (its host {owner_host} is not connected)",
                version.snapshot, version.id
            ));
        };
        let tickets = shipping
            .open(archive_limit(&version.spec))
            .map_err(|e| format!("ship dir {}: {e}", shipping.dir().display()))?;
        let result = self
            .ship_through(team_id, version, &from_host, &dest, &tickets)
            .await;
        shipping.close(&tickets.id);
        let (bytes, sha256, cached) = result?;
        let took_ms = t0.elapsed().as_millis() as u64;
        {
            snapshot_copies::record(
                self.db(),
                snapshot_copies::Model {
                    version_id: version.id.clone(),
                    host_id: to_host.to_string(),
                    from_host_id: from_host.clone(),
                    bytes: bytes as i64,
                    sha256: sha256.clone(),
                    shipped_ms: took_ms as i64,
                    created_at: String::new(),
                },
            )
            .await
            .map_err(|e| format!("store: {e}"))?;
        }
        Ok(Some(ShipEvidence {
            from_host,
            to_host: to_host.to_string(),
            bytes,
            sha256,
            took_ms,
            cached,
        }))
    }

    /// `snapshot.send` to `from_host`, the upload checked against its report, then
    /// `snapshot.receive` to `dest`: `(bytes, sha256, cached)`.
    async fn ship_through(
        &self,
        team_id: &str,
        version: &crate::domain::Version,
        from_host: &str,
        dest: &Addr,
        tickets: &Tickets,
    ) -> Result<(u64, String, bool), String> {
        let link = self.link();
        let src = Addr::new(team_id, from_host, &version.env_id);
        let sent = link
            .send_snapshot(
                &src,
                v1::SnapshotSend {
                    snapshot: version.snapshot.clone(),
                    volumes: version.spec.volumes.clone(),
                    url: tickets.url.clone(),
                    token: tickets.put_token.clone(),
                },
                SHIP_TIMEOUT,
            )
            .await
            .map_err(|e| format!("snapshot.send on {from_host}: {e}"))?;
        match self.shipping().uploaded(&tickets.id) {
            Some((b, s)) if b == sent.bytes && s == sent.sha256 => {}
            Some((b, s)) => {
                return Err(format!(
                    "the upload does not match: the control plane received {b} bytes with sha256 {s}, host {from_host} sent {} bytes with sha256 {}",
                    sent.bytes, sent.sha256
                ))
            }
            None => return Err(format!("host {from_host} reported an upload that did not arrive")),
        }
        let got = link
            .receive_snapshot(
                dest,
                v1::SnapshotReceive {
                    snapshot: version.snapshot.clone(),
                    volumes: version.spec.volumes.clone(),
                    url: tickets.url.clone(),
                    token: tickets.get_token.clone(),
                    sha256: sent.sha256.clone(),
                    bytes: sent.bytes,
                },
                SHIP_TIMEOUT,
            )
            .await
            .map_err(|e| format!("snapshot.receive on {}: {e}", dest.host_id))?;
        Ok((sent.bytes, sent.sha256, got.cached))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(b: &'static [u8]) -> axum::body::Body {
        axum::body::Body::from(b)
    }

    #[tokio::test]
    async fn tokens_work_once_each_way_and_the_upload_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let s = Shipping::new(dir.path(), "http://cp.test:8080/");
        let t = s.open(10).unwrap();
        assert_eq!(t.url, format!("http://cp.test:8080/v1/ship/{}", t.id));
        let put = format!("Bearer {}", t.put_token);
        let get = format!("Bearer {}", t.get_token);
        // Nothing to download before the upload; the download token cannot upload.
        assert_eq!(s.download(&t.id, Some(&get)).await.unwrap_err().status, 409);
        let e = s.upload(&t.id, Some(&get), body(b"x")).await.unwrap_err();
        assert_eq!(e.status, 401);
        assert_eq!(
            s.upload(&t.id, None, body(b"x")).await.unwrap_err().status,
            401
        );
        assert_eq!(
            s.upload("shp_other", Some(&put), body(b"x"))
                .await
                .unwrap_err()
                .status,
            404
        );
        let (n, sha) = s.upload(&t.id, Some(&put), body(b"hello")).await.unwrap();
        assert_eq!(
            (n, sha.as_str()),
            (
                5,
                "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
            )
        );
        assert_eq!(s.uploaded(&t.id), Some((5, sha)));
        // The upload token is spent.
        let e = s
            .upload(&t.id, Some(&put), body(b"again"))
            .await
            .unwrap_err();
        assert_eq!(e.status, 409);
        let (_f, len) = s.download(&t.id, Some(&get)).await.unwrap();
        assert_eq!(len, 5);
        assert_eq!(s.download(&t.id, Some(&get)).await.unwrap_err().status, 409);
        let staged = dir.path().join(format!("{}.tar", t.id));
        assert!(staged.exists());
        s.close(&t.id);
        assert!(!staged.exists());
        assert_eq!(s.download(&t.id, Some(&get)).await.unwrap_err().status, 404);

        // More than the limit: 413, nothing kept, the slot unusable.
        let t = s.open(4).unwrap();
        let put = format!("Bearer {}", t.put_token);
        let e = s
            .upload(&t.id, Some(&put), body(b"hello"))
            .await
            .unwrap_err();
        assert_eq!(e.status, 413, "{}", e.message);
        assert!(!dir.path().join(format!("{}.tar", t.id)).exists());
        assert_eq!(s.uploaded(&t.id), None);
        let get = format!("Bearer {}", t.get_token);
        assert_eq!(s.download(&t.id, Some(&get)).await.unwrap_err().status, 409);
    }

    #[test]
    fn the_archive_limit_follows_the_disk_quota() {
        let mut spec = denv_compose::Spec::default();
        let default = archive_limit(&spec);
        assert_eq!(default, (10240u64 << 20) * 9 / 8 + (64 << 20));
        spec.disk_mb = 1024;
        assert_eq!(archive_limit(&spec), (1024u64 << 20) * 9 / 8 + (64 << 20));
    }
}
