//! The parsed, validated environment description. Field names are the JSON shape
//! stored as a version's `Spec` and sent to sidecars; keep them stable.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Default memory cap when the compose file sets none (MiB).
pub const DEFAULT_MEMORY_MB: u64 = 4096;
/// Default pids cap when the compose file sets none.
pub const DEFAULT_PIDS: i64 = 2048;
/// Default CPU cap when the compose file sets none.
pub const DEFAULT_CPUS: f64 = 2.0;

/// CPUs a host keeps for itself and its sidecar: no container is given more than the
/// host's CPUs minus this (denvd applies it; the control plane checks requests and
/// writes evidence with it).
pub const CPU_RESERVE: f64 = 0.5;

/// The most CPUs one container may use on a host with `host_cpus` CPUs: `host_cpus −`
/// [`CPU_RESERVE`], but at least half a CPU (or all of a smaller host). 2 CPUs → 1.5,
/// 8 → 7.5, 1 → 0.5.
pub fn max_cpus(host_cpus: f64) -> f64 {
    (host_cpus - CPU_RESERVE).max(CPU_RESERVE.min(host_cpus))
}
/// Default verifier timeout (seconds; defined in `denv_proto::contract`).
pub use denv_proto::contract::VERIFIER_TIMEOUT_SEC as DEFAULT_VERIFIER_TIMEOUT_SEC;
/// Default disk quota of one environment when `x-denv.disk` is unset (MiB, 10 GiB).
pub const DEFAULT_DISK_MB: u64 = 10 * 1024;
/// Smallest `x-denv.disk` accepted (MiB).
pub const MIN_DISK_MB: u64 = 16;
/// The largest `x-denv.pool` (and `pool` field of a fork or sandbox request): warm forks
/// kept per version.
pub const MAX_POOL: u32 = 64;

/// Capabilities a non-agent service may add back with `cap_add` (names without the
/// `CAP_` prefix): Docker's default set. Anything else (`SYS_ADMIN`, `NET_ADMIN`,
/// `SYS_PTRACE`, `SYS_MODULE`, `SYS_RAWIO`, `SYS_BOOT`, `DAC_READ_SEARCH`, `MAC_ADMIN`,
/// `BPF`, `PERFMON`, `ALL`, …) is refused by the parser.
pub const ADDABLE_CAPS: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "NET_RAW",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// A whole environment: services in sorted name order, declared volumes, and the
/// `x-denv` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Spec {
    /// Services sorted by name; `services[0]` is the "first service" (warm, health).
    pub services: Vec<Service>,
    /// Top-level declared volume names, sorted.
    pub volumes: Vec<String>,
    /// `x-denv.egress`, default deny.
    pub egress: Egress,
    /// `x-denv.kind`, informational ("" when absent).
    #[serde(default)]
    pub kind: String,
    /// `x-denv.warm` argv (empty when absent).
    #[serde(default)]
    pub warm: Vec<String>,
    /// `x-denv.agent`.
    #[serde(default)]
    pub agent: Option<Agent>,
    /// `x-denv.verifier`.
    #[serde(default)]
    pub verifier: Option<Verifier>,
    /// `x-denv.clock`; `None` (unset) is [`Clock::Real`].
    #[serde(default)]
    pub clock: Option<Clock>,
    /// The world's wall clock at the instant the version's snapshot was captured, in
    /// milliseconds since the Unix epoch: the host's real time then plus the
    /// environment's clock offset (negative when it ran on a frozen clock itself). 0
    /// until a snapshot reported it (never set from a compose file). With
    /// [`Clock::Frozen`], an environment created from that snapshot (fork, rollback,
    /// sandbox `from_version`, verify's grader fork; such a version has no warm pool)
    /// starts its wall clock at this instant; 0 means the real clock (a first deploy).
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub world_instant_ms: i64,
    /// `x-denv.disk`: the environment's disk quota in MiB (volumes together, and each
    /// service's writable layer where the engine allows it); 0 means
    /// [`DEFAULT_DISK_MB`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub disk_mb: u64,
    /// Service → its compose `build:` (images built on the host by the sidecar). A
    /// service here has `image` "" until the control plane sets it to the build's tag
    /// `denv-build/<key>` (see [`Build::key`]); with an `image` in the file, the build
    /// runs only when the deploy carries the context.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub builds: BTreeMap<String, Build>,
    /// `x-denv.pool`: how many forks of the environment's current version the control
    /// plane keeps warm (0 = none, at most [`MAX_POOL`]); see `docs/reference/deployments.md`
    /// "Warm pool".
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub pool: u32,
    /// `x-denv.promote`: the gates `denv promote` runs on a version of this environment
    /// (`docs/reference/compose.md`, "x-denv.promote"); `None` runs the default gates
    /// (a fresh fork, the datasets read back alike by [`DEFAULT_REPLAY_FORKS`] forks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promote: Option<Promote>,
}

/// Replay forks of `gate.replay` when `x-denv.promote.replay.forks` is unset.
pub const DEFAULT_REPLAY_FORKS: u32 = 2;
/// The most replay forks `x-denv.promote.replay.forks` accepts.
pub const MAX_REPLAY_FORKS: u32 = 8;
/// The longest `x-denv.promote.soak` accepted (ms, ten minutes): the gate, with the
/// check of every service after it, runs within one phase's 15-minute bound.
pub const MAX_SOAK_MS: u64 = 600_000;
/// Time limit of one declared promote check (replay command, consistency check or
/// invariant), seconds.
pub const CHECK_TIMEOUT_SEC: u32 = 300;

/// `x-denv.promote`: what the gates of `denv promote` run, besides what they always do
/// (a fresh fork comes up healthy; every fork reads the captured datasets back alike).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Promote {
    /// `gate.replay`: `forks` fresh forks of the version (default
    /// [`DEFAULT_REPLAY_FORKS`], 2 to [`MAX_REPLAY_FORKS`]) each run `commands` in order;
    /// every fork's outputs (exit code and stdout of each command) must be identical.
    #[serde(default)]
    pub replay_forks: u32,
    /// `gate.replay` commands, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replay: Vec<Check>,
    /// `gate.consistency`: extra checks run in the gate's fork (exit 0 passes), e.g.
    /// `pg_amcheck`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consistency: Vec<Check>,
    /// `gate.invariants`: declared checks run in the gate's fork after the replay (exit 0
    /// holds): nothing deleted, disabled or silenced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub invariants: Vec<Check>,
    /// `gate.soak`: how long the gate's fork keeps running (ms) before every service is
    /// checked again; 0 skips the gate.
    #[serde(default)]
    pub soak_ms: u64,
}

impl Promote {
    /// The replay forks to make (the default when unset).
    pub fn forks(&self) -> u32 {
        if self.replay_forks == 0 {
            DEFAULT_REPLAY_FORKS
        } else {
            self.replay_forks
        }
    }
}

/// One declared promote check: `cmd` run in `service` of a fork (as the service's user,
/// [`CHECK_TIMEOUT_SEC`] at most).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// What the record calls it (`name`, else the argv joined with spaces).
    pub name: String,
    /// A service of the spec.
    pub service: String,
    /// The argv (a string is run with `sh -c`).
    pub cmd: Vec<String>,
}

fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// A service's compose `build:` (`13-ref-compose.md`, `30-blog-creating-an-environment.md`
/// "host-side image builds").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Build {
    /// `build.context` (or the string form) as written; `"."` when unset. The deploy
    /// request's `contexts` map is keyed by it.
    pub context: String,
    /// `build.dockerfile`: a relative path inside the context; `"Dockerfile"` when unset.
    pub dockerfile: String,
    /// `build.args` (a mapping or a `KEY=VALUE` list; a key without a value is unset).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub args: BTreeMap<String, String>,
    /// `build.target`: the stage to build; "" for the last one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target: String,
    /// `sha256:<hex>` of the context tar, set by the control plane from the upload
    /// ("" in a freshly parsed spec).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub context_digest: String,
    /// Who may share the built image: the control plane sets the team id, so one team's
    /// build (whose RUN steps may have fetched anything) is never reused for another's
    /// identical context. Part of [`Build::key`]; "" in a freshly parsed spec.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scope: String,
}

impl Build {
    /// The build's cache key: hex sha256 over the context digest, scope, dockerfile,
    /// target and args (sorted), each length-prefixed. The same key means the same image, so the
    /// sidecar reuses `denv-build/<key>` when it exists.
    pub fn key(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        let mut put = |s: &str| {
            h.update((s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        };
        put("denv-build/1");
        put(&self.context_digest);
        put(&self.scope);
        put(&self.dockerfile);
        put(&self.target);
        for (k, v) in &self.args {
            put(k);
            put(v);
        }
        hex::encode(h.finalize())
    }

    /// The image tag the sidecar builds: `denv-build/<key>`.
    pub fn tag(&self) -> String {
        format!("{BUILD_REPO}/{}", self.key())
    }
}

/// The repository of images built on the host (`denv-build/<key>`).
pub const BUILD_REPO: &str = "denv-build";

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Spec {
    /// The alphabetically first service (runs `warm` and the post-snapshot health check).
    pub fn first_service(&self) -> Option<&Service> {
        self.services.first()
    }

    /// The service with this name.
    pub fn service(&self, name: &str) -> Option<&Service> {
        self.services.iter().find(|s| s.name == name)
    }

    /// `x-denv.clock: frozen`.
    pub fn frozen_clock(&self) -> bool {
        self.clock == Some(Clock::Frozen)
    }
}

/// `x-denv.egress`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Egress {
    /// The default: the network is `internal`, proven by a probe.
    #[default]
    Deny,
    /// Ports are published on 127.0.0.1 and reported as endpoints.
    Allow,
}

impl Egress {
    /// `"deny"` or `"allow"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Egress::Deny => "deny",
            Egress::Allow => "allow",
        }
    }
}

/// `x-denv.clock`: which wall clock the environment's processes observe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Clock {
    /// An environment created from a snapshot starts its wall clock at the snapshot's
    /// world instant ([`Spec::world_instant_ms`]) and it advances normally from there.
    Frozen,
    /// The host's clock (the default).
    Real,
}

impl Clock {
    /// `"frozen"` or `"real"` (the compose and wire spelling).
    pub fn as_str(self) -> &'static str {
        match self {
            Clock::Frozen => "frozen",
            Clock::Real => "real",
        }
    }
}

/// One service, normalised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Service {
    pub name: String,
    /// Image reference exactly as written in the compose file.
    pub image: String,
    /// Environment variables (map or `KEY=VALUE` list in the file).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Container ports only (`"8080:80"` → 80, `/tcp` dropped).
    #[serde(default)]
    pub ports: Vec<u16>,
    /// Named volume mounts.
    #[serde(default)]
    pub volumes: Vec<VolumeMount>,
    /// Healthcheck, if any (`NONE` disables and yields `None`).
    #[serde(default)]
    pub health: Option<Health>,
    /// Names of services this one waits for before it starts.
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// Dependency → its compose `condition` when that is not `service_started` (the
    /// compose default, also for the list form): `service_healthy` or
    /// `service_completed_successfully`. The sidecar starts this service once each
    /// dependency is started, healthy, or exited 0, respectively.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub depends_on_condition: BTreeMap<String, String>,
    /// Command argv (a string command is split on whitespace); empty = image default.
    #[serde(default)]
    pub command: Vec<String>,
    /// `uid[:gid]` as written; "" when unset (runs as the image's user).
    #[serde(default)]
    pub user: String,
    /// Caps, with defaults filled in.
    #[serde(default)]
    pub resources: Resources,
    /// `cap_add`: capabilities added back on top of the sidecar's minimal set, upper
    /// case without `CAP_`, sorted, each one of [`ADDABLE_CAPS`]. Always empty for the
    /// agent service (it runs with no capabilities).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cap_add: Vec<String>,
    /// The local image id (`sha256:…`) the version pinned for this service, from the
    /// host's report of the first deploy; empty until then (never set from a compose
    /// file). When set, every fork, rollback and pool member runs exactly this image,
    /// never whatever the tag in `image` names now.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_id: String,
}

/// `name:/path[:ro]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    /// Declared top-level volume name.
    pub name: String,
    /// Absolute container path.
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
}

/// `depends_on` condition: start once the dependency's container is started (the
/// compose default).
pub const SERVICE_STARTED: &str = "service_started";
/// `depends_on` condition: start once the dependency is healthy (running, without a
/// healthcheck).
pub const SERVICE_HEALTHY: &str = "service_healthy";
/// `depends_on` condition: start once the dependency has exited with code 0.
pub const SERVICE_COMPLETED_SUCCESSFULLY: &str = "service_completed_successfully";

/// A healthcheck in Docker's normalised form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    /// `["CMD", argv...]` or `["CMD-SHELL", "script"]` (a plain string test becomes CMD-SHELL).
    pub test: Vec<String>,
    /// Interval between probes in milliseconds (compose `interval`; default 30000 as Docker).
    pub interval_ms: u64,
    /// Consecutive failures before unhealthy (compose `retries`; default 3 as Docker).
    pub retries: u32,
}

/// Memory / pids / CPU caps. Zero means "sidecar default"; the parser fills defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    pub memory_mb: u64,
    pub pids: i64,
    pub cpus: f64,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            memory_mb: DEFAULT_MEMORY_MB,
            pids: DEFAULT_PIDS,
            cpus: DEFAULT_CPUS,
        }
    }
}

/// `x-denv.agent`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Agent {
    /// The service the agent runs in; always sets a non-root user.
    pub service: String,
}

/// `x-denv.verifier`: exactly one of `image` / `service`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verifier {
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub service: Option<String>,
    pub command: Vec<String>,
    /// Absolute paths in the agent service.
    #[serde(default)]
    pub collect: Vec<String>,
    /// Grader time limit in seconds (default 600).
    pub timeout_sec: u64,
    /// The local image id (`sha256:…`) the version pinned for `image`, from the host's
    /// report of the first deploy; empty until then (never set from a compose file).
    /// When set, every verify of the version grades with exactly this image.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_id: String,
}
