//! Creating a sandbox (spec page `12-ref-rest-api.md`, `POST /v1/sandboxes`): one
//! environment for one episode, answered when it is healthy. The API edge
//! ([`crate::api::sandboxes`]) turns the wire request into a [`SandboxRequest`] (the
//! image form's one-service spec, the caps, the expiry); this module does the rest:
//! resolve the project, check the caps against the host placement would pick, refuse a
//! name in use, start the deploy or the fork (from the warm pool when it can), wait for
//! it, and destroy what a failed or abandoned create left.

use super::{lifecycle, repo, resources, Orchestrator, Pin};
use crate::domain::{Deployment, DeploymentStatus, EnvStatus, Environment};
use crate::error::ApiError;
use denv_compose::Spec;
use std::time::Duration;

/// The two forms of a sandbox (exactly one per request).
#[derive(Debug, Clone)]
pub enum SandboxForm {
    /// Deploy `spec` (built from an image) as a new environment of `project` (`""`: the
    /// team's `sandboxes` project, created on demand), placed on a host of the cloud
    /// named `target` when one is given.
    Image {
        spec: Box<Spec>,
        project: String,
        target: Option<String>,
    },
    /// Fork healthy version `from_version`; `pool` sets how many forks of it are kept
    /// warm from now on.
    Fork {
        from_version: String,
        pool: Option<i32>,
    },
}

/// A sandbox to create, as the API edge parsed it.
#[derive(Debug, Clone)]
pub struct SandboxRequest {
    /// The environment's name (the edge picks `sbx-<short>` when none was given).
    pub name: String,
    pub form: SandboxForm,
    /// Caps for the agent's service and the disk quota (empty: the spec's).
    pub caps: resources::Request,
    /// RFC 3339 time the TTL destroys it, `""` for none.
    pub expires_at: String,
    /// How long to wait for the deployment.
    pub timeout: Duration,
}

/// A sandbox that became healthy.
#[derive(Debug, Clone)]
pub struct SandboxCreated {
    pub environment: Option<Environment>,
    pub deployment: Deployment,
}

impl Orchestrator {
    /// Creates a sandbox and waits for it (see the module docs). Errors: `404` unknown
    /// project, cloud or version; `400` a version that is not a healthy snapshot, caps
    /// above the chosen host's capacity, `pool` on the image form; `409` a live
    /// environment of that name; `502` the deployment failed (its error; what it made
    /// is destroyed with reason `failed`); `504` still running at the timeout (the
    /// deployment carries on). Dropping the returned future before it is ready (the
    /// client went away) destroys the sandbox with reason `cancelled`.
    pub async fn create_sandbox(
        &self,
        team: &str,
        req: SandboxRequest,
    ) -> Result<SandboxCreated, ApiError> {
        let SandboxRequest {
            name,
            form,
            caps,
            expires_at,
            timeout,
        } = req;
        let started = match form {
            SandboxForm::Image {
                mut spec,
                project,
                target,
            } => {
                let pin = match &target {
                    None => None,
                    Some(t) => {
                        let cloud = crate::store::clouds::by_name(self.db(), team, t)
                            .await?
                            .ok_or_else(|| ApiError::NotFound(format!("no cloud named \"{t}\"")))?;
                        Some(Pin {
                            name: cloud.name,
                            provider: cloud.provider,
                            cloud_id: cloud.id,
                        })
                    }
                };
                resources::apply(&mut spec, &caps)?;
                let spec = *spec;
                // Placement as the runner will do it: 503 when no host has room, the
                // caps checked against the host it picks (400 above its capacity).
                super::placement::check_sandbox(self, team, pin.as_ref(), &spec, &caps).await?;
                let project_name = if project.is_empty() {
                    "sandboxes"
                } else {
                    project.as_str()
                };
                let project = match repo::project(self.db(), team, project_name).await? {
                    Some(p) => p,
                    None if project.is_empty() => {
                        repo::ensure_project(self.db(), team, "sandboxes").await?
                    }
                    None => {
                        return Err(ApiError::NotFound(format!(
                            "project {project_name} not found"
                        )))
                    }
                };
                if let Some(e) = repo::env_by_name(self.db(), team, &project.id, &name).await? {
                    if e.status != EnvStatus::Destroyed {
                        return Err(ApiError::Conflict(format!(
                            "environment \"{name}\" already exists"
                        )));
                    }
                }
                self.start_deploy_spec(
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
            SandboxForm::Fork { from_version, pool } => {
                let version = repo::version(self.db(), team, &from_version)
                    .await?
                    .ok_or_else(|| {
                        ApiError::NotFound(format!("version {from_version} not found"))
                    })?;
                if !version.healthy || version.snapshot.is_empty() {
                    return Err(ApiError::BadRequest(format!(
                        "version {} is not a healthy snapshot",
                        version.id
                    )));
                }
                let pool_owner = match pool {
                    Some(n) => Some((self.pool_owner_for(team, &version.id, n).await?, n)),
                    None => None,
                };
                let started = self
                    .fork_version(team, &version, &name, "fork", &expires_at, &caps)
                    .await?;
                if let Some((owner, n)) = pool_owner {
                    self.set_pool_size(team, &owner, n).await?;
                }
                started
            }
        };
        let dep = started.deployment;
        // Until an answer is returned, a dropped call (the client went away) destroys it.
        let mut guard = CancelGuard {
            orch: self.clone(),
            team: team.to_string(),
            env_id: dep.env_id.clone(),
            armed: true,
        };
        let done = self.wait_final(team, &dep.id, timeout).await?;
        let dep = done.deployment;
        guard.armed = false;
        match dep.status {
            DeploymentStatus::Succeeded => Ok(SandboxCreated {
                environment: repo::env(self.db(), team, &dep.env_id).await?,
                deployment: dep,
            }),
            DeploymentStatus::Failed | DeploymentStatus::RolledBack => {
                // The caller gets an error, not the environment: what was half made goes.
                let (o, t, env) = (self.clone(), team.to_string(), dep.env_id.clone());
                tokio::spawn(async move {
                    if let Err(e) = o.destroy_env(&t, &env, lifecycle::reason::FAILED).await {
                        tracing::error!(env = %env, error = %e, "destroying a failed sandbox");
                    }
                });
                Err(ApiError::BadGateway(if dep.error.is_empty() {
                    format!("deployment {} failed", dep.id)
                } else {
                    dep.error
                }))
            }
            _ => Err(ApiError::Timeout(format!(
                "sandbox did not become healthy within {} s (deployment {})",
                timeout.as_secs(),
                dep.id
            ))),
        }
    }
}

/// Destroys the sandbox (reason `cancelled`) when the create is dropped before it
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
