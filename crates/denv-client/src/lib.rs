//! Rust client for the denv API over gRPC (contract: `proto/denv/v1/api.proto`; REST
//! equivalents in spec page `12-ref-rest-api.md`). Used by the `denv` CLI and the Python
//! binding.
//!
//! [`Client`] holds one lazily connected HTTP/2 channel (h2c for `http://` servers, TLS
//! for `https://` ones: [`transport`]) and has one async method per RPC, taking and returning the generated messages of
//! [`denv_proto::v1`]. Every call carries `authorization: Bearer <key>` and, when a team
//! is set, `x-denv-team: <team>`. [`Client::wait_deployment`] follows a deployment to its
//! final status. [`Config`] resolves the server and credential the way the CLI does.
//! [`context::pack`] packs a compose build context (honouring `.dockerignore`) the way
//! every client sends it.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use denv_client::{Client, Config};
//! let cfg = Config::resolve()?;
//! let client = Client::from_config(&cfg)?;
//! let me = client.me(Default::default()).await?;
//! println!("{:?}", me.team);
//! # Ok(()) }
//! ```

pub mod config;
pub mod context;
pub mod transport;

pub use config::{Config, ConfigError, ConfigFile, DEFAULT_SERVER, NOT_SIGNED_IN};
pub use denv_proto::v1;
pub use tonic::Code;
pub use transport::{TransportError, Trust};

use futures::stream::{BoxStream, StreamExt};
use std::path::Path;
use std::time::Duration;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use v1::{
    auth_service_client::AuthServiceClient, deployment_service_client::DeploymentServiceClient,
    environment_service_client::EnvironmentServiceClient, event_service_client::EventServiceClient,
    github_service_client::GithubServiceClient, health_service_client::HealthServiceClient,
    project_service_client::ProjectServiceClient, sandbox_service_client::SandboxServiceClient,
    target_service_client::TargetServiceClient,
};

/// Connect timeout of the channel.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Per-request timeout (until the response headers; a stream's body is not bounded).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Largest message sent or received (files travel as bytes): 64 MiB (defined in
/// `denv_proto::contract`).
pub use denv_proto::contract::API_MESSAGE_MAX_BYTES as MAX_MESSAGE_BYTES;
/// Poll interval of [`Client::wait_deployment`] when the watch stream is unavailable.
pub const POLL_INTERVAL: Duration = Duration::from_millis(700);

/// Deployment statuses after which nothing changes.
pub const FINAL_STATUSES: [&str; 3] = ["succeeded", "failed", "rolled_back"];

/// Whether a deployment status is final (`succeeded`, `failed`, `rolled_back`).
pub fn is_final(status: &str) -> bool {
    FINAL_STATUSES.contains(&status)
}

/// Metadata key of the control plane's error statuses carrying the HTTP status the REST
/// API answers for the same failure (spec `12-ref-rest-api.md`, *Errors*).
pub const HTTP_STATUS_KEY: &str = "x-denv-http-status";

/// A failed call: the gRPC code, the HTTP status the server sent with it, and the
/// server's message.
///
/// `Display` is the message alone (what the CLI prints after `denv: `). For transport
/// failures (server unreachable) the message names the server and the cause.
///
/// Branch on [`ClientError::http_status`] (or [`ClientError::code`]): the status is the
/// server's own (`x-denv-http-status`), never derived from the code by a table here, so
/// `504` (the host did not answer in time), `502` (the host could not run it), `410`,
/// `428` and `429` arrive as the REST API answers them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ClientError {
    /// The gRPC status code (`NotFound`, `Unauthenticated`, `Unavailable`, ...).
    pub code: Code,
    /// The HTTP status of the failure: the one the control plane sent
    /// (`x-denv-http-status`), or the one this client gave an error it made itself
    /// (`502` when the server could not be reached, `400` for a request it refused to
    /// send, `504` when a caller's deadline passed); `None` when the status carried
    /// none (one from something other than denv's control plane).
    pub http_status: Option<u16>,
    /// The server's message, e.g. `environment not found`.
    pub message: String,
}

impl ClientError {
    /// An error with a code and message, without an HTTP status.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ClientError {
            code,
            http_status: None,
            message: message.into(),
        }
    }

    /// The same error with HTTP status `status` (for errors a client makes itself).
    pub fn with_status(mut self, status: u16) -> Self {
        self.http_status = Some(status);
        self
    }

    /// The HTTP status, if known (see [`ClientError::http_status`]).
    pub fn status(&self) -> Option<u16> {
        self.http_status
    }
}

/// The HTTP status a control plane's error status carries in its `x-denv-http-status`
/// metadata, if any.
pub fn http_status_of(s: &tonic::Status) -> Option<u16> {
    s.metadata()
        .get(HTTP_STATUS_KEY)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        // Transport failures carry their cause in the source chain; a server's status
        // has none, so its message passes through unchanged.
        let mut message = s.message().to_string();
        let mut src = std::error::Error::source(&s);
        while let Some(e) = src {
            let t = e.to_string();
            if !t.is_empty() && !message.contains(&t) {
                if message.is_empty() {
                    message = t;
                } else {
                    message = format!("{message}: {t}");
                }
            }
            src = e.source();
        }
        if message.is_empty() {
            message = format!("request failed ({:?})", s.code());
        }
        ClientError {
            code: s.code(),
            http_status: http_status_of(&s),
            message,
        }
    }
}

/// Adds `authorization: Bearer <key>` and `x-denv-team` to every request.
#[derive(Clone, Default)]
pub struct AuthInterceptor {
    bearer: Option<MetadataValue<Ascii>>,
    team: Option<MetadataValue<Ascii>>,
}

impl AuthInterceptor {
    /// An interceptor for a credential and team; errors when either is not a valid
    /// header value.
    pub fn new(api_key: Option<&str>, team: Option<&str>) -> Result<Self, ClientError> {
        let bearer = match api_key.filter(|k| !k.is_empty()) {
            Some(k) => Some(format!("Bearer {k}").parse().map_err(|_| {
                ClientError::new(Code::InvalidArgument, "api key is not a valid header value")
                    .with_status(400)
            })?),
            None => None,
        };
        let team = match team.filter(|t| !t.is_empty()) {
            Some(t) => Some(t.parse().map_err(|_| {
                ClientError::new(Code::InvalidArgument, "team is not a valid header value")
                    .with_status(400)
            })?),
            None => None,
        };
        Ok(AuthInterceptor { bearer, team })
    }
}

impl tonic::service::Interceptor for AuthInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(b) = &self.bearer {
            req.metadata_mut().insert("authorization", b.clone());
        }
        if let Some(t) = &self.team {
            req.metadata_mut().insert("x-denv-team", t.clone());
        }
        Ok(req)
    }
}

/// The transport every generated client runs over.
pub type Transport = InterceptedService<Channel, AuthInterceptor>;

/// A stream of deployment states (see [`Client::watch_deployment`]).
pub type DeploymentStream = BoxStream<'static, Result<v1::DeploymentResponse, ClientError>>;

/// The output of a streamed exec (see [`Client::exec_stream`]).
pub type ExecChunkStream = BoxStream<'static, Result<v1::ExecChunk, ClientError>>;

/// Log lines of an environment (see [`Client::logs`]).
pub type LogStream = BoxStream<'static, Result<v1::LogEntry, ClientError>>;

/// A client of one control plane. Cheap to clone (clones share the channel).
#[derive(Clone)]
pub struct Client {
    server: String,
    channel: Channel,
    auth: AuthInterceptor,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// The HTTP status of a call that never reached the control plane (`502`, as a gateway
/// answers when its upstream cannot be reached).
pub const TRANSPORT_STATUS: u16 = 502;

/// How many times a call refused by the control plane's rate limit is sent again.
pub const RATE_LIMIT_RETRIES: u32 = 5;

/// When `s` is the control plane's rate-limit answer (`RESOURCE_EXHAUSTED`) or its
/// refusal while it stops (`UNAVAILABLE`, `503 the control plane is stopping`), with
/// `retry-after` seconds (at most 60), and fewer than [`RATE_LIMIT_RETRIES`] retries were
/// made: how long to wait before sending the call again (the given seconds plus up to
/// 250 ms of jitter, so refused clients do not return together). Such a call was refused
/// before any work was done, so sending it again is safe for every method.
pub fn rate_limit_wait(s: &tonic::Status, retries: u32) -> Option<std::time::Duration> {
    let refused_before_work = matches!(s.code(), Code::ResourceExhausted | Code::Unavailable);
    if !refused_before_work || retries >= RATE_LIMIT_RETRIES {
        return None;
    }
    let secs: u64 = s
        .metadata()
        .get("retry-after")?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    if secs > 60 {
        return None;
    }
    let jitter = u64::from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0),
    ) % 250;
    Some(std::time::Duration::from_millis(secs * 1000 + jitter))
}

macro_rules! rpc {
    ($(#[$doc:meta])* $name:ident => $svc:ident, $req:ty, $resp:ty) => {
        $(#[$doc])*
        pub async fn $name(&self, req: $req) -> Result<$resp, ClientError> {
            let mut retries = 0;
            loop {
                match self.$svc().$name(req.clone()).await {
                    Ok(r) => return Ok(r.into_inner()),
                    Err(s) => match rate_limit_wait(&s, retries) {
                        Some(wait) => {
                            retries += 1;
                            tokio::time::sleep(wait).await;
                        }
                        None => return Err(self.error(s)),
                    },
                }
            }
        }
    };
}

macro_rules! service {
    ($name:ident, $client:ident) => {
        fn $name(&self) -> $client<Transport> {
            $client::with_interceptor(self.channel.clone(), self.auth.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
        }
    };
}

impl Client {
    /// A client for `server` (e.g. `http://127.0.0.1:8080` or `https://denv.example`; a
    /// trailing `/` is ignored), trusting the default roots for `https://`
    /// ([`Client::connect_with`] names a CA file).
    ///
    /// The channel connects lazily on the first call (connect timeout 10 s, request
    /// timeout 5 min, messages up to 64 MiB). Must be called within a Tokio runtime
    /// context (the channel spawns its worker task). Errors with `InvalidArgument` (HTTP
    /// status 400) on a malformed URL or a key/team that is not a valid header value.
    pub fn connect(
        server: &str,
        api_key: Option<&str>,
        team: Option<&str>,
    ) -> Result<Client, ClientError> {
        Self::connect_with(server, api_key, team, None)
    }

    /// [`Client::connect`], an `https://` server's certificate checked against the CA
    /// certificates of the PEM file `ca_file` instead of the default roots
    /// ([`transport`]). The file is read here: one that cannot be read or holds no
    /// certificate is `InvalidArgument` (400), `ca file <path>: …`.
    pub fn connect_with(
        server: &str,
        api_key: Option<&str>,
        team: Option<&str>,
        ca_file: Option<&Path>,
    ) -> Result<Client, ClientError> {
        let server = server.trim().trim_end_matches('/').to_string();
        let invalid = |e: TransportError| {
            ClientError::new(Code::InvalidArgument, e.to_string()).with_status(400)
        };
        let endpoint = Trust::load(ca_file)
            .and_then(|t| t.endpoint(&server))
            .map_err(invalid)?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .tcp_nodelay(true);
        let auth = AuthInterceptor::new(api_key, team)?;
        Ok(Client {
            channel: endpoint.connect_lazy(),
            server,
            auth,
        })
    }

    /// [`Client::connect_with`] with a resolved [`Config`] (the credential may be absent;
    /// the server then refuses calls that need one).
    pub fn from_config(cfg: &Config) -> Result<Client, ClientError> {
        Self::connect_with(
            &cfg.server,
            cfg.api_key.as_deref(),
            cfg.team.as_deref(),
            cfg.ca_file.as_deref(),
        )
    }

    /// A status as a [`ClientError`]; a transport failure (the status has a cause) reads
    /// `cannot reach <server>: <root cause>` ([`transport::describe`]: a TLS failure as
    /// `tls: …`), with HTTP status [`TRANSPORT_STATUS`].
    fn error(&self, s: tonic::Status) -> ClientError {
        match std::error::Error::source(&s) {
            Some(cause) if matches!(s.code(), Code::Unavailable | Code::Unknown) => {
                ClientError::new(
                    s.code(),
                    format!(
                        "cannot reach {}: {}",
                        self.server,
                        transport::describe(cause)
                    ),
                )
                .with_status(TRANSPORT_STATUS)
            }
            _ => ClientError::from(s),
        }
    }

    /// The server's base URL as given (without a trailing `/`).
    pub fn server(&self) -> &str {
        &self.server
    }

    service!(health_svc, HealthServiceClient);
    service!(auth_svc, AuthServiceClient);
    service!(project_svc, ProjectServiceClient);
    service!(env_svc, EnvironmentServiceClient);
    service!(deployment_svc, DeploymentServiceClient);
    service!(sandbox_svc, SandboxServiceClient);
    service!(target_svc, TargetServiceClient);
    service!(github_svc, GithubServiceClient);
    service!(event_svc, EventServiceClient);

    // ------------------------------------------------------------------ health

    rpc!(
        /// `GET /health`: `{status: "ok"}`. Needs no credential.
        health => health_svc, v1::HealthRequest, v1::HealthResponse
    );

    // ------------------------------------------------------------------ auth

    rpc!(
        /// `POST /auth/dev-login` (servers with `DENV_DEV_LOGIN=1`): a `dst_` session.
        dev_login => auth_svc, v1::DevLoginRequest, v1::DevLoginResponse
    );
    rpc!(
        /// `GET /auth/github/start`: where to send the browser.
        github_start => auth_svc, v1::GithubStartRequest, v1::RedirectResponse
    );
    rpc!(
        /// `GET /auth/github/callback`: where to send the browser after sign-in.
        github_callback => auth_svc, v1::GithubCallbackRequest, v1::RedirectResponse
    );
    rpc!(
        /// `POST /v1/device/code`: starts a device login (needs no credential).
        device_code => auth_svc, v1::DeviceCodeRequest, v1::DeviceCodeResponse
    );
    rpc!(
        /// `POST /v1/device/approve` (user session): approves a user code for a team.
        device_approve => auth_svc, v1::DeviceApproveRequest, v1::DeviceApproveResponse
    );
    rpc!(
        /// `POST /v1/device/token`: the key once approved; until then an error whose
        /// message is `authorization_pending` (see [`is_authorization_pending`]).
        device_token => auth_svc, v1::DeviceTokenRequest, v1::DeviceTokenResponse
    );
    rpc!(
        /// `GET /v1/me`: `{team, teams[], user?}`.
        me => auth_svc, v1::MeRequest, v1::MeResponse
    );
    rpc!(
        /// `GET /v1/teams` (user session).
        list_teams => auth_svc, v1::ListTeamsRequest, v1::ListTeamsResponse
    );
    rpc!(
        /// `POST /v1/teams` (user session).
        create_team => auth_svc, v1::CreateTeamRequest, v1::CreateTeamResponse
    );
    rpc!(
        /// `GET /v1/keys`: the team's keys (never the key material).
        list_keys => auth_svc, v1::ListKeysRequest, v1::ListKeysResponse
    );
    rpc!(
        /// `POST /v1/keys`: a new key; `api_key` is returned once.
        create_key => auth_svc, v1::CreateKeyRequest, v1::CreateKeyResponse
    );
    rpc!(
        /// `DELETE /v1/keys/{id}`.
        revoke_key => auth_svc, v1::RevokeKeyRequest, v1::RevokeKeyResponse
    );

    // ------------------------------------------------------------------ projects

    rpc!(
        /// `GET /v1/templates?kind=`.
        list_templates => project_svc, v1::ListTemplatesRequest, v1::ListTemplatesResponse
    );
    rpc!(
        /// `GET /v1/projects`.
        list_projects => project_svc, v1::ListProjectsRequest, v1::ListProjectsResponse
    );
    rpc!(
        /// `POST /v1/projects`: the project and its `alpha` environment.
        create_project => project_svc, v1::CreateProjectRequest, v1::CreateProjectResponse
    );
    rpc!(
        /// `GET /v1/projects/{project}/envs` (`project` is an id or a name).
        list_envs => project_svc, v1::ListEnvsRequest, v1::ListEnvsResponse
    );
    rpc!(
        /// `DELETE /v1/projects/{project}?force=`: `409` while environments of the project
        /// are not destroyed (unless `force`, which destroys them first and waits).
        delete_project => project_svc, v1::DeleteProjectRequest, v1::DeleteProjectResponse
    );
    rpc!(
        /// `POST /v1/projects/{project}/deploy`: starts a deploy deployment.
        deploy => project_svc, v1::DeployRequest, v1::DeploymentResponse
    );
    rpc!(
        /// `GET /v1/projects/{project}/source`.
        get_source => project_svc, v1::GetSourceRequest, v1::SourceResponse
    );
    rpc!(
        /// `POST /v1/projects/{project}/source`.
        update_source => project_svc, v1::UpdateSourceRequest, v1::SourceResponse
    );
    rpc!(
        /// `POST /v1/projects/{project}/promote`: starts a promote deployment (on the
        /// target environment, `deployment.EnvID`).
        promote => project_svc, v1::PromoteRequest, v1::DeploymentResponse
    );
    rpc!(
        /// `POST /v1/projects/{project}/deploy-from-source`.
        deploy_from_source => project_svc, v1::DeployFromSourceRequest, v1::DeployFromSourceResponse
    );

    // ------------------------------------------------------------------ environments

    rpc!(
        /// `GET /v1/envs/{env}`: `{environment, connected}`.
        get_env => env_svc, v1::EnvRequest, v1::GetEnvResponse
    );
    rpc!(
        /// `GET /v1/envs/{env}/sheet` (or `GET /v1/versions/{version}/sheet` with
        /// `version` set): the data sheet as a JSON object in `sheet`.
        get_sheet => env_svc, v1::SheetRequest, v1::SheetResponse
    );
    rpc!(
        /// `GET /v1/envs/{env}/versions`.
        list_versions => env_svc, v1::EnvRequest, v1::ListVersionsResponse
    );
    rpc!(
        /// `GET /v1/envs/{env}/deployments`.
        list_deployments => env_svc, v1::EnvRequest, v1::ListDeploymentsResponse
    );
    rpc!(
        /// `POST /v1/envs/{env}/fork`: the new environment's id is `deployment.EnvID`.
        fork => env_svc, v1::ForkRequest, v1::DeploymentResponse
    );
    rpc!(
        /// `POST /v1/envs/{env}/snapshot`: the version id is `deployment.VersionID`.
        snapshot => env_svc, v1::EnvRequest, v1::DeploymentResponse
    );
    rpc!(
        /// `POST /v1/envs/{env}/rollback`.
        rollback => env_svc, v1::RollbackRequest, v1::DeploymentResponse
    );
    rpc!(
        /// `POST /v1/envs/{env}/verify`: the reward is in the `verdict` phase's evidence.
        verify => env_svc, v1::VerifyRequest, v1::DeploymentResponse
    );
    rpc!(
        /// `POST /v1/envs/{env}/exec`: a non-zero `exit_code` is not an error.
        exec => env_svc, v1::ExecRequest, v1::ExecResponse
    );
    rpc!(
        /// `PUT /v1/envs/{env}/files`: extracts a tar (at most 32 MiB) into `path`.
        put_files => env_svc, v1::PutFilesRequest, v1::PutFilesResponse
    );
    rpc!(
        /// `GET /v1/envs/{env}/files`: `path` as a tar.
        get_files => env_svc, v1::GetFilesRequest, v1::GetFilesResponse
    );
    rpc!(
        /// `DELETE /v1/envs/{env}`: starts a destroy deployment.
        destroy => env_svc, v1::EnvRequest, v1::DestroyResponse
    );

    rpc!(
        /// `GET /v1/envs?project=&status=&all=`: the team's environments across projects.
        list_all_envs => env_svc, v1::ListAllEnvsRequest, v1::ListAllEnvsResponse
    );

    /// `Logs` (`GET /v1/envs/{env}/logs`): one item per log line, each attributed to its
    /// service by the control plane; an entry with `truncated` says a service's output
    /// reached the byte cap. Ends after the backlog, or (with `follow`) when dropped.
    /// A refused request (unknown service, bad `tail`, host away) is the `Err`.
    pub async fn logs(&self, req: v1::LogsRequest) -> Result<LogStream, ClientError> {
        let s = self
            .env_svc()
            .logs(req)
            .await
            .map_err(|s| self.error(s))?
            .into_inner();
        Ok(s.map(|r| r.map_err(ClientError::from)).boxed())
    }

    /// `ExecStream` (gRPC only): the command's output as it is written, each item a
    /// piece of stdout or stderr, the last one carrying `result` (exit code and flags).
    /// A refused request (bad user, unknown environment, …) is the `Err`; a host that
    /// could not run the command is an error item.
    pub async fn exec_stream(&self, req: v1::ExecRequest) -> Result<ExecChunkStream, ClientError> {
        let s = self
            .env_svc()
            .exec_stream(req)
            .await
            .map_err(|s| self.error(s))?
            .into_inner();
        Ok(s.map(|r| r.map_err(ClientError::from)).boxed())
    }

    // ------------------------------------------------------------------ deployments

    rpc!(
        /// `GET /v1/deployments/{id}`: `{deployment, phases[]}`.
        get_deployment => deployment_svc, v1::GetDeploymentRequest, v1::DeploymentResponse
    );

    /// The deployment now and again on every change; the stream ends after a final
    /// status. Errors of the stream itself arrive as items.
    pub async fn watch_deployment(
        &self,
        req: v1::GetDeploymentRequest,
    ) -> Result<DeploymentStream, ClientError> {
        let s = self
            .deployment_svc()
            .watch_deployment(req)
            .await
            .map_err(|s| self.error(s))?
            .into_inner();
        Ok(s.map(|r| r.map_err(ClientError::from)).boxed())
    }

    /// Follows deployment `id` until its status is final and returns that state.
    ///
    /// Uses the `WatchDeployment` stream; if the stream cannot be opened, errors, or ends
    /// before a final status, falls back to polling `GetDeployment` every 700 ms.
    /// `on_change` is called with every state that differs from the previous one
    /// (including the first and the final one). Errors only when polling fails
    /// (after up to 5 consecutive `Unavailable` retries).
    pub async fn wait_deployment(
        &self,
        id: &str,
        mut on_change: impl FnMut(&v1::DeploymentResponse),
    ) -> Result<v1::DeploymentResponse, ClientError> {
        let req = v1::GetDeploymentRequest { id: id.to_string() };
        let mut last: Option<v1::DeploymentResponse> = None;
        let mut seen = |d: v1::DeploymentResponse, last: &mut Option<v1::DeploymentResponse>| {
            if last.as_ref() != Some(&d) {
                on_change(&d);
            }
            let done = d.deployment.as_ref().is_some_and(|x| is_final(&x.status));
            *last = Some(d);
            done
        };
        if let Ok(mut stream) = self.watch_deployment(req.clone()).await {
            while let Some(item) = stream.next().await {
                match item {
                    Ok(d) => {
                        if seen(d, &mut last) {
                            return Ok(last.unwrap_or_default());
                        }
                    }
                    Err(_) => break,
                }
            }
        }
        let mut retries = 0;
        loop {
            match self.get_deployment(req.clone()).await {
                Ok(d) => {
                    retries = 0;
                    if seen(d, &mut last) {
                        return Ok(last.unwrap_or_default());
                    }
                }
                Err(e) if e.code == Code::Unavailable && retries < 5 => retries += 1,
                Err(e) => return Err(e),
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    // ------------------------------------------------------------------ sandboxes

    rpc!(
        /// `POST /v1/sandboxes` (or `/v1/targets/{target}/sandboxes` with `target` set):
        /// returns when healthy.
        create_sandbox => sandbox_svc, v1::CreateSandboxRequest, v1::CreateSandboxResponse
    );

    // ------------------------------------------------------------------ targets

    rpc!(
        /// `GET /v1/clouds` (secrets returned as `•••`).
        list_clouds => target_svc, v1::ListCloudsRequest, v1::ListCloudsResponse
    );
    rpc!(
        /// `POST /v1/clouds`: the provider validates the config first.
        create_cloud => target_svc, v1::CreateCloudRequest, v1::CreateCloudResponse
    );
    rpc!(
        /// `POST /v1/join-tokens`: `{token: "djt_…", expires_in_sec, command}`.
        create_join_token => target_svc, v1::CreateJoinTokenRequest, v1::CreateJoinTokenResponse
    );
    rpc!(
        /// `GET /v1/hosts`.
        list_hosts => target_svc, v1::ListHostsRequest, v1::ListHostsResponse
    );
    rpc!(
        /// `GET /v1/targets`: sidecars first, then driver hosts.
        list_targets => target_svc, v1::ListTargetsRequest, v1::ListTargetsResponse
    );
    rpc!(
        /// `POST /v1/targets/connect`: a hosted provider's cloud and driver host.
        connect_target => target_svc, v1::ConnectTargetRequest, v1::ConnectTargetResponse
    );

    // ------------------------------------------------------------------ GitHub

    rpc!(
        /// `GET /v1/github/installations`.
        list_installations => github_svc, v1::ListInstallationsRequest, v1::ListInstallationsResponse
    );
    rpc!(
        /// `POST /v1/github/installations/{id}/link`.
        link_installation => github_svc, v1::LinkInstallationRequest, v1::LinkInstallationResponse
    );
    rpc!(
        /// `GET /v1/github/repos?installation=`.
        list_repos => github_svc, v1::ListReposRequest, v1::ListReposResponse
    );
    rpc!(
        /// `POST /webhooks/github` (signature checked by the server).
        webhook => github_svc, v1::WebhookRequest, v1::WebhookResponse
    );

    // ------------------------------------------------------------------ events

    rpc!(
        /// `GET /v1/events?subject=`: up to 200, newest first.
        list_events => event_svc, v1::ListEventsRequest, v1::ListEventsResponse
    );
}

/// Whether a `DeviceToken` error means "not approved yet, keep polling"
/// (`authorization_pending` or `slow_down`).
pub fn is_authorization_pending(e: &ClientError) -> bool {
    e.message.contains("authorization_pending") || e.message.contains("slow_down")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_with_retry_after_wait_and_others_do_not() {
        let with = |code: Code, secs: Option<&str>| {
            let mut s = tonic::Status::new(code, "refused");
            if let Some(v) = secs {
                s.metadata_mut().insert("retry-after", v.parse().unwrap());
            }
            s
        };
        // The rate limit and a stopping control plane: wait the given seconds (+ jitter).
        for code in [Code::ResourceExhausted, Code::Unavailable] {
            let w = rate_limit_wait(&with(code, Some("2")), 0).expect("a wait");
            assert!(
                w >= Duration::from_secs(2) && w < Duration::from_millis(2250),
                "{w:?}"
            );
            assert_eq!(
                rate_limit_wait(&with(code, Some("2")), RATE_LIMIT_RETRIES),
                None
            );
        }
        // A host that could not run the command (502, no retry-after), an over-long wait,
        // another code: no retry.
        assert_eq!(rate_limit_wait(&with(Code::Unavailable, None), 0), None);
        assert_eq!(
            rate_limit_wait(&with(Code::ResourceExhausted, Some("61")), 0),
            None
        );
        assert_eq!(rate_limit_wait(&with(Code::Internal, Some("1")), 0), None);
    }

    #[test]
    fn status_message_is_the_display() {
        let e = ClientError::from(tonic::Status::not_found("environment not found"));
        assert_eq!(e.code, Code::NotFound);
        assert_eq!(e.to_string(), "environment not found");
    }

    #[test]
    fn the_server_status_is_read_not_derived() {
        let mut s = tonic::Status::deadline_exceeded("timed out after 11s");
        s.metadata_mut()
            .insert(HTTP_STATUS_KEY, "504".parse().unwrap());
        let e = ClientError::from(s);
        assert_eq!((e.code, e.http_status), (Code::DeadlineExceeded, Some(504)));
        // 428 and 410 share FAILED_PRECONDITION: only the metadata tells them apart.
        for http in ["428", "410"] {
            let mut s = tonic::Status::failed_precondition("x");
            s.metadata_mut()
                .insert(HTTP_STATUS_KEY, http.parse().unwrap());
            assert_eq!(ClientError::from(s).status(), http.parse().ok());
        }
        // A status without it has none: no table guesses one.
        assert_eq!(
            ClientError::from(tonic::Status::not_found("x")).http_status,
            None
        );
        assert_eq!(
            ClientError::new(Code::Internal, "x")
                .with_status(500)
                .status(),
            Some(500)
        );
    }

    #[test]
    fn device_pending_is_recognised() {
        let e = ClientError::from(tonic::Status::failed_precondition("authorization_pending"));
        assert!(is_authorization_pending(&e));
        let e = ClientError::from(tonic::Status::invalid_argument("invalid_device_code"));
        assert!(!is_authorization_pending(&e));
    }

    #[tokio::test]
    async fn bad_urls_and_header_values_are_refused() {
        let e = Client::connect("127.0.0.1:8080", Some("dak_x"), None).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.contains("invalid server url"), "{}", e.message);
        let e = Client::connect("http://127.0.0.1:1", Some("dak\nx"), None).unwrap_err();
        assert_eq!(e.message, "api key is not a valid header value");
        let c = Client::connect("http://127.0.0.1:1/", Some("dak_x"), Some("team_1")).unwrap();
        assert_eq!(c.server(), "http://127.0.0.1:1");
    }

    #[tokio::test]
    async fn unreachable_server_is_unavailable_with_a_cause() {
        // Port 1 on loopback: nothing listens, the connect is refused at once.
        let c = Client::connect("http://127.0.0.1:1", Some("dak_x"), None).unwrap();
        let e = c.me(Default::default()).await.unwrap_err();
        assert_eq!(e.code, Code::Unavailable);
        assert_eq!(e.http_status, Some(TRANSPORT_STATUS));
        assert!(
            e.message
                .starts_with("cannot reach http://127.0.0.1:1: connection refused"),
            "{}",
            e.message
        );
    }
}
