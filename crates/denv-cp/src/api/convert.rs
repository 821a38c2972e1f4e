//! The API edge: the domain rows ([`crate::domain`]) as the wire messages
//! (`denv_proto::v1`) that gRPC and the REST gateway answer with, in one place.
//!
//! The JSON the API prints is exactly what it was when the rows were the messages: a
//! version's spec is its stored JSON object as a `google.protobuf.Struct`, a
//! deployment's params a `Struct` (an empty one when not an object), a phase's evidence
//! a `google.protobuf.Value` (`null` when none).

use crate::domain;
use denv_proto::json::to_struct;
use denv_proto::v1;

impl From<&domain::Version> for v1::Version {
    fn from(v: &domain::Version) -> Self {
        let spec = serde_json::to_value(&v.spec).unwrap_or_default();
        v1::Version {
            id: v.id.clone(),
            project_id: v.project_id.clone(),
            env_id: v.env_id.clone(),
            number: v.number,
            spec: Some(to_struct(&spec)),
            snapshot: v.snapshot.clone(),
            healthy: v.healthy,
            created_at: v.created_at.clone(),
        }
    }
}

impl From<&domain::Environment> for v1::Environment {
    fn from(e: &domain::Environment) -> Self {
        v1::Environment {
            id: e.id.clone(),
            project_id: e.project_id.clone(),
            name: e.name.clone(),
            stage: e.stage.clone(),
            host_id: e.host_id.clone(),
            parent_version_id: e.parent_version_id.clone(),
            current_version_id: e.current_version_id.clone(),
            status: e.status.as_str().to_string(),
            created_at: e.created_at.clone(),
            endpoints: e
                .endpoints
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            expires_at: e.expires_at.clone(),
        }
    }
}

/// An environment's store row as the wire message (the listings that read rows).
pub fn env_row(m: &crate::store::environments::Model) -> v1::Environment {
    (&crate::orchestrator::repo::env_of(m)).into()
}
