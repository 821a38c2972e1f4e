//! `EnvironmentService` (spec page `12-ref-rest-api.md`, Environments):
//!
//! | rpc | REST | answer |
//! |---|---|---|
//! | `GetEnv` | `GET /v1/envs/{env}` | `{environment, connected}` |
//! | `GetSheet` | `GET /v1/envs/{env}/sheet`, `GET /v1/versions/{version}/sheet` | `{sheet}` ([`crate::orchestrator::sheet`]) |
//! | `ListVersions` | `GET /v1/envs/{env}/versions` | `{versions}` oldest first |
//! | `ListDeployments` | `GET /v1/envs/{env}/deployments` | `{deployments}` newest first |
//! | `Fork` | `POST /v1/envs/{env}/fork` | 202 `{deployment, phases}`; new env = `deployment.EnvID`; a warm pool hand-out answers already `succeeded`; `pool` sets the pool size (`orchestrator::pool`) |
//! | `Snapshot` | `POST /v1/envs/{env}/snapshot` | 202; new version = `deployment.VersionID` |
//! | `Rollback` | `POST /v1/envs/{env}/rollback` | 202 |
//! | `Verify` | `POST /v1/envs/{env}/verify` | 202; reward in the `verdict` phase |
//! | `Exec` | `POST /v1/envs/{env}/exec` | 200 `{exit_code, stdout, stderr}`, 502 when the host cannot run it, 504 when it does not answer within `timeout_sec` + 10 s |
//! | `PutFiles` | `PUT /v1/envs/{env}/files` | `{ok, bytes}`; 413 over 32 MiB |
//! | `GetFiles` | `GET /v1/envs/{env}/files` | the tar (`tar` bytes); 502 with the host's error |
//! | `Destroy` | `DELETE /v1/envs/{env}` | 202 `{deployment}` |
//! | `ListAllEnvs` | `GET /v1/envs?project=&status=&all=` | `{environments: [EnvEntry]}` oldest first |
//! | `Logs` | `GET /v1/envs/{env}/logs` | a stream of `LogEntry` ([`super::logs`]) |
//!
//! `{env}` is an environment id of the caller's team; another team's is `404`.
//! Errors: see [`crate::error::ApiError`]; the orchestrator's rules are documented in
//! [`crate::orchestrator`].

use crate::auth::Caller;
use crate::domain::{EnvStatus, Environment, UnknownValue};
use crate::error::ApiError;
use crate::orchestrator::{repo, Orchestrator};
use crate::state::AppState;
use crate::store::projects;
use denv_proto::v1::{
    self, environment_service_server::EnvironmentService,
    environment_service_server::EnvironmentServiceServer,
};
use tonic::{Request, Response, Status};

/// The gRPC implementation of `denv.v1.EnvironmentService`.
#[derive(Clone)]
pub struct EnvironmentApi {
    state: AppState,
}

impl EnvironmentApi {
    /// The service over the shared state.
    pub fn new(state: AppState) -> Self {
        EnvironmentApi { state }
    }

    /// The tonic server, with 64 MiB messages both ways (files travel as bytes).
    pub fn server(state: AppState) -> EnvironmentServiceServer<EnvironmentApi> {
        EnvironmentServiceServer::new(Self::new(state))
            .max_decoding_message_size(denv_proto::contract::API_MESSAGE_MAX_BYTES)
            .max_encoding_message_size(denv_proto::contract::API_MESSAGE_MAX_BYTES)
    }

    fn orch(&self) -> &Orchestrator {
        &self.state.orchestrator
    }

    async fn caller<T>(&self, req: &Request<T>) -> Result<Caller, ApiError> {
        crate::auth::authenticate(&self.state, req.metadata()).await
    }

    /// The caller's environment `id` (404 otherwise).
    async fn env(&self, caller: &Caller, id: &str) -> Result<Environment, ApiError> {
        find_env(self.orch(), &caller.team_id, id).await
    }
}

/// An environment of the team by id: `NotFound("environment <id> not found")` otherwise.
pub async fn find_env(
    orch: &Orchestrator,
    team_id: &str,
    id: &str,
) -> Result<Environment, ApiError> {
    if id.is_empty() {
        return Err(ApiError::BadRequest("env is required".into()));
    }
    repo::env(orch.db(), team_id, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("environment {id} not found")))
}

/// The `ExecStream` response stream.
pub type ExecStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<v1::ExecChunk, Status>> + Send>>;

#[tonic::async_trait]
impl EnvironmentService for EnvironmentApi {
    async fn get_env(
        &self,
        req: Request<v1::EnvRequest>,
    ) -> Result<Response<v1::GetEnvResponse>, Status> {
        let caller = self.caller(&req).await?;
        let env = self.env(&caller, &req.get_ref().env).await?;
        let connected = self.orch().link().is_connected(&env.host_id);
        Ok(Response::new(v1::GetEnvResponse {
            environment: Some((&env).into()),
            connected,
        }))
    }

    async fn list_versions(
        &self,
        req: Request<v1::EnvRequest>,
    ) -> Result<Response<v1::ListVersionsResponse>, Status> {
        let caller = self.caller(&req).await?;
        let env = self.env(&caller, &req.get_ref().env).await?;
        let versions = repo::versions_of(self.orch().db(), &env.id).await?;
        Ok(Response::new(v1::ListVersionsResponse {
            versions: versions.iter().map(v1::Version::from).collect(),
        }))
    }

    async fn list_deployments(
        &self,
        req: Request<v1::EnvRequest>,
    ) -> Result<Response<v1::ListDeploymentsResponse>, Status> {
        let caller = self.caller(&req).await?;
        let env = self.env(&caller, &req.get_ref().env).await?;
        let deployments = repo::deployments_of(self.orch().db(), &env.id).await?;
        Ok(Response::new(v1::ListDeploymentsResponse {
            deployments: deployments.iter().map(v1::Deployment::from).collect(),
        }))
    }

    async fn fork(
        &self,
        req: Request<v1::ForkRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.get_ref();
        let caps = super::convert::caps(r.resources.as_ref())?;
        let env = self.env(&caller, &r.env).await?;
        let expires_at = crate::orchestrator::lifecycle::expiry_from_ttl(r.ttl_sec)?;
        // `pool`: checked before the fork starts, applied once it is accepted.
        let pool_owner = match r.pool {
            Some(n) => {
                let v = if r.version.is_empty() {
                    env.current_version_id.as_str()
                } else {
                    r.version.as_str()
                };
                Some((self.orch().pool_owner_for(&caller.team_id, v, n).await?, n))
            }
            None => None,
        };
        let out = self
            .orch()
            .start_fork(
                &caller.team_id,
                &env,
                &r.version,
                &r.name,
                "fork",
                &expires_at,
                &caps,
            )
            .await?;
        if let Some((owner, n)) = pool_owner {
            self.orch()
                .set_pool_size(&caller.team_id, &owner, n)
                .await?;
        }
        Ok(Response::new(out.into()))
    }

    async fn get_sheet(
        &self,
        req: Request<v1::SheetRequest>,
    ) -> Result<Response<v1::SheetResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.get_ref();
        let version = if r.version.is_empty() {
            let env = self.env(&caller, &r.env).await?;
            if env.current_version_id.is_empty() {
                return Err(ApiError::Conflict(format!(
                    "environment {} has no version yet: nothing was deployed",
                    env.id
                ))
                .into());
            }
            env.current_version_id
        } else {
            r.version.clone()
        };
        let sheet =
            crate::orchestrator::sheet::sheet(self.orch().db(), &caller.team_id, &version).await?;
        Ok(Response::new(v1::SheetResponse {
            sheet: Some(denv_proto::json::to_struct(&sheet)),
        }))
    }

    async fn snapshot(
        &self,
        req: Request<v1::EnvRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        let caller = self.caller(&req).await?;
        let env = self.env(&caller, &req.get_ref().env).await?;
        let out = self.orch().start_snapshot(&caller.team_id, &env).await?;
        Ok(Response::new(out.into()))
    }

    async fn rollback(
        &self,
        req: Request<v1::RollbackRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.get_ref();
        let env = self.env(&caller, &r.env).await?;
        let out = self
            .orch()
            .start_rollback(&caller.team_id, &env, &r.version)
            .await?;
        Ok(Response::new(out.into()))
    }

    async fn verify(
        &self,
        req: Request<v1::VerifyRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.get_ref();
        let env = self.env(&caller, &r.env).await?;
        let out = self
            .orch()
            .start_verify(&caller.team_id, &env, r.resume)
            .await?;
        Ok(Response::new(out.into()))
    }

    async fn exec(
        &self,
        req: Request<v1::ExecRequest>,
    ) -> Result<Response<v1::ExecResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let env = self.env(&caller, &r.env).await?;
        let timeout = u32::try_from(r.timeout_sec.max(0)).unwrap_or(0);
        let out = self
            .orch()
            .exec(
                &caller.team_id,
                &env,
                v1::EnvExec {
                    service: r.service,
                    cmd: r.cmd,
                    timeout_sec: timeout,
                    user: r.user,
                    workdir: r.workdir,
                    stdin: r.stdin,
                    env_vars: r.env_vars,
                    stream: false,
                },
            )
            .await?;
        Ok(Response::new(v1::ExecResponse {
            exit_code: out.exit_code,
            stdout: out.stdout,
            stderr: out.stderr,
            stdout_truncated: out.stdout_truncated,
            stderr_truncated: out.stderr_truncated,
            timed_out: out.timed_out,
        }))
    }

    type ExecStreamStream = ExecStream;

    async fn exec_stream(
        &self,
        req: Request<v1::ExecRequest>,
    ) -> Result<Response<Self::ExecStreamStream>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let env = self.env(&caller, &r.env).await?;
        let mut exec = v1::EnvExec {
            service: r.service,
            cmd: r.cmd,
            timeout_sec: u32::try_from(r.timeout_sec.max(0)).unwrap_or(0),
            user: r.user,
            workdir: r.workdir,
            stdin: r.stdin,
            env_vars: r.env_vars,
            stream: true,
        };
        let (to, wait) = self
            .orch()
            .prepare_exec(&caller.team_id, &env, &mut exec)
            .await?;
        let link = self.orch().link().clone();
        let (otx, mut orx) = tokio::sync::mpsc::unbounded_channel::<v1::Progress>();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<v1::ExecChunk, Status>>(64);
        tokio::spawn(async move {
            let chunk = |p: v1::Progress| v1::ExecChunk {
                stdout: p.stdout,
                stderr: p.stderr,
                result: None,
            };
            let run = link.exec_stream(&to, exec, wait, otx);
            tokio::pin!(run);
            loop {
                tokio::select! {
                    Some(p) = orx.recv() => {
                        // A caller that went away stops the forwarding; the command
                        // itself runs to its end or its timeout.
                        if tx.send(Ok(chunk(p))).await.is_err() {
                            return;
                        }
                    }
                    res = &mut run => {
                        // Output frames are routed before the result resolves.
                        while let Ok(p) = orx.try_recv() {
                            if tx.send(Ok(chunk(p))).await.is_err() {
                                return;
                            }
                        }
                        let last = match res {
                            Ok(out) => Ok(v1::ExecChunk {
                                result: Some(v1::ExecResponse {
                                    exit_code: out.exit_code,
                                    stdout_truncated: out.stdout_truncated,
                                    stderr_truncated: out.stderr_truncated,
                                    timed_out: out.timed_out,
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }),
                            Err(e) => Err(Status::from(ApiError::from(e))),
                        };
                        let _ = tx.send(last).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn put_files(
        &self,
        req: Request<v1::PutFilesRequest>,
    ) -> Result<Response<v1::PutFilesResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let env = self.env(&caller, &r.env).await?;
        let bytes = self
            .orch()
            .put_files(&caller.team_id, &env, &r.service, &r.path, r.tar)
            .await?;
        Ok(Response::new(v1::PutFilesResponse {
            ok: true,
            bytes: i32::try_from(bytes).unwrap_or(i32::MAX),
        }))
    }

    async fn get_files(
        &self,
        req: Request<v1::GetFilesRequest>,
    ) -> Result<Response<v1::GetFilesResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let env = self.env(&caller, &r.env).await?;
        let tar = self
            .orch()
            .get_files(&caller.team_id, &env, &r.service, &r.path)
            .await?;
        Ok(Response::new(v1::GetFilesResponse { tar }))
    }

    async fn destroy(
        &self,
        req: Request<v1::EnvRequest>,
    ) -> Result<Response<v1::DestroyResponse>, Status> {
        let caller = self.caller(&req).await?;
        let env = self.env(&caller, &req.get_ref().env).await?;
        // At most one destroy at a time: a destroy in flight is answered again; a
        // destroyed environment is destroyed again (its host may still hold it).
        let out = self
            .orch()
            .destroy_env(
                &caller.team_id,
                &env.id,
                crate::orchestrator::lifecycle::reason::REQUESTED,
            )
            .await?;
        Ok(Response::new(v1::DestroyResponse {
            deployment: out.map(|s| (&s.deployment).into()),
        }))
    }

    async fn list_all_envs(
        &self,
        req: Request<v1::ListAllEnvsRequest>,
    ) -> Result<Response<v1::ListAllEnvsResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let environments = list_all(self.orch(), &caller.team_id, &r).await?;
        Ok(Response::new(v1::ListAllEnvsResponse { environments }))
    }

    type LogsStream = super::logs::LogStream;

    async fn logs(
        &self,
        req: Request<v1::LogsRequest>,
    ) -> Result<Response<Self::LogsStream>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let env = self.env(&caller, &r.env).await?;
        let s = super::logs::start(self.orch(), &caller.team_id, &env, r).await?;
        Ok(Response::new(s))
    }
}

/// `ListAllEnvs`: the team's environments across projects (see
/// [`repo::envs_of_team`]) with their project's name. `status` must be one of
/// [`EnvStatus`] (`BadRequest` naming them); an unknown `project` is
/// `NotFound`.
pub async fn list_all(
    orch: &Orchestrator,
    team_id: &str,
    r: &v1::ListAllEnvsRequest,
) -> Result<Vec<v1::EnvEntry>, ApiError> {
    let status = r.status.trim();
    let status: Option<EnvStatus> = if status.is_empty() {
        None
    } else {
        Some(status.parse().map_err(|e: UnknownValue| {
            ApiError::BadRequest(format!(
                "unknown status {status:?}: use one of {}",
                e.expected
            ))
        })?)
    };
    let projects = projects::list(orch.db(), team_id).await?;
    let project = r.project.trim();
    let project_id = if project.is_empty() {
        None
    } else {
        Some(
            projects
                .iter()
                .find(|p| p.id == project || p.name == project)
                .map(|p| p.id.clone())
                .ok_or_else(|| ApiError::NotFound(format!("project {project} not found")))?,
        )
    };
    let names: std::collections::HashMap<&str, &str> = projects
        .iter()
        .map(|p| (p.id.as_str(), p.name.as_str()))
        .collect();
    let rows = repo::envs_of_team(orch.db(), team_id, project_id.as_deref(), status, r.all).await?;
    Ok(rows
        .into_iter()
        .map(|e| v1::EnvEntry {
            project: names
                .get(e.project_id.as_str())
                .map(|n| n.to_string())
                .unwrap_or_default(),
            id: e.id,
            name: e.name,
            project_id: e.project_id,
            stage: e.stage,
            status: e.status,
            current_version_id: e.current_version_id,
            host_id: e.host_id,
            created_at: e.created_at,
            expires_at: e.expires_at,
        })
        .collect())
}
