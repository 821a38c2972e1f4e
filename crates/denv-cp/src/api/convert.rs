//! The API edge: the domain rows ([`crate::domain`]) as the wire messages
//! (`denv_proto::v1`) that gRPC and the REST gateway answer with, in one place.
//!
//! The JSON the API prints is exactly what it was when the rows were the messages: a
//! version's spec is its stored JSON object as a `google.protobuf.Struct`, a
//! deployment's params a `Struct` (an empty one when not an object), a phase's evidence
//! a `google.protobuf.Value` (`null` when none).

use crate::domain;
use denv_proto::json::{to_struct, to_value};
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

impl From<&domain::Deployment> for v1::Deployment {
    fn from(d: &domain::Deployment) -> Self {
        v1::Deployment {
            id: d.id.clone(),
            project_id: d.project_id.clone(),
            env_id: d.env_id.clone(),
            kind: d.kind.as_str().to_string(),
            status: d.status.as_str().to_string(),
            version_id: d.version_id.clone(),
            target_env_id: d.target_env_id.clone(),
            params: Some(to_struct(&d.params)),
            error: d.error.clone(),
            created_at: d.created_at.clone(),
            finished_at: d.finished_at.clone(),
        }
    }
}

impl From<&domain::Phase> for v1::Phase {
    fn from(p: &domain::Phase) -> Self {
        v1::Phase {
            deployment_id: p.deployment_id.clone(),
            seq: p.seq,
            name: p.name.as_str().to_string(),
            status: p.status.as_str().to_string(),
            evidence: Some(to_value(&p.evidence)),
            error: p.error.clone(),
            started_at: p.started_at.clone(),
            finished_at: p.finished_at.clone(),
        }
    }
}

impl From<&domain::DeploymentState> for v1::DeploymentResponse {
    fn from(s: &domain::DeploymentState) -> Self {
        v1::DeploymentResponse {
            deployment: Some((&s.deployment).into()),
            phases: s.phases.iter().map(v1::Phase::from).collect(),
        }
    }
}

impl From<domain::DeploymentState> for v1::DeploymentResponse {
    fn from(s: domain::DeploymentState) -> Self {
        (&s).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{DeploymentStatus, Kind, PhaseName, PhaseStatus};
    use denv_proto::json::to_json;
    use serde_json::{json, Value};

    fn state() -> domain::DeploymentState {
        let deployment = domain::Deployment {
            id: "dep_1".into(),
            project_id: "prj_1".into(),
            env_id: "env_1".into(),
            status: DeploymentStatus::Failed,
            version_id: "ver_1".into(),
            params: json!({"resume": true, "n": 2}),
            error: "grade: verifier wrote no reward (exit 3)".into(),
            created_at: "2026-12-01T10:00:00.000Z".into(),
            finished_at: "2026-12-01T10:00:05.000Z".into(),
            ..domain::Deployment::new(Kind::Verify)
        };
        let phase = |seq, name, status, evidence| domain::Phase {
            deployment_id: "dep_1".into(),
            seq,
            name,
            status,
            evidence,
            error: String::new(),
            started_at: String::new(),
            finished_at: String::new(),
        };
        domain::DeploymentState {
            deployment,
            phases: vec![
                phase(
                    1,
                    PhaseName::Stop,
                    PhaseStatus::Ok,
                    json!({"exit_code": 0, "reward": 0.5, "took_ms": 812, "x": 3.0}),
                ),
                phase(2, PhaseName::Collect, PhaseStatus::Pending, Value::Null),
            ],
        }
    }

    #[test]
    fn a_deployment_is_the_message_the_rows_were() {
        let s = state();
        // What the API answered when deployments and phases were the messages.
        let before = v1::DeploymentResponse {
            deployment: Some(v1::Deployment {
                id: "dep_1".into(),
                project_id: "prj_1".into(),
                env_id: "env_1".into(),
                kind: "verify".into(),
                status: "failed".into(),
                version_id: "ver_1".into(),
                target_env_id: String::new(),
                params: Some(to_struct(&json!({"resume": true, "n": 2}))),
                error: "grade: verifier wrote no reward (exit 3)".into(),
                created_at: "2026-12-01T10:00:00.000Z".into(),
                finished_at: "2026-12-01T10:00:05.000Z".into(),
            }),
            phases: vec![
                v1::Phase {
                    deployment_id: "dep_1".into(),
                    seq: 1,
                    name: "stop".into(),
                    status: "ok".into(),
                    evidence: Some(to_value(
                        &json!({"exit_code": 0, "reward": 0.5, "took_ms": 812, "x": 3.0}),
                    )),
                    ..Default::default()
                },
                v1::Phase {
                    deployment_id: "dep_1".into(),
                    seq: 2,
                    name: "collect".into(),
                    status: "pending".into(),
                    evidence: Some(to_value(&Value::Null)),
                    ..Default::default()
                },
            ],
        };
        assert_eq!(v1::DeploymentResponse::from(&s), before);
    }

    #[test]
    fn a_deployment_prints_with_the_documented_field_names() {
        let j = to_json(&v1::DeploymentResponse::from(state()));
        assert_eq!(
            serde_json::to_string(&j).unwrap(),
            concat!(
                r#"{"deployment":{"CreatedAt":"2026-12-01T10:00:00.000Z","EnvID":"env_1","#,
                r#""Error":"grade: verifier wrote no reward (exit 3)","#,
                r#""FinishedAt":"2026-12-01T10:00:05.000Z","ID":"dep_1","Kind":"verify","#,
                r#""Params":{"n":2,"resume":true},"ProjectID":"prj_1","Status":"failed","#,
                r#""TargetEnvID":"","VersionID":"ver_1"},"phases":["#,
                r#"{"DeploymentID":"dep_1","Error":"","#,
                r#""Evidence":{"exit_code":0,"reward":0.5,"took_ms":812,"x":3},"#,
                r#""FinishedAt":"","Name":"stop","Seq":1,"StartedAt":"","Status":"ok"},"#,
                r#"{"DeploymentID":"dep_1","Error":"","Evidence":null,"FinishedAt":"","#,
                r#""Name":"collect","Seq":2,"StartedAt":"","Status":"pending"}]}"#
            )
        );
    }
}
