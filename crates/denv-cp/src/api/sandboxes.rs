//! `SandboxService` (spec page `12-ref-rest-api.md`, `POST /v1/sandboxes`): one
//! environment for one episode, answered when it is healthy.
//!
//! Two request forms, exactly one of them (`400 give exactly one of image or
//! from_version` otherwise):
//!
//! - **image**: a one-service spec built by [`image_spec`] (service `main`; `cmd`, `env`,
//!   `ports`; `volumes` default `["/work"]`, each path a named volume `v0`, `v1`, …;
//!   `egress` default `deny`; `ports` are published on `127.0.0.1` under either egress:
//!   a denied sandbox still serves on them and is still denied the internet),
//!   deployed as environment `name` (default `sbx-<short>`, stage `sandbox`) of project
//!   `project` (default `sandboxes`, created on demand).
//! - **from_version**: a fork (stage `fork`) of that healthy version (`404` unknown,
//!   `400` not a healthy snapshot), handed out from the version's warm pool when a member
//!   is ready ([`crate::orchestrator::pool`]). `pool` (this form only, `0..=64`) sets
//!   how many forks of the version are kept warm from now on; the version must be its
//!   environment's current version (`400` otherwise).
//!
//! The call waits up to `timeout_sec` (default 600) for the deployment: `succeeded` is
//! `201 {environment, deployment}`; `failed`/`rolled_back` is `502` with the
//! deployment's error; still running is `504` (the deployment carries on).
//! An existing, not destroyed environment of the same name is `409`.
//!
//! `ttl_sec` (0 = none, at most 365 days) sets the sandbox's `expires_at`: it is
//! destroyed then with reason `ttl` (see [`lifecycle`]). A call dropped before it answers
//! (the client disconnected or cancelled) destroys the sandbox with reason `cancelled`; a
//! create that failed (`502`) destroys it with reason `failed`.
//!
//! `resources` (either form; [`resources`]): caps for this sandbox, replacing the
//! spec's for the agent's service (`main` in the image form) and the environment's disk
//! quota; `400` naming the key when invalid or above the capacity of the host the
//! sandbox would go to. A fork with caps of its own is never taken from the warm pool.
//!
//! `target` (set by `POST /v1/targets/{name}/sandboxes`, image form only) pins placement
//! to a connected host that joined through the cloud named `{name}` (`404` when the team
//! has no such cloud); with none connected the deployment fails at `place` with
//! `target "<name>" (<provider>): no connected host` (so the call answers `502`).

use crate::domain::{DeploymentRow, DeploymentStatus, EnvStatus};
use crate::error::ApiError;
use crate::orchestrator::{lifecycle, repo, resources, short_id, Orchestrator, Pin};
use crate::state::AppState;
use denv_compose::{Egress, Resources, Service, Spec, VolumeMount};
use denv_proto::v1::{
    self, sandbox_service_server::SandboxService, sandbox_service_server::SandboxServiceServer,
};
use std::time::Duration;
use tonic::{Request, Response, Status};

/// Default wait for health (seconds).
pub const DEFAULT_TIMEOUT_SEC: i32 = 600;

/// The gRPC implementation of `denv.v1.SandboxService`.
#[derive(Clone)]
pub struct SandboxApi {
    state: AppState,
}

impl SandboxApi {
    /// The service over the shared state.
    pub fn new(state: AppState) -> Self {
        SandboxApi { state }
    }

    /// The tonic server.
    pub fn server(state: AppState) -> SandboxServiceServer<SandboxApi> {
        SandboxServiceServer::new(Self::new(state))
            .max_decoding_message_size(denv_proto::contract::API_MESSAGE_MAX_BYTES)
            .max_encoding_message_size(denv_proto::contract::API_MESSAGE_MAX_BYTES)
    }

    fn orch(&self) -> &Orchestrator {
        &self.state.orchestrator
    }
}

/// A container port from a sandbox request: `"80"`, `"80/tcp"`, or `"8080:80"` (the
/// container side is kept, as in compose).
fn parse_port(p: &str) -> Result<u16, ApiError> {
    let container = p.rsplit(':').next().unwrap_or(p);
    let container = container.strip_suffix("/tcp").unwrap_or(container);
    container
        .trim()
        .parse::<u16>()
        .ok()
        .filter(|n| *n != 0)
        .ok_or_else(|| ApiError::BadRequest(format!("invalid port \"{p}\"")))
}

/// The one-service spec of an image sandbox (see the module docs).
pub fn image_spec(req: &v1::CreateSandboxRequest) -> Result<Spec, ApiError> {
    let egress = match req.egress.as_str() {
        "" | "deny" => Egress::Deny,
        "allow" => Egress::Allow,
        other => {
            return Err(ApiError::BadRequest(format!(
                "egress must be deny or allow, got \"{other}\""
            )))
        }
    };
    let ports = req
        .ports
        .iter()
        .map(|p| parse_port(p))
        .collect::<Result<Vec<_>, _>>()?;
    let paths: Vec<String> = if req.volumes.is_empty() {
        vec!["/work".to_string()]
    } else {
        req.volumes.clone()
    };
    let mut mounts = Vec::with_capacity(paths.len());
    for (i, p) in paths.iter().enumerate() {
        if !p.starts_with('/') {
            return Err(ApiError::BadRequest(format!(
                "volume path \"{p}\" must be absolute"
            )));
        }
        mounts.push(VolumeMount {
            name: format!("v{i}"),
            path: p.clone(),
            read_only: false,
        });
    }
    let mut volumes: Vec<String> = mounts.iter().map(|m| m.name.clone()).collect();
    volumes.sort();
    Ok(Spec {
        services: vec![Service {
            name: "main".into(),
            image: req.image.clone(),
            env: req.env.clone().into_iter().collect(),
            ports,
            volumes: mounts,
            health: None,
            depends_on: vec![],
            depends_on_condition: Default::default(),
            command: req.cmd.clone(),
            user: String::new(),
            resources: Resources::default(),
            cap_add: vec![],
            image_id: String::new(),
        }],
        volumes,
        egress,
        kind: String::new(),
        warm: vec![],
        agent: None,
        verifier: None,
        clock: None,
        world_instant_ms: 0,
        disk_mb: 0,
        builds: Default::default(),
        pool: 0,
        promote: None,
    })
}

#[tonic::async_trait]
impl SandboxService for SandboxApi {
    async fn create_sandbox(
        &self,
        req: Request<v1::CreateSandboxRequest>,
    ) -> Result<Response<v1::CreateSandboxResponse>, Status> {
        let caller = crate::auth::authenticate(&self.state, req.metadata()).await?;
        let r = req.into_inner();
        let team = caller.team_id.as_str();
        let orch = self.orch();
        let expires_at = lifecycle::expiry_from_ttl(r.ttl_sec)?;
        let caps = resources::parse(r.resources.as_ref())?;
        let name = if r.name.is_empty() {
            format!("sbx-{}", short_id())
        } else {
            r.name.clone()
        };
        let started = match (r.image.is_empty(), r.from_version.is_empty()) {
            (false, true) => {
                if r.pool.is_some() {
                    return Err(ApiError::BadRequest(
                        "pool takes the from_version form only".into(),
                    )
                    .into());
                }
                let pin = if r.target.is_empty() {
                    None
                } else {
                    let cloud = crate::store::clouds::by_name(orch.db(), team, &r.target)
                        .await
                        .map_err(|e| ApiError::Internal(format!("store: {e}")))?
                        .ok_or_else(|| {
                            ApiError::NotFound(format!("no cloud named \"{}\"", r.target))
                        })?;
                    Some(Pin {
                        name: cloud.name,
                        provider: cloud.provider,
                        cloud_id: cloud.id,
                    })
                };
                let mut spec = image_spec(&r)?;
                resources::apply(&mut spec, &caps)?;
                if !caps.is_empty() {
                    // Checked against the host placement would pick now (a pinned
                    // cloud's connected host, else the team's first connected host).
                    let host = match &pin {
                        Some(p) => crate::store::hosts::list(orch.db(), team)
                            .await
                            .map_err(|e| ApiError::Internal(format!("store: {e}")))?
                            .into_iter()
                            .find(|h| h.cloud_id == p.cloud_id && orch.link().is_connected(&h.id))
                            .map(|h| h.id),
                        None => orch.link().first_connected_host(team),
                    };
                    if let Some(h) = host {
                        orch.check_caps_on_host(&h, &caps).await?;
                    }
                }
                let project_name = if r.project.is_empty() {
                    "sandboxes"
                } else {
                    r.project.as_str()
                };
                let project = match repo::project(orch.db(), team, project_name).await? {
                    Some(p) => p,
                    None if r.project.is_empty() => {
                        repo::ensure_project(orch.db(), team, "sandboxes").await?
                    }
                    None => {
                        return Err(
                            ApiError::NotFound(format!("project {project_name} not found")).into(),
                        )
                    }
                };
                if let Some(e) = repo::env_by_name(orch.db(), team, &project.id, &name).await? {
                    if e.status != EnvStatus::Destroyed {
                        return Err(ApiError::Conflict(format!(
                            "environment \"{name}\" already exists"
                        ))
                        .into());
                    }
                }
                orch.start_deploy_spec(
                    team,
                    &project.id,
                    &name,
                    "sandbox",
                    spec,
                    vec![],
                    pin,
                    &expires_at,
                )
                .await?
            }
            (true, false) => {
                if !r.target.is_empty() {
                    return Err(ApiError::BadRequest(
                        "a target sandbox takes the image form only".into(),
                    )
                    .into());
                }
                let version = repo::version(orch.db(), team, &r.from_version)
                    .await?
                    .ok_or_else(|| {
                        ApiError::NotFound(format!("version {} not found", r.from_version))
                    })?;
                if !version.healthy || version.snapshot.is_empty() {
                    return Err(ApiError::BadRequest(format!(
                        "version {} is not a healthy snapshot",
                        version.id
                    ))
                    .into());
                }
                let pool_owner = match r.pool {
                    Some(n) => Some((orch.pool_owner_for(team, &version.id, n).await?, n)),
                    None => None,
                };
                let started = orch
                    .fork_version(team, &version, &name, "fork", &expires_at, &caps)
                    .await?;
                if let Some((owner, n)) = pool_owner {
                    orch.set_pool_size(team, &owner, n).await?;
                }
                started
            }
            _ => {
                return Err(ApiError::BadRequest(
                    "give exactly one of image or from_version".into(),
                )
                .into())
            }
        };
        let dep = started.deployment.unwrap_or_default();
        // Until an answer is returned, a dropped call (the client went away) destroys it.
        let mut guard = CancelGuard {
            orch: orch.clone(),
            team: team.to_string(),
            env_id: dep.env_id.clone(),
            armed: true,
        };
        let timeout_sec = if r.timeout_sec <= 0 {
            DEFAULT_TIMEOUT_SEC
        } else {
            r.timeout_sec
        };
        let done = orch
            .wait_final(team, &dep.id, Duration::from_secs(timeout_sec as u64))
            .await?;
        let dep = done.deployment.unwrap_or(dep);
        guard.armed = false;
        match dep.status() {
            DeploymentStatus::Succeeded => {
                let environment = repo::env(orch.db(), team, &dep.env_id).await?;
                Ok(Response::new(v1::CreateSandboxResponse {
                    environment: environment.as_ref().map(v1::Environment::from),
                    deployment: Some(dep),
                    target: r.target,
                }))
            }
            DeploymentStatus::Failed | DeploymentStatus::RolledBack => {
                // The caller gets an error, not the environment: what was half made goes.
                let (o, t, env) = (orch.clone(), team.to_string(), dep.env_id.clone());
                tokio::spawn(async move {
                    if let Err(e) = o.destroy_env(&t, &env, lifecycle::reason::FAILED).await {
                        tracing::error!(env = %env, error = %e, "destroying a failed sandbox");
                    }
                });
                Err(ApiError::BadGateway(if dep.error.is_empty() {
                    format!("deployment {} failed", dep.id)
                } else {
                    dep.error
                })
                .into())
            }
            _ => Err(ApiError::Timeout(format!(
                "sandbox did not become healthy within {timeout_sec} s (deployment {})",
                dep.id
            ))
            .into()),
        }
    }
}

/// Destroys the sandbox (reason `cancelled`) when the call is dropped before it
/// answers: the client disconnected (HTTP) or cancelled (gRPC) while it was being created.
struct CancelGuard {
    orch: Orchestrator,
    team: String,
    env_id: String,
    armed: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.armed || self.env_id.is_empty() {
            return;
        }
        let (orch, team, env) = (
            self.orch.clone(),
            std::mem::take(&mut self.team),
            std::mem::take(&mut self.env_id),
        );
        tracing::warn!(env = %env, "the client went away while its sandbox was created; destroying it");
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = orch
                    .destroy_env(&team, &env, lifecycle::reason::CANCELLED)
                    .await
                {
                    tracing::error!(env = %env, error = %e, "destroying a cancelled sandbox");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> v1::CreateSandboxRequest {
        v1::CreateSandboxRequest {
            image: "busybox:1.36".into(),
            cmd: vec!["sleep".into(), "infinity".into()],
            ..Default::default()
        }
    }

    #[test]
    fn image_form_defaults_to_one_work_volume_and_deny() {
        let s = image_spec(&req()).unwrap();
        assert_eq!(s.services.len(), 1);
        let m = &s.services[0];
        assert_eq!(m.name, "main");
        assert_eq!(m.image, "busybox:1.36");
        assert_eq!(m.command, vec!["sleep", "infinity"]);
        assert_eq!(m.volumes.len(), 1);
        assert_eq!(m.volumes[0].name, "v0");
        assert_eq!(m.volumes[0].path, "/work");
        assert_eq!(s.volumes, vec!["v0"]);
        assert_eq!(s.egress, Egress::Deny);
    }

    #[test]
    fn volumes_become_numbered_named_volumes() {
        let mut r = req();
        r.volumes = vec!["/a".into(), "/b".into()];
        r.egress = "allow".into();
        r.ports = vec!["8080:80".into(), "9000/tcp".into()];
        let s = image_spec(&r).unwrap();
        let names: Vec<_> = s.services[0]
            .volumes
            .iter()
            .map(|v| (v.name.as_str(), v.path.as_str()))
            .collect();
        assert_eq!(names, vec![("v0", "/a"), ("v1", "/b")]);
        assert_eq!(s.services[0].ports, vec![80, 9000]);
        assert_eq!(s.egress, Egress::Allow);
    }

    #[test]
    fn ports_under_deny() {
        let mut r = req();
        r.ports = vec!["80".into()];
        let s = image_spec(&r).unwrap();
        assert_eq!(s.egress, Egress::Deny);
        assert_eq!(s.services[0].ports, vec![80]);
    }

    #[test]
    fn refusals() {
        let mut r = req();
        r.egress = "maybe".into();
        assert!(image_spec(&r).is_err());
        let mut r = req();
        r.volumes = vec!["work".into()];
        assert!(image_spec(&r).is_err());
        let mut r = req();
        r.egress = "allow".into();
        r.ports = vec!["http".into()];
        assert!(image_spec(&r).is_err());
    }
}
