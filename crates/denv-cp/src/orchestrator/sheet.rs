//! The data sheet of a version (`docs/reference/rest-api.md`, "Data sheet"; `denv
//! sheet`): what a lab asks about the world a run trained or was graded in, assembled
//! from the version and the evidence its deployments recorded. Nothing here talks to a
//! host.
//!
//! Shape (`null` where nothing was recorded):
//!
//! ```json
//! {"version": {"id", "number", "env", "env_name", "project", "created_at", "snapshot", "healthy"},
//!  "images": {"<service>": {"image", "image_id", "digest"}},
//!  "snapshot": {"deployment", "kind", "frozen_for_ms", "consistent", "datasets"},
//!  "datasets": {"<volume>": {"digest", "files", "bytes"}} | null,
//!  "egress": {"policy", "result", "probe", "deployment"},
//!  "caps": {"services": {"<service>": {"memory_mb", "pids", "cpus"}}, "disk_mb"},
//!  "clock": "real" | "frozen",
//!  "protections": {"agent_service", "agent_user", "verifier"},
//!  "gates": {"deployment", "status", "target", "error", "finished_at",
//!            "phases": [{"name", "status", "error", "evidence"}]} | null}
//! ```
//!
//! `datasets` and `gates` come from the newest `promote` of the version; `snapshot`
//! from the deployment that captured it (deploy, snapshot or verify); `egress` from the
//! newest deployment of the version's environment that proved it (a deploy's
//! `prepare` or a fork's `health`).

use super::repo;
use crate::domain::{DeploymentState, Kind, PhaseName};
use crate::error::ApiError;
use sea_orm::DatabaseConnection;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The sheet of version `version_id` of the team (`NotFound` when there is none).
pub async fn sheet(
    db: &DatabaseConnection,
    team_id: &str,
    version_id: &str,
) -> Result<Value, ApiError> {
    let version = repo::version(db, team_id, version_id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("version {version_id} not found")))?;
    let spec = &version.spec;
    let env = repo::env(db, team_id, &version.env_id).await?;
    let project = repo::project(db, team_id, &version.project_id).await?;

    // The deployment that captured the version, and what its phases recorded.
    let mut captured: Option<DeploymentState> = None;
    for kind in [Kind::Deploy, Kind::Snapshot, Kind::Verify] {
        let found = repo::deployments_of_version(db, team_id, &version.id, kind).await?;
        if let Some(d) = found.into_iter().next() {
            captured = Some(d);
            break;
        }
    }
    let phase = |d: &DeploymentState, name: PhaseName| -> Value {
        d.phases
            .iter()
            .find(|p| p.is(name))
            .map(|p| p.evidence.clone())
            .unwrap_or(Value::Null)
    };
    let snapshot = captured.as_ref().map(|d| {
        let ev = phase(d, PhaseName::Snapshot);
        json!({
            "deployment": d.deployment.id,
            "kind": d.deployment.kind,
            "frozen_for_ms": ev.get("frozen_for").cloned().unwrap_or(Value::Null),
            "consistent": ev.get("consistent").cloned().unwrap_or(Value::Null),
            "datasets": ev.get("datasets").cloned().unwrap_or(Value::Null),
        })
    });
    // Repository digests as the host read them back at the deploy (service → ref@sha256).
    let digests = captured
        .as_ref()
        .map(|d| phase(d, PhaseName::Prepare))
        .and_then(|ev| ev.get("digests").cloned())
        .unwrap_or(Value::Null);
    let images: BTreeMap<String, Value> = spec
        .services
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                json!({
                    "image": s.image,
                    "image_id": s.image_id,
                    "digest": digests.get(&s.name).cloned().unwrap_or(Value::Null),
                }),
            )
        })
        .collect();

    // The egress proof: the newest deploy or fork of the environment that recorded one.
    let mut egress = json!({"policy": spec.egress.as_str(), "result": Value::Null,
                            "probe": Value::Null, "deployment": Value::Null});
    if let Some(env) = &env {
        let mut deps = repo::deployments_of(db, &env.id).await?;
        deps.retain(|d| matches!(d.kind, Kind::Deploy | Kind::Fork));
        for d in deps {
            let full = repo::deployment(db, team_id, &d.id).await?;
            let Some(full) = full else { continue };
            let phase_name = if d.kind == Kind::Deploy {
                PhaseName::Prepare
            } else {
                PhaseName::Health
            };
            let ev = phase(&full, phase_name);
            if let Some(result) = ev.get("egress").filter(|v| !v.is_null()) {
                egress["result"] = result.clone();
                egress["probe"] = ev.get("egress_probe").cloned().unwrap_or(Value::Null);
                egress["deployment"] = json!(d.id);
                break;
            }
        }
    }

    // The gate record: the newest promote of the version.
    let promotes = repo::deployments_of_version(db, team_id, &version.id, Kind::Promote).await?;
    let gates = promotes.first().map(|d| {
        let dep = &d.deployment;
        let params = &dep.params;
        json!({
            "deployment": dep.id,
            "status": dep.status,
            "target": params.get("to").cloned().unwrap_or(Value::Null),
            "error": dep.error,
            "finished_at": dep.finished_at,
            "phases": d.phases.iter().map(|p| json!({
                "name": p.name,
                "status": p.status,
                "error": p.error,
                "evidence": p.evidence,
            })).collect::<Vec<_>>(),
        })
    });
    let datasets = promotes
        .iter()
        .find_map(|d| {
            let ev = phase(d, PhaseName::GateConsistency);
            ev.get("datasets").filter(|v| v.is_object()).cloned()
        })
        .unwrap_or(Value::Null);

    let caps: BTreeMap<String, Value> = spec
        .services
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                json!({"memory_mb": s.resources.memory_mb, "pids": s.resources.pids,
                       "cpus": s.resources.cpus}),
            )
        })
        .collect();
    let disk_mb = if spec.disk_mb == 0 {
        denv_compose::DEFAULT_DISK_MB
    } else {
        spec.disk_mb
    };
    let clock = match spec.clock {
        Some(denv_compose::Clock::Frozen) => "frozen",
        _ => "real",
    };
    let agent = spec.agent.as_ref().map(|a| a.service.clone());
    let agent_user = agent
        .as_ref()
        .and_then(|a| spec.service(a))
        .map(|s| s.user.clone());
    let verifier = spec.verifier.as_ref().map(|v| {
        json!({"image": v.image, "service": v.service, "command": v.command,
               "collect": v.collect, "timeout_sec": v.timeout_sec})
    });

    Ok(json!({
        "version": {
            "id": version.id,
            "number": version.number,
            "env": version.env_id,
            "env_name": env.as_ref().map(|e| e.name.clone()),
            "project": project.as_ref().map(|p| p.name.clone()),
            "created_at": version.created_at,
            "snapshot": version.snapshot,
            "healthy": version.healthy,
        },
        "images": images,
        "snapshot": snapshot,
        "datasets": datasets,
        "egress": egress,
        "caps": {"services": caps, "disk_mb": disk_mb},
        "clock": clock,
        "protections": {
            "agent_service": agent,
            "agent_user": agent_user,
            "verifier": verifier,
        },
        "gates": gates,
    }))
}
