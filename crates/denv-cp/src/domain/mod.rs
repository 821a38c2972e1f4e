//! The control plane's domain vocabulary: environment statuses, deployment kinds and
//! statuses, phase names and statuses (spec page `16-ref-deployments.md`), with the
//! transitions each status allows, in one place.
//!
//! Every enum stores and travels as exactly the string of its [`as_str`] (the strings
//! the REST API and the store have always used: `rolled_back`, `gate.fork`, ...); the
//! string turns back into the enum with [`FromStr`] (an [`UnknownValue`] error naming
//! the string and what was expected) and prints with [`Display`].
//!
//! The rows the orchestrator works on are in [`rows`]: [`Environment`] (status an
//! [`EnvStatus`]), [`Version`] (its spec a `denv_compose::Spec`), [`Deployment`] (kind a
//! [`Kind`], status a [`DeploymentStatus`]), [`Phase`] (name a [`PhaseName`], status a
//! [`PhaseStatus`]) and [`DeploymentState`] (a deployment with its phases, what a
//! running deployment's watch channel carries). They are used from the repository to
//! the API edge, where [`crate::api::convert`] makes the wire messages; no protobuf
//! type is below it. [`EnvRow`] reads and writes the status of the store's
//! `environments::Model` (which listings still use) as an [`EnvStatus`]. The strings
//! are read and written only here and in the repository
//! ([`crate::orchestrator::repo`]), which refuses a save that moves a status along a
//! transition its `can_become` does not allow.
//!
//! [`as_str`]: DeploymentStatus::as_str
//! [`Display`]: std::fmt::Display

use std::fmt;

pub mod rows;
pub use rows::{Deployment, DeploymentState, Environment, Phase, Version};
use std::str::FromStr;

/// A string that names none of an enum's values: `unknown deployment status "x"
/// (expected one of pending, running, ...)`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?} (expected one of {expected})")]
pub struct UnknownValue {
    /// What was parsed (`deployment status`, `phase name`, ...).
    pub what: &'static str,
    /// The string that matched nothing.
    pub value: String,
    /// The accepted strings, comma-separated.
    pub expected: String,
}

/// Declares a string-valued enum: `as_str`, `ALL`, `FromStr`, `Display`, and
/// `Serialize` as the string.
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        $name:ident, $what:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $s:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The stored and wire string.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $s,)+
                }
            }
        }

        impl FromStr for $name {
            type Err = UnknownValue;

            fn from_str(s: &str) -> Result<Self, UnknownValue> {
                match s {
                    $($s => Ok($name::$variant),)+
                    _ => Err(UnknownValue {
                        what: $what,
                        value: s.to_string(),
                        expected: [$($s),+].join(", "),
                    }),
                }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

string_enum! {
    /// An environment's status (`environments.status`, `Environment.Status`).
    EnvStatus, "environment status" {
        /// Created, nothing deployed yet.
        Pending = "pending",
        /// A deployment is changing it.
        Deploying = "deploying",
        /// Running and healthy.
        Healthy = "healthy",
        /// The last deployment failed and nothing was reverted, or the host lost it.
        Failed = "failed",
        /// A destroy deployment runs.
        Destroying = "destroying",
        /// Torn down.
        Destroyed = "destroyed",
    }
}

string_enum! {
    /// A deployment's status (`deployments.status`, `Deployment.Status`).
    DeploymentStatus, "deployment status" {
        /// Created, not started (also: queued behind another deployment of the same
        /// environment).
        Pending = "pending",
        /// Phases executing.
        Running = "running",
        /// Every non-skipped phase ok.
        Succeeded = "succeeded",
        /// A phase failed and nothing was reverted.
        Failed = "failed",
        /// A deploy failed and the environment was restored to its previous version.
        RolledBack = "rolled_back",
    }
}

string_enum! {
    /// A phase's status (`phases.status`, `Phase.Status`).
    PhaseStatus, "phase status" {
        /// Not reached yet.
        Pending = "pending",
        /// Executing.
        Running = "running",
        /// Done; its evidence is recorded.
        Ok = "ok",
        /// Failed; its error is recorded.
        Failed = "failed",
        /// Not needed this time, or after an earlier phase failed.
        Skipped = "skipped",
    }
}

string_enum! {
    /// A phase's name (`phases.name`, `Phase.Name`); which phases a deployment has, in
    /// which order, is [`Kind::phases`].
    PhaseName, "phase name" {
        Resolve = "resolve",
        Place = "place",
        Provision = "provision",
        Join = "join",
        Prepare = "prepare",
        Start = "start",
        Health = "health",
        Warm = "warm",
        Snapshot = "snapshot",
        Ingress = "ingress",
        Clone = "clone",
        Restore = "restore",
        Stop = "stop",
        Collect = "collect",
        Grade = "grade",
        Teardown = "teardown",
        GateFork = "gate.fork",
        GateConsistency = "gate.consistency",
        GateReplay = "gate.replay",
        GateInvariants = "gate.invariants",
        GateSoak = "gate.soak",
        Apply = "apply",
        /// Always the last phase: records the outcome.
        Verdict = "verdict",
    }
}

string_enum! {
    /// The kinds of deployment the orchestrator runs (`deployments.kind`,
    /// `Deployment.Kind`).
    Kind, "deployment kind" {
        Deploy = "deploy",
        Fork = "fork",
        Snapshot = "snapshot",
        Rollback = "rollback",
        Verify = "verify",
        Destroy = "destroy",
        Promote = "promote",
    }
}

impl Kind {
    /// The phases of this kind, in order; the last is always [`PhaseName::Verdict`].
    pub fn phases(self) -> &'static [PhaseName] {
        use PhaseName::*;
        match self {
            Kind::Deploy => &[
                Resolve, Place, Provision, Join, Prepare, Start, Health, Warm, Snapshot, Ingress,
                Verdict,
            ],
            Kind::Fork => &[Place, Clone, Health, Verdict],
            Kind::Snapshot => &[Snapshot, Health, Verdict],
            Kind::Rollback => &[Restore, Health, Verdict],
            Kind::Verify => &[Stop, Collect, Snapshot, Clone, Grade, Verdict],
            Kind::Destroy => &[Teardown, Verdict],
            Kind::Promote => &[
                GateFork,
                GateConsistency,
                GateReplay,
                GateInvariants,
                GateSoak,
                Apply,
                Verdict,
            ],
        }
    }
}

impl DeploymentStatus {
    /// Whether the status is final (`succeeded`, `failed`, `rolled_back`).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            DeploymentStatus::Succeeded | DeploymentStatus::Failed | DeploymentStatus::RolledBack
        )
    }

    /// Whether a deployment may move from `self` to `next` (staying is not a move):
    /// `pending → running` when its runner starts, `running → succeeded | failed |
    /// rolled_back` when it ends, `pending → failed` when a restart finds it queued.
    /// A final status never changes. (A pool hand-out inserts its fork deployment
    /// already `succeeded`; that is an insert, not a move.)
    pub fn can_become(self, next: DeploymentStatus) -> bool {
        use DeploymentStatus::*;
        matches!(
            (self, next),
            (Pending, Running) | (Pending, Failed) | (Running, Succeeded | Failed | RolledBack)
        )
    }
}

impl PhaseStatus {
    /// Whether the status is final (`ok`, `failed`, `skipped`).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            PhaseStatus::Ok | PhaseStatus::Failed | PhaseStatus::Skipped
        )
    }

    /// Whether a phase may move from `self` to `next` (staying is not a move):
    /// `pending → running → ok | failed`; `pending → skipped` (not needed, or after a
    /// failure); `pending → failed` (a phase refused before it could start, or a
    /// verdict of a deployment whose rows cannot be read). A final status never changes.
    pub fn can_become(self, next: PhaseStatus) -> bool {
        use PhaseStatus::*;
        matches!(
            (self, next),
            (Pending, Running | Failed | Skipped) | (Running, Ok | Failed)
        )
    }
}

impl EnvStatus {
    /// Whether an environment may move from `self` to `next` (staying is not a move):
    ///
    /// - a deploy, fork or promote starts: `pending | healthy | failed | destroyed →
    ///   deploying` (a deploy or promote to a destroyed environment starts it again);
    /// - it ends: `deploying → healthy | failed`; a rollback restores a failed one:
    ///   `failed → healthy`;
    /// - the host loses it, or a restart interrupts its deployment:
    ///   `pending | deploying | healthy | destroying → failed`;
    /// - a destroy starts (again, after a failed one or for a destroyed one):
    ///   `any → destroying`, and ends `destroying → destroyed | failed`.
    pub fn can_become(self, next: EnvStatus) -> bool {
        use EnvStatus::*;
        match next {
            Pending => false,
            Deploying => matches!(self, Pending | Healthy | Failed | Destroyed),
            Healthy => matches!(self, Deploying | Failed),
            Failed => matches!(self, Pending | Deploying | Healthy | Destroying),
            Destroying => self != Destroying,
            Destroyed => self == Destroying,
        }
    }
}

/// A refused move: `Internal` error text naming the row and both states.
pub fn illegal_transition(
    what: &str,
    id: &str,
    from: impl fmt::Display,
    to: impl fmt::Display,
) -> String {
    format!("{what} {id}: illegal status transition {from} -> {to}")
}

// ---------------------------------------------------------------- typed rows

/// Reads a stored status; a string no enum knows (a row written by something else than
/// this code) reads as `fallback` and is logged, so callers compare enums only. The
/// repository refuses to save such a row.
pub(crate) fn read_status<T: FromStr<Err = UnknownValue>>(s: &str, id: &str, fallback: T) -> T {
    s.parse().unwrap_or_else(|e: UnknownValue| {
        tracing::error!(row = id, error = %e, "unreadable status");
        fallback
    })
}

/// An environment store row's status as an enum (the store's model; the domain row
/// [`Environment`] holds it typed).
pub trait EnvRow {
    /// The status; an unknown string reads as [`EnvStatus::Failed`] (logged).
    fn status(&self) -> EnvStatus;
    /// Sets the status.
    fn set_status(&mut self, s: EnvStatus);
}

impl EnvRow for crate::store::environments::Model {
    fn status(&self) -> EnvStatus {
        read_status(&self.status, &self.id, EnvStatus::Failed)
    }

    fn set_status(&mut self, s: EnvStatus) {
        self.status = s.as_str().to_string();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T>(all: &[T])
    where
        T: Copy + PartialEq + fmt::Debug + fmt::Display + FromStr<Err = UnknownValue>,
    {
        for v in all {
            assert_eq!(v.to_string().parse::<T>(), Ok(*v));
        }
    }

    fn joined<T: fmt::Display>(all: &[T]) -> String {
        all.iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    #[test]
    fn strings_are_the_stored_ones_and_round_trip() {
        round_trips(EnvStatus::ALL);
        round_trips(DeploymentStatus::ALL);
        round_trips(PhaseStatus::ALL);
        round_trips(PhaseName::ALL);
        round_trips(Kind::ALL);
        assert_eq!(
            joined(EnvStatus::ALL),
            "pending,deploying,healthy,failed,destroying,destroyed"
        );
        assert_eq!(
            joined(DeploymentStatus::ALL),
            "pending,running,succeeded,failed,rolled_back"
        );
        assert_eq!(
            joined(PhaseStatus::ALL),
            "pending,running,ok,failed,skipped"
        );
        assert_eq!(PhaseName::GateFork.as_str(), "gate.fork");
        assert_eq!(Kind::Promote.to_string(), "promote");
    }

    #[test]
    fn unknown_strings_are_named() {
        let e = "prove".parse::<Kind>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown deployment kind \"prove\" (expected one of deploy, fork, snapshot, \
             rollback, verify, destroy, promote)"
        );
        assert!("Running".parse::<DeploymentStatus>().is_err());
        assert!("".parse::<EnvStatus>().is_err());
        assert!("gate".parse::<PhaseName>().is_err());
    }

    #[test]
    fn every_kind_ends_with_verdict() {
        for k in Kind::ALL {
            assert_eq!(k.phases().last(), Some(&PhaseName::Verdict), "{k}");
            let names: Vec<_> = k.phases().iter().map(|p| p.as_str()).collect();
            let mut dedup = names.clone();
            dedup.dedup();
            assert_eq!(names, dedup, "{k} names a phase twice");
        }
        assert_eq!(Kind::Deploy.phases().len(), 11);
        assert_eq!(Kind::Promote.phases().len(), 7);
        assert_eq!(
            Kind::Verify.phases(),
            &[
                PhaseName::Stop,
                PhaseName::Collect,
                PhaseName::Snapshot,
                PhaseName::Clone,
                PhaseName::Grade,
                PhaseName::Verdict
            ]
        );
    }

    #[test]
    fn an_environment_row_reads_and_writes_its_status_as_an_enum() {
        let mut m = crate::store::environments::Model {
            id: "env_1".into(),
            project_id: String::new(),
            team_id: String::new(),
            name: String::new(),
            stage: String::new(),
            host_id: String::new(),
            parent_version_id: String::new(),
            current_version_id: String::new(),
            status: "deploying".into(),
            endpoints: String::new(),
            created_at: String::new(),
            expires_at: String::new(),
            pool: -1,
        };
        assert_eq!(m.status(), EnvStatus::Deploying);
        m.set_status(EnvStatus::Healthy);
        assert_eq!(m.status, "healthy");
        // A string no enum knows reads as failed (the repository refuses to save it).
        m.status = "exploded".into();
        assert_eq!(m.status(), EnvStatus::Failed);
    }

    /// Every pair `(from, to)` with `from != to` that `can_become` allows.
    fn allowed<T: Copy + PartialEq + fmt::Display>(
        all: &[T],
        can: impl Fn(T, T) -> bool,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for &a in all {
            for &b in all {
                if a != b && can(a, b) {
                    out.push(format!("{a}->{b}"));
                }
            }
        }
        out
    }

    #[test]
    fn deployment_transitions() {
        assert_eq!(
            allowed(DeploymentStatus::ALL, DeploymentStatus::can_become),
            [
                "pending->running",
                "pending->failed",
                "running->succeeded",
                "running->failed",
                "running->rolled_back"
            ]
        );
        for s in DeploymentStatus::ALL {
            if s.is_final() {
                assert!(
                    DeploymentStatus::ALL.iter().all(|n| !s.can_become(*n)),
                    "{s}"
                );
            }
        }
    }

    #[test]
    fn phase_transitions() {
        assert_eq!(
            allowed(PhaseStatus::ALL, PhaseStatus::can_become),
            [
                "pending->running",
                "pending->failed",
                "pending->skipped",
                "running->ok",
                "running->failed"
            ]
        );
        assert!(!PhaseStatus::Ok.can_become(PhaseStatus::Running));
        assert!(!PhaseStatus::Skipped.can_become(PhaseStatus::Ok));
        assert!(!PhaseStatus::Running.can_become(PhaseStatus::Skipped));
    }

    #[test]
    fn env_transitions() {
        assert_eq!(
            allowed(EnvStatus::ALL, EnvStatus::can_become),
            [
                "pending->deploying",
                "pending->failed",
                "pending->destroying",
                "deploying->healthy",
                "deploying->failed",
                "deploying->destroying",
                "healthy->deploying",
                "healthy->failed",
                "healthy->destroying",
                "failed->deploying",
                "failed->healthy",
                "failed->destroying",
                "destroying->failed",
                "destroying->destroyed",
                "destroyed->deploying",
                "destroyed->destroying",
            ]
        );
        // Nothing goes back to pending; only a destroy ends in destroyed.
        assert!(EnvStatus::ALL
            .iter()
            .all(|s| !s.can_become(EnvStatus::Pending)));
        assert!(!EnvStatus::Healthy.can_become(EnvStatus::Destroyed));
        assert!(!EnvStatus::Destroyed.can_become(EnvStatus::Healthy));
    }
}
