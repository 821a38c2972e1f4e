//! The rows the orchestrator works on: an environment, a version (its compose spec
//! parsed once, when the row is read), a deployment, a phase, and a deployment with its
//! phases ([`DeploymentState`], what a deployment's watch channel carries).
//!
//! Statuses, kinds and phase names are the enums of [`crate::domain`]; params and
//! evidence are JSON, kept as the store keeps them (whole numbers as integers). The
//! repository ([`crate::orchestrator::repo`]) reads and writes these rows; the API edge
//! turns them into the wire messages (`denv_proto::v1`) in one place,
//! [`crate::api::convert`].

use super::{DeploymentStatus, EnvStatus, Kind, PhaseName, PhaseStatus};
use serde_json::Value;
use std::collections::BTreeMap;

/// An environment (`environments`).
#[derive(Debug, Clone, PartialEq)]
pub struct Environment {
    pub id: String,
    pub project_id: String,
    pub name: String,
    /// `alpha`, `fork`, `verify`, `sandbox`, `gate`, `pool`, ...
    pub stage: String,
    pub host_id: String,
    pub parent_version_id: String,
    pub current_version_id: String,
    pub status: EnvStatus,
    pub created_at: String,
    /// Service → `127.0.0.1:port` (only with egress allow).
    pub endpoints: BTreeMap<String, String>,
    /// When the TTL destroys it, RFC 3339; `""` = no TTL.
    pub expires_at: String,
}

impl Default for Environment {
    fn default() -> Self {
        Environment {
            id: String::new(),
            project_id: String::new(),
            name: String::new(),
            stage: String::new(),
            host_id: String::new(),
            parent_version_id: String::new(),
            current_version_id: String::new(),
            status: EnvStatus::Pending,
            created_at: String::new(),
            endpoints: BTreeMap::new(),
            expires_at: String::new(),
        }
    }
}

/// A version of an environment (`versions`): the compose spec it runs and the snapshot
/// that captured it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Version {
    pub id: String,
    pub project_id: String,
    pub env_id: String,
    pub number: i32,
    /// The compose spec (stored as its JSON).
    pub spec: denv_compose::Spec,
    /// Snapshot name on the host (`""` until captured).
    pub snapshot: String,
    pub healthy: bool,
    pub created_at: String,
}

/// A deployment (`deployments`).
#[derive(Debug, Clone, PartialEq)]
pub struct Deployment {
    pub id: String,
    pub project_id: String,
    pub env_id: String,
    pub kind: Kind,
    pub status: DeploymentStatus,
    pub version_id: String,
    pub target_env_id: String,
    /// The request's parameters, a JSON object (`{}` when none).
    pub params: Value,
    pub error: String,
    pub created_at: String,
    pub finished_at: String,
}

impl Deployment {
    /// A `pending` deployment of `kind` with no ids, params `{}` and no times.
    pub fn new(kind: Kind) -> Self {
        Deployment {
            id: String::new(),
            project_id: String::new(),
            env_id: String::new(),
            kind,
            status: DeploymentStatus::Pending,
            version_id: String::new(),
            target_env_id: String::new(),
            params: Value::Object(Default::default()),
            error: String::new(),
            created_at: String::new(),
            finished_at: String::new(),
        }
    }
}

/// A phase of a deployment (`phases`).
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    pub deployment_id: String,
    pub seq: i32,
    pub name: PhaseName,
    pub status: PhaseStatus,
    /// What the phase recorded, a JSON value (`null` when none).
    pub evidence: Value,
    pub error: String,
    pub started_at: String,
    pub finished_at: String,
}

impl Phase {
    /// Whether this is phase `name`.
    pub fn is(&self, name: PhaseName) -> bool {
        self.name == name
    }
}

/// A deployment with its phases, in order: what the repository reads and a running
/// deployment's watch channel carries.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentState {
    pub deployment: Deployment,
    pub phases: Vec<Phase>,
}
