//! The hub: the control plane's end of the sidecar stream (`HostStream.Open`, spec page
//! `15-ref-protocol.md`; `proto/denv/v1/host.proto`) and the only way to send a command
//! to a host.
//!
//! - **Admission.** The first frame must be `hello` within [`HubOptions::hello_timeout`]
//!   (5 s). A new host presents a join token (`djt_…`, single use, one hour); the token
//!   is consumed in the transaction that creates the host row (`host_<ulid>`, the
//!   token's team and cloud), and the `welcome` frame carries the host's `dhs_` secret,
//!   stored only as a SHA-256 hash and compared in constant time. A known host presents
//!   its secret. Any refusal ends the call with `PERMISSION_DENIED` and the reason
//!   (`join: join token already used`, `join: join token expired`, `join: unknown join
//!   token`, `unknown host host_…`, `host secret rejected`); the sidecar exits on it.
//! - **Liveness.** Hello and heartbeats write `status = connected` and `last_seen_at`;
//!   a heartbeat's `load` is kept in memory for placement ([`Hub::load`], with the
//!   [`Claim`]s of deploys under way). No frame for [`HubOptions::grace`] (60 s) or a
//!   dropped stream marks the host `unreachable` (and forgets its load). A reconnect as
//!   the same host replaces the older stream (the older call ends with `ABORTED`).
//! - **Commands.** [`Hub::send`] writes a `commands` row (status `sent`) before the
//!   frame, waits for the result, and stores ack (`acked`), result (`done`/`failed`,
//!   result JSON, error) on the row; progress lines become events on subject
//!   `cmd:<id>` (kind `progress`, body `{"message": …}`); sidecar events (typed
//!   `HostEvent`s) go to `host:<id>` under their kind ([`event_record`]), and
//!   `host.report` / `env.expired` also to [`Hub::notices`] (the orchestrator's
//!   lifecycle answers them). A failed result's `code` travels in [`HubError::Failed`].
//!   Commands without a result are sent again, same id, when the host reconnects (the
//!   sidecar's journal answers repeats without running them twice).
//!   A deployment runner's commands have ids it can send again after a restart
//!   ([`replay`]): a known id is answered from its row or re-sent, never duplicated. A
//!   caller's timeout marks the row `failed` with `timed out after <duration>`. A command
//!   sent with [`Hub::send_cancellable`] (`env.logs`) whose caller leaves first is
//!   marked `failed` (`cancelled: the caller left`) and ended on the host with an
//!   unrecorded `command.cancel` frame.
//! - **Replicas** ([`crate::replica`]): a command for a host whose stream another live
//!   replica holds goes through that replica ([`relay`]), which records it; hosts held
//!   elsewhere count as connected and their stored load is what placement reads. A
//!   command waiting for a host not held here also watches its row (every 250 ms): the
//!   host may reconnect to another replica, which sends it again and records the result.

mod admit;
mod load;
pub mod relay;
pub mod replay;
mod stream;
mod util;

pub use load::{Claim, Claimed, Figures};
pub use util::{go_duration, hash_secret, new_secret};

use crate::store::{commands, hosts};
use denv_proto::v1::{
    self, command, command_result, control_frame, host_event, host_stream_server::HostStreamServer,
    Command, CommandResult, ControlFrame, HostErrorCode,
};
use sea_orm::{DatabaseConnection, DbErr};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Largest frame either way (files travel as bytes): 64 MiB (defined in
/// `denv_proto::contract`).
pub use denv_proto::contract::HOST_FRAME_MAX_BYTES as MAX_FRAME_BYTES;

/// A sidecar event the orchestrator acts on.
#[derive(Debug, Clone)]
pub struct HostNotice {
    /// The sending host.
    pub host_id: String,
    /// The host's team.
    pub team_id: String,
    /// What the host said.
    pub notice: Notice,
}

/// The sidecar events handed to [`Hub::notices`] subscribers.
#[derive(Debug, Clone, PartialEq)]
pub enum Notice {
    /// `host.report`, sent by denvd after every welcome: what it holds.
    Report(v1::HostReportEvent),
    /// `env.expired`: denvd destroyed an environment whose TTL passed.
    Expired(v1::EnvExpired),
}

impl Notice {
    /// The notice an event is, if subscribers act on it (`env.failed` the hub handles
    /// itself).
    pub fn of(ev: &host_event::Event) -> Option<Notice> {
        match ev {
            host_event::Event::HostReport(r) => Some(Notice::Report(r.clone())),
            host_event::Event::EnvExpired(x) => Some(Notice::Expired(x.clone())),
            host_event::Event::EnvFailed(_) => None,
        }
    }
}

/// How a host event is stored on subject `host:<id>` (and shown by `GET /v1/events`):
/// its kind (`env.failed`, `env.expired`, `host.report`) and its message's JSON as the
/// body (`{env_id, reason}`, `{env_id, expires_at}`, `{environments, failed}`).
pub fn event_record(ev: &host_event::Event) -> (&'static str, serde_json::Value) {
    use denv_proto::json::to_json;
    match ev {
        host_event::Event::EnvFailed(f) => ("env.failed", to_json(f)),
        host_event::Event::EnvExpired(x) => ("env.expired", to_json(x)),
        host_event::Event::HostReport(r) => ("host.report", to_json(r)),
    }
}

/// Tunables (tests shorten them).
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// How long a new stream may take to send `hello`. Default 5 s.
    pub hello_timeout: Duration,
    /// No frame for this long marks the host unreachable and ends the call. Default 60 s.
    pub grace: Duration,
    /// The host-protocol versions this control plane speaks, oldest and newest (both
    /// included). Default `denv_proto::contract::{PROTOCOL_MIN, PROTOCOL}`; tests
    /// widen it to exercise the negotiation.
    pub protocols: (u32, u32),
}

impl Default for HubOptions {
    fn default() -> Self {
        HubOptions {
            hello_timeout: denv_proto::contract::HELLO_TIMEOUT,
            grace: denv_proto::contract::HOST_GRACE,
            protocols: (
                denv_proto::contract::PROTOCOL_MIN,
                denv_proto::contract::PROTOCOL,
            ),
        }
    }
}

/// Why a command to a host did not return its result payload: [`Hub::send`]'s errors,
/// and those [`crate::orchestrator::link::Link`] adds before sending. The one mapping to
/// an API status is `impl From<HubError> for ApiError` in [`crate::error`]; the
/// `Display` text is what a phase records.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// No such host in the caller's team.
    #[error("host {0} not found")]
    UnknownHost(String),
    /// The environment has no host to send to.
    #[error("environment has no host")]
    NoHost,
    /// The host has no stream: either the caller's timeout passed while it was away (the
    /// row is marked failed; `after` is that timeout), or a command that must not wait
    /// for a reconnect was refused at once (`after` is `None`).
    #[error("host {host_id} is not connected{}", waited(.after))]
    NotConnected {
        /// The addressed host.
        host_id: String,
        /// The caller's timeout, Go-style (`15m0s`), when the hub waited for it.
        after: Option<String>,
    },
    /// The timeout passed while the host was connected: `timed out after 15m0s`.
    #[error("timed out after {0}")]
    Timeout(String),
    /// The sidecar answered `ok: false`: its error verbatim, and its code (what kind of
    /// failure; `Unspecified` from a sidecar older than the code, or for a row failed
    /// here without a result).
    #[error("{message}")]
    Failed {
        /// The result's `code`.
        code: HostErrorCode,
        /// The result's `error`.
        message: String,
    },
    /// The sidecar answered `ok: true` without the kind's result payload.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The sidecar answered with the result of another command kind (the name is the
    /// command's).
    #[error("unexpected result for {0}")]
    UnexpectedResult(&'static str),
    /// The store failed.
    #[error("store: {0}")]
    Db(#[from] DbErr),
}

fn waited(after: &Option<String>) -> String {
    match after {
        Some(a) => format!(" (timed out after {a})"),
        None => String::new(),
    }
}

/// One open stream.
pub(crate) struct Conn {
    pub(crate) generation: u64,
    pub(crate) team_id: String,
    pub(crate) tx: mpsc::Sender<Result<ControlFrame, tonic::Status>>,
    /// Dropped when this stream is replaced: ends its read loop.
    pub(crate) _stop: oneshot::Sender<()>,
}

/// Where a streamed command's output frames go.
pub type OutputSender = tokio::sync::mpsc::UnboundedSender<denv_proto::v1::Progress>;

pub(crate) struct Inner {
    pub(crate) db: DatabaseConnection,
    pub(crate) opts: HubOptions,
    pub(crate) conns: Mutex<HashMap<String, Conn>>,
    pub(crate) waiters: Mutex<HashMap<String, oneshot::Sender<CommandResult>>>,
    /// Commands whose stored row lacks their bulk bytes ([`util::stored_command`]),
    /// kept whole while their caller waits, so a reconnect can re-send them.
    pub(crate) bulk: Mutex<HashMap<String, Command>>,
    /// Command id → (its host, where its streamed output goes): `env.exec` with `stream`.
    pub(crate) outputs: Mutex<HashMap<String, (String, OutputSender)>>,
    pub(crate) next_generation: AtomicU64,
    pub(crate) notices: tokio::sync::broadcast::Sender<HostNotice>,
    /// Each host's latest load and the claims on it ([`load`]).
    pub(crate) loads: Mutex<load::Loads>,
    /// Replica mode ([`crate::replica`]): set once at start, before serving.
    pub(crate) replica: std::sync::OnceLock<Arc<crate::replica::Replica>>,
}

/// Host id → live stream, and the command path. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct Hub {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("connected", &self.connected_count())
            .finish()
    }
}

impl Hub {
    /// A hub over the store with default timings (hello 5 s, grace 60 s).
    pub fn new(db: DatabaseConnection) -> Hub {
        Hub::with_options(db, HubOptions::default())
    }

    /// A hub with explicit timings.
    pub fn with_options(db: DatabaseConnection, opts: HubOptions) -> Hub {
        Hub {
            inner: Arc::new(Inner {
                db,
                opts,
                conns: Mutex::new(HashMap::new()),
                waiters: Mutex::new(HashMap::new()),
                bulk: Mutex::new(HashMap::new()),
                outputs: Mutex::new(HashMap::new()),
                next_generation: AtomicU64::new(1),
                notices: tokio::sync::broadcast::channel(1024).0,
                loads: Mutex::default(),
                replica: std::sync::OnceLock::new(),
            }),
        }
    }

    /// The tonic service to mount (`denv.v1.HostStream`), 64 MiB frames both ways.
    pub fn service(&self) -> HostStreamServer<stream::HubService> {
        HostStreamServer::new(stream::HubService { hub: self.clone() })
            .max_decoding_message_size(MAX_FRAME_BYTES)
            .max_encoding_message_size(MAX_FRAME_BYTES)
    }

    /// Subscribes to the sidecar events of [`Notice`] (from every host; a
    /// subscriber more than 1024 events behind loses the oldest).
    pub fn notices(&self) -> tokio::sync::broadcast::Receiver<HostNotice> {
        self.inner.notices.subscribe()
    }

    /// Turns replica mode on ([`crate::replica`]): hosts other replicas hold count as
    /// connected, and commands to them go through their replica. Once, before serving.
    pub fn set_replica(&self, replica: Arc<crate::replica::Replica>) {
        let _ = self.inner.replica.set(replica);
    }

    /// This process as a replica (`None`: the only control plane).
    pub fn replica(&self) -> Option<&Arc<crate::replica::Replica>> {
        self.inner.replica.get()
    }

    /// The tonic service replicas call each other on (`denv.v1.Relay`); `None` when
    /// replica mode is off (the service is then not mounted at all).
    pub fn relay_service(&self) -> Option<relay::RelayServer> {
        self.replica().map(|_| relay::server(self.clone()))
    }

    /// Whether the host has an open stream now: here, or (replica mode) on another live
    /// replica as of its last beat.
    pub fn is_connected(&self, host_id: &str) -> bool {
        self.is_local(host_id) || self.replica().is_some_and(|r| r.remote(host_id).is_some())
    }

    /// [`Hub::is_connected`] read from the store now for a host whose stream is not
    /// here (replica mode): the copy of the other replicas' hosts is refreshed only
    /// every heartbeat, so a host that has just connected to another replica would
    /// read as away for up to that long. A store error reads as not connected.
    pub async fn is_connected_now(&self, host_id: &str) -> bool {
        if self.is_local(host_id) {
            return true;
        }
        match self.replica() {
            Some(r) => matches!(r.holder(host_id).await, Ok(Some(_))),
            None => false,
        }
    }

    /// Whether the host's stream is open on this process.
    pub fn is_local(&self, host_id: &str) -> bool {
        self.conns().contains_key(host_id)
    }

    /// The team's connected sidecar hosts (on any replica), oldest host first (ids are
    /// ULIDs).
    pub fn connected_hosts(&self, team_id: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .conns()
            .iter()
            .filter(|(_, c)| c.team_id == team_id)
            .map(|(h, _)| h.clone())
            .collect();
        if let Some(r) = self.replica() {
            v.extend(r.remote_hosts(team_id));
        }
        v.sort();
        v.dedup();
        v
    }

    /// The team's oldest connected sidecar host (placement by capacity is
    /// [`crate::orchestrator::placement`]; this is for "is any host of the team back").
    pub fn first_connected_host(&self, team_id: &str) -> Option<String> {
        self.connected_hosts(team_id).into_iter().next()
    }

    fn connected_count(&self) -> usize {
        self.conns().len()
    }

    /// Ends every host stream of this process (shutdown, after the drain): each read
    /// loop stops as if replaced, the sidecars see their stream end and dial again (to
    /// the next process). Hosts keep their recorded status; the next process's streams
    /// set it. Returns how many streams were open.
    pub fn close_streams(&self) -> usize {
        let closed: Vec<Conn> = self.conns().drain().map(|(_, c)| c).collect();
        tracing::info!(streams = closed.len(), "closing host streams");
        closed.len()
    }

    pub(crate) fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<String, Conn>> {
        self.inner.conns.lock().expect("hub conns poisoned")
    }

    pub(crate) fn db(&self) -> &DatabaseConnection {
        &self.inner.db
    }

    pub(crate) fn next_generation(&self) -> u64 {
        self.inner.next_generation.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends one command to a host of the team and waits for its result.
    ///
    /// The `commands` row (`cmd_<ulid>`, status `sent`) is written before the frame. When
    /// the host has no stream the row waits and is delivered when it reconnects; either
    /// way the wait is bounded by `timeout`, after which the row is marked `failed`
    /// (`timed out after 15m0s`) and [`HubError::Timeout`] (or
    /// [`HubError::NotConnected`] when the host is away) is returned. `ok: false` from
    /// the sidecar is [`HubError::Failed`] with its error and code. `env_id` is `""` for
    /// `host.report`.
    pub async fn send(
        &self,
        team_id: &str,
        host_id: &str,
        env_id: &str,
        payload: command::Payload,
        timeout: Duration,
    ) -> Result<command_result::Payload, HubError> {
        let (_, result) = self
            .send_with_id(team_id, host_id, env_id, payload, timeout)
            .await?;
        result
    }

    /// [`Hub::send`], also returning the command id (for events on `cmd:<id>`). The
    /// outer error is a failure before the command was recorded.
    pub async fn send_with_id(
        &self,
        team_id: &str,
        host_id: &str,
        env_id: &str,
        payload: command::Payload,
        timeout: Duration,
    ) -> Result<(String, Result<command_result::Payload, HubError>), HubError> {
        self.send_inner(team_id, host_id, env_id, payload, timeout, None)
            .await
    }

    /// [`Hub::send`] for a command whose output the sidecar streams (`env.exec` with
    /// `stream`): every Progress frame of this command that carries `stdout`/`stderr`
    /// bytes, from the addressed host only, goes to `output` in arrival order (never to
    /// the event log); the result follows them.
    pub async fn send_with_output(
        &self,
        team_id: &str,
        host_id: &str,
        env_id: &str,
        payload: command::Payload,
        timeout: Duration,
        output: OutputSender,
    ) -> Result<command_result::Payload, HubError> {
        let (_, r) = self
            .send_inner(
                team_id,
                host_id,
                env_id,
                payload,
                timeout,
                Some((output, false)),
            )
            .await?;
        r
    }

    /// [`Hub::send_with_output`] for a command that runs until it is stopped (`env.logs`
    /// with `follow`): when the caller stops waiting before the result came (it was
    /// dropped, or `timeout` passed), the row is marked `failed` (`cancelled: the caller
    /// left`, so a reconnect does not send it again) and a `command.cancel` frame naming
    /// it goes to the host, which ends it.
    pub async fn send_cancellable(
        &self,
        team_id: &str,
        host_id: &str,
        env_id: &str,
        payload: command::Payload,
        timeout: Duration,
        output: OutputSender,
    ) -> Result<command_result::Payload, HubError> {
        let (_, r) = self
            .send_inner(
                team_id,
                host_id,
                env_id,
                payload,
                timeout,
                Some((output, true)),
            )
            .await?;
        r
    }

    /// Ends command `command_id` on `host_id` early: its open row is marked `failed`
    /// (`cancelled: the caller left`) and a `command.cancel` frame is delivered if the
    /// host has a stream now (not recorded; a host that is away has lost the command's
    /// stream anyway, which ends it there too).
    pub async fn cancel(&self, host_id: &str, env_id: &str, command_id: &str) {
        if let Err(e) = commands::fail_open(
            self.db(),
            command_id,
            "cancelled: the caller left",
            &util::now(),
        )
        .await
        {
            tracing::warn!(command_id, error = %e, "marking a cancelled command");
        }
        let cmd = Command {
            command_id: util::new_id("cmd"),
            kind: "command.cancel".into(),
            env_id: env_id.to_string(),
            payload: Some(command::Payload::CommandCancel(
                denv_proto::v1::CommandCancel {
                    command_id: command_id.to_string(),
                },
            )),
        };
        tracing::debug!(command_id, host_id, "command cancelled");
        self.deliver(host_id, cmd).await;
    }

    /// Routes a Progress frame with output bytes to its command's subscriber, when
    /// `host_id` is the host the command went to. Returns whether it was taken.
    pub(crate) fn route_output(&self, host_id: &str, p: denv_proto::v1::Progress) -> bool {
        let outputs = self.inner.outputs.lock().expect("hub outputs poisoned");
        match outputs.get(&p.command_id) {
            Some((h, tx)) if h == host_id => {
                let _ = tx.send(p);
                true
            }
            _ => false,
        }
    }

    async fn send_inner(
        &self,
        team_id: &str,
        host_id: &str,
        env_id: &str,
        payload: command::Payload,
        timeout: Duration,
        output: Option<(OutputSender, bool)>,
    ) -> Result<(String, Result<command_result::Payload, HubError>), HubError> {
        // The id is taken before the first await, so a runner's commands are numbered
        // in the order it sends them ([`replay`]).
        let keyed = replay::next_id();
        let id = keyed.clone().unwrap_or_else(|| util::new_id("cmd"));
        let kind = util::kind_of(&payload);
        let cmd = Command {
            command_id: id,
            kind: kind.to_string(),
            env_id: env_id.to_string(),
            payload: Some(payload),
        };
        self.send_command(
            team_id,
            host_id,
            cmd,
            keyed.is_some(),
            true,
            timeout,
            output,
        )
        .await
    }

    /// Sends `cmd` (its id chosen) to the host: through the replica holding its stream
    /// when that is another one (`may_relay`, replica mode), else on this process's
    /// path. `keyed`: a row already under the id is answered from or sent again
    /// ([`replay`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn send_command(
        &self,
        team_id: &str,
        host_id: &str,
        cmd: Command,
        keyed: bool,
        may_relay: bool,
        timeout: Duration,
        output: Option<(OutputSender, bool)>,
    ) -> Result<(String, Result<command_result::Payload, HubError>), HubError> {
        let id = cmd.command_id.clone();
        let env_id = cmd.env_id.clone();
        let env_id = env_id.as_str();
        let db = self.db();
        if hosts::get_in_team(db, team_id, host_id).await?.is_none() {
            return Err(HubError::UnknownHost(host_id.to_string()));
        }
        let kind = cmd
            .payload
            .as_ref()
            .map_or("an empty command", util::kind_of);
        if let (true, Some(rep)) = (may_relay, self.replica()) {
            if !self.is_local(host_id) {
                if let Some(remote) = rep.holder(host_id).await? {
                    match relay::forward(
                        self,
                        rep,
                        &remote,
                        team_id,
                        host_id,
                        &cmd,
                        keyed,
                        timeout,
                        output.as_ref(),
                    )
                    .await
                    {
                        relay::Forwarded::Done(r) => return r,
                        relay::Forwarded::Unreached(why) => {
                            tracing::warn!(command_id = %id, host_id, replica = %remote.replica_id, error = %why, "the replica holding the host did not answer; the command waits here");
                        }
                    }
                }
            }
        }
        // A keyed command sent before (by this deployment's runner before a restart).
        let earlier = if keyed {
            commands::get(db, &id).await?
        } else {
            None
        };
        if let Some(row) = &earlier {
            let was = util::command_from_row(row)
                .ok()
                .and_then(|c| c.payload)
                .map_or("an unreadable command", |p| util::kind_of(&p));
            if row.host_id != host_id || row.env_id != env_id || was != kind {
                return Err(HubError::Protocol(format!(
                    "resumed deployment diverged: command {id} was {was} for {} on {}, now {kind} for {env_id} on {host_id}",
                    row.env_id, row.host_id
                )));
            }
            if let Some(outcome) = util::outcome_of_row(row) {
                tracing::info!(command_id = %id, host_id, kind, "command answered from its row");
                return Ok((id, outcome));
            }
        }
        let now = util::now();
        let (message, left_out) = util::stored_command(&cmd);
        if left_out > 0 {
            self.inner
                .bulk
                .lock()
                .expect("hub bulk poisoned")
                .insert(id.clone(), cmd.clone());
        }
        if earlier.is_none() {
            commands::insert(
                db,
                commands::Model {
                    id: id.clone(),
                    team_id: team_id.to_string(),
                    host_id: host_id.to_string(),
                    env_id: env_id.to_string(),
                    status: commands::SENT.into(),
                    message,
                    left_out,
                    result: None,
                    result_left_out: 0,
                    error: String::new(),
                    created_at: now.clone(),
                    updated_at: now,
                },
            )
            .await?;
        }
        let (wtx, wrx) = oneshot::channel();
        let guard = WaiterGuard {
            hub: self,
            id: id.clone(),
            cancel: output
                .as_ref()
                .filter(|(_, c)| *c)
                .map(|_| (host_id.to_string(), env_id.to_string())),
        };
        self.inner
            .waiters
            .lock()
            .expect("hub waiters poisoned")
            .insert(id.clone(), wtx);
        if let Some((o, _)) = output {
            self.inner
                .outputs
                .lock()
                .expect("hub outputs poisoned")
                .insert(id.clone(), (host_id.to_string(), o));
        }
        if earlier.is_some() {
            // Its result may have been stored between the read above and the waiter.
            if let Some(outcome) = commands::get(db, &id)
                .await?
                .as_ref()
                .and_then(util::outcome_of_row)
            {
                drop(guard);
                return Ok((id, outcome));
            }
            tracing::info!(command_id = %id, host_id, kind, "command sent again under its id");
        }
        tracing::debug!(command_id = %id, host_id, env_id, kind, "command sent");
        self.deliver(host_id, cmd).await;

        // Replica mode: the host may (re)connect to another replica, which sends the
        // command again and records its result: the row is watched too.
        let waited = async {
            match self.replica() {
                None => wrx.await.map(Answer::Result),
                Some(_) => tokio::select! {
                    biased;
                    r = wrx => r.map(Answer::Result),
                    o = util::row_outcome(db, &id, || self.is_local(host_id)) => Ok(Answer::Row(o)),
                },
            }
        };
        let outcome = match tokio::time::timeout(timeout, waited).await {
            Ok(Ok(Answer::Result(res))) => result_of(res),
            Ok(Ok(Answer::Row(o))) => o,
            Ok(Err(_)) => Err(HubError::Protocol("the hub dropped the command".into())),
            Err(_) => {
                let after = go_duration(timeout);
                let msg = format!("timed out after {after}");
                let connected = self.is_connected(host_id);
                let row_msg = if connected {
                    msg.clone()
                } else {
                    format!("{msg}: host not connected")
                };
                commands::fail_open(db, &id, &row_msg, &util::now()).await?;
                tracing::warn!(command_id = %id, host_id, kind, %after, "command timed out");
                if connected {
                    Err(HubError::Timeout(after))
                } else {
                    Err(HubError::NotConnected {
                        host_id: host_id.to_string(),
                        after: Some(after),
                    })
                }
            }
        };
        drop(guard);
        Ok((id, outcome))
    }

    /// Writes a command frame on the host's stream, if it has one (else it waits in the
    /// table for the reconnect).
    async fn deliver(&self, host_id: &str, cmd: Command) {
        let tx = self.conns().get(host_id).map(|c| c.tx.clone());
        if let Some(tx) = tx {
            let frame = ControlFrame {
                sent_at: util::now(),
                frame: Some(control_frame::Frame::Command(cmd)),
            };
            if tx.send(Ok(frame)).await.is_err() {
                tracing::debug!(
                    host_id,
                    "stream closed while sending; command waits for reconnect"
                );
            }
        }
    }

    /// Hands a result to the waiting caller, if any.
    pub(crate) fn resolve(&self, res: CommandResult) {
        let w = self
            .inner
            .waiters
            .lock()
            .expect("hub waiters poisoned")
            .remove(&res.command_id);
        if let Some(w) = w {
            let _ = w.send(res);
        }
    }
}

/// How a waiting command got its outcome.
enum Answer {
    /// The result frame, on this process's stream.
    Result(CommandResult),
    /// Its row, closed by another replica.
    Row(Result<command_result::Payload, HubError>),
}

/// Removes the waiter when the caller returns or is cancelled.
struct WaiterGuard<'a> {
    hub: &'a Hub,
    id: String,
    /// (host, env) of a command to cancel when its caller leaves before the result.
    cancel: Option<(String, String)>,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        let pending = match self.hub.inner.waiters.lock() {
            Ok(mut w) => w.remove(&self.id).is_some(),
            Err(_) => false,
        };
        if let (true, Some((host, env))) = (pending, self.cancel.take()) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let hub = self.hub.clone();
                let id = self.id.clone();
                rt.spawn(async move { hub.cancel(&host, &env, &id).await });
            }
        }
        if let Ok(mut b) = self.hub.inner.bulk.lock() {
            b.remove(&self.id);
        }
        if let Ok(mut o) = self.hub.inner.outputs.lock() {
            o.remove(&self.id);
        }
    }
}

fn result_of(res: CommandResult) -> Result<command_result::Payload, HubError> {
    if !res.ok {
        let code = res.code();
        return Err(HubError::Failed {
            code,
            message: if res.error.is_empty() {
                "command failed".into()
            } else {
                res.error
            },
        });
    }
    res.payload
        .ok_or_else(|| HubError::Protocol(format!("result of {} has no payload", res.command_id)))
}
