//! The REST gateway: every path of `12-ref-rest-api.md`, mapped onto the tonic service
//! implementations in-process. It holds no logic of its own.
//!
//! # How a call is mapped
//!
//! 1. The JSON body (an object; empty means `{}`), the path parameters and the query
//!    parameters are merged into one JSON object (path parameters win; a query
//!    parameter fills a field the body did not set). Path parameter names are the
//!    request message's field names (`project`, `env`, `id`, `target`).
//! 2. The object becomes the request message with [`denv_proto::json::from_json`]
//!    (unknown fields are ignored; a shape error is `400`).
//! 3. The service's trait method is called with a `tonic::Request` whose metadata are
//!    the HTTP headers (`authorization`, `x-denv-team`, ...), exactly as over gRPC.
//! 4. The response message is printed with [`denv_proto::json::to_json`] (stored
//!    objects use the Go field names, every field emitted) with the route's success
//!    status; an error `Status` becomes its HTTP status (metadata
//!    `x-denv-http-status`, else by gRPC code) and `{"error": "<message>"}`.
//!
//! Bodies are limited to 32 MiB (`413`). Files travel as raw tar
//! (`application/x-tar`) both ways; the GitHub sign-in routes answer `302`.
//! `WatchDeployment` (server streaming) is `GET /v1/deployments/{id}/events`, answered
//! as server-sent events or JSON lines; see [`follow`].
//!
//! # Route table
//!
//! | method | path | RPC | success |
//! |---|---|---|---|
//! | GET | `/health` | `HealthService.Health` | 200 |
//! | POST | `/auth/dev-login` | `AuthService.DevLogin` | 200 |
//! | GET | `/auth/github/start?return=` | `AuthService.GithubStart` | 302 |
//! | GET | `/auth/github/callback?code=&state=` | `AuthService.GithubCallback` | 302 |
//! | POST | `/v1/device/code` | `AuthService.DeviceCode` | 200 |
//! | POST | `/v1/device/approve` | `AuthService.DeviceApprove` | 200 |
//! | POST | `/v1/device/token` | `AuthService.DeviceToken` | 200 |
//! | GET | `/v1/me` | `AuthService.Me` | 200 |
//! | GET | `/v1/teams` | `AuthService.ListTeams` | 200 |
//! | POST | `/v1/teams` | `AuthService.CreateTeam` | 201 |
//! | GET | `/v1/keys` | `AuthService.ListKeys` | 200 |
//! | POST | `/v1/keys` | `AuthService.CreateKey` | 201 |
//! | DELETE | `/v1/keys/{id}` | `AuthService.RevokeKey` | 200 |
//! | GET | `/v1/templates?kind=` | `ProjectService.ListTemplates` | 200 |
//! | GET | `/v1/projects` | `ProjectService.ListProjects` | 200 |
//! | POST | `/v1/projects` | `ProjectService.CreateProject` | 201 |
//! | DELETE | `/v1/projects/{project}?force=` | `ProjectService.DeleteProject` | 200 |
//! | GET | `/v1/projects/{project}/envs` | `ProjectService.ListEnvs` | 200 |
//! | POST | `/v1/projects/{project}/deploy` | `ProjectService.Deploy` | 202 |
//! | GET | `/v1/projects/{project}/source` | `ProjectService.GetSource` | 200 |
//! | POST | `/v1/projects/{project}/source` | `ProjectService.UpdateSource` | 200 |
//! | POST | `/v1/projects/{project}/deploy-from-source` | `ProjectService.DeployFromSource` | 202 |
//! | POST | `/v1/projects/{project}/promote` | `ProjectService.Promote` | 202 |
//! | GET | `/v1/envs?project=&status=&all=` | `EnvironmentService.ListAllEnvs` | 200 |
//! | GET | `/v1/envs/{env}/logs?service=&tail=&follow=&timestamps=&format=` (JSON lines or text) | `EnvironmentService.Logs` | 200 |
//! | GET | `/v1/envs/{env}` | `EnvironmentService.GetEnv` | 200 |
//! | DELETE | `/v1/envs/{env}` | `EnvironmentService.Destroy` | 202 |
//! | GET | `/v1/envs/{env}/versions` | `EnvironmentService.ListVersions` | 200 |
//! | GET | `/v1/envs/{env}/sheet` | `EnvironmentService.GetSheet` | 200 |
//! | GET | `/v1/versions/{version}/sheet` | `EnvironmentService.GetSheet` (`version` set) | 200 |
//! | GET | `/v1/envs/{env}/deployments` | `EnvironmentService.ListDeployments` | 200 |
//! | POST | `/v1/envs/{env}/fork` | `EnvironmentService.Fork` | 202 |
//! | POST | `/v1/envs/{env}/snapshot` | `EnvironmentService.Snapshot` | 202 |
//! | POST | `/v1/envs/{env}/rollback` | `EnvironmentService.Rollback` | 202 |
//! | POST | `/v1/envs/{env}/verify` | `EnvironmentService.Verify` | 202 |
//! | POST | `/v1/envs/{env}/exec` | `EnvironmentService.Exec` | 200 |
//! | POST | `/v1/envs/{env}/exec/stream` (JSON lines) | `EnvironmentService.ExecStream` | 200 |
//! | PUT | `/v1/envs/{env}/files?service=&path=` (tar body) | `EnvironmentService.PutFiles` | 200 |
//! | GET | `/v1/envs/{env}/files?service=&path=` (tar answer) | `EnvironmentService.GetFiles` | 200 |
//! | GET | `/v1/deployments/{id}` | `DeploymentService.GetDeployment` | 200 |
//! | GET | `/v1/deployments/{id}/events` (`text/event-stream` or `application/x-ndjson`) | `DeploymentService.WatchDeployment` | 200 |
//! | POST | `/v1/sandboxes` | `SandboxService.CreateSandbox` | 201 |
//! | POST | `/v1/targets/{target}/sandboxes` | `SandboxService.CreateSandbox` (`target` set) | 201 |
//! | GET | `/v1/clouds` | `TargetService.ListClouds` | 200 |
//! | POST | `/v1/clouds` | `TargetService.CreateCloud` | 201 |
//! | POST | `/v1/join-tokens` | `TargetService.CreateJoinToken` | 201 |
//! | GET | `/v1/hosts` | `TargetService.ListHosts` | 200 |
//! | GET | `/v1/targets` | `TargetService.ListTargets` | 200 |
//! | POST | `/v1/targets/connect` | `TargetService.ConnectTarget` | 201 |
//! | GET | `/v1/github/installations` | `GithubService.ListInstallations` | 200 |
//! | POST | `/v1/github/installations/{id}/link` | `GithubService.LinkInstallation` | 200 |
//! | GET | `/v1/github/repos?installation=` | `GithubService.ListRepos` | 200 |
//! | POST | `/webhooks/github` (raw body, `X-GitHub-Event`, `X-Hub-Signature-256`) | `GithubService.Webhook` | 200 |
//! | GET | `/v1/events?subject=` | `EventService.ListEvents` | 200 |
//! | GET | `/denvd`, `/denvd-linux-amd64`, `/denvd-linux-arm64` (`?arch=arm64`) | — (files from `DENV_RELEASES_DIR`) | 200 |
//! | — | `/v1/hosts/stream` | — (sidecars use gRPC `HostStream.Open`) | — |

mod call;
mod cors;
pub mod exec_stream;
pub mod follow;
pub mod logs;
mod releases;

pub use call::{error_response, reply, Call, MAX_BODY_BYTES};
pub use cors::cors_middleware;

use crate::api::{
    auth::AuthApi, deployments::DeploymentApi, envs::EnvironmentApi, events::EventApi,
    github::GithubApi, health::HealthApi, projects::ProjectApi, sandboxes::SandboxApi,
    targets::TargetApi,
};
use crate::state::AppState;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::Router;
use denv_proto::v1::{
    auth_service_server::AuthService, deployment_service_server::DeploymentService,
    environment_service_server::EnvironmentService, event_service_server::EventService,
    github_service_server::GithubService, health_service_server::HealthService,
    project_service_server::ProjectService, sandbox_service_server::SandboxService,
    target_service_server::TargetService, GetFilesRequest, PutFilesRequest, WebhookRequest,
};
use std::sync::Arc;
use tonic::Status;

/// The service implementations the gateway calls, one of each.
#[derive(Clone)]
pub struct Gateway {
    /// Shared state (releases directory, CORS origin).
    pub state: AppState,
    pub health: Arc<HealthApi>,
    pub auth: Arc<AuthApi>,
    pub projects: Arc<ProjectApi>,
    pub envs: Arc<EnvironmentApi>,
    pub deployments: Arc<DeploymentApi>,
    pub sandboxes: Arc<SandboxApi>,
    pub targets: Arc<TargetApi>,
    pub github: Arc<GithubApi>,
    pub events: Arc<EventApi>,
}

impl Gateway {
    /// One instance of every service over `state`.
    pub fn new(state: AppState) -> Gateway {
        Gateway {
            health: Arc::new(HealthApi),
            auth: Arc::new(AuthApi::new(state.clone())),
            projects: Arc::new(ProjectApi::new(state.clone())),
            envs: Arc::new(EnvironmentApi::new(state.clone())),
            deployments: Arc::new(DeploymentApi::new(state.clone())),
            sandboxes: Arc::new(SandboxApi::new(state.clone())),
            targets: Arc::new(TargetApi::new(state.clone())),
            github: Arc::new(GithubApi::new(state.clone())),
            events: Arc::new(EventApi::new(state.clone())),
            state,
        }
    }
}

/// A handler calling `gw.$svc.$method` with the merged request, answering `$status`.
macro_rules! rpc {
    ($svc:ident . $method:ident, $status:expr) => {
        |State(gw): State<Gateway>, call: Call| async move {
            let res = async {
                let req = call.decode()?;
                gw.$svc.$method(call.request(req)).await
            }
            .await;
            reply($status, res)
        }
    };
}

const OK: StatusCode = StatusCode::OK;
const CREATED: StatusCode = StatusCode::CREATED;
const ACCEPTED: StatusCode = StatusCode::ACCEPTED;

/// The REST router (every route in the table above), with its state applied.
pub fn router(state: AppState) -> Router {
    let gw = Gateway::new(state);
    Router::new()
        .route("/health", get(rpc!(health.health, OK)))
        // auth, teams, keys
        .route("/auth/dev-login", post(rpc!(auth.dev_login, OK)))
        .route("/auth/github/start", get(github_start))
        .route("/auth/github/callback", get(github_callback))
        .route("/v1/device/code", post(rpc!(auth.device_code, OK)))
        .route("/v1/device/approve", post(rpc!(auth.device_approve, OK)))
        .route("/v1/device/token", post(rpc!(auth.device_token, OK)))
        .route("/v1/me", get(rpc!(auth.me, OK)))
        .route(
            "/v1/teams",
            get(rpc!(auth.list_teams, OK)).post(rpc!(auth.create_team, CREATED)),
        )
        .route(
            "/v1/keys",
            get(rpc!(auth.list_keys, OK)).post(rpc!(auth.create_key, CREATED)),
        )
        .route("/v1/keys/:id", delete(rpc!(auth.revoke_key, OK)))
        // projects
        .route("/v1/templates", get(rpc!(projects.list_templates, OK)))
        .route(
            "/v1/projects",
            get(rpc!(projects.list_projects, OK)).post(rpc!(projects.create_project, CREATED)),
        )
        .route("/v1/projects/:project", delete(delete_project))
        .route(
            "/v1/projects/:project/envs",
            get(rpc!(projects.list_envs, OK)),
        )
        .route(
            "/v1/projects/:project/deploy",
            post(rpc!(projects.deploy, ACCEPTED)),
        )
        .route(
            "/v1/projects/:project/promote",
            post(rpc!(projects.promote, ACCEPTED)),
        )
        .route(
            "/v1/projects/:project/source",
            get(rpc!(projects.get_source, OK)).post(rpc!(projects.update_source, OK)),
        )
        .route(
            "/v1/projects/:project/deploy-from-source",
            post(rpc!(projects.deploy_from_source, ACCEPTED)),
        )
        // environments
        .route("/v1/envs", get(list_all_envs))
        .route("/v1/envs/:env/logs", get(logs::logs))
        .route(
            "/v1/envs/:env",
            get(rpc!(envs.get_env, OK)).delete(rpc!(envs.destroy, ACCEPTED)),
        )
        .route("/v1/envs/:env/versions", get(rpc!(envs.list_versions, OK)))
        .route("/v1/envs/:env/sheet", get(rpc!(envs.get_sheet, OK)))
        .route("/v1/versions/:version/sheet", get(rpc!(envs.get_sheet, OK)))
        .route(
            "/v1/envs/:env/deployments",
            get(rpc!(envs.list_deployments, OK)),
        )
        .route("/v1/envs/:env/fork", post(rpc!(envs.fork, ACCEPTED)))
        .route(
            "/v1/envs/:env/snapshot",
            post(rpc!(envs.snapshot, ACCEPTED)),
        )
        .route(
            "/v1/envs/:env/rollback",
            post(rpc!(envs.rollback, ACCEPTED)),
        )
        .route("/v1/envs/:env/verify", post(rpc!(envs.verify, ACCEPTED)))
        .route("/v1/envs/:env/exec", post(rpc!(envs.exec, OK)))
        .route("/v1/envs/:env/exec/stream", post(exec_stream::exec_stream))
        .route("/v1/envs/:env/files", put(put_files).get(get_files))
        // deployments and sandboxes
        .route(
            "/v1/deployments/:id",
            get(rpc!(deployments.get_deployment, OK)),
        )
        .route("/v1/deployments/:id/events", get(follow::follow_deployment))
        .route(
            "/v1/sandboxes",
            post(rpc!(sandboxes.create_sandbox, CREATED)),
        )
        .route(
            "/v1/targets/:target/sandboxes",
            post(rpc!(sandboxes.create_sandbox, CREATED)),
        )
        // targets, clouds, hosts
        .route(
            "/v1/clouds",
            get(rpc!(targets.list_clouds, OK)).post(rpc!(targets.create_cloud, CREATED)),
        )
        .route(
            "/v1/join-tokens",
            post(rpc!(targets.create_join_token, CREATED)),
        )
        .route("/v1/hosts", get(rpc!(targets.list_hosts, OK)))
        .route("/v1/targets", get(rpc!(targets.list_targets, OK)))
        .route(
            "/v1/targets/connect",
            post(rpc!(targets.connect_target, CREATED)),
        )
        // github
        .route(
            "/v1/github/installations",
            get(rpc!(github.list_installations, OK)),
        )
        .route(
            "/v1/github/installations/:id/link",
            post(rpc!(github.link_installation, OK)),
        )
        .route("/v1/github/repos", get(rpc!(github.list_repos, OK)))
        .route("/webhooks/github", post(webhook))
        // events
        .route("/v1/events", get(rpc!(events.list_events, OK)))
        // releases
        .route("/denvd", get(releases::denvd))
        .route("/denvd-linux-amd64", get(releases::denvd_amd64))
        .route("/denvd-linux-arm64", get(releases::denvd_arm64))
        .with_state(gw)
}

fn redirect(res: Result<tonic::Response<denv_proto::v1::RedirectResponse>, Status>) -> Response {
    match res {
        Ok(r) => match HeaderValue::from_str(&r.get_ref().location) {
            Ok(loc) => (StatusCode::FOUND, [(header::LOCATION, loc)]).into_response(),
            Err(_) => error_response(&Status::internal("invalid redirect location")),
        },
        Err(s) => error_response(&s),
    }
}

async fn github_start(State(gw): State<Gateway>, call: Call) -> Response {
    let res = async {
        let req = call.decode()?;
        gw.auth.github_start(call.request(req)).await
    }
    .await;
    redirect(res)
}

async fn github_callback(State(gw): State<Gateway>, call: Call) -> Response {
    let res = async {
        let req = call.decode()?;
        gw.auth.github_callback(call.request(req)).await
    }
    .await;
    redirect(res)
}

async fn put_files(State(gw): State<Gateway>, call: Call) -> Response {
    let res = async {
        let mut req: PutFilesRequest = call.decode_without_body()?;
        req.tar = call.body.to_vec();
        gw.envs.put_files(call.request(req)).await
    }
    .await;
    reply(OK, res)
}

async fn get_files(State(gw): State<Gateway>, call: Call) -> Response {
    let res = async {
        let req: GetFilesRequest = call.decode_without_body()?;
        gw.envs.get_files(call.request(req)).await
    }
    .await;
    match res {
        Ok(r) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-tar"),
            )],
            r.into_inner().tar,
        )
            .into_response(),
        Err(s) => error_response(&s),
    }
}

async fn webhook(State(gw): State<Gateway>, call: Call) -> Response {
    let h = |name: &str| {
        call.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let req = WebhookRequest {
        event: h("x-github-event"),
        signature: h("x-hub-signature-256"),
        body: call.body.to_vec(),
        delivery: h("x-github-delivery"),
    };
    let res = gw.github.webhook(call.request(req)).await;
    reply(OK, res)
}

/// A boolean query parameter: absent or empty is `false`; `true`/`1`/`yes` and
/// `false`/`0`/`no`; anything else is a `400` naming it.
pub fn query_bool(call: &Call, name: &str) -> Result<bool, crate::error::ApiError> {
    match call.query.get(name).map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(false),
        Some(v) => match v.as_str() {
            "" | "false" | "0" | "no" => Ok(false),
            "true" | "1" | "yes" => Ok(true),
            _ => Err(crate::error::ApiError::BadRequest(format!(
                "invalid {name} {v:?}: use true or false"
            ))),
        },
    }
}

/// A query parameter as text (`""` when absent).
pub fn query_str(call: &Call, name: &str) -> String {
    call.query.get(name).cloned().unwrap_or_default()
}

async fn delete_project(State(gw): State<Gateway>, call: Call) -> Response {
    let res = async {
        let req = denv_proto::v1::DeleteProjectRequest {
            project: call.params.get("project").cloned().unwrap_or_default(),
            force: query_bool(&call, "force")?,
        };
        gw.projects.delete_project(call.request(req)).await
    }
    .await;
    reply(OK, res)
}

async fn list_all_envs(State(gw): State<Gateway>, call: Call) -> Response {
    let res = async {
        let req = denv_proto::v1::ListAllEnvsRequest {
            project: query_str(&call, "project"),
            status: query_str(&call, "status"),
            all: query_bool(&call, "all")?,
        };
        gw.envs.list_all_envs(call.request(req)).await
    }
    .await;
    reply(OK, res)
}

/// A `200` streaming each message of `items` as one JSON line (its proto JSON), an empty
/// line every [`follow::KEEP_ALIVE`] while nothing comes, and a last `{"error": msg}`
/// line when the stream ends with an error: the answer of the logs and streamed exec
/// routes.
pub(crate) fn message_lines<S, T>(items: S) -> Response
where
    S: futures::Stream<Item = Result<T, tonic::Status>> + Send + 'static,
    T: serde::Serialize + Send + 'static,
{
    use futures::StreamExt;
    let lines = async_stream::stream! {
        let mut items = std::pin::pin!(items);
        let mut tick = tokio::time::interval(follow::KEEP_ALIVE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                item = items.next() => {
                    tick.reset();
                    match item {
                        Some(Ok(m)) => {
                            yield Ok::<_, std::convert::Infallible>(format!("{}\n", denv_proto::json::to_json(&m)));
                        }
                        Some(Err(s)) => {
                            yield Ok(format!("{}\n", serde_json::json!({ "error": s.message() })));
                            break;
                        }
                        None => break,
                    }
                }
                _ = tick.tick() => yield Ok("\n".to_string()),
            }
        }
    };
    json_lines(lines)
}

/// A `200` streaming `lines` as JSON lines (`application/x-ndjson`, chunked), neither
/// cached nor buffered by a proxy (`Cache-Control: no-cache`, `X-Accel-Buffering: no`):
/// the answer of every following route (deployment events, logs).
pub(crate) fn json_lines<S>(lines: S) -> Response
where
    S: futures::Stream<Item = Result<String, std::convert::Infallible>> + Send + 'static,
{
    (
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-ndjson"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::HeaderName::from_static("x-accel-buffering"),
                HeaderValue::from_static("no"),
            ),
        ],
        axum::body::Body::from_stream(lines),
    )
        .into_response()
}
