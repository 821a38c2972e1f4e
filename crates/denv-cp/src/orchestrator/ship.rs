//! Moving a version's data to the host a fork was placed on
//! (`docs/reference/targets.md`, "Forks on any host"; host commands `snapshot.send`,
//! `snapshot.receive`, `image.send`, `image.receive` in `docs/reference/protocol.md`).
//!
//! The control plane decides, the hosts move the bytes: no byte of a snapshot or an
//! image passes through this process. For each of the two (the version's images, its
//! snapshot) a random one-time token (`dsh_…`, 256 bits) is minted; the source host is
//! sent an offer carrying only the token's SHA-256 and answers with a URL on its data
//! port (`denvd --data-addr`); the destination host is sent that URL and the token,
//! fetches from the source directly, and checks what arrives: the snapshot archive
//! against the size and SHA-256 in its trailer (nothing is put in place otherwise), the
//! images by their ids (the Engine checks every layer against the image's config, whose
//! digest is the id). The token lives only in the two commands (never in the
//! `commands` table) and in the destination's memory.
//!
//! A recorded copy ([`crate::store::snapshot_copies`]) is confirmed with a
//! `snapshot.receive` without a URL that the host answers `cached`; a copy the host no
//! longer has is forgotten and shipped again. The images are confirmed every time
//! (an `image.receive` fetches only the ids the host's Engine lacks).
//!
//! Shipments of one version to one host are serialised (one ships, the others find the
//! copy): a group of forks landing on a new host ships once.

use super::link::Addr;
use super::Orchestrator;
use crate::hub::{hash_secret, new_secret};
use crate::store::snapshot_copies;
use denv_proto::v1;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long one send or receive may take: the phase's own bound, 15 min
/// ([`denv_proto::contract::PHASE_TIMEOUT`]).
pub const SHIP_TIMEOUT: Duration = denv_proto::contract::PHASE_TIMEOUT;

/// The turns shipments of one (version, host) pair take.
#[derive(Debug, Default)]
pub struct Lanes {
    inflight: Mutex<HashMap<(String, String), Lane>>,
}

/// The lock one (version, host) pair's shipments take turns on.
type Lane = Arc<tokio::sync::Mutex<()>>;

impl Lanes {
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

/// What moving the images did: the `images` object of the `ship` evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagesEvidence {
    /// The image ids the destination lacked and loaded (none: it had them all).
    pub loaded: Vec<String>,
    /// Bytes of `docker save` archive it fetched.
    pub bytes: u64,
    /// How long it took, ms.
    pub took_ms: u64,
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
    /// The version's images: what the destination had to fetch.
    pub images: ImagesEvidence,
}

impl ShipEvidence {
    /// `{from_host, to_host, bytes, sha256, took_ms, cached, images: {loaded, bytes,
    /// took_ms}}`.
    pub fn to_json(&self) -> Value {
        json!({
            "from_host": self.from_host, "to_host": self.to_host, "bytes": self.bytes,
            "sha256": self.sha256, "took_ms": self.took_ms, "cached": self.cached,
            "images": {"loaded": self.images.loaded, "bytes": self.images.bytes,
                       "took_ms": self.images.took_ms},
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

    /// Makes snapshot `version.snapshot` of `owner_env`, and the images the version
    /// pinned, present on `to_host` (see the module docs). `Ok(None)` when `to_host` is
    /// the owner's host. Errors: no connected host holds the snapshot, or the sidecars'
    /// or the store's error, prefixed by the step (`snapshot.send on <host>: …`).
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
        let lane = self.inner.lanes.lane(&version.id, to_host);
        let _one = lane.lock().await;
        let link = self.link();
        let vols = version.spec.volumes.clone();
        let dest = Addr::new(team_id, to_host, &version.env_id);
        let recorded = snapshot_copies::get(self.db(), &version.id, to_host)
            .await
            .map_err(|e| format!("store: {e}"))?;
        let mut copy = None;
        if let Some(c) = recorded {
            // Confirmed by the host: answered `cached` at once, or an error (no URL to
            // download from) when the copy is gone.
            let check = v1::SnapshotReceive {
                snapshot: version.snapshot.clone(),
                volumes: vols.clone(),
                ..Default::default()
            };
            match link.receive_snapshot(&dest, check, SHIP_TIMEOUT).await {
                Ok(r) if r.cached => copy = Some(c),
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
        let src = Addr::new(team_id, &from_host, &version.env_id);
        let images = self.ship_images(version, &src, &dest);
        if let Some(c) = copy {
            let images = images.await?;
            return Ok(Some(ShipEvidence {
                from_host: c.from_host_id,
                to_host: to_host.to_string(),
                bytes: c.bytes as u64,
                sha256: c.sha256,
                took_ms: t0.elapsed().as_millis() as u64,
                cached: true,
                images,
            }));
        }
        // The images and the snapshot travel side by side.
        let (images, snap) = tokio::join!(images, self.ship_snapshot(version, &src, &dest));
        let images = images?;
        let (bytes, sha256, cached, transfer_ms) = snap?;
        let took_ms = t0.elapsed().as_millis() as u64;
        if !cached {
            snapshot_copies::record(
                self.db(),
                snapshot_copies::Model {
                    version_id: version.id.clone(),
                    host_id: to_host.to_string(),
                    from_host_id: from_host.clone(),
                    bytes: bytes as i64,
                    sha256: sha256.clone(),
                    // The transfer alone (what placement measures throughput by), not
                    // the waits for the lane or the images.
                    shipped_ms: transfer_ms as i64,
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
            images,
        }))
    }

    /// `snapshot.send` (an offer) to `src`, then `snapshot.receive` from it to `dest`:
    /// `(bytes, sha256, cached, ms the receive took)`.
    async fn ship_snapshot(
        &self,
        version: &crate::domain::Version,
        src: &Addr,
        dest: &Addr,
    ) -> Result<(u64, String, bool, u64), String> {
        let link = self.link();
        let token = new_secret("dsh");
        let offer = link
            .send_snapshot(
                src,
                v1::SnapshotSend {
                    snapshot: version.snapshot.clone(),
                    volumes: version.spec.volumes.clone(),
                    token_sha256: hash_secret(&token),
                },
                SHIP_TIMEOUT,
            )
            .await
            .map_err(|e| format!("snapshot.send on {}: {e}", src.host_id))?;
        let got = link
            .receive_snapshot(
                dest,
                v1::SnapshotReceive {
                    snapshot: version.snapshot.clone(),
                    volumes: version.spec.volumes.clone(),
                    url: offer.url,
                    token,
                    max_bytes: archive_limit(&version.spec),
                },
                SHIP_TIMEOUT,
            )
            .await
            .map_err(|e| format!("snapshot.receive on {}: {e}", dest.host_id))?;
        Ok((got.bytes, got.sha256, got.cached, got.took_ms))
    }

    /// Makes the images `version` pinned (every service's and the verifier's) present
    /// on `dest`, fetched from `src` when it lacks any.
    async fn ship_images(
        &self,
        version: &crate::domain::Version,
        src: &Addr,
        dest: &Addr,
    ) -> Result<ImagesEvidence, String> {
        let ids = pinned_images(&version.spec);
        if ids.is_empty() {
            return Ok(ImagesEvidence {
                loaded: vec![],
                bytes: 0,
                took_ms: 0,
            });
        }
        let link = self.link();
        // Asked first without a source: most forks land where the images already are.
        let check = v1::ImageReceive {
            image_ids: ids.clone(),
            ..Default::default()
        };
        if let Ok(r) = link.receive_images(dest, check, SHIP_TIMEOUT).await {
            return Ok(ImagesEvidence {
                loaded: r.loaded,
                bytes: r.bytes,
                took_ms: r.took_ms,
            });
        }
        let token = new_secret("dsh");
        let offer = link
            .send_images(
                src,
                v1::ImageSend {
                    image_ids: ids.clone(),
                    token_sha256: hash_secret(&token),
                },
                SHIP_TIMEOUT,
            )
            .await
            .map_err(|e| format!("image.send on {}: {e}", src.host_id))?;
        let r = link
            .receive_images(
                dest,
                v1::ImageReceive {
                    image_ids: ids,
                    url: offer.url,
                    token,
                },
                SHIP_TIMEOUT,
            )
            .await
            .map_err(|e| format!("image.receive on {}: {e}", dest.host_id))?;
        Ok(ImagesEvidence {
            loaded: r.loaded,
            bytes: r.bytes,
            took_ms: r.took_ms,
        })
    }
}

/// The image ids a version's spec pinned (its services', then its verifier's), each
/// once, in that order; none for a spec captured before images were pinned.
pub fn pinned_images(spec: &denv_compose::Spec) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    let verifier = spec.verifier.as_ref().map(|v| v.image_id.clone());
    for id in spec
        .services
        .iter()
        .map(|s| s.image_id.clone())
        .chain(verifier)
    {
        if !id.is_empty() && !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_limit_follows_the_disk_quota() {
        let mut spec = denv_compose::Spec::default();
        let default = archive_limit(&spec);
        assert_eq!(default, (10240u64 << 20) * 9 / 8 + (64 << 20));
        spec.disk_mb = 1024;
        assert_eq!(archive_limit(&spec), (1024u64 << 20) * 9 / 8 + (64 << 20));
    }
}
