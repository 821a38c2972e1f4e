//! `SandboxService` (spec page `12-ref-rest-api.md`, `POST /v1/sandboxes`): one
//! environment for one episode, answered when it is healthy. This edge checks the
//! request's form and builds its parts (the image form's spec, the caps, the expiry);
//! [`crate::orchestrator::sandbox`] creates it.
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
//! `resources` (either form; [`crate::orchestrator::resources`]): caps for this sandbox, replacing the
//! spec's for the agent's service (`main` in the image form) and the environment's disk
//! quota; `400` naming the key when invalid or above the capacity of the host the
//! sandbox would go to. A fork with caps of its own is never taken from the warm pool.
//!
//! `target` (set by `POST /v1/targets/{name}/sandboxes`, image form only) pins placement
//! to a connected host that joined through the cloud named `{name}` (`404` when the team
//! has no such cloud); with none connected the deployment fails at `place` with
//! `target "<name>" (<provider>): no connected host` (so the call answers `502`).

use crate::error::ApiError;
use crate::orchestrator::sandbox::{SandboxForm, SandboxRequest};
use crate::orchestrator::{lifecycle, short_id, Orchestrator};
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
        let form = match (r.image.is_empty(), r.from_version.is_empty()) {
            (false, true) => {
                if r.pool.is_some() {
                    return Err(ApiError::BadRequest(
                        "pool takes the from_version form only".into(),
                    )
                    .into());
                }
                SandboxForm::Image {
                    spec: Box::new(image_spec(&r)?),
                    project: r.project.clone(),
                    target: Some(r.target.clone()).filter(|t| !t.is_empty()),
                }
            }
            (true, false) => {
                if !r.target.is_empty() {
                    return Err(ApiError::BadRequest(
                        "a target sandbox takes the image form only".into(),
                    )
                    .into());
                }
                SandboxForm::Fork {
                    from_version: r.from_version.clone(),
                    pool: r.pool,
                }
            }
            _ => {
                return Err(ApiError::BadRequest(
                    "give exactly one of image or from_version".into(),
                )
                .into())
            }
        };
        let timeout_sec = if r.timeout_sec <= 0 {
            DEFAULT_TIMEOUT_SEC
        } else {
            r.timeout_sec
        };
        let created = self
            .orch()
            .create_sandbox(
                &caller.team_id,
                SandboxRequest {
                    name: if r.name.is_empty() {
                        format!("sbx-{}", short_id())
                    } else {
                        r.name.clone()
                    },
                    form,
                    caps: super::convert::caps(r.resources.as_ref())?,
                    expires_at: lifecycle::expiry_from_ttl(r.ttl_sec)?,
                    timeout: Duration::from_secs(timeout_sec as u64),
                },
            )
            .await?;
        Ok(Response::new(v1::CreateSandboxResponse {
            environment: created.environment.as_ref().map(v1::Environment::from),
            deployment: Some((&created.deployment).into()),
            target: r.target,
        }))
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
