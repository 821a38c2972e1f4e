//! The API edge: the domain rows ([`crate::domain`]) and the store rows the API lists
//! ([`crate::store`]: users, teams, keys, projects, sources, installations, events) as
//! the wire messages (`denv_proto::v1`) that gRPC and the REST gateway answer with, in
//! one place.
//!
//! The JSON the API prints is exactly what it was when the rows were the messages: a
//! version's spec is its stored JSON object as a `google.protobuf.Struct`, a
//! deployment's params a `Struct` (an empty one when not an object), a phase's evidence
//! a `google.protobuf.Value` (`null` when none).

use crate::domain;
use crate::store::{api_keys, events, installations, projects, sources, teams, users};
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

// ---------------------------------------------------------------- store rows

/// A team as the wire message with the caller's `role` (`owner`, `member`, `key`, or
/// `""`).
pub fn team(t: &teams::Model, role: &str) -> v1::Team {
    v1::Team {
        id: t.id.clone(),
        name: t.name.clone(),
        created_at: t.created_at.clone(),
        role: role.to_string(),
    }
}

impl From<&users::Model> for v1::User {
    fn from(u: &users::Model) -> Self {
        v1::User {
            id: u.id.clone(),
            github_id: u.github_id,
            login: u.login.clone(),
            name: u.name.clone(),
            email: u.email.clone(),
            created_at: u.created_at.clone(),
        }
    }
}

/// No key material: the hash stays in the store.
impl From<&api_keys::Model> for v1::ApiKey {
    fn from(k: &api_keys::Model) -> Self {
        v1::ApiKey {
            id: k.id.clone(),
            team_id: k.team_id.clone(),
            name: k.name.clone(),
            created_by: k.created_by.clone(),
            created_at: k.created_at.clone(),
            last_used_at: k.last_used_at.clone(),
            revoked_at: k.revoked_at.clone(),
        }
    }
}

impl From<&projects::Model> for v1::Project {
    fn from(p: &projects::Model) -> Self {
        v1::Project {
            id: p.id.clone(),
            team_id: p.team_id.clone(),
            name: p.name.clone(),
            kind: p.kind.clone(),
            source: p.source.clone(),
            created_at: p.created_at.clone(),
        }
    }
}

impl From<&sources::Model> for v1::Source {
    fn from(s: &sources::Model) -> Self {
        v1::Source {
            project_id: s.project_id.clone(),
            repo: s.repo.clone(),
            default_branch: s.default_branch.clone(),
            compose_path: s.compose_path.clone(),
            installation_id: s.installation_id,
            deploy_branches: s.deploy_branches,
            last_deployed_sha: s.last_deployed_sha.clone(),
        }
    }
}

impl From<&installations::Model> for v1::Installation {
    fn from(i: &installations::Model) -> Self {
        v1::Installation {
            installation_id: i.installation_id,
            team_id: i.team_id.clone(),
            account_login: i.account_login.clone(),
            created_at: i.created_at.clone(),
        }
    }
}

/// The body is the stored JSON as a `google.protobuf.Value`.
impl From<&events::Model> for v1::Event {
    fn from(e: &events::Model) -> Self {
        v1::Event {
            id: e.id.clone(),
            team_id: e.team_id.clone(),
            subject: e.subject.clone(),
            kind: e.kind.clone(),
            body: Some(to_value(&e.body_json())),
            at: e.at.clone(),
        }
    }
}

/// A request's `resources` object as caps ([`crate::orchestrator::resources::parse`]);
/// absent, or not an object, is no caps.
///
/// # Errors
/// `400` naming `resources.<key>` and the rule it broke.
pub fn caps(
    s: Option<&pbjson_types::Struct>,
) -> Result<crate::orchestrator::resources::Request, crate::error::ApiError> {
    match s.map(denv_proto::json::from_struct) {
        Some(serde_json::Value::Object(m)) => crate::orchestrator::resources::parse(&m),
        _ => Ok(Default::default()),
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
