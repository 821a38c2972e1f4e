//! Deployment kinds, their ordered phases, and the status vocabulary
//! (spec page `16-ref-deployments.md`). The phase and command timeouts are in
//! [`denv_proto::contract`].

/// Deployment statuses.
pub mod status {
    /// Created, not started (also: queued behind another deployment of the same env).
    pub const PENDING: &str = "pending";
    /// Phases executing.
    pub const RUNNING: &str = "running";
    /// Every non-skipped phase ok.
    pub const SUCCEEDED: &str = "succeeded";
    /// A phase failed and nothing was reverted.
    pub const FAILED: &str = "failed";
    /// A deploy failed and the environment was restored to its previous version.
    pub const ROLLED_BACK: &str = "rolled_back";

    /// Whether a deployment status is final.
    pub fn is_final(s: &str) -> bool {
        matches!(s, SUCCEEDED | FAILED | ROLLED_BACK)
    }
}

/// Phase statuses.
pub mod phase_status {
    pub const PENDING: &str = "pending";
    pub const RUNNING: &str = "running";
    pub const OK: &str = "ok";
    pub const FAILED: &str = "failed";
    pub const SKIPPED: &str = "skipped";
}

/// Environment statuses.
pub mod env_status {
    pub const PENDING: &str = "pending";
    pub const DEPLOYING: &str = "deploying";
    pub const HEALTHY: &str = "healthy";
    pub const FAILED: &str = "failed";
    pub const DESTROYING: &str = "destroying";
    pub const DESTROYED: &str = "destroyed";
}

/// The kinds of deployment the orchestrator runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Deploy,
    Fork,
    Snapshot,
    Rollback,
    Verify,
    Destroy,
    Promote,
}

impl Kind {
    /// The stored `Kind` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Deploy => "deploy",
            Kind::Fork => "fork",
            Kind::Snapshot => "snapshot",
            Kind::Rollback => "rollback",
            Kind::Verify => "verify",
            Kind::Destroy => "destroy",
            Kind::Promote => "promote",
        }
    }

    /// Parses a stored `Kind` string.
    pub fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "deploy" => Kind::Deploy,
            "fork" => Kind::Fork,
            "snapshot" => Kind::Snapshot,
            "rollback" => Kind::Rollback,
            "verify" => Kind::Verify,
            "destroy" => Kind::Destroy,
            "promote" => Kind::Promote,
            _ => return None,
        })
    }

    /// The phases of this kind, in order; the last is always `verdict`.
    pub fn phases(self) -> &'static [&'static str] {
        match self {
            Kind::Deploy => &[
                "resolve",
                "place",
                "provision",
                "join",
                "prepare",
                "start",
                "health",
                "warm",
                "snapshot",
                "ingress",
                "verdict",
            ],
            Kind::Fork => &["place", "clone", "health", "verdict"],
            Kind::Snapshot => &["snapshot", "health", "verdict"],
            Kind::Rollback => &["restore", "health", "verdict"],
            Kind::Verify => &["stop", "collect", "snapshot", "clone", "grade", "verdict"],
            Kind::Destroy => &["teardown", "verdict"],
            Kind::Promote => &[
                "gate.fork",
                "gate.consistency",
                "gate.replay",
                "gate.invariants",
                "gate.soak",
                "apply",
                "verdict",
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_ends_with_verdict_and_round_trips() {
        for k in [
            Kind::Deploy,
            Kind::Fork,
            Kind::Snapshot,
            Kind::Rollback,
            Kind::Verify,
            Kind::Destroy,
            Kind::Promote,
        ] {
            assert_eq!(k.phases().last(), Some(&"verdict"));
            assert_eq!(Kind::parse(k.as_str()), Some(k));
        }
        assert_eq!(Kind::Deploy.phases().len(), 11);
        assert_eq!(Kind::Promote.phases().len(), 7);
        assert_eq!(Kind::parse("prove"), None);
    }
}
