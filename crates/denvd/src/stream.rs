//! The outbound host stream (spec `15-ref-protocol.md`, "Session"; `host.proto`).
//!
//! One gRPC call `HostStream.Open` to the control plane's one port, over h2c
//! (`http://host:8080`) or TLS (`https://…`, the certificate checked against the
//! built-in and system roots or the `--ca-file`: [`denv_client::transport`]). Each session sends `hello` (host id + secret, or the join token
//! on the first join, and the capabilities), waits for `welcome` (saving a new identity
//! to the state file, mode 0600), then sends a heartbeat at once and every 10 s (each
//! with the host's [load](crate::runtime::Load), what placement needs) and answers
//! commands: `ack` on receipt, `progress` lines while running, one `result` (from the
//! [journal](crate::journal), which runs each id once; on one environment execs and
//! file transfers run together, every other command alone). A dropped session reconnects
//! after a delay growing from 1 s towards 30 s with random jitter ([`reconnect_delays`];
//! reset once a session was welcomed); `PERMISSION_DENIED` is fatal and [`run`] returns it.
//!
//! [`RuntimeExecutor`] dispatches every command kind to the Docker
//! [`Runtime`](crate::runtime::Runtime).

use crate::config::{State, VERSION};
use crate::journal::{CommandError, Executor, Journal, Progress};
use crate::runtime::Runtime;
use denv_client::transport::{self, TransportError, Trust};
use denv_proto::contract;
use denv_proto::v1::{
    self, command, command_result, control_frame, host_event, host_stream_client::HostStreamClient,
    sidecar_frame, Ack, Capabilities, Command, ControlFrame, Heartbeat, Hello, SidecarFrame,
};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Largest frame either way: 64 MiB (files travel as bytes; defined in
/// `denv_proto::contract`).
pub use denv_proto::contract::HOST_FRAME_MAX_BYTES as MAX_FRAME_BYTES;

/// The newest and oldest protocol versions spoken (defined in `denv_proto::contract`;
/// sent in `hello` as `protocol` and `min_protocol`).
pub use denv_proto::contract::{PROTOCOL, PROTOCOL_MIN};

/// What a sidecar session needs besides the executor.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// Control plane base URL (`http://host:8080` or `https://…`).
    pub server: String,
    /// What an `https://` server's certificate is checked against (default: the built-in
    /// and system roots; [`trust`] reads a CA file).
    pub trust: Trust,
    /// Join token, used only while `state` has no identity.
    pub token: String,
    /// Where a new identity is saved.
    pub state_path: PathBuf,
    /// The identity (and the server, data dir and pool saved with it).
    pub state: State,
    /// Heartbeat period (10 s).
    pub heartbeat: Duration,
    /// Smallest reconnect delay (1 s; see [`reconnect_delays`]).
    pub backoff_min: Duration,
    /// Largest reconnect delay (30 s).
    pub backoff_max: Duration,
}

impl StreamOptions {
    /// Options with the protocol's timings.
    pub fn new(server: &str, token: &str, state_path: PathBuf, state: State) -> Self {
        StreamOptions {
            server: server.trim_end_matches('/').to_string(),
            trust: Trust::default_roots(),
            token: token.to_string(),
            state_path,
            state,
            heartbeat: contract::HEARTBEAT_INTERVAL,
            backoff_min: contract::RECONNECT_MIN,
            backoff_max: contract::RECONNECT_MAX,
        }
    }
}

/// Why [`run`] returned.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The control plane refused this host (PERMISSION_DENIED): exit non-zero.
    #[error("refused by the control plane: {0}")]
    Refused(String),
    /// No identity and no join token.
    #[error("no saved identity in {0} and no join token (--token or DENV_JOIN_TOKEN)")]
    NoCredential(String),
    /// The server URL cannot be used.
    #[error("server {url:?}: {reason}")]
    BadServer {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The CA file cannot be read or holds no certificate.
    #[error("{0}")]
    CaFile(String),
    /// The `welcome` chose a protocol version this denvd does not speak (a control plane
    /// that ignored the range sent in `hello`): exit non-zero.
    #[error("the control plane chose protocol {chosen}, which this denvd does not speak (it speaks {}); upgrade denvd or the control plane", show_range(.min, .max))]
    Protocol {
        /// `welcome.protocol` (0 read as 1).
        chosen: u32,
        /// [`PROTOCOL_MIN`].
        min: u32,
        /// [`PROTOCOL`].
        max: u32,
    },
    /// A new identity could not be saved.
    #[error("saving identity to {path}: {source}")]
    State {
        /// The state file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The version a `welcome` chose (`welcome.protocol`; 0, from a control plane older
/// than the negotiation, is read as 1), if it is one of `min..=max`, the versions this
/// denvd speaks; else [`StreamError::Protocol`] (spec `15-ref-protocol.md`, "Session";
/// `docs/reference/protocol.md`, "Protocol versions").
pub fn accept_protocol(chosen: u32, min: u32, max: u32) -> Result<u32, StreamError> {
    let chosen = chosen.max(1);
    if (min..=max).contains(&chosen) {
        Ok(chosen)
    } else {
        Err(StreamError::Protocol { chosen, min, max })
    }
}

/// The delays between reconnect attempts: exponential backoff with jitter (the `backon`
/// crate), so the sidecars of a restarted control plane do not all come back at once.
/// The n-th delay is drawn from `[b, 2b)` where `b` starts at `min` and doubles up to
/// `max / 2`; every delay is at least `min` and at most `max` (1 s and 30 s: the first in
/// `[1 s, 2 s)`, from the fifth on in `[15 s, 30 s)`). Endless.
pub fn reconnect_delays(min: Duration, max: Duration) -> impl Iterator<Item = Duration> {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::new()
        .with_min_delay(min)
        .with_max_delay((max / 2).max(min))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
        .map(move |d| d.clamp(min, max.max(min)))
}

/// `n`, or `n to m`, for messages.
fn show_range(min: &u32, max: &u32) -> String {
    if min == max {
        min.to_string()
    } else {
        format!("{min} to {max}")
    }
}

/// How one session ended.
enum SessionEnd {
    Fatal(StreamError),
    Retry { reason: String, welcomed: bool },
}

/// What `server` is reached with: the CA file's certificates (read now) or the default
/// roots; errors when the URL is not `http://…`/`https://…` or the CA file cannot be
/// used, so that `denvd` stops at start instead of retrying what cannot work.
pub fn trust(server: &str, ca_file: Option<&std::path::Path>) -> Result<Trust, StreamError> {
    let t = Trust::load(ca_file).map_err(stream_error)?;
    t.endpoint(server).map_err(stream_error)?;
    Ok(t)
}

fn stream_error(e: TransportError) -> StreamError {
    match e {
        TransportError::BadUrl { url, reason } => StreamError::BadServer { url, reason },
        e @ TransportError::CaFile { .. } => StreamError::CaFile(e.to_string()),
    }
}

/// Runs sessions until a fatal refusal (returned as the error). Never returns `Ok`.
pub async fn run(
    mut opts: StreamOptions,
    exec: Arc<dyn Executor>,
    journal: Arc<Journal>,
) -> Result<(), StreamError> {
    if !opts.state.has_identity() && opts.token.is_empty() {
        return Err(StreamError::NoCredential(
            opts.state_path.display().to_string(),
        ));
    }
    opts.trust.endpoint(&opts.server).map_err(stream_error)?;
    let (min, max) = (opts.backoff_min, opts.backoff_max);
    let mut delays = reconnect_delays(min, max);
    loop {
        match session(&mut opts, &exec, &journal).await {
            SessionEnd::Fatal(e) => return Err(e),
            SessionEnd::Retry { reason, welcomed } => {
                if welcomed {
                    delays = reconnect_delays(min, max);
                }
                let backoff = delays.next().unwrap_or(max);
                tracing::warn!(%reason, retry_in = ?backoff, "stream ended; reconnecting");
                tokio::time::sleep(backoff).await;
            }
        }
    }
}

/// `<code>: <message>`, and the transport's cause when the call never reached the
/// control plane (a plain `http://` URL to a TLS port: the server's `use https://`).
fn status_words(s: &tonic::Status) -> String {
    match std::error::Error::source(s) {
        Some(cause) => format!(
            "{}: {}: {}",
            s.code(),
            s.message(),
            transport::describe(cause)
        ),
        None => format!("{}: {}", s.code(), s.message()),
    }
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn frame(f: sidecar_frame::Frame) -> SidecarFrame {
    SidecarFrame {
        sent_at: now(),
        frame: Some(f),
    }
}

async fn session(
    opts: &mut StreamOptions,
    exec: &Arc<dyn Executor>,
    journal: &Arc<Journal>,
) -> SessionEnd {
    let retry = |reason: String| SessionEnd::Retry {
        reason,
        welcomed: false,
    };
    let endpoint = match opts.trust.endpoint(&opts.server) {
        Ok(e) => e
            .connect_timeout(Duration::from_secs(10))
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(20))
            .keep_alive_while_idle(true),
        Err(e) => return SessionEnd::Fatal(stream_error(e)),
    };
    // A TLS failure reads `tls: …` (an unknown issuer, a name the certificate does not
    // hold, a plain-HTTP server): retried like any connect failure, since a renewed
    // certificate or a restarted server may fix it, and logged with each retry.
    let channel = match endpoint.connect().await {
        Ok(c) => c,
        Err(e) => {
            return retry(format!(
                "connect {}: {}",
                opts.server,
                transport::describe(&e)
            ))
        }
    };
    let mut client = HostStreamClient::new(channel)
        .max_decoding_message_size(MAX_FRAME_BYTES)
        .max_encoding_message_size(MAX_FRAME_BYTES);

    let (out_tx, out_rx) = mpsc::channel::<SidecarFrame>(256);
    let (host_id, token) = if opts.state.has_identity() {
        (opts.state.host_id.clone(), opts.state.secret.clone())
    } else {
        (String::new(), opts.token.clone())
    };
    let caps = exec.capabilities().await;
    let hello = frame(sidecar_frame::Frame::Hello(Hello {
        host_id,
        token,
        capabilities: Some(caps),
        protocol: PROTOCOL,
        min_protocol: PROTOCOL_MIN,
    }));
    let _ = out_tx.send(hello).await;

    let mut inbound = match client.open(ReceiverStream::new(out_rx)).await {
        Ok(r) => r.into_inner(),
        Err(s) if s.code() == tonic::Code::PermissionDenied => {
            return SessionEnd::Fatal(StreamError::Refused(s.message().to_string()))
        }
        Err(s) => return retry(format!("open: {}", status_words(&s))),
    };

    // The first frame is the welcome.
    let welcome = match inbound.message().await {
        Ok(Some(ControlFrame {
            frame: Some(control_frame::Frame::Welcome(w)),
            ..
        })) => w,
        Ok(Some(_)) => return retry("the first frame was not welcome".into()),
        Ok(None) => return retry("stream closed before welcome".into()),
        Err(s) if s.code() == tonic::Code::PermissionDenied => {
            return SessionEnd::Fatal(StreamError::Refused(s.message().to_string()))
        }
        Err(s) => return retry(status_words(&s)),
    };
    if !welcome.secret.is_empty() {
        opts.state.server = opts.server.clone();
        opts.state.host_id = welcome.host_id.clone();
        opts.state.secret = welcome.secret.clone();
        if let Err(source) = opts.state.save(&opts.state_path) {
            return SessionEnd::Fatal(StreamError::State {
                path: opts.state_path.display().to_string(),
                source,
            });
        }
        tracing::info!(host_id = %welcome.host_id, state = %opts.state_path.display(), "joined; identity saved");
    }
    // Checked after the identity is saved: a first join consumed the token, and an
    // upgraded denvd can then reconnect with it. Protocol 1 is the only version there
    // is, so nothing below depends on the chosen one yet.
    let protocol = match accept_protocol(welcome.protocol, PROTOCOL_MIN, PROTOCOL) {
        Ok(v) => v,
        Err(e) => return SessionEnd::Fatal(e),
    };
    tracing::info!(host_id = %welcome.host_id, protocol, "connected");

    // What this host holds: the control plane answers with env.destroy for what no
    // live record owns, and marks dead environments failed.
    if let Some(report) = exec.report().await {
        if out_tx
            .send(frame(sidecar_frame::Frame::Event(report)))
            .await
            .is_err()
        {
            return SessionEnd::Retry {
                reason: "outbound stream closed".into(),
                welcomed: true,
            };
        }
    }

    // The first tick is immediate: a heartbeat with the host's load follows the welcome
    // at once, so placement knows this host's room from the start.
    let mut tick = tokio::time::interval(opts.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let reason = loop {
        tokio::select! {
            _ = tick.tick() => {
                let load = exec.load().await;
                if out_tx.send(frame(sidecar_frame::Frame::Heartbeat(Heartbeat { load }))).await.is_err() {
                    break "outbound stream closed".to_string();
                }
            }
            ev = exec.next_event() => {
                if out_tx.send(frame(sidecar_frame::Frame::Event(ev))).await.is_err() {
                    break "outbound stream closed".to_string();
                }
            }
            m = inbound.message() => match m {
                Ok(Some(ControlFrame { frame: Some(control_frame::Frame::Command(cmd)), .. })) => {
                    if let Some(command::Payload::CommandCancel(c)) = &cmd.payload {
                        // Not journalled, not answered: it ends a running command.
                        tracing::info!(command_id = %c.command_id, "command cancelled by the control plane");
                        cancel_signal(&c.command_id).notify_one();
                        continue;
                    }
                    tokio::spawn(handle_command(cmd, exec.clone(), journal.clone(), out_tx.clone()));
                }
                Ok(Some(_)) => tracing::debug!("ignoring an unexpected control frame"),
                Ok(None) => break "stream closed by the control plane".to_string(),
                Err(s) if s.code() == tonic::Code::PermissionDenied => {
                    return SessionEnd::Fatal(StreamError::Refused(s.message().to_string()));
                }
                Err(s) => break format!("{}: {}", s.code(), s.message()),
            }
        }
    };
    SessionEnd::Retry {
        reason,
        welcomed: true,
    }
}

/// Cancellation signals of running commands, by command id (see [`cancel_signal`]).
static CANCELS: std::sync::OnceLock<
    std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Notify>>>,
> = std::sync::OnceLock::new();

/// The signal a `command.cancel` naming `command_id` notifies (created on first use by
/// either side, so a cancel that arrives before the command started still counts: the
/// permit is kept). A command that watches it calls [`forget_cancel`] when it ends.
pub fn cancel_signal(command_id: &str) -> Arc<tokio::sync::Notify> {
    CANCELS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(command_id.to_string())
        .or_default()
        .clone()
}

/// Drops the signal of a command that ended.
pub fn forget_cancel(command_id: &str) {
    if let Some(m) = CANCELS.get() {
        m.lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(command_id);
    }
}

tokio::task_local! {
    /// The frame sender and command id of the command being run, for an `env.exec` with
    /// `stream` (its output goes up as Progress frames before the result).
    static EXEC_OUT: (mpsc::Sender<SidecarFrame>, String);
}

/// Acks, runs through the journal (forwarding progress), sends the result.
async fn handle_command(
    cmd: Command,
    exec: Arc<dyn Executor>,
    journal: Arc<Journal>,
    out: mpsc::Sender<SidecarFrame>,
) {
    let id = cmd.command_id.clone();
    tracing::info!(command_id = %id, kind = %cmd.kind, env_id = %cmd.env_id, "command");
    let _ = out
        .send(frame(sidecar_frame::Frame::Ack(Ack {
            command_id: id.clone(),
        })))
        .await;
    let (ptx, mut prx) = mpsc::unbounded_channel::<String>();
    let fwd_out = out.clone();
    let fwd_id = id.clone();
    let forward = tokio::spawn(async move {
        while let Some(message) = prx.recv().await {
            let _ = fwd_out
                .send(frame(sidecar_frame::Frame::Progress(v1::Progress {
                    command_id: fwd_id.clone(),
                    message,
                    ..Default::default()
                })))
                .await;
        }
    });
    let outcome = EXEC_OUT
        .scope(
            (out.clone(), id.clone()),
            journal.run(&cmd, exec.as_ref(), &ptx),
        )
        .await;
    drop(ptx);
    // Progress lines go out before the result; a sender kept alive elsewhere cannot
    // hold the result back for more than a second.
    let mut forward = forward;
    if tokio::time::timeout(Duration::from_secs(1), &mut forward)
        .await
        .is_err()
    {
        forward.abort();
    }
    let res = outcome.into_result();
    tracing::info!(command_id = %id, ok = res.ok, error = %res.error, code = ?res.code(), "result");
    let _ = out.send(frame(sidecar_frame::Frame::Result(res))).await;
}

/// Dispatches command kinds to the Docker runtime.
pub struct RuntimeExecutor {
    rt: Runtime,
    events: Option<tokio::sync::Mutex<mpsc::UnboundedReceiver<v1::HostEvent>>>,
    /// The HTTP client of `snapshot.receive` / `image.receive` (trusting what the host
    /// stream trusts: see [`RuntimeExecutor::with_ca_file`]).
    client: reqwest::Client,
    /// Where `snapshot.send` / `image.send` make their offers: `None` without
    /// `--data-addr`.
    data: Option<crate::dataport::DataPort>,
}

/// The HTTP client fetching snapshots and images from other hosts' data ports (10 s to
/// connect, 60 s without a byte read fails the transfer): the default roots, plus the
/// certificates of `ca_file` when given (the CA file of `--ca-file`). Error: the file
/// cannot be read or holds no certificate.
pub fn ship_client(ca_file: Option<&std::path::Path>) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(10))
        // A transfer that stalls (no byte for a minute) fails instead of hanging.
        .read_timeout(std::time::Duration::from_secs(60))
        .tcp_keepalive(std::time::Duration::from_secs(30));
    if let Some(p) = ca_file {
        let pem = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
        for c in reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("{}: {e}", p.display()))?
        {
            b = b.add_root_certificate(c);
        }
    }
    b.build().map_err(|e| format!("HTTP client: {e}"))
}

impl RuntimeExecutor {
    /// Over a runtime (no engine watch, no TTL enforcement: no events).
    pub fn new(rt: Runtime) -> Self {
        RuntimeExecutor {
            rt,
            events: None,
            client: ship_client(None).unwrap_or_default(),
            data: None,
        }
    }

    /// Fetches from other hosts with [`ship_client`]`(ca_file)`.
    pub fn with_ca_file(mut self, ca_file: Option<&std::path::Path>) -> Result<Self, String> {
        self.client = ship_client(ca_file)?;
        Ok(self)
    }

    /// Makes `snapshot.send` / `image.send` offers on `port`.
    pub fn with_data_port(mut self, port: crate::dataport::DataPort) -> Self {
        self.data = Some(port);
        self
    }

    fn with_data_url(&self, mut c: Capabilities) -> Capabilities {
        c.data_url = self
            .data
            .as_ref()
            .map(|d| d.url().to_string())
            .unwrap_or_default();
        c
    }

    fn data_port(&self) -> Result<&crate::dataport::DataPort, String> {
        self.data.as_ref().ok_or_else(|| {
            "this host has no data port (denvd --data-addr), so other hosts cannot fetch \
             its snapshots or images"
                .to_string()
        })
    }

    /// Over a runtime, with [`Runtime::watch_engine`] and [`Runtime::watch_expiry`]
    /// running in the background (spawned on the current tokio runtime): every
    /// environment found dead is sent to the control plane as an `env_failed` event
    /// ([`v1::EnvFailed`]), every environment destroyed because its TTL passed as
    /// `env_expired` ([`v1::EnvExpired`]) (queued while the stream is down).
    pub fn watching(rt: Runtime) -> Self {
        let (etx, erx) = mpsc::unbounded_channel();
        let (ftx, mut frx) = mpsc::unbounded_channel();
        tokio::spawn(rt.clone().watch_engine(ftx));
        let fwd = etx.clone();
        tokio::spawn(async move {
            while let Some(f) = frx.recv().await {
                if fwd.send(failure_event(f)).is_err() {
                    return;
                }
            }
        });
        let (xtx, mut xrx) = mpsc::unbounded_channel();
        tokio::spawn(rt.clone().watch_expiry(xtx));
        tokio::spawn(async move {
            while let Some(x) = xrx.recv().await {
                if etx.send(expired_event(x)).is_err() {
                    return;
                }
            }
        });
        RuntimeExecutor {
            rt,
            events: Some(tokio::sync::Mutex::new(erx)),
            client: ship_client(None).unwrap_or_default(),
            data: None,
        }
    }
}

fn event(e: host_event::Event) -> v1::HostEvent {
    v1::HostEvent { event: Some(e) }
}

/// The `env.expired` host event for an environment its TTL destroyed.
pub fn expired_event(x: crate::runtime::Expired) -> v1::HostEvent {
    event(host_event::Event::EnvExpired(v1::EnvExpired {
        env_id: x.env_id,
        expires_at: x.expires_at,
    }))
}

/// The `host.report` event: every environment this host holds and the ones found dead
/// with why (the [`v1::HostReportResult`] fields the control plane reconciles with).
pub async fn report_event(rt: &Runtime) -> v1::HostEvent {
    let environments = rt.list_envs().await;
    let failed = environments
        .iter()
        .filter_map(|e| rt.recorded_failure(e).map(|r| (e.clone(), r)))
        .collect();
    event(host_event::Event::HostReport(v1::HostReportEvent {
        environments,
        failed,
    }))
}

/// The `env.failed` host event for a dead environment.
pub fn failure_event(f: crate::runtime::EnvFailure) -> v1::HostEvent {
    event(host_event::Event::EnvFailed(v1::EnvFailed {
        env_id: f.env_id,
        reason: f.reason,
    }))
}

/// The runtime's capabilities as the wire message (with this build's version).
pub fn wire_capabilities(c: crate::runtime::Capabilities) -> Capabilities {
    Capabilities {
        hostname: c.hostname,
        os: c.os,
        arch: c.arch,
        cpus: c.cpus,
        memory_mb: u32::try_from(c.memory_mb).unwrap_or(u32::MAX),
        disk_gb: u32::try_from(c.disk_gb).unwrap_or(u32::MAX),
        storage: c.storage,
        docker: c.docker,
        compose: c.compose,
        netns: c.netns,
        public_ip: c.public_ip.unwrap_or_default(),
        denvd_version: VERSION.to_string(),
        volume_quota: c.volume_quota,
        layer_quota: c.layer_quota,
        default_disk_mb: c.default_disk_mb,
        packet_filter: c.packet_filter,
        clock: c.clock,
        data_url: String::new(),
    }
}

/// The runtime's load as the wire message.
pub fn wire_load(l: crate::runtime::Load) -> v1::HostLoad {
    v1::HostLoad {
        memory_free_mb: l.memory_free_mb,
        memory_total_mb: l.memory_total_mb,
        disk_free_mb: l.disk_free_mb,
        cpus: l.cpus,
        environments: l.environments,
        reserved_cpus: l.reserved_cpus,
        reserved_memory_mb: l.reserved_memory_mb,
        reserved_disk_mb: l.reserved_disk_mb,
    }
}

/// The egress probe as the wire message.
pub fn wire_probe(p: crate::runtime::EgressProbe) -> v1::EgressProbe {
    v1::EgressProbe {
        took_us: p.took_us,
        from: p.from,
        attempts: p
            .attempts
            .into_iter()
            .map(|a| v1::EgressAttempt {
                target: a.target,
                addr: a.addr,
                result: a.result,
                took_us: a.took_us,
            })
            .collect(),
    }
}

/// The one-minute load average of /proc/loadavg (0 when unreadable). procfs parses it as
/// an `f32`; rounded back to the file's two decimals so the JSON shows `0.15`, not
/// `0.15000000596046448`.
fn load_avg() -> f64 {
    <procfs::LoadAverage as procfs::Current>::current()
        .map(|l| (f64::from(l.one) * 100.0).round() / 100.0)
        .unwrap_or(0.0)
}

fn clamp_i32(v: i64) -> i32 {
    i32::try_from(v).unwrap_or(if v < 0 { i32::MIN } else { i32::MAX })
}

#[tonic::async_trait]
impl Executor for RuntimeExecutor {
    async fn capabilities(&self) -> Capabilities {
        self.with_data_url(wire_capabilities(self.rt.capabilities().await))
    }

    async fn next_event(&self) -> v1::HostEvent {
        let Some(rx) = &self.events else {
            return std::future::pending().await;
        };
        match rx.lock().await.recv().await {
            Some(ev) => ev,
            None => std::future::pending().await,
        }
    }

    async fn report(&self) -> Option<v1::HostEvent> {
        Some(report_event(&self.rt).await)
    }

    async fn load(&self) -> Option<v1::HostLoad> {
        Some(wire_load(self.rt.load().await))
    }

    async fn execute(
        &self,
        cmd: &Command,
        progress: &Progress,
    ) -> Result<command_result::Payload, CommandError> {
        use command::Payload as P;
        use command_result::Payload as R;
        let rt = &self.rt;
        let env = cmd.env_id.as_str();
        let e = CommandError::from;
        let Some(payload) = &cmd.payload else {
            // A kind newer than this sidecar: the host's shortcoming, not the caller's.
            return Err(format!("unknown command kind {}", cmd.kind).into());
        };
        Ok(match payload {
            P::HostReport(_) => {
                let environments = rt.list_envs().await;
                let failed = environments
                    .iter()
                    .filter_map(|e| rt.recorded_failure(e).map(|r| (e.clone(), r)))
                    .collect();
                R::HostReport(v1::HostReportResult {
                    capabilities: Some(
                        self.with_data_url(wire_capabilities(rt.capabilities().await)),
                    ),
                    environments,
                    load_avg: load_avg(),
                    failed,
                })
            }
            P::EnvCreate(p) => {
                let mut spec = denv_compose::wire::spec_from_wire(
                    &p.services,
                    &p.volumes,
                    &p.egress,
                    &p.agent_service,
                    p.disk_mb,
                );
                // A create starts on the real clock whatever the spec says.
                spec.clock = denv_compose::wire::clock_from_wire(&p.clock);
                rt.set_expiry(env, &p.expires_at).map_err(e)?;
                let verifier_image_id = if p.verifier_image.is_empty() {
                    String::new()
                } else {
                    rt.resolve_verifier_image(&p.verifier_image)
                        .await
                        .map_err(e)?
                };
                let r = rt.create(env, &spec, progress).await.map_err(e)?;
                R::EnvCreate(v1::EnvCreateResult {
                    verifier_image_id,
                    endpoints: r.endpoints.into_iter().collect(),
                    started_in_ms: r.started_in,
                    digests: r.digests.into_iter().collect(),
                    image_ids: r.image_ids.into_iter().collect(),
                    storage: r.storage,
                    egress: r.egress,
                    egress_probe: Some(wire_probe(r.egress_probe)),
                })
            }
            P::EnvSnapshot(p) => {
                let r = rt
                    .snapshot(env, &p.name, &p.keep_paused, progress)
                    .await
                    .map_err(e)?;
                R::EnvSnapshot(v1::SnapshotResult {
                    snapshot: r.snapshot,
                    datasets: r.datasets,
                    frozen_for_ms: r.frozen_for,
                    consistent: r.consistent,
                    world_instant_ms: r.world_instant_ms,
                    clock_offset_ms: r.clock_offset_ms,
                })
            }
            P::EnvFork(p) => {
                let mut spec = denv_compose::wire::spec_from_wire(
                    &p.services,
                    &p.volumes,
                    &p.egress,
                    &p.agent_service,
                    p.disk_mb,
                );
                spec.clock = denv_compose::wire::clock_from_wire(&p.clock);
                spec.world_instant_ms = p.world_instant_ms;
                rt.set_expiry(env, &p.expires_at).map_err(e)?;
                let r = rt
                    .fork_digested(
                        env,
                        &p.from_env,
                        &p.from_snapshot,
                        &spec,
                        p.digest_volumes,
                        progress,
                    )
                    .await
                    .map_err(e)?;
                R::EnvFork(v1::ForkResult {
                    forked_in_ms: r.forked_in,
                    endpoints: r.endpoints.into_iter().collect(),
                    egress: r.egress,
                    egress_probe: Some(wire_probe(r.egress_probe)),
                    datasets: r
                        .datasets
                        .into_iter()
                        .map(|(v, d)| {
                            (
                                v,
                                v1::DatasetDigest {
                                    digest: d.digest,
                                    files: d.files,
                                    bytes: d.bytes,
                                },
                            )
                        })
                        .collect(),
                    clock_offset_ms: r.clock_offset_ms,
                    clock_real_services: r.clock_real_services.into_iter().collect(),
                })
            }
            P::EnvRollback(p) => {
                let r = rt.rollback(env, &p.snapshot, progress).await.map_err(e)?;
                R::EnvRollback(v1::RollbackResult {
                    snapshot: r.snapshot,
                    endpoints: r.endpoints.into_iter().collect(),
                    clock_offset_ms: r.clock_offset_ms,
                    clock_real_services: r.clock_real_services.into_iter().collect(),
                })
            }
            P::EnvExec(p) => {
                let secs = if p.timeout_sec == 0 {
                    contract::EXEC_TIMEOUT_SEC
                } else {
                    p.timeout_sec
                };
                let mut opts = crate::runtime::ExecOptions {
                    user: Some(p.user.clone()).filter(|u| !u.is_empty()),
                    workdir: Some(p.workdir.clone()).filter(|w| !w.is_empty()),
                    env: p.env_vars.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                    stdin: Some(p.stdin.clone()).filter(|b| !b.is_empty()),
                    output: None,
                };
                // Streamed output: each piece goes up as a Progress frame, in order,
                // before the result (the forwarder is drained before returning).
                let mut forward = None;
                if p.stream {
                    if let Ok((up, id)) = EXEC_OUT.try_with(|x| x.clone()) {
                        let (tx, mut rx) = mpsc::channel::<(bool, Vec<u8>)>(64);
                        opts.output = Some(tx);
                        forward = Some(tokio::spawn(async move {
                            while let Some((is_err, bytes)) = rx.recv().await {
                                let (stdout, stderr) = if is_err {
                                    (Vec::new(), bytes)
                                } else {
                                    (bytes, Vec::new())
                                };
                                let _ = up
                                    .send(frame(sidecar_frame::Frame::Progress(v1::Progress {
                                        command_id: id.clone(),
                                        message: String::new(),
                                        stdout,
                                        stderr,
                                    })))
                                    .await;
                            }
                        }));
                    }
                }
                let r = rt
                    .exec_with(
                        env,
                        &p.service,
                        &p.cmd,
                        opts,
                        Duration::from_secs(u64::from(secs)),
                    )
                    .await;
                if let Some(f) = forward {
                    let _ = f.await;
                }
                let r = r.map_err(e)?;
                R::EnvExec(v1::ExecOutput {
                    exit_code: clamp_i32(r.exit_code),
                    stdout: r.stdout,
                    stderr: r.stderr,
                    stdout_truncated: r.stdout_truncated,
                    stderr_truncated: r.stderr_truncated,
                    timed_out: r.timed_out,
                })
            }
            P::EnvLogs(p) => {
                let Ok((up, id)) = EXEC_OUT.try_with(|x| x.clone()) else {
                    return Err("env.logs: no stream to send the lines on".into());
                };
                let (tx, mut rx) = mpsc::channel::<(bool, Vec<u8>)>(64);
                let fwd_id = id.clone();
                let forward = tokio::spawn(async move {
                    while let Some((is_err, bytes)) = rx.recv().await {
                        let (stdout, stderr) = if is_err {
                            (Vec::new(), bytes)
                        } else {
                            (bytes, Vec::new())
                        };
                        let f = frame(sidecar_frame::Frame::Progress(v1::Progress {
                            command_id: fwd_id.clone(),
                            message: String::new(),
                            stdout,
                            stderr,
                        }));
                        if up.send(f).await.is_err() {
                            // The session is gone: closing `rx` ends the read.
                            return;
                        }
                    }
                });
                let opts = crate::runtime::LogsOptions {
                    tail: p.tail,
                    follow: p.follow,
                    follow_for: Duration::from_secs(u64::from(p.follow_sec)),
                    timestamps: p.timestamps,
                    max_bytes: p.max_bytes,
                };
                let r = rt.logs(env, &p.service, opts, tx, cancel_signal(&id)).await;
                forget_cancel(&id);
                let _ = forward.await;
                let r = r.map_err(e)?;
                R::EnvLogs(v1::LogsResult {
                    lines: r.lines,
                    bytes: r.bytes,
                    truncated: r.truncated,
                })
            }
            P::CommandCancel(c) => {
                cancel_signal(&c.command_id).notify_one();
                return Err(CommandError::invalid(
                    "command.cancel is not a command to run",
                ));
            }
            P::EnvPut(p) => {
                let r = rt
                    .put(env, &p.service, &p.path, p.tar.clone())
                    .await
                    .map_err(e)?;
                R::EnvPut(v1::PutResult { path: r.path })
            }
            P::EnvGet(p) => {
                let tar = rt.get(env, &p.service, &p.path).await.map_err(e)?;
                R::EnvGet(v1::GetResult { tar })
            }
            P::VerifyCollect(p) => {
                let r = rt
                    .verify_collect(
                        env,
                        &p.id,
                        &p.agent_service,
                        &p.collect,
                        p.resume_if_refused,
                        progress,
                    )
                    .await
                    .map_err(e)?;
                R::VerifyCollect(v1::CollectResult {
                    files: u32::try_from(r.files).unwrap_or(u32::MAX),
                    bytes: r.bytes,
                    missing: r.missing,
                    refused: r.refused,
                })
            }
            P::VerifyRun(p) => {
                let Some(spec) = &p.verifier else {
                    return Err(CommandError::invalid(
                        "verify.run: the payload has no verifier",
                    ));
                };
                let verifier = denv_compose::Verifier::from(spec);
                let r = rt
                    .verify_run(env, &p.id, &verifier, p.refused, progress)
                    .await
                    .map_err(e)?;
                R::VerifyRun(v1::RunResult {
                    reward: r.reward,
                    exit_code: clamp_i32(r.exit_code),
                    stdout: r.stdout,
                    stderr: r.stderr,
                    source: r.source,
                    ran_for_ms: r.ran_for,
                })
            }
            P::ImageBuild(p) => {
                let req = crate::runtime::BuildRequest {
                    service: p.service.clone(),
                    tag: p.tag.clone(),
                    context: p.context.clone(),
                    context_digest: p.context_digest.clone(),
                    dockerfile: p.dockerfile.clone(),
                    args: p.args.clone().into_iter().collect(),
                    target: p.target.clone(),
                    scope: p.scope.clone(),
                };
                let r = rt.build_image(&req, progress).await.map_err(e)?;
                R::ImageBuild(v1::BuildResult {
                    tag: r.tag,
                    image_id: r.image_id,
                    cached: r.cached,
                    took_ms: r.took_ms,
                    log_tail: r.log_tail,
                })
            }
            P::SnapshotSend(p) => {
                let url = self.data_port()?.offer(
                    crate::dataport::Goods::Snapshot {
                        env: env.to_string(),
                        snap: p.snapshot.clone(),
                        vols: p.volumes.clone(),
                    },
                    &p.token_sha256,
                );
                // Refused at once when there is nothing to send.
                rt.check_snapshot(env, &p.snapshot, &p.volumes).map_err(e)?;
                R::SnapshotSend(v1::SnapshotSendResult {
                    url: url.map_err(e)?,
                })
            }
            P::SnapshotReceive(p) => {
                let r = rt
                    .ship_receive(
                        &self.client,
                        env,
                        &p.snapshot,
                        &p.volumes,
                        &p.url,
                        &p.token,
                        p.max_bytes,
                    )
                    .await
                    .map_err(e)?;
                R::SnapshotReceive(v1::SnapshotReceiveResult {
                    bytes: r.bytes,
                    took_ms: r.took_ms,
                    cached: r.cached,
                    sha256: r.sha256,
                })
            }
            P::ImageSend(p) => {
                let port = self.data_port()?;
                let missing = rt.missing_images(&p.image_ids).await.map_err(e)?;
                if !missing.is_empty() {
                    return Err(CommandError::new(
                        v1::HostErrorCode::NotFound,
                        format!(
                            "image.send: images {} are not on this host",
                            missing.join(", ")
                        ),
                    ));
                }
                let url = port
                    .offer(
                        crate::dataport::Goods::Images(p.image_ids.clone()),
                        &p.token_sha256,
                    )
                    .map_err(e)?;
                R::ImageSend(v1::ImageSendResult { url })
            }
            P::ImageReceive(p) => {
                let r = rt
                    .receive_images(&self.client, &p.image_ids, &p.url, &p.token)
                    .await
                    .map_err(e)?;
                R::ImageReceive(v1::ImageReceiveResult {
                    loaded: r.loaded,
                    bytes: r.bytes,
                    took_ms: r.took_ms,
                })
            }
            P::EnvDestroy(_) => {
                let r = rt.destroy(env).await.map_err(e)?;
                R::EnvDestroy(v1::DestroyResult {
                    destroyed: r.destroyed,
                })
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_avg_is_the_first_field_of_proc_loadavg() {
        // The load may move between the two reads: retry a few times.
        let ok = (0..5).any(|_| {
            let file: f64 = std::fs::read_to_string("/proc/loadavg")
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap();
            load_avg() == file
        });
        assert!(ok, "{} vs /proc/loadavg", load_avg());
    }

    #[test]
    fn reconnect_delays_grow_with_jitter_within_the_bounds() {
        let s = Duration::from_secs;
        let (min, max) = (contract::RECONNECT_MIN, contract::RECONNECT_MAX);
        let d: Vec<Duration> = reconnect_delays(min, max).take(40).collect();
        assert_eq!(d.len(), 40, "endless");
        // b = 1, 2, 4, 8, then 15 (max / 2) for good; each delay in [b, 2b).
        for (i, b) in [1, 2, 4, 8, 15, 15, 15].into_iter().enumerate() {
            assert!(d[i] >= s(b) && d[i] < s(2 * b), "delay {i}: {:?}", d[i]);
        }
        assert!(d.iter().all(|x| *x >= s(1) && *x <= s(30)), "{d:?}");
        // Jittered: the delays at the cap are not all the same, nor are first delays.
        assert!(d[10..].iter().any(|x| *x != d[10]), "{d:?}");
        let firsts: std::collections::BTreeSet<Duration> = (0..20)
            .map(|_| reconnect_delays(min, max).next().unwrap())
            .collect();
        assert!(firsts.len() > 1, "{firsts:?}");
        // Tight bounds (tests use them) stay within bounds.
        let ms = Duration::from_millis;
        assert!(reconnect_delays(ms(50), ms(100))
            .take(10)
            .all(|x| x >= ms(50) && x <= ms(100)));
        assert!(reconnect_delays(ms(50), ms(50))
            .take(5)
            .all(|x| x == ms(50)));
    }

    #[test]
    fn the_welcomes_version_is_accepted_only_within_the_spoken_range() {
        // This build: the chosen version back, and an older control plane's 0 is 1.
        assert_eq!(
            accept_protocol(PROTOCOL, PROTOCOL_MIN, PROTOCOL).unwrap(),
            1
        );
        assert_eq!(accept_protocol(0, PROTOCOL_MIN, PROTOCOL).unwrap(), 1);
        // A wider range: any version in it, both ends included.
        assert_eq!(accept_protocol(2, 2, 4).unwrap(), 2);
        assert_eq!(accept_protocol(4, 2, 4).unwrap(), 4);
        // Outside it: the error names the choice and the range.
        let e = accept_protocol(7, 1, 3).unwrap_err();
        assert!(matches!(
            e,
            StreamError::Protocol {
                chosen: 7,
                min: 1,
                max: 3
            }
        ));
        assert_eq!(
            e.to_string(),
            "the control plane chose protocol 7, which this denvd does not speak (it speaks 1 to 3); upgrade denvd or the control plane"
        );
        let e = accept_protocol(0, 2, 3).unwrap_err();
        assert!(matches!(e, StreamError::Protocol { chosen: 1, .. }));
    }
}
