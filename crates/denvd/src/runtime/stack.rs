//! Environment lifecycle: create, fork, rollback, snapshot, destroy.

use super::clock;
use super::contain::{harden, Privilege};
use super::docker::tail;
use super::render::{render_compose, write_env_files};
use super::watch::DATA_LABEL;
use super::{
    container_name, fail, network_name, project, say, CreateResult, DestroyResult, EgressProbe,
    ForkResult, Progress, Result, RollbackResult, Runtime, RuntimeError, SnapshotResult,
};
use crate::storage::validate_name;
use bollard::container::{Config, CreateContainerOptions, NetworkingConfig, StopContainerOptions};
use bollard::models::{EndpointSettings, HealthConfig, HostConfig, PortBinding};
use denv_compose::{
    Egress, Resources, Service, Spec, VolumeMount, DEFAULT_CPUS, DEFAULT_MEMORY_MB, DEFAULT_PIDS,
};
use futures::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// How long a service another one waits to complete (`service_completed_successfully`)
/// may run.
pub(crate) const COMPLETE_TIMEOUT: Duration = Duration::from_secs(600);

/// Services some other service waits to complete (`service_completed_successfully`):
/// they are done when they exit 0 and are not expected to keep running.
pub(crate) fn one_shot_services(spec: &Spec) -> std::collections::BTreeSet<String> {
    spec.services
        .iter()
        .flat_map(|s| s.depends_on_condition.iter())
        .filter(|(_, c)| c.as_str() == denv_compose::SERVICE_COMPLETED_SUCCESSFULLY)
        .map(|(d, _)| d.clone())
        .collect()
}

/// Post-snapshot (and post-unpause) health wait.
const UNPAUSE_HEALTH_TIMEOUT: Duration = Duration::from_secs(90);

/// Effective caps: (memory bytes, pids, cpus). Zero (or negative) means the default
/// (4096 MiB, 2048, 2.0); CPUs are clamped to [`super::contain::max_cpus`] (the host's
/// CPUs minus a 0.5 CPU reserve; the Engine refuses more than the host has anyway).
pub(crate) fn caps(r: &Resources, host_cpus: f64) -> (i64, i64, f64) {
    let mem_mb = if r.memory_mb == 0 {
        DEFAULT_MEMORY_MB
    } else {
        r.memory_mb
    };
    let pids = if r.pids <= 0 { DEFAULT_PIDS } else { r.pids };
    let cpus = if r.cpus <= 0.0 { DEFAULT_CPUS } else { r.cpus };
    (
        (mem_mb as i64) << 20,
        pids,
        cpus.min(super::contain::max_cpus(host_cpus)),
    )
}

/// The environment's disk quota in bytes: `x-denv.disk`, or
/// [`denv_compose::DEFAULT_DISK_MB`] (10 GiB) when unset.
pub(crate) fn disk_bytes(spec: &Spec) -> u64 {
    let mb = if spec.disk_mb == 0 {
        denv_compose::DEFAULT_DISK_MB
    } else {
        spec.disk_mb
    };
    mb << 20
}

/// Services in start order: dependencies first, ties by name. Unknown dependencies are
/// ignored (the compose parser validates them); a cycle is an error.
pub(crate) fn start_order(spec: &Spec) -> Result<Vec<&Service>> {
    let names: Vec<&str> = spec.services.iter().map(|s| s.name.as_str()).collect();
    let mut done: Vec<&str> = Vec::new();
    let mut order = Vec::new();
    let mut pending: Vec<&Service> = spec.services.iter().collect();
    pending.sort_by(|a, b| a.name.cmp(&b.name));
    while !pending.is_empty() {
        let pos = pending.iter().position(|s| {
            s.depends_on
                .iter()
                .all(|d| done.contains(&d.as_str()) || !names.contains(&d.as_str()))
        });
        match pos {
            Some(i) => {
                let s = pending.remove(i);
                done.push(&s.name);
                order.push(s);
            }
            None => {
                let left: Vec<&str> = pending.iter().map(|s| s.name.as_str()).collect();
                return Err(RuntimeError::Invalid(format!(
                    "depends_on cycle among services: {}",
                    left.join(", ")
                )));
            }
        }
    }
    Ok(order)
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// How long to wait for one service: interval × retries (+ start period) + 30 s, at
/// least 60 s.
fn ready_timeout(hc: Option<&HealthConfig>) -> Duration {
    let Some(h) = hc else {
        return Duration::from_secs(60);
    };
    let interval_ns = h.interval.filter(|i| *i > 0).unwrap_or(30_000_000_000);
    let retries = h.retries.filter(|r| *r > 0).unwrap_or(3);
    let start = h.start_period.unwrap_or(0).max(0);
    let total =
        Duration::from_nanos((interval_ns * retries + start) as u64) + Duration::from_secs(30);
    total.max(Duration::from_secs(60))
}

fn dir_is_empty(p: &Path) -> bool {
    std::fs::read_dir(p)
        .map(|mut rd| rd.next().is_none())
        .unwrap_or(false)
}

/// Runs blocking file-system work `f` on tokio's blocking pool. A volume's file system
/// can stall (a FUSE mount such as zfs-fuse under load): on the blocking pool that
/// stalls this one operation, not the runtime's worker threads (heartbeats, other
/// environments' commands). A panic of `f` becomes an `io::Error`.
async fn on_fs<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(format!("file-system task: {e}"))))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Create,
    Fork,
    Rollback,
}

/// The image reference a service's containers are created from: the pinned or resolved
/// image id when there is one, else the tag as written.
pub(crate) fn run_image(s: &Service) -> &str {
    if s.image_id.is_empty() {
        &s.image
    } else {
        &s.image_id
    }
}

/// What [`Runtime::up`] brought up.
struct Up {
    /// Service → `127.0.0.1:<port>`.
    endpoints: BTreeMap<String, String>,
    /// The egress probe's verdict and attempts.
    probe: EgressProbe,
    /// The environment's clock offset, ms (0: the real clock).
    clock_offset_ms: i64,
    /// Services a frozen clock does not reach, with why (see [`ForkResult`]).
    clock_real_services: BTreeMap<String, String>,
}

/// What every service container of one start shares besides the network name.
struct Shared {
    /// DNS servers (the network's gateway under egress deny).
    dns: Option<Vec<String>>,
    /// The frozen clock's mounts and variables, when the clock is frozen.
    clock: Option<clock::Mounts>,
    /// Services left on the real clock under a frozen one (musl, jemalloc), with why.
    clock_real: BTreeMap<String, String>,
}

/// A spec with every service's image resolved ([`Runtime::resolve_images`]).
struct Resolved {
    /// The spec, each service's `image_id` set to the id its containers are created from.
    spec: Spec,
    /// Service → repo digest, else image id (evidence).
    digests: BTreeMap<String, String>,
    /// How long the resolution took.
    took: Duration,
}

impl Runtime {
    fn env_dir(&self, env_id: &str) -> PathBuf {
        self.inner.cfg.data_dir.join("envs").join(env_id)
    }

    /// The spec saved by the last create/fork of `env_id` (`<data>/envs/<id>/spec.json`).
    pub async fn saved_spec(&self, env_id: &str) -> Result<Spec> {
        let p = self.env_dir(env_id).join("spec.json");
        let bytes = match tokio::fs::read(&p).await {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(RuntimeError::NotFound(format!(
                    "environment {env_id} not found on this host (no {})",
                    p.display()
                )))
            }
            Err(e) => return Err(RuntimeError::io(p.display().to_string(), e)),
        };
        serde_json::from_slice(&bytes)
            .map_err(|e| RuntimeError::Failed(format!("{}: {e}", p.display())))
    }

    fn snapshot_spec_path(&self, env_id: &str, snapshot: &str) -> PathBuf {
        self.env_dir(env_id)
            .join("snapshots")
            .join(format!("{snapshot}.spec.json"))
    }

    /// The spec an environment ran when `snapshot` was taken
    /// (`<data>/envs/<id>/snapshots/<snapshot>.spec.json`), if recorded.
    pub async fn snapshot_spec(&self, env_id: &str, snapshot: &str) -> Result<Option<Spec>> {
        let p = self.snapshot_spec_path(env_id, snapshot);
        match tokio::fs::read(&p).await {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| RuntimeError::Failed(format!("{}: {e}", p.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(RuntimeError::io(p.display().to_string(), e)),
        }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn crate::storage::Storage) -> Result<T, crate::storage::StorageError>
            + Send
            + 'static,
    ) -> Result<T> {
        let st = self.inner.storage.clone();
        tokio::task::spawn_blocking(move || f(st.as_ref()))
            .await
            .map_err(|e| RuntimeError::Failed(format!("storage task: {e}")))?
            .map_err(RuntimeError::from)
    }

    /// `env.create`: datasets, network, containers, health, egress probe. Running it again
    /// on an existing environment recreates the containers and keeps the datasets
    /// (`--force-recreate`). See the module docs for what runs.
    ///
    /// Errors: `image "x" is not present locally and could not be pulled: …`,
    /// `service "db" is unhealthy: exit 1: …`, `service "db" did not become healthy
    /// within 90s: …`, `service "x" exited with code 1: <logs>`,
    /// `network policy: …` (the rules could not be applied; nothing was started),
    /// the egress probe's errors ([`Runtime::probe_env`]: `egress is denied but the
    /// stack reached …`, `egress probe failed to run: …`; the stack is stopped), Docker's
    /// messages with context.
    pub async fn create(
        &self,
        env_id: &str,
        spec: &Spec,
        progress: &Progress,
    ) -> Result<CreateResult> {
        let _g = self.lock_env(env_id).await;
        let t0 = Instant::now();
        self.require_clock(spec)?;
        let run = self.resolve_images(spec).await?;
        let up = self
            .up(env_id, &run.spec, run.took, progress, Mode::Create)
            .await?;
        let probe = up.probe;
        Ok(CreateResult {
            endpoints: up.endpoints,
            started_in: ms(t0.elapsed()),
            image_ids: run
                .spec
                .services
                .iter()
                .map(|s| (s.name.clone(), s.image_id.clone()))
                .collect(),
            digests: run.digests,
            storage: self.storage_name().to_string(),
            egress: probe.egress.clone(),
            egress_probe: probe,
        })
    }

    /// `env.fork`: clones every volume of snapshot `from_snapshot` of `from_env` into
    /// `new_env_id`, then starts it like [`Runtime::create`] (own network, egress probe).
    /// `spec` is the new environment's spec (the source's). Error when `new_env_id`
    /// already has volumes: `volume "v" of env_x already exists`; a pinned image gone from
    /// the host fails it before anything is cloned (`image "x" of service "s" (pinned by the
    /// version as sha256:…) is no longer on this host; …`).
    pub async fn fork(
        &self,
        new_env_id: &str,
        from_env: &str,
        from_snapshot: &str,
        spec: &Spec,
        progress: &Progress,
    ) -> Result<ForkResult> {
        self.fork_digested(new_env_id, from_env, from_snapshot, spec, false, progress)
            .await
    }

    /// [`Self::fork`]; with `digest`, every cloned volume is digested
    /// ([`crate::storage::digest`]) before the services start, in parallel, and the
    /// result's `datasets` holds the digests (`denv promote`'s `gate.consistency`).
    pub async fn fork_digested(
        &self,
        new_env_id: &str,
        from_env: &str,
        from_snapshot: &str,
        spec: &Spec,
        digest: bool,
        progress: &Progress,
    ) -> Result<ForkResult> {
        let _g = self.lock_env(new_env_id).await;
        let t0 = Instant::now();
        validate_name("environment id", new_env_id)?;
        validate_name("environment id", from_env)?;
        validate_name("snapshot name", from_snapshot)?;
        for v in &spec.volumes {
            validate_name("volume", v)?;
        }
        // A pinned image gone from the host, or a frozen clock this host cannot give,
        // fails the fork before any data is cloned.
        self.require_clock(spec)?;
        let run = self.resolve_images(spec).await?;
        self.apply_quota(new_env_id, spec).await?;
        say(progress, format!("cloning {from_env}@{from_snapshot}"));
        let (f, s, n, vols) = (
            from_env.to_string(),
            from_snapshot.to_string(),
            new_env_id.to_string(),
            spec.volumes.clone(),
        );
        let tc = Instant::now();
        self.clone_volumes(f, s, n, vols).await?;
        say(
            progress,
            format!(
                "cloned {} volume(s) in {} ms",
                spec.volumes.len(),
                tc.elapsed().as_millis()
            ),
        );
        let mut datasets = BTreeMap::new();
        if digest {
            let td = Instant::now();
            let digests = futures::future::try_join_all(spec.volumes.iter().map(|v| {
                let path = self.inner.storage.volume_path(new_env_id, v);
                let v = v.clone();
                self.blocking(move |_| crate::storage::digest::digest_tree(&path).map(|d| (v, d)))
            }))
            .await?;
            datasets.extend(digests);
            say(
                progress,
                format!(
                    "digested {} volume(s) in {} ms",
                    datasets.len(),
                    td.elapsed().as_millis()
                ),
            );
        }
        let Up {
            endpoints,
            probe,
            clock_offset_ms,
            clock_real_services,
        } = self
            .up(new_env_id, &run.spec, run.took, progress, Mode::Fork)
            .await?;
        Ok(ForkResult {
            forked_in: ms(t0.elapsed()),
            endpoints,
            egress: probe.egress.clone(),
            egress_probe: probe,
            datasets,
            clock_offset_ms,
            clock_real_services,
        })
    }

    /// `env.rollback`: removes the containers, restores every volume from `snapshot`,
    /// starts again from the saved spec (works after a sidecar restart), waits for health
    /// and probes egress.
    pub async fn rollback(
        &self,
        env_id: &str,
        snapshot: &str,
        progress: &Progress,
    ) -> Result<RollbackResult> {
        let _g = self.lock_env(env_id).await;
        validate_name("snapshot name", snapshot)?;
        let current = self.saved_spec(env_id).await?;
        if !self.inner.storage.has_snapshot(env_id, snapshot) {
            return Err(RuntimeError::NotFound(format!(
                "snapshot {snapshot:?} of {env_id} not found"
            )));
        }
        // The snapshot's own spec: a rollback after a failed deploy must not re-render
        // the failed version's services.
        let spec = self
            .snapshot_spec(env_id, snapshot)
            .await?
            .unwrap_or(current.clone());
        self.require_clock(&spec)?;
        say(progress, format!("stopping {env_id}"));
        self.remove_service_containers(env_id, &current).await?;
        say(progress, format!("restoring {snapshot}"));
        let (e, s, vols) = (
            env_id.to_string(),
            snapshot.to_string(),
            spec.volumes.clone(),
        );
        self.blocking(move |st| st.rollback(&e, &s, &vols)).await?;
        let run = self.resolve_images(&spec).await?;
        let up = self
            .up(env_id, &run.spec, run.took, progress, Mode::Rollback)
            .await?;
        Ok(RollbackResult {
            snapshot: snapshot.to_string(),
            endpoints: up.endpoints,
            clock_offset_ms: up.clock_offset_ms,
            clock_real_services: up.clock_real_services,
        })
    }

    /// The local image id (`sha256:…`) of a verifier image: resolved like a service's
    /// image (pulled when missing, never a `denv-build/` one), before a deploy starts
    /// its stack, so that the version can pin the grader too. Errors name the image.
    pub async fn resolve_verifier_image(&self, image: &str) -> Result<String> {
        self.ensure_image(image)
            .await
            .map(|r| r.id)
            .map_err(|e| RuntimeError::Failed(format!("x-denv.verifier.image {image:?}: {e}")))
    }

    /// Clones the volumes of snapshot `snap` of `from` into `to`: the first alone (it
    /// makes the environment's parents in the backend), the others in parallel, one
    /// blocking task each.
    async fn clone_volumes(
        &self,
        from: String,
        snap: String,
        to: String,
        vols: Vec<String>,
    ) -> Result<()> {
        let Some((first, rest)) = vols.split_first() else {
            return self
                .blocking(move |st| st.fork(&from, &snap, &to, &[]))
                .await;
        };
        let (f, s, n, v) = (from.clone(), snap.clone(), to.clone(), first.clone());
        self.blocking(move |st| st.fork(&f, &s, &n, &[v])).await?;
        futures::future::try_join_all(rest.iter().map(|v| {
            let (f, s, n, v) = (from.clone(), snap.clone(), to.clone(), v.clone());
            self.blocking(move |st| st.fork(&f, &s, &n, &[v]))
        }))
        .await?;
        Ok(())
    }

    /// Removes (SIGKILL, then remove with anonymous volumes) every container of
    /// `env_id`: the spec's services and any other container labelled with the
    /// environment (services removed from the spec, probes, helpers), all at once.
    async fn remove_service_containers(&self, env_id: &str, spec: &Spec) -> Result<()> {
        let mut names: Vec<String> = spec
            .services
            .iter()
            .map(|s| container_name(env_id, &s.name))
            .collect();
        // Each container once: two concurrent removals of one container conflict.
        let others: Vec<String> = self
            .managed_containers(Some(env_id))
            .await?
            .into_iter()
            .filter(|c| {
                !c.names
                    .iter()
                    .flatten()
                    .any(|n| names.iter().any(|m| n.trim_start_matches('/') == m))
            })
            .filter_map(|c| c.id)
            .collect();
        names.extend(others);
        futures::future::try_join_all(names.iter().map(|n| self.remove_container(n))).await?;
        Ok(())
    }

    /// Each service's image as its containers will be created: a service the version
    /// pinned runs exactly that id ([`Runtime::pinned_image`]); the others resolve their
    /// tag now, once ([`Runtime::ensure_image`]), so a retag later changes nothing.
    /// Nothing is created when an image is missing.
    async fn resolve_images(&self, spec: &Spec) -> Result<Resolved> {
        let t0 = Instant::now();
        let found = futures::future::try_join_all(spec.services.iter().map(|s| async move {
            if s.image_id.is_empty() {
                self.ensure_image(&s.image).await
            } else {
                self.pinned_image(&s.name, &s.image, &s.image_id).await
            }
        }))
        .await?;
        let mut run = spec.clone();
        let mut digests = BTreeMap::new();
        for (s, r) in run.services.iter_mut().zip(found) {
            digests.insert(s.name.clone(), r.digest);
            s.image_id = r.id;
        }
        Ok(Resolved {
            spec: run,
            digests,
            took: t0.elapsed(),
        })
    }

    /// Shared body of create / fork / rollback, for a spec whose images are resolved
    /// ([`Runtime::resolve_images`], which took `images`).
    async fn up(
        &self,
        env_id: &str,
        spec: &Spec,
        images: Duration,
        progress: &Progress,
        mode: Mode,
    ) -> Result<Up> {
        validate_name("environment id", env_id)?;
        for v in &spec.volumes {
            validate_name("volume", v)?;
        }
        if spec.services.is_empty() {
            return Err(RuntimeError::Invalid("compose: no services".into()));
        }
        let t0 = Instant::now();

        let order = start_order(spec)?;

        // Datasets.
        if mode == Mode::Create {
            say(
                progress,
                format!("preparing {} dataset(s)", spec.volumes.len()),
            );
        }
        // A fork set it before cloning (the clones are charged to it).
        if mode != Mode::Fork {
            self.apply_quota(env_id, spec).await?;
        }
        let paths = futures::future::try_join_all(spec.volumes.iter().map(|v| {
            let (e, n) = (env_id.to_string(), v.clone());
            self.blocking(move |st| st.create(&e, &n))
        }))
        .await?;
        let vol_paths: HashMap<String, PathBuf> = spec.volumes.iter().cloned().zip(paths).collect();
        let st = self.inner.storage.clone();
        let env_s = env_id.to_string();
        let compose = render_compose(
            env_id,
            spec,
            &move |v: &str| st.volume_path(&env_s, v),
            self.inner.host_cpus,
        );
        let dir = self.env_dir(env_id);
        write_env_files(&dir, spec, &compose)
            .map_err(|e| RuntimeError::io(format!("write {}", dir.display()), e))?;

        if mode != Mode::Rollback {
            self.remove_service_containers(env_id, spec).await?;
        }
        // The network, then its policy, before any container exists.
        let envnet = self.ensure_network(env_id, spec.egress).await?;
        self.apply_env_policy(&envnet).await?;
        let net = network_name(env_id);
        let dns = match (spec.egress, envnet.gateway) {
            (Egress::Deny, Some(gw)) => Some(vec![gw.to_string()]),
            _ => None,
        };
        // Images the clock cannot reach (musl, jemalloc) stay on the real clock (found
        // first: the offset below is fixed as late as possible).
        let clock_real = if spec.frozen_clock() && spec.world_instant_ms != 0 {
            self.uncovered_services(env_id, spec, progress).await?
        } else {
            BTreeMap::new()
        };
        // The clock's offset is fixed here, just before the containers exist: every
        // process of every service runs on this one offset from its start.
        let shared = Shared {
            dns,
            clock: self.prepare_clock(env_id, spec, progress)?,
            clock_real,
        };
        let clock_offset_ms = shared.clock.as_ref().map_or(0, |c| c.offset_ms);

        // Copy-up (create only), in start order so it follows Docker's "first mount
        // fills". A fork or rollback starts from the source's captured volumes, which
        // already went through it: no helper container there.
        for s in &order {
            for m in &s.volumes {
                let p = vol_paths.get(&m.name).ok_or_else(|| {
                    RuntimeError::Invalid(format!(
                        "service {:?} uses undeclared volume {:?}",
                        s.name, m.name
                    ))
                })?;
                if mode == Mode::Create {
                    self.copy_up(env_id, s, m, p).await?;
                }
            }
        }
        futures::future::try_join_all(
            order
                .iter()
                .map(|s| self.create_service_container(env_id, spec, s, &net, &shared, &vol_paths)),
        )
        .await?;

        say(
            progress,
            format!(
                "starting services ({} ms for images, datasets, network and containers)",
                (images + t0.elapsed()).as_millis()
            ),
        );
        self.start_services(env_id, spec, &order, mode == Mode::Create, progress)
            .await
            .map_err(|e| match &shared.clock {
                // Name the likely cause: a program libfaketime cannot run in (jemalloc
                // linked statically, an older glibc) hangs or exits at start.
                Some(_) => RuntimeError::Failed(format!(
                    "{e} (x-denv.clock: frozen preloads libfaketime into every service not \
                     listed as on the real clock; a program it cannot run in hangs or fails \
                     to start: see docs/reference/compose.md#clock)"
                )),
                None => e,
            })?;

        let mut endpoints = BTreeMap::new();
        for s in &spec.services {
            if let Some(p) = s.ports.first() {
                if let Some(hp) = self.host_port(env_id, &s.name, *p).await? {
                    endpoints.insert(s.name.clone(), format!("127.0.0.1:{hp}"));
                }
            }
        }

        // Any failure of the proof, including a probe that cannot run, stops the stack.
        let probe = match self.probe_env(env_id).await {
            Ok(p) => p,
            Err(e) => {
                // A service that died since it was ready is the cause, not the probe.
                let e = self.exited_service(env_id, spec).await.unwrap_or(e);
                self.stop_all(env_id, spec).await;
                return Err(e);
            }
        };
        // A service without a healthcheck counts as ready once it runs, so one that
        // exits at once can pass that check; by now (after the probe) it has exited.
        if let Some(e) = self.exited_service(env_id, spec).await {
            self.stop_all(env_id, spec).await;
            return Err(e);
        }
        self.clear_failure(env_id);
        say(progress, format!("healthy; egress {}", probe.egress));
        say(
            progress,
            format!(
                "egress probe: {} attempts in {} µs from {}",
                probe.attempts.len(),
                probe.took_us,
                probe.from
            ),
        );
        Ok(Up {
            endpoints,
            probe,
            clock_offset_ms,
            clock_real_services: shared.clock_real,
        })
    }

    /// The services of `spec` a frozen clock cannot reach, with why: their image has one
    /// of [`clock::uncovered_markers`] (`musl: <loader>`, `jemalloc: <library>`); they are
    /// left on the real clock. Each image is looked at once per sidecar process, through
    /// a container created from it and never started. A progress line names each one.
    async fn uncovered_services(
        &self,
        env_id: &str,
        spec: &Spec,
        progress: &Progress,
    ) -> Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for s in &spec.services {
            let image = run_image(s).to_string();
            let known = self
                .inner
                .uncovered_images
                .lock()
                .expect("clock check cache poisoned")
                .get(&image)
                .cloned();
            let found = match known {
                Some(f) => f,
                None => {
                    let f = self.uncovered_marker_in(env_id, s, &image).await?;
                    self.inner
                        .uncovered_images
                        .lock()
                        .expect("clock check cache poisoned")
                        .insert(image.clone(), f.clone());
                    f
                }
            };
            if let Some(why) = found {
                say(
                    progress,
                    format!(
                        "clock frozen: service {} stays on the real clock ({why}; libfaketime cannot run there)",
                        s.name
                    ),
                );
                out.insert(s.name.clone(), why);
            }
        }
        Ok(out)
    }

    /// The first of [`clock::uncovered_markers`] that `image` (service `s`'s) has, as
    /// `<kind>: <path>`: read through the archive API of a container created from it and
    /// never started.
    async fn uncovered_marker_in(
        &self,
        env_id: &str,
        s: &Service,
        image: &str,
    ) -> Result<Option<String>> {
        let helper = format!(
            "{}-clockcheck-{:08x}",
            project(env_id),
            rand::random::<u32>()
        );
        let labels = HashMap::from([
            ("denv.env".to_string(), env_id.to_string()),
            ("denv.managed".to_string(), "true".to_string()),
            (DATA_LABEL.to_string(), self.data_label()),
        ]);
        let mut hc = HostConfig {
            network_mode: Some("none".into()),
            memory: Some(64 << 20),
            pids_limit: Some(16),
            ..Default::default()
        };
        harden(&mut hc, Privilege::None);
        let ctx = || format!("clock check of service {:?}", s.name);
        self.inner
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: helper.clone(),
                    platform: None,
                }),
                Config {
                    image: Some(image.to_string()),
                    entrypoint: Some(vec!["/denv-clock-check-never-started".to_string()]),
                    labels: Some(labels),
                    host_config: Some(hc),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| RuntimeError::docker(ctx(), e))?;
        let mut r = Ok(None);
        for (path, kind) in clock::uncovered_markers() {
            let mut st = self.inner.docker.download_from_container(
                &helper,
                Some(bollard::container::DownloadFromContainerOptions { path: path.clone() }),
            );
            match st.next().await {
                Some(Ok(_)) => {
                    r = Ok(Some(format!("{kind}: {path}")));
                    break;
                }
                None
                | Some(Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404,
                    ..
                })) => {}
                Some(Err(e)) => {
                    r = Err(RuntimeError::docker(ctx(), e));
                    break;
                }
            }
        }
        let _ = self.remove_container(&helper).await;
        r
    }

    /// Fails when `spec` asks for a frozen clock and this host has no libfaketime: called
    /// before anything of the environment is created, cloned or stopped.
    fn require_clock(&self, spec: &Spec) -> Result<()> {
        if spec.frozen_clock() {
            clock::find_lib(self.inner.cfg.libfaketime.as_deref()).map_err(RuntimeError::Failed)?;
        }
        Ok(())
    }

    /// The clock of an environment about to start ([`clock`]). `x-denv.clock: frozen`
    /// with a snapshot's world instant ([`Spec::world_instant_ms`]; a fork, rollback or
    /// pool member) writes the environment's offset (world instant − real time now) and
    /// returns the mounts; a frozen-clock spec without one (a first deploy) runs on the
    /// real clock. Either frozen case needs libfaketime on the host and fails without it
    /// (`x-denv.clock: frozen needs libfaketime on this host …`), never falling back to
    /// the real clock. A real clock removes earlier clock files.
    fn prepare_clock(
        &self,
        env_id: &str,
        spec: &Spec,
        progress: &Progress,
    ) -> Result<Option<clock::Mounts>> {
        let dir = self.env_dir(env_id);
        let drop_files = |dir: &Path| {
            clock::remove_files(dir)
                .map_err(|e| RuntimeError::io(format!("remove {}", clock::dir(dir).display()), e))
        };
        if !spec.frozen_clock() {
            drop_files(&dir)?;
            return Ok(None);
        }
        let lib =
            clock::find_lib(self.inner.cfg.libfaketime.as_deref()).map_err(RuntimeError::Failed)?;
        if spec.world_instant_ms == 0 {
            drop_files(&dir)?;
            say(
                progress,
                "clock frozen: this start runs on the real clock (no snapshot yet); forks start at their snapshot's instant",
            );
            return Ok(None);
        }
        let offset = clock::offset_ms(spec.world_instant_ms, clock::real_now_ms());
        clock::write_files(&dir, offset).map_err(|e| {
            RuntimeError::io(format!("write {}", clock::spec_file(&dir).display()), e)
        })?;
        say(
            progress,
            format!(
                "clock frozen: starts at {} (offset {offset} ms, libfaketime {})",
                clock::rfc3339(spec.world_instant_ms),
                lib.display()
            ),
        );
        Ok(Some(clock::mounts(&dir, &lib, offset)))
    }

    /// Starts every service as soon as its dependencies meet their `depends_on`
    /// conditions (started; healthy for `service_healthy`; exited 0 for
    /// `service_completed_successfully`), so independent services start together, and
    /// waits until every service is done: ready ([`Runtime::wait_ready`]: its own
    /// healthcheck run by denvd, or running when it has none), or exited 0 for a service
    /// that another one waits to complete. The first failure ends the wait and is
    /// returned (`service "migrate" exited with code 3: <logs>`); services not yet
    /// started stay created. Each service's start and readiness are progress lines with
    /// their times (`db started in 210 ms`, `db ready 830 ms after its start`).
    async fn start_services(
        &self,
        env_id: &str,
        spec: &Spec,
        order: &[&Service],
        first_start: bool,
        progress: &Progress,
    ) -> Result<()> {
        use futures::future::{BoxFuture, FutureExt, Shared};
        // Each step resolves to the instant it finished.
        type Step = Shared<BoxFuture<'static, Result<Instant, Arc<RuntimeError>>>>;
        let one_shot = one_shot_services(spec);
        let mut started: HashMap<String, Step> = HashMap::new();
        let mut done: HashMap<String, Step> = HashMap::new();
        for s in order {
            let deps: Vec<Step> = s
                .depends_on
                .iter()
                .filter_map(|d| {
                    match s.depends_on_condition.get(d).map(String::as_str) {
                        Some(denv_compose::SERVICE_HEALTHY)
                        | Some(denv_compose::SERVICE_COMPLETED_SUCCESSFULLY) => done.get(d),
                        _ => started.get(d),
                    }
                    .cloned()
                })
                .collect();
            let (rt, env, name) = (self.clone(), env_id.to_string(), s.name.clone());
            let p = progress.clone();
            let start = async move {
                futures::future::try_join_all(deps).await?;
                let cname = container_name(&env, &name);
                let t = Instant::now();
                rt.inner
                    .docker
                    .start_container::<String>(&cname, None)
                    .await
                    .map_err(|e| {
                        Arc::new(RuntimeError::docker(format!("start service {name:?}"), e))
                    })?;
                say(
                    &p,
                    format!("{name} started in {} ms", t.elapsed().as_millis()),
                );
                Ok(Instant::now())
            }
            .boxed()
            .shared();
            let (rt, env, name) = (self.clone(), env_id.to_string(), s.name.clone());
            let (st, once) = (start.clone(), one_shot.contains(&s.name));
            let p = progress.clone();
            let finish = async move {
                let since = st.await?;
                if once {
                    rt.wait_completed(&env, &name).await.map_err(Arc::new)?;
                    say(
                        &p,
                        format!(
                            "{name} completed {} ms after its start",
                            since.elapsed().as_millis()
                        ),
                    );
                } else {
                    rt.wait_service(&env, &name, true, first_start)
                        .await
                        .map_err(Arc::new)?;
                    say(
                        &p,
                        format!(
                            "{name} ready {} ms after its start",
                            since.elapsed().as_millis()
                        ),
                    );
                }
                Ok(Instant::now())
            }
            .boxed()
            .shared();
            started.insert(s.name.clone(), start);
            done.insert(s.name.clone(), finish);
        }
        let all = order.iter().map(|s| done[s.name.as_str()].clone());
        futures::future::try_join_all(all)
            .await
            .map(|_| ())
            .map_err(|e| Arc::try_unwrap(e).unwrap_or_else(|e| RuntimeError::Failed(e.to_string())))
    }

    /// Waits (up to [`COMPLETE_TIMEOUT`], checking every 50 ms) until a service's
    /// container has exited with code 0. Errors: `service "x" exited with code N: <logs>`,
    /// `service "x" did not complete within 600s`.
    async fn wait_completed(&self, env_id: &str, service: &str) -> Result<()> {
        let cname = container_name(env_id, service);
        let deadline = Instant::now() + COMPLETE_TIMEOUT;
        loop {
            let Some(c) = self.inspect(&cname).await? else {
                return fail(format!("service {service:?}: container {cname} is gone"));
            };
            let st = c.state.unwrap_or_default();
            if st.running != Some(true)
                && matches!(
                    st.status,
                    Some(bollard::models::ContainerStateStatusEnum::EXITED)
                        | Some(bollard::models::ContainerStateStatusEnum::DEAD)
                )
            {
                if st.exit_code == Some(0) {
                    return Ok(());
                }
                return Err(self.exit_error(service, &cname, &st).await);
            }
            if Instant::now() >= deadline {
                return fail(format!(
                    "service {service:?} did not complete within {}s",
                    COMPLETE_TIMEOUT.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The first service of `spec` (one another waits to complete excepted) whose
    /// container has exited or is dead, as the error a start reports for it:
    /// `service "db" exited with code 7: <last log lines>`.
    async fn exited_service(&self, env_id: &str, spec: &Spec) -> Option<RuntimeError> {
        use bollard::models::ContainerStateStatusEnum as S;
        let one_shot = one_shot_services(spec);
        for s in spec.services.iter().filter(|s| !one_shot.contains(&s.name)) {
            let cname = container_name(env_id, &s.name);
            let Ok(Some(c)) = self.inspect(&cname).await else {
                continue;
            };
            let st = c.state.unwrap_or_default();
            if matches!(st.status, Some(S::EXITED) | Some(S::DEAD)) {
                return Some(self.exit_error(&s.name, &cname, &st).await);
            }
        }
        None
    }

    /// Sets the environment's volume quota in the storage backend (btrfs qgroup, zfs
    /// quota; nothing on `dir`) before its volumes are created or cloned.
    async fn apply_quota(&self, env_id: &str, spec: &Spec) -> Result<()> {
        let (e, bytes) = (env_id.to_string(), disk_bytes(spec));
        self.blocking(move |st| st.set_quota(&e, bytes)).await
    }

    /// Waits until `service` is ready (see `wait_ready` in `docker.rs`). On a
    /// `first_start` (a create: its volumes were empty) a passing healthcheck must keep
    /// passing for the check's `interval` (at least 1 s, at most 2 s): images such as
    /// PostgreSQL's initialise an empty volume under a temporary server that answers the
    /// check and is then stopped before the real one starts.
    async fn wait_service(
        &self,
        env_id: &str,
        service: &str,
        fail_fast: bool,
        first_start: bool,
    ) -> Result<()> {
        let cname = container_name(env_id, service);
        let hc = self
            .inspect(&cname)
            .await?
            .and_then(|c| c.config)
            .and_then(|c| c.healthcheck);
        let timeout = if fail_fast {
            ready_timeout(hc.as_ref())
        } else {
            UNPAUSE_HEALTH_TIMEOUT
        };
        let settle = if first_start {
            let interval = hc
                .as_ref()
                .and_then(|h| h.interval)
                .filter(|i| *i > 0)
                .map(|i| Duration::from_nanos(i as u64))
                .unwrap_or(Duration::from_secs(30));
            interval.clamp(Duration::from_secs(1), Duration::from_secs(2))
        } else {
            Duration::ZERO
        };
        self.wait_ready(service, &cname, timeout, fail_fast, settle)
            .await
    }

    async fn host_port(&self, env_id: &str, service: &str, port: u16) -> Result<Option<String>> {
        let c = self.inspect(&container_name(env_id, service)).await?;
        Ok(c.and_then(|c| c.network_settings)
            .and_then(|n| n.ports)
            .and_then(|p| p.get(&format!("{port}/tcp")).cloned().flatten())
            .and_then(|b| b.into_iter().find_map(|b| b.host_port))
            .filter(|p| !p.is_empty()))
    }

    async fn stop_all(&self, env_id: &str, spec: &Spec) {
        for s in &spec.services {
            let _ = self
                .inner
                .docker
                .stop_container(
                    &container_name(env_id, &s.name),
                    Some(StopContainerOptions { t: 5 }),
                )
                .await;
        }
    }

    async fn create_service_container(
        &self,
        env_id: &str,
        spec: &Spec,
        s: &Service,
        net: &str,
        shared: &Shared,
        vol_paths: &HashMap<String, PathBuf>,
    ) -> Result<()> {
        let cname = container_name(env_id, &s.name);
        let (mem, pids, cpus) = caps(&s.resources, self.inner.host_cpus);
        let mut exposed = HashMap::new();
        let mut bindings = HashMap::new();
        for p in &s.ports {
            exposed.insert(format!("{p}/tcp"), HashMap::new());
            bindings.insert(
                format!("{p}/tcp"),
                Some(vec![PortBinding {
                    host_ip: Some("127.0.0.1".into()),
                    host_port: None,
                }]),
            );
        }
        let mut binds: Vec<String> = s
            .volumes
            .iter()
            .map(|m| {
                format!(
                    "{}:{}{}",
                    vol_paths[&m.name].display(),
                    m.path,
                    if m.read_only { ":ro" } else { "" }
                )
            })
            .collect();
        let clock = shared
            .clock
            .as_ref()
            .filter(|_| !shared.clock_real.contains_key(&s.name));
        if let Some(c) = clock {
            binds.extend(c.binds.iter().cloned());
        }
        let labels = HashMap::from([
            ("denv.env".to_string(), env_id.to_string()),
            ("denv.service".to_string(), s.name.clone()),
            ("denv.managed".to_string(), "true".to_string()),
            ("com.docker.compose.project".to_string(), project(env_id)),
            ("com.docker.compose.service".to_string(), s.name.clone()),
            (DATA_LABEL.to_string(), self.data_label()),
        ]);
        let healthcheck = s.health.as_ref().map(|h| HealthConfig {
            test: Some(h.test.clone()),
            interval: Some((h.interval_ms as i64) * 1_000_000),
            retries: Some(h.retries as i64),
            ..Default::default()
        });
        let mut host_config = HostConfig {
            memory: Some(mem),
            memory_swap: Some(mem),
            pids_limit: Some(pids),
            nano_cpus: Some((cpus * 1e9) as i64),
            binds: if binds.is_empty() { None } else { Some(binds) },
            port_bindings: if bindings.is_empty() {
                None
            } else {
                Some(bindings)
            },
            network_mode: Some(net.to_string()),
            dns: shared.dns.clone(),
            ..Default::default()
        };
        let is_agent = spec.agent.as_ref().is_some_and(|a| a.service == s.name);
        harden(
            &mut host_config,
            if is_agent {
                Privilege::None
            } else {
                Privilege::Service(&s.cap_add)
            },
        );
        if self.inner.layer_quota {
            host_config.storage_opt = Some(HashMap::from([(
                "size".to_string(),
                disk_bytes(spec).to_string(),
            )]));
        }
        let cfg = Config {
            image: Some(run_image(s).to_string()),
            env: Some(match clock {
                Some(c) => clock::merge_env(&s.env, c),
                None => s.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            }),
            cmd: if s.command.is_empty() {
                None
            } else {
                Some(s.command.clone())
            },
            user: if s.user.is_empty() {
                None
            } else {
                Some(s.user.clone())
            },
            labels: Some(labels),
            healthcheck,
            exposed_ports: if exposed.is_empty() {
                None
            } else {
                Some(exposed)
            },
            host_config: Some(host_config),
            networking_config: Some(NetworkingConfig {
                endpoints_config: HashMap::from([(
                    net.to_string(),
                    EndpointSettings {
                        aliases: Some(vec![s.name.clone()]),
                        ..Default::default()
                    },
                )]),
            }),
            ..Default::default()
        };
        self.inner
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: cname.clone(),
                    platform: None,
                }),
                cfg,
            )
            .await
            .map_err(|e| RuntimeError::docker(format!("create service {:?}", s.name), e))?;
        Ok(())
    }

    /// Docker's named-volume semantics: an empty volume is filled from the image's
    /// content at its mount path (ownership, modes, links kept). Done with a helper
    /// container that is created, never started, read through the archive API, and
    /// removed; the tar is unpacked with GNU tar inside the dataset (same file system).
    async fn copy_up(&self, env_id: &str, s: &Service, m: &VolumeMount, dest: &Path) -> Result<()> {
        let d = dest.to_path_buf();
        if !on_fs(move || Ok(dir_is_empty(&d))).await.unwrap_or(false) {
            return Ok(());
        }
        let helper = format!("{}-copyup-{:08x}", project(env_id), rand::random::<u32>());
        let labels = HashMap::from([
            ("denv.env".to_string(), env_id.to_string()),
            ("denv.managed".to_string(), "true".to_string()),
            (DATA_LABEL.to_string(), self.data_label()),
        ]);
        self.inner
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: helper.clone(),
                    platform: None,
                }),
                Config {
                    image: Some(run_image(s).to_string()),
                    entrypoint: Some(vec!["/denv-copy-up-never-started".to_string()]),
                    labels: Some(labels),
                    host_config: Some({
                        let mut hc = HostConfig {
                            network_mode: Some("none".into()),
                            memory: Some(64 << 20),
                            pids_limit: Some(16),
                            ..Default::default()
                        };
                        harden(&mut hc, Privilege::None);
                        hc
                    }),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| RuntimeError::docker(format!("copy-up for volume {:?}", m.name), e))?;
        let r = self.copy_up_from(&helper, m, dest).await;
        let _ = self.remove_container(&helper).await;
        if !r? {
            // The image has nothing at the mount path, so Docker would leave a root-owned
            // 0755 directory that a non-root service cannot write to. Give the empty
            // volume to the service's numeric user instead (a named user is not resolved).
            if let Some((uid, gid)) = numeric_user(&s.user) {
                let d = dest.to_path_buf();
                on_fs(move || std::os::unix::fs::chown(d, Some(uid), Some(gid.unwrap_or(uid))))
                    .await
                    .map_err(|e| {
                        RuntimeError::io(format!("chown of volume {:?} to {}", m.name, s.user), e)
                    })?;
            }
        }
        Ok(())
    }

    /// Fills `dest` from the image's content at the mount path; `false` when the image
    /// has nothing there.
    async fn copy_up_from(&self, helper: &str, m: &VolumeMount, dest: &Path) -> Result<bool> {
        let ctx = |e: std::io::Error| {
            RuntimeError::io(format!("copy-up of {} into volume {:?}", m.path, m.name), e)
        };
        let staging = dest.join(format!(".denv-copyup-{:08x}", rand::random::<u32>()));
        let st = staging.clone();
        on_fs(move || std::fs::create_dir(st)).await.map_err(ctx)?;
        let mut s = self.inner.docker.download_from_container(
            helper,
            Some(bollard::container::DownloadFromContainerOptions {
                path: m.path.clone(),
            }),
        );
        let mut child = tokio::process::Command::new("tar")
            .args([
                "-x",
                "-p",
                "--same-owner",
                "--numeric-owner",
                "-f",
                "-",
                "-C",
            ])
            .arg(&staging)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(ctx)?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        let mut missing = false;
        let mut err = None;
        while let Some(chunk) = s.next().await {
            match chunk {
                Ok(b) => {
                    if let Err(e) = stdin.write_all(&b).await {
                        err = Some(ctx(e));
                        break;
                    }
                }
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => {
                    missing = true;
                    break;
                }
                Err(e) => {
                    err = Some(RuntimeError::docker(
                        format!("copy-up of {} for volume {:?}", m.path, m.name),
                        e,
                    ));
                    break;
                }
            }
        }
        drop(stdin);
        let out = child.wait_with_output().await.map_err(ctx)?;
        let failed = if let Some(e) = err {
            Some(Err(e))
        } else if missing {
            // The image has nothing at the mount path: the volume stays empty.
            Some(Ok(false))
        } else if !out.status.success() {
            Some(fail(format!(
                "copy-up of {} into volume {:?}: tar: {}",
                m.path,
                m.name,
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        } else {
            None
        };
        if let Some(r) = failed {
            let st = staging.clone();
            let _ = on_fs(move || std::fs::remove_dir_all(st)).await;
            return r;
        }
        let base = Path::new(&m.path)
            .file_name()
            .map(|b| b.to_os_string())
            .unwrap_or_default();
        let root = staging.join(&base);
        let dest = dest.to_path_buf();
        on_fs(move || {
            let r = (|| -> std::io::Result<()> {
                let meta = std::fs::symlink_metadata(&root)?;
                if meta.is_dir() {
                    for e in std::fs::read_dir(&root)? {
                        let e = e?;
                        std::fs::rename(e.path(), dest.join(e.file_name()))?;
                    }
                    std::os::unix::fs::chown(&dest, Some(meta.uid()), Some(meta.gid()))?;
                    std::fs::set_permissions(&dest, meta.permissions())?;
                }
                Ok(())
            })();
            let _ = std::fs::remove_dir_all(&staging);
            r
        })
        .await
        .map_err(ctx)
        .map(|()| true)
    }

    /// `env.snapshot`: checkpoints recognised databases (PostgreSQL `CHECKPOINT`, Redis
    /// `SAVE`, MySQL/MariaDB `FLUSH TABLES`; best effort, reported as progress), pauses
    /// every running container that is not already paused, captures every volume under
    /// `name`, unpauses every paused service container except `keep_paused`, and waits
    /// up to 90 s for the unpaused ones to be healthy again. `frozen_for` runs from the
    /// first pause to the last unpause. A failure during the capture still unpauses.
    pub async fn snapshot(
        &self,
        env_id: &str,
        name: &str,
        keep_paused: &[String],
        progress: &Progress,
    ) -> Result<SnapshotResult> {
        let _g = self.lock_env(env_id).await;
        validate_name("snapshot name", name)?;
        let spec = self.saved_spec(env_id).await?;
        if self.inner.storage.has_snapshot(env_id, name) {
            return Err(RuntimeError::Conflict(format!(
                "snapshot {name:?} of {env_id} already exists"
            )));
        }
        let mut running = Vec::new();
        // Init process of every running container: their process groups are the writers
        // frozen below (`None` when one is unknown: storage then looks at every process).
        let mut inits: Option<Vec<u32>> = Some(Vec::new());
        for s in &spec.services {
            let cname = container_name(env_id, &s.name);
            let Some(c) = self.inspect(&cname).await? else {
                continue;
            };
            let st = c.state.unwrap_or_default();
            if st.running == Some(true) {
                match (inits.as_mut(), st.pid.and_then(|p| u32::try_from(p).ok())) {
                    (Some(v), Some(p)) if p > 0 => v.push(p),
                    _ => inits = None,
                }
            }
            if st.running == Some(true) && st.paused != Some(true) {
                self.checkpoint(s, &cname, progress).await;
                running.push(s.name.clone());
            }
        }
        // Work done while the services still run (`dir`: a pre-copy; `btrfs`: a commit),
        // so the frozen window only covers what changes from here on.
        let (e, n, vols) = (env_id.to_string(), name.to_string(), spec.volumes.clone());
        let t_pre = Instant::now();
        if let Err(e) = self
            .blocking(move |st| st.prepare_snapshot(&e, &n, &vols))
            .await
        {
            tracing::warn!("prepare snapshot {name} of {env_id}: {e}");
        }
        say(
            progress,
            format!(
                "prepared the capture in {} ms; freezing {} service(s)",
                ms(t_pre.elapsed()),
                running.len()
            ),
        );
        let t0 = Instant::now();
        // The world's clock at the freeze: what the snapshot's forks start at.
        let clock_offset_ms = clock::current_offset_ms(&self.env_dir(env_id));
        let world_instant_ms = clock::world_ms(clock::real_now_ms(), clock_offset_ms);
        let mut consistent = true;
        for s in &running {
            let cname = container_name(env_id, s);
            if let Err(e) = self.inner.docker.pause_container(&cname).await {
                tracing::warn!("pause {cname}: {e}");
                consistent = false;
            }
        }
        let paused_in = ms(t0.elapsed());
        let t_cap = Instant::now();
        let (e, n, vols) = (env_id.to_string(), name.to_string(), spec.volumes.clone());
        let captured = self
            .blocking(move |st| {
                let writers = inits.and_then(|v| {
                    v.iter()
                        .map(|p| crate::storage::delta::cgroup_pids_of(*p))
                        .collect::<Option<Vec<_>>>()
                        .map(|g| g.concat())
                });
                st.snapshot_frozen(&e, &n, &vols, writers.as_deref())
            })
            .await;
        let captured_in = ms(t_cap.elapsed());
        let mut unpaused = Vec::new();
        for s in &spec.services {
            if keep_paused.contains(&s.name) {
                continue;
            }
            let cname = container_name(env_id, &s.name);
            if let Some(c) = self.inspect(&cname).await? {
                if c.state.and_then(|s| s.paused) == Some(true) {
                    self.inner
                        .docker
                        .unpause_container(&cname)
                        .await
                        .map_err(|e| {
                            RuntimeError::docker(format!("unpause service {:?}", s.name), e)
                        })?;
                    unpaused.push(s.name.clone());
                }
            }
        }
        let frozen_for = ms(t0.elapsed());
        let datasets = captured?;
        let sp = self.snapshot_spec_path(env_id, name);
        // A rollback to this snapshot restarts a frozen clock at its world instant.
        let mut spec = spec;
        spec.world_instant_ms = world_instant_ms;
        let json = serde_json::to_vec_pretty(&spec)
            .map_err(|e| RuntimeError::Failed(format!("spec of snapshot {name}: {e}")))?;
        let write = async {
            tokio::fs::create_dir_all(sp.parent().unwrap_or(&sp)).await?;
            tokio::fs::write(&sp, json).await
        };
        write
            .await
            .map_err(|e| RuntimeError::io(sp.display().to_string(), e))?;
        say(
            progress,
            format!(
                "captured {} dataset(s); frozen for {frozen_for} ms (pause {paused_in} ms, \
                 capture {captured_in} ms, unpause {} ms); checking health",
                datasets.len(),
                frozen_for.saturating_sub(paused_in + captured_in)
            ),
        );
        // One immediate check per unpaused service (Docker would report `unhealthy`
        // until its next interval; its status is not consulted here).
        futures::future::try_join_all(
            unpaused
                .iter()
                .map(|s| self.wait_service(env_id, s, false, false)),
        )
        .await?;
        Ok(SnapshotResult {
            snapshot: name.to_string(),
            datasets,
            frozen_for,
            consistent,
            world_instant_ms,
            clock_offset_ms,
        })
    }

    /// Best-effort database checkpoint before the freeze.
    async fn checkpoint(&self, s: &Service, cname: &str, progress: &Progress) {
        let hay = format!("{} {}", s.image, s.command.join(" ")).to_lowercase();
        let (what, cmd): (&str, Vec<String>) = if hay.contains("postgres") {
            (
                "postgres CHECKPOINT",
                ["psql", "-U", "postgres", "-c", "CHECKPOINT"]
                    .map(String::from)
                    .to_vec(),
            )
        } else if hay.contains("redis") {
            (
                "redis SAVE",
                ["redis-cli", "SAVE"].map(String::from).to_vec(),
            )
        } else if hay.contains("mysql") || hay.contains("mariadb") {
            (
                "mysql FLUSH TABLES",
                [
                    "sh",
                    "-c",
                    "mysql -uroot ${MYSQL_ROOT_PASSWORD:+-p$MYSQL_ROOT_PASSWORD} -e 'FLUSH TABLES'",
                ]
                .map(String::from)
                .to_vec(),
            )
        } else {
            return;
        };
        match self
            .exec_raw(cname, &cmd, None, vec![], Duration::from_secs(60))
            .await
        {
            Ok(r) if r.exit_code == 0 => say(progress, format!("{what} in {}", s.name)),
            Ok(r) => say(
                progress,
                format!(
                    "{what} in {} failed (exit {}): {}",
                    s.name,
                    r.exit_code,
                    tail(String::from_utf8_lossy(&r.stderr).trim(), 300)
                ),
            ),
            Err(e) => say(progress, format!("{what} in {} failed: {e}", s.name)),
        }
    }

    /// `env.destroy`: removes every container of the environment (service containers,
    /// helpers, verifiers; paused ones are unpaused first), its network and the network's
    /// policy (rules, DNS refuser), its volumes and snapshots (storage backend), and `<data>/envs/<env>`. Idempotent:
    /// destroying an unknown environment succeeds. Forks of its snapshots keep working
    /// (see the storage backends).
    pub async fn destroy(&self, env_id: &str) -> Result<DestroyResult> {
        let _g = self.lock_env(env_id).await;
        self.destroy_locked(env_id).await
    }

    /// [`Runtime::destroy`] with the environment's lock already held.
    pub(crate) async fn destroy_locked(&self, env_id: &str) -> Result<DestroyResult> {
        validate_name("environment id", env_id)?;
        let spec = self.saved_spec(env_id).await.unwrap_or_default();
        self.remove_service_containers(env_id, &spec).await?;
        let envnet = self.env_network(env_id).await?;
        self.remove_network(&network_name(env_id)).await?;
        let bridge = match envnet {
            Some(n) => n.bridge,
            None => super::bridge_name(env_id),
        };
        self.remove_env_policy(&bridge).await;
        let e = env_id.to_string();
        self.blocking(move |st| st.destroy(&e)).await?;
        let dir = self.env_dir(env_id);
        crate::storage::remove_tree(&dir)?;
        Ok(DestroyResult {
            destroyed: env_id.to_string(),
        })
    }
}

/// `uid[:gid]` when both parts are numeric (`"1000:1000"` → `(1000, Some(1000))`).
fn numeric_user(user: &str) -> Option<(u32, Option<u32>)> {
    let mut parts = user.trim().splitn(2, ':');
    let uid = parts.next()?.trim().parse().ok()?;
    let gid = match parts.next() {
        Some(g) => Some(g.trim().parse().ok()?),
        None => None,
    };
    Some((uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, deps: &[&str]) -> Service {
        Service {
            name: name.into(),
            image: "busybox:1.36".into(),
            depends_on: deps.iter().map(|d| d.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn order_respects_depends_on() {
        let spec = Spec {
            services: vec![
                svc("api", &["db", "cache"]),
                svc("cache", &[]),
                svc("db", &["cache"]),
            ],
            ..Default::default()
        };
        let o: Vec<&str> = start_order(&spec)
            .unwrap()
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(o, ["cache", "db", "api"]);
    }

    #[test]
    fn cycle_is_an_error() {
        let spec = Spec {
            services: vec![svc("a", &["b"]), svc("b", &["a"])],
            ..Default::default()
        };
        let e = start_order(&spec).unwrap_err().to_string();
        assert_eq!(e, "depends_on cycle among services: a, b");
    }

    #[test]
    fn caps_defaults_and_clamp() {
        let r = Resources {
            memory_mb: 0,
            pids: 0,
            cpus: 0.0,
        };
        assert_eq!(caps(&r, 8.0), (4096 << 20, 2048, 2.0));
        let r = Resources {
            memory_mb: 512,
            pids: 64,
            cpus: 4.0,
        };
        assert_eq!(caps(&r, 2.0), (512 << 20, 64, 1.5));
        assert_eq!(caps(&Resources::default(), 2.0), (4096 << 20, 2048, 1.5));
    }

    #[test]
    fn timeout_from_health() {
        assert_eq!(ready_timeout(None), Duration::from_secs(60));
        let h = HealthConfig {
            interval: Some(10_000_000_000),
            retries: Some(10),
            ..Default::default()
        };
        assert_eq!(ready_timeout(Some(&h)), Duration::from_secs(130));
    }
}
