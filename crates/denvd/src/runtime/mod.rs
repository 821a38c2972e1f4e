//! The sidecar's engine: runs environments on the local Docker Engine through bollard
//! (no `docker compose` CLI), keeps their volumes in a [storage backend](crate::storage),
//! and implements every environment command of `15-ref-protocol.md`.
//!
//! One [`Runtime`] per sidecar process; it is cheap to clone and safe to share between
//! tasks. Lifecycle commands on one environment (create, fork into it, rollback, snapshot,
//! destroy, verify) are serialised by an internal per-environment lock; execs and file
//! transfers take no runtime lock (the [journal](crate::journal) runs them together and
//! keeps lifecycle commands apart from them).
//!
//! What runs, per environment `<env>` (lower-cased as `<lc>`):
//!
//! - a bridge network `<lc>_default` whose interface is named [`bridge_name`] and whose
//!   policy (egress `deny` or `allow`) denvd keeps in the host's packet filter, applied
//!   before any container starts (`netpolicy.rs`); under `deny` every container gets the
//!   network's gateway as its DNS server, where only denvd's refusing responder answers;
//! - one container per service named `<lc>-<service>-1`, labelled `denv.env=<env>`,
//!   `denv.service=<service>`, `denv.managed=true`, with the service name as network alias,
//!   memory/pids/CPU caps (memory swap = memory, so a memory hog is OOM-killed), the
//!   containment of [`contain`] (no-new-privileges, capabilities, log cap, nofile; a
//!   writable-layer size limit when the engine's storage driver allows one), the
//!   healthcheck from the spec, and each named volume bind-mounted from its dataset
//!   directory (an empty dataset is first filled from the image's content at the mount
//!   path, as Docker does for named volumes);
//! - each service's ports published on `127.0.0.1:<ephemeral>` (under either egress);
//! - after health, the egress probe from inside the environment's network namespace
//!   (`egress.rs`).
//!
//! On disk: `<data>/envs/<env>/spec.json` (the spec, so rollback works after a restart)
//! and `<data>/envs/<env>/compose.yaml` (an equivalent compose file for humans, with the
//! seccomp profile beside it in `seccomp.json`).
//!
//! Errors name the service, path or volume and carry Docker's own message.

mod build;
pub mod clock;
mod contain;
mod docker;
mod egress;
mod files;
mod iptables;
mod load;
mod logs;
mod netpolicy;
pub mod refuser;
mod render;
pub mod seccomp;
mod ship;
mod stack;
mod ttl;
mod watch;

pub use build::{BuildOutcome, BuildRequest, BUILD_MEMORY_BYTES, BUILD_TIMEOUT, LOG_TAIL_LINES};
pub(crate) use contain::{harden, Privilege};
pub use contain::{
    max_cpus, CPU_RESERVE, LOG_MAX_FILES, LOG_MAX_SIZE_BYTES, NOFILE_LIMIT, SERVICE_CAPS,
};
pub(crate) use docker::tail as docker_tail;
pub use docker::{health_argv, READY_FAST_FOR, READY_POLL, READY_POLL_SLOW, READY_SLOT_WAIT};
pub use egress::{
    parse_target, EgressProbe, ProbeAttempt, CANARY_HOST_IP, CANARY_IP, CANARY_NETNS,
    CONNECT_TIMEOUT, METADATA,
};
pub use files::GET_LIMIT;
pub use load::{free_disk_bytes, held, measure, Held, Load};
pub use logs::{LogsOptions, LogsSummary, DEFAULT_MAX_BYTES};
pub use netpolicy::{
    bridge_name, owner_table, owner_tag, BRIDGE_OPTION, DNS_MARK, EGRESS_LABEL, LOCK_PATH,
    OWNER_LABEL, TABLE,
};
pub use render::render_compose;
pub use ship::{check_image_id, ImagesOutcome, ReceiveOutcome, CHANNEL_CHUNKS, CHUNK_BYTES};
pub use ttl::{Expired, EXPIRES_FILE, REAP_EVERY};
pub use watch::EnvFailure;

use crate::storage::{BtrfsStorage, DirStorage, Storage, StorageError, ZfsStorage};
use bollard::Docker;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

/// Progress lines for the command's `progress` frames, e.g. `healthy; egress denied
/// (verified)`, `freezing agent service box`, `checking the copy`, `grading in
/// busybox:1.36`. Send failures (nobody listening) are ignored.
pub type Progress = tokio::sync::mpsc::UnboundedSender<String>;

pub(crate) fn say(p: &Progress, msg: impl Into<String>) {
    let m = msg.into();
    tracing::info!(target: "denvd::runtime", "{m}");
    let _ = p.send(m);
}

/// Which storage backend holds the volumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageKind {
    /// Plain directories, recursive copies (reflinks where possible).
    Dir,
    /// Subvolumes on a btrfs data directory.
    Btrfs,
    /// Datasets in this ZFS pool.
    Zfs {
        /// Pool name (`--zfs-pool` / `DENV_ZFS_POOL`).
        pool: String,
    },
}

/// How the runtime is set up.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Data directory (`--data`, default `/var/lib/denv`); layout in `11-ref-denvd.md`.
    pub data_dir: PathBuf,
    /// Storage backend for volumes.
    pub storage: StorageKind,
    /// Public address the egress probe tries under `deny`, last and only once every
    /// other attempt was stopped (an IP literal: `http://1.1.1.1/`, `1.1.1.1:80`; the
    /// probe resolves no names). Default `http://1.1.1.1/`. Never contacted under
    /// `allow`.
    pub egress_probe_target: String,
    /// Ports the egress probe tries on every address of the host besides the runtime's
    /// own sentinel (e.g. the control plane's). Default none.
    pub egress_probe_ports: Vec<u16>,
    /// The packet filter for the network policy: `auto` (nftables when usable, else
    /// iptables), `nftables` or `iptables`. Default `DENV_PACKET_FILTER`, else `auto`.
    pub packet_filter: String,
    /// The host's `libfaketime.so.1` for `x-denv.clock: frozen`; `None` looks in
    /// [`clock::LIB_CANDIDATES`] each time a frozen-clock environment starts. Default
    /// `DENV_LIBFAKETIME` ([`clock::lib_from_env`]).
    pub libfaketime: Option<PathBuf>,
}

impl RuntimeConfig {
    /// Defaults for everything but the data directory: `dir` storage, public target
    /// `http://1.1.1.1/`, no extra host ports, the packet filter of `DENV_PACKET_FILTER`
    /// (`auto` when unset).
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        RuntimeConfig {
            data_dir: data_dir.into(),
            storage: StorageKind::Dir,
            egress_probe_target: "http://1.1.1.1/".into(),
            egress_probe_ports: Vec::new(),
            packet_filter: std::env::var("DENV_PACKET_FILTER").unwrap_or_default(),
            libfaketime: clock::lib_from_env(),
        }
    }
}

/// A runtime error. `Display` is the message sent as the command result's `error`;
/// [`RuntimeError::code`] its `code`.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A failed operation with a message naming the service, path or volume.
    #[error("{0}")]
    Failed(String),
    /// What the command names is not on this host: the environment, a service of it, a
    /// snapshot, an image.
    #[error("{0}")]
    NotFound(String),
    /// What the command would make exists already.
    #[error("{0}")]
    Conflict(String),
    /// Over a size limit (an `env.get` archive above 32 MiB).
    #[error("{0}")]
    TooLarge(String),
    /// A malformed argument: an id, a time, an exec option.
    #[error("{0}")]
    Invalid(String),
    /// A Docker Engine call failed; `message` is Docker's own message.
    #[error("{context}: {message}")]
    Docker {
        /// What was being done (`create container box`, `start service db`, …).
        context: String,
        /// Docker's message (for server errors, without bollard's status prefix).
        message: String,
        /// HTTP status from the Engine, when it answered.
        status: Option<u16>,
        /// The Engine could not be reached at all (no socket, connection refused or
        /// reset): see [`engine_unreachable`].
        unreachable: bool,
    },
    /// A storage backend failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A file system error on the host.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the path.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl RuntimeError {
    pub(crate) fn docker(context: impl Into<String>, e: bollard::errors::Error) -> Self {
        let unreachable = engine_unreachable(&e);
        let (message, status) = match e {
            bollard::errors::Error::DockerResponseServerError {
                status_code,
                message,
            } => (message.trim().to_string(), Some(status_code)),
            other => (other.to_string(), None),
        };
        RuntimeError::Docker {
            context: context.into(),
            message,
            status,
            unreachable,
        }
    }

    /// The command result's code for this error (`HostErrorCode`): the variant's, a
    /// storage error's own, `UNAVAILABLE` for an Engine that cannot be reached, and
    /// `FAILED` for every other Engine or file system error. An Engine's 404 stays
    /// `FAILED`: where a missing container or image means the command's subject is not
    /// here, the runtime says so itself ([`RuntimeError::NotFound`]).
    pub fn code(&self) -> denv_proto::v1::HostErrorCode {
        use denv_proto::v1::HostErrorCode as C;
        match self {
            RuntimeError::NotFound(_) => C::NotFound,
            RuntimeError::Conflict(_) => C::Conflict,
            RuntimeError::TooLarge(_) => C::TooLarge,
            RuntimeError::Invalid(_) => C::Invalid,
            RuntimeError::Storage(e) => e.code(),
            RuntimeError::Docker {
                unreachable: true, ..
            } => C::Unavailable,
            RuntimeError::Failed(_) | RuntimeError::Docker { .. } | RuntimeError::Io { .. } => {
                C::Failed
            }
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        RuntimeError::Io {
            context: context.into(),
            source,
        }
    }

    /// The Engine's HTTP status when this is a Docker error (404 = not found, …).
    pub fn docker_status(&self) -> Option<u16> {
        match self {
            RuntimeError::Docker { status, .. } => *status,
            _ => None,
        }
    }
}

/// Whether a Docker client error means the Engine could not be reached at all: its
/// socket is missing, or connecting to it was refused or reset (found anywhere in the
/// error's chain of sources). An Engine that answered, even with an error, was reached.
pub fn engine_unreachable(e: &bollard::errors::Error) -> bool {
    use bollard::errors::Error as E;
    use std::io::ErrorKind as K;
    match e {
        E::SocketNotFoundError(_) => return true,
        E::DockerResponseServerError { .. } => return false,
        _ => {}
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                K::NotFound | K::ConnectionRefused | K::ConnectionReset | K::ConnectionAborted
            ) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// Shorthand for this module's results.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

pub(crate) fn fail<T>(msg: impl Into<String>) -> Result<T> {
    Err(RuntimeError::Failed(msg.into()))
}

/// The machine, as sent in `hello` and `host.report` (`15-ref-protocol.md`, Capabilities).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Host name.
    pub hostname: String,
    /// `linux`, `macos`, …
    pub os: String,
    /// `amd64` or `arm64` (Go-style names, as the download routes use), else Rust's name.
    pub arch: String,
    /// Logical CPUs.
    pub cpus: u32,
    /// Total memory, MiB.
    pub memory_mb: u64,
    /// Free space under the data directory, GiB.
    pub disk_gb: u64,
    /// `dir`, `btrfs` or `zfs`.
    pub storage: String,
    /// Docker server version, `""` when the Engine does not answer.
    pub docker: String,
    /// Whether `docker compose version` works (informational: the runtime does not use it).
    pub compose: bool,
    /// Linux and running as root.
    pub netns: bool,
    /// From `DENV_PUBLIC_IP` when set.
    pub public_ip: Option<String>,
    /// Build version (`DENV_VERSION` at build time, else `dev`).
    pub denvd_version: String,
    /// How an environment's disk quota is enforced on its volumes: `"btrfs qgroup"`,
    /// `"zfs quota"` or `"none"` (`dir` storage).
    #[serde(default)]
    pub volume_quota: String,
    /// Whether each container's writable layer is size-limited (`storage_opt size`;
    /// the engine's storage driver allows it on btrfs, zfs, and overlay2 over xfs with
    /// `pquota`; not on overlay2 over ext4).
    #[serde(default)]
    pub layer_quota: bool,
    /// Quota of an environment without `x-denv.disk`, MiB.
    #[serde(default)]
    pub default_disk_mb: u64,
    /// The packet filter that holds the environments' network policy, e.g.
    /// `nftables v1.0.6` (`nft --version`).
    pub packet_filter: String,
    /// What `x-denv.clock: frozen` runs with here: `libfaketime <host path> (dynamically
    /// linked glibc programs)`, or `unavailable: <why>` (a frozen-clock deploy or fork
    /// then fails); see [`clock`].
    #[serde(default)]
    pub clock: String,
}

/// `env.create` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateResult {
    /// Service → `127.0.0.1:<port>` for the first port of each service (under either
    /// egress: inbound connections to a published port and their replies pass a denied
    /// network's policy).
    pub endpoints: BTreeMap<String, String>,
    /// Wall time of the whole create, ms.
    pub started_in: u64,
    /// Service → the image's repo digest (`name@sha256:…`) when it has one, else the image
    /// id (`sha256:…`).
    pub digests: BTreeMap<String, String>,
    /// Service → the local image id (`sha256:…`) its container was created from: what
    /// the version pins ([`denv_compose::Service::image_id`]).
    pub image_ids: BTreeMap<String, String>,
    /// Storage backend name.
    pub storage: String,
    /// `allowed` or `denied (verified)`.
    pub egress: String,
    /// What the egress probe tried and what answered.
    pub egress_probe: EgressProbe,
}

/// `env.snapshot` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotResult {
    /// The snapshot name.
    pub snapshot: String,
    /// What was captured, one entry per volume (backend-specific names).
    pub datasets: Vec<String>,
    /// From the first pause to the last unpause, ms.
    pub frozen_for: u64,
    /// True when every running container was frozen during the capture.
    pub consistent: bool,
    /// The world's wall clock when the services were paused, ms since the Unix epoch:
    /// the host's real time then plus [`SnapshotResult::clock_offset_ms`]. Recorded in
    /// the snapshot's spec too, where a rollback to it starts a frozen clock.
    pub world_instant_ms: i64,
    /// The environment's clock offset against the host's real time, ms (0: real clock).
    pub clock_offset_ms: i64,
}

/// `env.fork` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForkResult {
    /// Wall time of clone + start + health + egress probe, ms.
    pub forked_in: u64,
    /// As in [`CreateResult::endpoints`].
    pub endpoints: BTreeMap<String, String>,
    /// As in [`CreateResult::egress`] (extra field beyond the documented two).
    pub egress: String,
    /// As in [`CreateResult::egress_probe`].
    pub egress_probe: EgressProbe,
    /// Volume → its digest as cloned, before any service started (only when the fork
    /// was asked to digest, see [`Runtime::fork_digested`]).
    #[serde(default)]
    pub datasets: BTreeMap<String, crate::storage::digest::VolumeDigest>,
    /// The fork's clock offset against the host's real time, ms: its world instant
    /// (`x-denv.clock: frozen`) minus the real time at its start; 0 on the real clock.
    pub clock_offset_ms: i64,
    /// Services of a frozen-clock fork left on the real clock, with why
    /// ([`clock::uncovered_markers`]): `musl: /lib/ld-musl-x86_64.so.1` (a musl program
    /// would not start with the glibc libfaketime preloaded), `jemalloc:
    /// /usr/lib/x86_64-linux-gnu/libjemalloc.so.2` (its programs would hang).
    pub clock_real_services: BTreeMap<String, String>,
}

/// `env.rollback` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RollbackResult {
    /// The snapshot restored.
    pub snapshot: String,
    /// As in [`CreateResult::endpoints`].
    pub endpoints: BTreeMap<String, String>,
    /// As in [`ForkResult::clock_offset_ms`] (the snapshot's world instant restarts).
    pub clock_offset_ms: i64,
    /// As in [`ForkResult::clock_real_services`].
    pub clock_real_services: BTreeMap<String, String>,
}

/// `env.exec` result. A non-zero exit is still a success of the command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecResult {
    /// The process's exit code; `124` when the timeout killed it.
    pub exit_code: i64,
    /// Standard output (lossy UTF-8, at most the first 4 MiB).
    pub stdout: String,
    /// Standard error, same limit; on timeout ends with
    /// `denvd: command timed out after <N>s`.
    pub stderr: String,
    /// The command wrote more than 4 MiB to stdout; the rest was dropped.
    pub stdout_truncated: bool,
    /// The same for stderr.
    pub stderr_truncated: bool,
    /// The timeout killed the command (`exit_code` 124).
    pub timed_out: bool,
}

/// How `env.exec` runs its argv beyond the argv itself (spec `12-ref-rest-api.md`,
/// `POST /v1/envs/{env}/exec`). Every field maps to the engine's own exec option, so
/// nothing goes through a shell.
#[derive(Debug, Clone, Default)]
pub struct ExecOptions {
    /// The engine's exec `User` (`name`, `uid`, `name:group`, `uid:gid`); `None`: the
    /// container's configured user. Must pass [`denv_compose::is_valid_user`].
    pub user: Option<String>,
    /// The engine's exec `WorkingDir`, an absolute path passed as given (symlinks and
    /// `..` resolve inside the container); `None`: the container's working directory.
    pub workdir: Option<String>,
    /// `KEY=VALUE` entries added to the process's environment.
    pub env: Vec<String>,
    /// Written to the process's stdin, which is then closed; `None`: not attached.
    pub stdin: Option<Vec<u8>>,
    /// Stream the output here as it is written, `(is_stderr, bytes)`, instead of
    /// collecting it (no cap; the result's stdout and stderr are then empty). A closed
    /// receiver drops the rest of the output; the command still runs to its end.
    pub output: Option<tokio::sync::mpsc::Sender<(bool, Vec<u8>)>>,
}

impl ExecOptions {
    /// Refuses what the engine would misread: a user that is not one user
    /// ([`denv_compose::is_valid_user`]), a working directory that is not absolute or has
    /// a NUL, an environment entry whose name is empty or has `=` or NUL, or a value with
    /// a NUL. The error names the field.
    pub fn check(&self) -> std::result::Result<(), String> {
        if let Some(u) = &self.user {
            if !denv_compose::is_valid_user(u) {
                return Err(format!(
                    "exec: user {u:?} is not a user (name, uid, name:group or uid:gid; \
                     letters, digits, _ - . only, at most 64 characters)"
                ));
            }
        }
        if let Some(w) = &self.workdir {
            if !w.starts_with('/') || w.contains('\0') || w.len() > 4096 {
                return Err(format!(
                    "exec: workdir {w:?} must be an absolute path (at most 4096 bytes, no NUL)"
                ));
            }
        }
        for kv in &self.env {
            let (k, _) = kv.split_once('=').unwrap_or((kv, ""));
            if k.is_empty() || kv.contains('\0') || !kv.contains('=') {
                return Err(format!(
                    "exec: environment variable {k:?} is invalid (a name without = or NUL)"
                ));
            }
        }
        Ok(())
    }
}

/// `env.put` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PutResult {
    /// The directory the archive was extracted into.
    pub path: String,
}

/// `env.destroy` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DestroyResult {
    /// The environment id.
    pub destroyed: String,
}

/// Host-side state of one runtime.
pub(crate) struct Inner {
    pub(crate) docker: Docker,
    pub(crate) cfg: RuntimeConfig,
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) host_cpus: f64,
    /// Whether the engine accepts `storage_opt size` (probed once at start).
    pub(crate) layer_quota: bool,
    locks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pub(crate) canary: tokio::sync::Mutex<Option<egress::Canary>>,
    pub(crate) sentinel: tokio::sync::Mutex<Option<egress::Sentinel>>,
    pub(crate) packet_filter: String,
    pub(crate) backend: netpolicy::Backend,
    /// [`netpolicy::owner_tag`] of the data directory and engine.
    pub(crate) owner: String,
    /// Readiness checks running at once on this host ([`ready_check_slots`]): when a
    /// group of forks starts together, their services' checks take turns instead of
    /// each polling with `docker exec` and starving the services they wait for.
    pub(crate) ready_checks: tokio::sync::Semaphore,
    /// Image id → why a frozen clock leaves its services on the real clock
    /// (`musl: /lib/ld-musl-x86_64.so.1`, [`clock::uncovered_markers`]), `None` when
    /// nothing does; checked once per image.
    pub(crate) uncovered_images: std::sync::Mutex<HashMap<String, Option<String>>>,
}

/// How many readiness checks ([`Runtime`]'s own runs of a service's healthcheck) run
/// at once on a host with `host_cpus` CPUs: two per CPU, at least 4.
pub fn ready_check_slots(host_cpus: f64) -> usize {
    ((host_cpus.ceil() as usize) * 2).max(4)
}

/// The Docker runtime. `Clone + Send + Sync`; clones share state.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("data_dir", &self.inner.cfg.data_dir)
            .field("storage", &self.inner.storage.name())
            .finish()
    }
}

impl Runtime {
    /// Connects to the local Engine (`DOCKER_HOST` or the default socket, API version
    /// negotiated down to the Engine's), creates the data directory, opens the storage
    /// backend, and re-applies the network policy of every environment network on the
    /// engine ([`Runtime::reconcile_network_policy`]). Errors: `docker: …` when the
    /// Engine does not answer, the backend's error when it cannot be used (`<data> is
    /// not on btrfs …`, `zfs pool "p" not available: …`), `network policy: `nft` not
    /// found; …` without nftables, `network policy: nft: …` when the rules cannot be
    /// applied (not root).
    pub async fn new(cfg: RuntimeConfig) -> Result<Runtime> {
        let docker = Docker::connect_with_local_defaults()
            .map_err(|e| RuntimeError::docker("docker", e))?
            .negotiate_version()
            .await
            .map_err(|e| RuntimeError::docker("docker", e))?;
        docker
            .ping()
            .await
            .map_err(|e| RuntimeError::docker("docker", e))?;
        std::fs::create_dir_all(&cfg.data_dir)
            .map_err(|e| RuntimeError::io(format!("{}", cfg.data_dir.display()), e))?;
        let data = cfg.data_dir.clone();
        let kind = cfg.storage.clone();
        let storage: Arc<dyn Storage> = tokio::task::spawn_blocking(move || {
            Ok::<Arc<dyn Storage>, StorageError>(match kind {
                StorageKind::Dir => Arc::new(DirStorage::new(data)),
                StorageKind::Btrfs => Arc::new(BtrfsStorage::new(data)?),
                StorageKind::Zfs { pool } => Arc::new(ZfsStorage::new(data, &pool)?),
            })
        })
        .await
        .map_err(|e| RuntimeError::Failed(format!("storage: {e}")))??;
        let host_cpus = std::thread::available_parallelism()
            .map(|n| n.get() as f64)
            .unwrap_or(1.0);
        let layer_quota = probe_layer_quota(&docker).await;
        let (backend, packet_filter) = netpolicy::detect(&cfg.packet_filter).await?;
        let owner = netpolicy::owner_tag(
            &cfg.data_dir,
            &std::env::var("DOCKER_HOST").unwrap_or_default(),
        );
        let rt = Runtime {
            inner: Arc::new(Inner {
                docker,
                cfg,
                storage,
                host_cpus,
                layer_quota,
                locks: Default::default(),
                canary: tokio::sync::Mutex::new(None),
                sentinel: tokio::sync::Mutex::new(None),
                packet_filter,
                backend,
                owner,
                ready_checks: tokio::sync::Semaphore::new(ready_check_slots(host_cpus)),
                uncovered_images: Default::default(),
            }),
        };
        let n = rt.reconcile_network_policy().await?;
        tracing::info!(networks = n, "network policy reconciled");
        Ok(rt)
    }

    /// `"dir"`, `"btrfs"` or `"zfs"`.
    pub fn storage_name(&self) -> &'static str {
        self.inner.storage.name()
    }

    /// The data directory.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.inner.cfg.data_dir
    }

    /// The bollard client (for callers that need to inspect what runs, e.g. tests).
    pub fn docker(&self) -> &Docker {
        &self.inner.docker
    }

    /// Serialises commands on one environment.
    pub(crate) async fn lock_env(&self, env_id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let m = {
            let mut map = self.inner.locks.lock().expect("env lock map poisoned");
            map.entry(env_id.to_string()).or_default().clone()
        };
        m.lock_owned().await
    }

    /// The machine's capabilities (never fails; unknown values are empty or zero).
    pub async fn capabilities(&self) -> Capabilities {
        let docker = match self.inner.docker.version().await {
            Ok(v) => v.version.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let compose = tokio::process::Command::new("docker")
            .args(["compose", "version"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .await
            .map(|s| s.success())
            .unwrap_or(false);
        let data = self.inner.cfg.data_dir.clone();
        let disk_gb = tokio::process::Command::new("df")
            .args(["-Pk", &data.to_string_lossy()])
            .output()
            .await
            .ok()
            .and_then(|o| {
                let s = String::from_utf8_lossy(&o.stdout).into_owned();
                s.lines()
                    .nth(1)
                    .and_then(|l| l.split_whitespace().nth(3).map(str::to_string))
            })
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb / (1024 * 1024))
            .unwrap_or(0);
        // `MemTotal` of /proc/meminfo (procfs gives bytes), in MiB.
        let memory_mb = <procfs::Meminfo as procfs::Current>::current()
            .map(|m| m.mem_total / (1024 * 1024))
            .unwrap_or(0);
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        let root = crate::config::is_root();
        Capabilities {
            hostname,
            os: std::env::consts::OS.to_string(),
            arch: arch.to_string(),
            cpus: self.inner.host_cpus as u32,
            memory_mb,
            disk_gb,
            storage: self.storage_name().to_string(),
            docker,
            compose,
            netns: cfg!(target_os = "linux") && root,
            public_ip: std::env::var("DENV_PUBLIC_IP")
                .ok()
                .filter(|s| !s.is_empty()),
            denvd_version: option_env!("DENV_VERSION").unwrap_or("dev").to_string(),
            volume_quota: self.inner.storage.quota_kind().to_string(),
            layer_quota: self.inner.layer_quota,
            default_disk_mb: denv_compose::DEFAULT_DISK_MB,
            packet_filter: self.inner.packet_filter.clone(),
            clock: match clock::find_lib(self.inner.cfg.libfaketime.as_deref()) {
                Ok(p) => format!(
                    "libfaketime {} (dynamically linked glibc programs)",
                    p.display()
                ),
                Err(e) => format!("unavailable: {e}"),
            },
        }
    }

    /// Environment ids known on this host: directories under `<data>/envs` and
    /// `<data>/snaps` (but not an environment of which this host only holds snapshots
    /// received from another host, [`crate::storage::RECEIVED_MARK`]), and containers
    /// labelled `denv.managed=true` and with this data directory (`denv.data`; so
    /// environments are found again after a sidecar restart, and another sidecar's on
    /// the same engine are never claimed). Sorted, unique.
    pub async fn list_envs(&self) -> Vec<String> {
        // Snapshots received from another host (the fork cache) are not an environment
        // of this host: listing them would have the control plane tear down, here, an
        // environment that runs elsewhere.
        let data = self.inner.storage.data_dir().to_path_buf();
        let mut out: Vec<String> = self
            .inner
            .storage
            .envs()
            .into_iter()
            .filter(|env| {
                let received = data
                    .join("snaps")
                    .join(env)
                    .join(crate::storage::RECEIVED_MARK)
                    .is_file();
                !received || data.join("envs").join(env).exists()
            })
            .collect();
        if let Ok(rd) = std::fs::read_dir(self.inner.cfg.data_dir.join("envs")) {
            out.extend(
                rd.flatten()
                    .filter_map(|e| e.file_name().to_str().map(str::to_string)),
            );
        }
        if let Ok(cs) = self.own_containers().await {
            for c in cs {
                if let Some(e) = c.labels.as_ref().and_then(|l| l.get("denv.env")) {
                    out.push(e.clone());
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

/// Whether the engine's storage driver accepts a writable-layer size limit: creates
/// (never starts) a container from any local image with `storage_opt size=1G` and removes it.
/// `false` when the driver refuses (overlay2 over ext4: "--storage-opt is supported only
/// for overlay over xfs with 'pquota' mount option") or there is no local image.
async fn probe_layer_quota(docker: &Docker) -> bool {
    use bollard::container::{Config, CreateContainerOptions, RemoveContainerOptions};
    // Any local image will do: the container is created, never started.
    let Some(image) = docker
        .list_images::<String>(None)
        .await
        .ok()
        .and_then(|images| images.into_iter().next().map(|i| i.id))
    else {
        tracing::info!("no local image to probe writable-layer limits with; assuming none");
        return false;
    };
    let name = format!("denv-layer-quota-probe-{:08x}", rand::random::<u32>());
    let mut hc = bollard::models::HostConfig {
        network_mode: Some("none".into()),
        storage_opt: Some(HashMap::from([("size".to_string(), "1G".to_string())])),
        ..Default::default()
    };
    harden(&mut hc, Privilege::None);
    let r = docker
        .create_container(
            Some(CreateContainerOptions {
                name: name.clone(),
                platform: None,
            }),
            Config {
                image: Some(image),
                entrypoint: Some(vec!["/denv-never-started".to_string()]),
                labels: Some(HashMap::from([(
                    "denv.managed".to_string(),
                    "true".to_string(),
                )])),
                host_config: Some(hc),
                ..Default::default()
            },
        )
        .await;
    let ok = r.is_ok();
    if let Err(e) = &r {
        tracing::info!("writable layers have no size limit on this engine: {e}");
    }
    let _ = docker
        .remove_container(
            &name,
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await;
    ok
}

/// Lower-cased environment id: the compose project name.
pub(crate) fn project(env_id: &str) -> String {
    env_id.to_lowercase()
}

/// `<lc>_default`.
pub fn network_name(env_id: &str) -> String {
    format!("{}_default", project(env_id))
}

/// `<lc>-<service>-1`.
pub fn container_name(env_id: &str, service: &str) -> String {
    format!("{}-{service}-1", project(env_id))
}

#[cfg(test)]
mod tests {
    use super::RuntimeError;
    use denv_proto::v1::HostErrorCode as C;

    /// A Docker client on `socket` (nothing is connected until a call; a socket that
    /// does not exist is refused at once).
    fn client(socket: &std::path::Path) -> Result<bollard::Docker, bollard::errors::Error> {
        bollard::Docker::connect_with_unix(
            &socket.to_string_lossy(),
            5,
            bollard::API_DEFAULT_VERSION,
        )
    }

    #[tokio::test]
    async fn an_engine_that_cannot_be_reached_is_unavailable() {
        let t = tempfile::tempdir().unwrap();
        // No socket at all.
        let e = client(&t.path().join("none.sock")).unwrap_err();
        let e = RuntimeError::docker("docker", e);
        assert_eq!(e.code(), C::Unavailable, "{e:?}");
        // A socket file nobody listens on any more: the connection is refused.
        let dead = t.path().join("dead.sock");
        drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
        assert!(dead.exists());
        let e = client(&dead).unwrap().ping().await.unwrap_err();
        let e = RuntimeError::docker("docker", e);
        assert_eq!(e.code(), C::Unavailable, "{e:?}");
        // An Engine that answered, even with an error, was reached.
        let answered = bollard::errors::Error::DockerResponseServerError {
            status_code: 500,
            message: "boom".into(),
        };
        assert_eq!(RuntimeError::docker("start", answered).code(), C::Failed);
    }

    #[test]
    fn each_variant_has_its_code() {
        for (e, code) in [
            (RuntimeError::NotFound("x".into()), C::NotFound),
            (RuntimeError::Conflict("x".into()), C::Conflict),
            (RuntimeError::TooLarge("x".into()), C::TooLarge),
            (RuntimeError::Invalid("x".into()), C::Invalid),
            (RuntimeError::Failed("x".into()), C::Failed),
            (
                RuntimeError::io("x", std::io::Error::other("disk")),
                C::Failed,
            ),
            (
                crate::storage::StorageError::NotFound("x".into()).into(),
                C::NotFound,
            ),
        ] {
            assert_eq!(e.code(), code, "{e:?}");
        }
    }

    #[test]
    fn ready_check_slots_per_cpu() {
        assert_eq!(super::ready_check_slots(1.0), 4);
        assert_eq!(super::ready_check_slots(2.0), 4);
        assert_eq!(super::ready_check_slots(3.5), 8);
        assert_eq!(super::ready_check_slots(16.0), 32);
    }
}
