//! An in-test sidecar: speaks the real host stream (`HostStream.Open`, h2c) over the
//! network to a control plane (a real `denv-cp` binary or a tonic server in-test) and
//! answers every command kind with plausible results, without Docker.
//!
//! ```text
//! let sc = FakeSidecar::join(&server_url, &join_token, FakeOptions::default()).await?;
//! // ... the control plane now sees sc.host_id() connected ...
//! sc.disconnect().await;                                  // stream drops
//! let sc = FakeSidecar::reconnect(&server_url, &sc.identity(), FakeOptions::default()).await?;
//! ```
//!
//! Behaviour, like the real sidecar: `ack` on receipt, two `progress` lines, one
//! `result`; a command id answered before is answered again from an in-memory journal
//! without "executing" (see [`FakeSidecar::executions`]); heartbeats every
//! [`FakeOptions::heartbeat`], carrying [`FakeOptions::load`] when set (then one right
//! after the welcome too, as denvd; [`FakeSidecar::report_load`] changes it). Configurable: per-kind failures
//! ([`FakeOptions::fail`], [`FakeSidecar::set_failing_with`] for a `HostErrorCode`:
//! the fake sets the codes denvd sets), holding results back ([`FakeSidecar::set_answering`]), a
//! delay per command, the verifier's reward, a custom `env.exec` answer.

use denv_proto::v1::{
    self, command, command_result, control_frame, host_event, host_stream_client::HostStreamClient,
    sidecar_frame, Command, CommandResult, ControlFrame, HostErrorCode, SidecarFrame,
};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};
use tokio_stream::wrappers::ReceiverStream;

/// A custom `env.exec` answer.
pub type ExecFn = Arc<dyn Fn(&v1::EnvExec) -> v1::ExecOutput + Send + Sync>;

/// How the fake behaves.
#[derive(Clone)]
pub struct FakeOptions {
    /// Reported hostname (and the host's name on first join).
    pub hostname: String,
    /// Heartbeat period (the real sidecar: 10 s).
    pub heartbeat: Duration,
    /// Kind → error: commands of that kind answer `ok: false` with the error (code
    /// `FAILED`).
    pub fail: HashMap<String, String>,
    /// Sleep before answering each command.
    pub delay: Duration,
    /// Reward `verify.run` reports (not refused).
    pub reward: f64,
    /// Custom `env.exec` answer (default: exit 0, stdout = the argv joined by spaces + "\n").
    pub exec: Option<ExecFn>,
    /// Storage reported in capabilities and results.
    pub storage: String,
    /// `hello.protocol`: the newest protocol version claimed (default: this build's).
    pub protocol: u32,
    /// `hello.min_protocol`: the oldest (default: this build's; 0 plays a sidecar older
    /// than the negotiation).
    pub min_protocol: u32,
    /// The `load` every heartbeat carries (default none: a sidecar older than the load
    /// report, which placement knows nothing of).
    pub load: Option<v1::HostLoad>,
}

impl Default for FakeOptions {
    fn default() -> Self {
        FakeOptions {
            hostname: "fake-sidecar".into(),
            heartbeat: denv_proto::contract::HEARTBEAT_INTERVAL,
            fail: HashMap::new(),
            delay: Duration::ZERO,
            reward: 1.0,
            exec: None,
            storage: "dir".into(),
            protocol: denv_proto::contract::PROTOCOL,
            min_protocol: denv_proto::contract::PROTOCOL_MIN,
            load: None,
        }
    }
}

impl FakeOptions {
    /// Fails every command of `kind` with `error`.
    pub fn failing(mut self, kind: &str, error: &str) -> Self {
        self.fail.insert(kind.into(), error.into());
        self
    }
}

/// The saved identity of a fake host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `host_…`.
    pub host_id: String,
    /// `dhs_…`.
    pub secret: String,
}

#[derive(Default)]
struct EnvState {
    services: Vec<v1::ServiceSpec>,
    volumes: Vec<String>,
    egress: String,
    snapshots: Vec<String>,
    files: HashMap<(String, String), Vec<u8>>,
}

#[derive(Default)]
struct Shared {
    received: Vec<Command>,
    executions: Vec<String>,
    journal: HashMap<String, CommandResult>,
    envs: BTreeMap<String, EnvState>,
    /// Runtime per-kind failures (see [`FakeSidecar::set_failing_with`]).
    fail_now: HashMap<String, Failure>,
    /// What `verify.collect` reports as refused (see [`FakeSidecar::set_collect_refused`]).
    refuse: Vec<String>,
    /// The load heartbeats carry ([`FakeOptions::load`], [`FakeSidecar::report_load`]).
    load: Option<v1::HostLoad>,
}

/// A connected fake sidecar. Dropping it (or [`FakeSidecar::disconnect`]) ends the stream.
pub struct FakeSidecar {
    identity: Identity,
    opts: FakeOptions,
    shared: Arc<Mutex<Shared>>,
    answering: Arc<AtomicBool>,
    answered: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
    closed: Arc<AtomicBool>,
    out: mpsc::Sender<SidecarFrame>,
    protocol: u32,
}

impl Drop for FakeSidecar {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The world instant every snapshot of a fake reports (2023-11-14T22:13:20Z), ms.
pub const FAKE_WORLD_INSTANT_MS: i64 = 1_700_000_000_000;

/// The capabilities a fake reports.
pub fn fake_capabilities(opts: &FakeOptions) -> v1::Capabilities {
    v1::Capabilities {
        hostname: opts.hostname.clone(),
        os: "linux".into(),
        arch: "amd64".into(),
        cpus: 2,
        memory_mb: 24_000,
        disk_gb: 100,
        storage: opts.storage.clone(),
        docker: "20.10.24".into(),
        compose: false,
        netns: true,
        public_ip: String::new(),
        denvd_version: "fake".into(),
        packet_filter: "nftables v1.0.6".into(),
        ..Default::default()
    }
}

fn frame(f: sidecar_frame::Frame) -> SidecarFrame {
    SidecarFrame {
        sent_at: chrono::Utc::now().to_rfc3339(),
        frame: Some(f),
    }
}

impl FakeSidecar {
    /// First join with a `djt_` token. `Err` is the control plane's status (a refusal is
    /// `PERMISSION_DENIED` with the reason).
    pub async fn join(
        server: &str,
        token: &str,
        opts: FakeOptions,
    ) -> Result<FakeSidecar, tonic::Status> {
        Self::open(server, "", token, opts, Arc::default()).await
    }

    /// Reconnects with a saved identity (a fresh journal).
    pub async fn reconnect(
        server: &str,
        id: &Identity,
        opts: FakeOptions,
    ) -> Result<FakeSidecar, tonic::Status> {
        Self::open(server, &id.host_id, &id.secret, opts, Arc::default()).await
    }

    /// Reconnects keeping this fake's journal and environments (a sidecar whose stream
    /// dropped but whose process lived on). Consumes the old connection.
    pub async fn reconnect_same(self, server: &str) -> Result<FakeSidecar, tonic::Status> {
        self.disconnect().await.reconnect(server).await
    }

    async fn open(
        server: &str,
        host_id: &str,
        token: &str,
        opts: FakeOptions,
        shared: Arc<Mutex<Shared>>,
    ) -> Result<FakeSidecar, tonic::Status> {
        let channel = tonic::transport::Endpoint::from_shared(server.to_string())
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?
            .connect()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("connect {server}: {e}")))?;
        let mut client = HostStreamClient::new(channel)
            .max_decoding_message_size(denv_proto::contract::HOST_FRAME_MAX_BYTES)
            .max_encoding_message_size(denv_proto::contract::HOST_FRAME_MAX_BYTES);
        let (tx, rx) = mpsc::channel::<SidecarFrame>(256);
        tx.send(frame(sidecar_frame::Frame::Hello(v1::Hello {
            host_id: host_id.into(),
            token: token.into(),
            capabilities: Some(fake_capabilities(&opts)),
            protocol: opts.protocol,
            min_protocol: opts.min_protocol,
        })))
        .await
        .ok();
        let mut inbound = client.open(ReceiverStream::new(rx)).await?.into_inner();
        let welcome = match inbound.message().await? {
            Some(ControlFrame {
                frame: Some(control_frame::Frame::Welcome(w)),
                ..
            }) => w,
            other => {
                return Err(tonic::Status::internal(format!(
                    "expected welcome, got {other:?}"
                )))
            }
        };
        let identity = Identity {
            host_id: welcome.host_id.clone(),
            secret: if welcome.secret.is_empty() {
                token.to_string()
            } else {
                welcome.secret.clone()
            },
        };
        {
            let mut sh = shared.lock().unwrap();
            if sh.load.is_none() {
                sh.load = opts.load;
            }
        }
        let answering = Arc::new(AtomicBool::new(true));
        let answered = Arc::new(Notify::new());
        let closed = Arc::new(AtomicBool::new(false));
        let out = tx.clone();
        let task = tokio::spawn(run(
            inbound,
            tx,
            opts.clone(),
            shared.clone(),
            answering.clone(),
            answered.clone(),
            closed.clone(),
        ));
        Ok(FakeSidecar {
            identity,
            opts,
            shared,
            answering,
            answered,
            task,
            closed,
            out,
            protocol: welcome.protocol,
        })
    }

    /// Sends an unsolicited `event` frame.
    pub async fn send_event(&self, event: host_event::Event) {
        let ev = v1::HostEvent { event: Some(event) };
        self.out
            .send(frame(sidecar_frame::Frame::Event(ev)))
            .await
            .expect("stream open");
    }

    /// Sends a heartbeat carrying `load` now, and keeps it for the following ones.
    pub async fn report_load(&self, load: v1::HostLoad) {
        self.shared.lock().unwrap().load = Some(load);
        self.out
            .send(frame(sidecar_frame::Frame::Heartbeat(v1::Heartbeat {
                load: Some(load),
            })))
            .await
            .expect("stream open");
    }

    /// The protocol version the control plane chose in `welcome`.
    pub fn protocol(&self) -> u32 {
        self.protocol
    }

    /// The host id the control plane assigned.
    pub fn host_id(&self) -> &str {
        &self.identity.host_id
    }

    /// Host id and secret, for [`FakeSidecar::reconnect`].
    pub fn identity(&self) -> Identity {
        self.identity.clone()
    }

    /// Every command frame received, in order (repeats included).
    pub fn received(&self) -> Vec<Command> {
        self.shared.lock().unwrap().received.clone()
    }

    /// Command ids actually "executed" (a repeat answered from the journal is not).
    pub fn executions(&self) -> Vec<String> {
        self.shared.lock().unwrap().executions.clone()
    }

    /// Environment ids currently "running" on this fake.
    pub fn environments(&self) -> Vec<String> {
        self.shared.lock().unwrap().envs.keys().cloned().collect()
    }

    /// Whether results are sent (false: commands are acked and held, unanswered).
    pub fn set_answering(&self, on: bool) {
        self.answering.store(on, Ordering::SeqCst);
    }

    /// From now on, fails every command of `kind` with `error`, code `FAILED` (`None`
    /// clears it).
    pub fn set_failing(&self, kind: &str, error: Option<&str>) {
        match error {
            Some(e) => self.set_failing_with(kind, HostErrorCode::Failed, e),
            None => {
                self.shared.lock().unwrap().fail_now.remove(kind);
            }
        }
    }

    /// From now on, fails every command of `kind` with `error` and `code` (cleared by
    /// [`FakeSidecar::set_failing`]`(kind, None)`).
    pub fn set_failing_with(&self, kind: &str, code: HostErrorCode, error: &str) {
        self.shared
            .lock()
            .unwrap()
            .fail_now
            .insert(kind.into(), (code, error.into()));
    }

    /// From now on, `verify.collect` reports these refusals (`"path: symlink"`, ...).
    pub fn set_collect_refused(&self, refused: Vec<String>) {
        self.shared.lock().unwrap().refuse = refused;
    }

    /// Whether the control plane ended the stream.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Waits until a command frame arrives or `timeout` passes; returns the count of
    /// commands received.
    pub async fn wait_received(&self, at_least: usize, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let n = self.shared.lock().unwrap().received.len();
            if n >= at_least || tokio::time::Instant::now() >= deadline {
                return n;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), self.answered.notified()).await;
        }
    }

    /// Ends the stream (as a partitioned sidecar would). The returned [`Parked`] keeps
    /// the journal and environments, so [`Parked::reconnect`] is the same sidecar
    /// process coming back.
    pub async fn disconnect(self) -> Parked {
        self.task.abort();
        tokio::time::sleep(Duration::from_millis(50)).await;
        Parked {
            identity: self.identity.clone(),
            opts: self.opts.clone(),
            shared: self.shared.clone(),
        }
    }
}

/// A disconnected fake sidecar that remembers its journal and environments.
pub struct Parked {
    identity: Identity,
    opts: FakeOptions,
    shared: Arc<Mutex<Shared>>,
}

impl Parked {
    /// The identity it will present.
    pub fn identity(&self) -> Identity {
        self.identity.clone()
    }

    /// Connects again with the saved identity.
    pub async fn reconnect(self, server: &str) -> Result<FakeSidecar, tonic::Status> {
        FakeSidecar::open(
            server,
            &self.identity.host_id,
            &self.identity.secret,
            self.opts,
            self.shared,
        )
        .await
    }
}

async fn run(
    mut inbound: tonic::Streaming<ControlFrame>,
    tx: mpsc::Sender<SidecarFrame>,
    opts: FakeOptions,
    shared: Arc<Mutex<Shared>>,
    answering: Arc<AtomicBool>,
    answered: Arc<Notify>,
    closed: Arc<AtomicBool>,
) {
    let mut tick = tokio::time::interval(opts.heartbeat);
    if shared.lock().unwrap().load.is_none() {
        // Without a load, the first heartbeat waits a period (as before the report).
        tick.tick().await;
    }
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let load = shared.lock().unwrap().load;
                if tx.send(frame(sidecar_frame::Frame::Heartbeat(v1::Heartbeat { load }))).await.is_err() {
                    break;
                }
            }
            m = inbound.message() => match m {
                Ok(Some(ControlFrame { frame: Some(control_frame::Frame::Command(cmd)), .. })) => {
                    shared.lock().unwrap().received.push(cmd.clone());
                    answered.notify_waiters();
                    if matches!(cmd.payload, Some(command::Payload::CommandCancel(_))) {
                        // Not acked, not answered (as denvd).
                        continue;
                    }
                    if let Some(command::Payload::EnvLogs(l)) = &cmd.payload {
                        let (tx, shared, answering, l, cmd) = (tx.clone(), shared.clone(), answering.clone(), l.clone(), cmd.clone());
                        tokio::spawn(async move {
                            if !answering.load(Ordering::SeqCst) {
                                return;
                            }
                            fake_logs(&cmd, &l, &tx, &shared).await;
                        });
                        continue;
                    }
                    let _ = tx.send(frame(sidecar_frame::Frame::Ack(v1::Ack { command_id: cmd.command_id.clone() }))).await;
                    let (tx, opts, shared, answering) = (tx.clone(), opts.clone(), shared.clone(), answering.clone());
                    tokio::spawn(async move {
                        if !answering.load(Ordering::SeqCst) {
                            return;
                        }
                        for line in [format!("{} started", cmd.kind), format!("{} finishing", cmd.kind)] {
                            let _ = tx.send(frame(sidecar_frame::Frame::Progress(v1::Progress {
                                command_id: cmd.command_id.clone(), message: line, ..Default::default()
                            }))).await;
                        }
                        if !opts.delay.is_zero() {
                            tokio::time::sleep(opts.delay).await;
                        }
                        let res = answer(&cmd, &opts, &shared);
                        let _ = tx.send(frame(sidecar_frame::Frame::Result(res))).await;
                    });
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
    }
    closed.store(true, Ordering::SeqCst);
}

/// `env.logs` as the fake plays it: per service, `<service> line <n>` for n in 1..=tail
/// (at most 3) on stdout, where `box`'s last line carries a newline and a forged
/// `web | …` line in the same frame, and `<service> oops` on stderr split across two
/// frames. With `follow`, one `<service> live` line, then it waits (30 s at most) for a
/// `command.cancel` naming it before answering.
async fn fake_logs(
    cmd: &Command,
    l: &v1::EnvLogs,
    tx: &mpsc::Sender<SidecarFrame>,
    shared: &Mutex<Shared>,
) {
    let out = |stdout: Vec<u8>, stderr: Vec<u8>| {
        frame(sidecar_frame::Frame::Progress(v1::Progress {
            command_id: cmd.command_id.clone(),
            message: String::new(),
            stdout,
            stderr,
        }))
    };
    let svc = &l.service;
    let mut lines = 0;
    for n in 1..=l.tail.min(3) {
        let mut line = format!("{svc} line {n}\n");
        if svc == "box" && n == l.tail.min(3) {
            line = format!("{svc} line {n}\nweb | forged by {svc}\n");
        }
        let _ = tx.send(out(line.into_bytes(), vec![])).await;
        lines += 1;
    }
    if l.tail > 0 {
        let _ = tx.send(out(vec![], format!("{svc} oo").into_bytes())).await;
        let _ = tx.send(out(vec![], b"ps\n".to_vec())).await;
    }
    if l.follow {
        let _ = tx
            .send(out(format!("{svc} live\n").into_bytes(), vec![]))
            .await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::time::Instant::now() < deadline {
            let cancelled = shared.lock().unwrap().received.iter().any(|c| {
                matches!(&c.payload, Some(command::Payload::CommandCancel(x)) if x.command_id == cmd.command_id)
            });
            if cancelled {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let res = CommandResult {
        command_id: cmd.command_id.clone(),
        ok: true,
        payload: Some(command_result::Payload::EnvLogs(v1::LogsResult {
            lines,
            bytes: 0,
            truncated: false,
        })),
        ..Default::default()
    };
    let _ = tx.send(frame(sidecar_frame::Frame::Result(res))).await;
}

fn sha(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// Published ports, under either egress (as the real sidecar does).
fn endpoints(services: &[v1::ServiceSpec], _egress: &str) -> HashMap<String, String> {
    services
        .iter()
        .filter_map(|s| {
            s.ports
                .first()
                .map(|p| (s.name.clone(), format!("127.0.0.1:{}", 30000 + (p % 20000))))
        })
        .collect()
}

/// A probe like the real one's, in shape.
fn probe(egress: &str) -> Option<v1::EgressProbe> {
    let stopped = "rejected (no route to host)".to_string();
    let canary = if egress == "allow" {
        "connected".to_string()
    } else {
        stopped.clone()
    };
    let mut attempts = vec![
        v1::EgressAttempt {
            target: "canary".into(),
            addr: "198.19.255.254:40000".into(),
            result: canary,
            took_us: 60,
        },
        v1::EgressAttempt {
            target: "host eth0".into(),
            addr: "192.0.2.2:80".into(),
            result: stopped.clone(),
            took_us: 40,
        },
    ];
    if egress != "allow" {
        attempts.push(v1::EgressAttempt {
            target: "public".into(),
            addr: "1.1.1.1:80".into(),
            result: stopped,
            took_us: 40,
        });
    }
    Some(v1::EgressProbe {
        took_us: 900,
        from: "box (pid 4242, 172.18.0.2)".into(),
        attempts,
    })
}

fn egress_word(egress: &str) -> String {
    if egress == "allow" {
        "allowed"
    } else {
        "denied (verified)"
    }
    .into()
}

/// The journalled answer to a command.
fn answer(cmd: &Command, opts: &FakeOptions, shared: &Mutex<Shared>) -> CommandResult {
    let mut sh = shared.lock().unwrap();
    if let Some(r) = sh.journal.get(&cmd.command_id) {
        return r.clone();
    }
    sh.executions.push(cmd.command_id.clone());
    let res = match execute(cmd, opts, &mut sh) {
        Ok(p) => CommandResult {
            command_id: cmd.command_id.clone(),
            ok: true,
            payload: Some(p),
            ..Default::default()
        },
        Err((code, error)) => CommandResult {
            command_id: cmd.command_id.clone(),
            ok: false,
            error,
            code: code.into(),
            payload: None,
        },
    };
    sh.journal.insert(cmd.command_id.clone(), res.clone());
    res
}

/// Why a command failed: the result's code and error.
type Failure = (HostErrorCode, String);

fn failed(msg: impl Into<String>) -> Failure {
    (HostErrorCode::Failed, msg.into())
}

/// A command's answer, with the codes denvd sets: what the command names and the fake
/// does not hold is `NOT_FOUND`, a missing path the host's `FAILED`.
fn execute(
    cmd: &Command,
    opts: &FakeOptions,
    sh: &mut Shared,
) -> Result<command_result::Payload, Failure> {
    use command::Payload as P;
    use command_result::Payload as R;
    if let Some(e) = opts.fail.get(&cmd.kind) {
        return Err(failed(e.clone()));
    }
    if let Some(f) = sh.fail_now.get(&cmd.kind) {
        return Err(f.clone());
    }
    let env = cmd.env_id.clone();
    let Some(p) = &cmd.payload else {
        return Err(failed(format!("unknown command kind {}", cmd.kind)));
    };
    let missing = |env: &str| {
        (
            HostErrorCode::NotFound,
            format!("environment {env} not found"),
        )
    };
    Ok(match p {
        P::HostReport(_) => R::HostReport(v1::HostReportResult {
            capabilities: Some(fake_capabilities(opts)),
            environments: sh.envs.keys().cloned().collect(),
            load_avg: 0.1,
            failed: Default::default(),
        }),
        P::EnvCreate(c) => {
            let st = sh.envs.entry(env.clone()).or_default();
            st.services = c.services.clone();
            st.volumes = c.volumes.clone();
            st.egress = c.egress.clone();
            R::EnvCreate(v1::EnvCreateResult {
                endpoints: endpoints(&c.services, &c.egress),
                started_in_ms: 1200,
                digests: c
                    .services
                    .iter()
                    .map(|s| {
                        (
                            s.name.clone(),
                            format!("{}@sha256:{}", s.image, sha(&s.image)),
                        )
                    })
                    .collect(),
                verifier_image_id: if c.verifier_image.is_empty() {
                    String::new()
                } else {
                    format!("sha256:{}", sha(&format!("id:{}", c.verifier_image)))
                },
                image_ids: c
                    .services
                    .iter()
                    .map(|s| (s.name.clone(), format!("sha256:{}", sha(&s.image))))
                    .collect(),
                storage: opts.storage.clone(),
                egress: egress_word(&c.egress),
                egress_probe: probe(&c.egress),
            })
        }
        P::EnvSnapshot(s) => {
            let st = sh.envs.get_mut(&env).ok_or_else(|| missing(&env))?;
            st.snapshots.push(s.name.clone());
            R::EnvSnapshot(v1::SnapshotResult {
                snapshot: s.name.clone(),
                datasets: st
                    .volumes
                    .iter()
                    .map(|v| format!("{env}/vol/{v}@{}", s.name))
                    .collect(),
                frozen_for_ms: 150,
                consistent: true,
                world_instant_ms: FAKE_WORLD_INSTANT_MS,
                clock_offset_ms: 0,
            })
        }
        P::EnvFork(f) => {
            let src = sh
                .envs
                .get(&f.from_env)
                .ok_or_else(|| missing(&f.from_env))?;
            if !src.snapshots.contains(&f.from_snapshot) {
                return Err((
                    HostErrorCode::NotFound,
                    format!("snapshot {} of {} not found", f.from_snapshot, f.from_env),
                ));
            }
            sh.envs.insert(
                env.clone(),
                EnvState {
                    services: f.services.clone(),
                    volumes: f.volumes.clone(),
                    egress: f.egress.clone(),
                    ..Default::default()
                },
            );
            R::EnvFork(v1::ForkResult {
                forked_in_ms: 800,
                endpoints: endpoints(&f.services, &f.egress),
                egress: egress_word(&f.egress),
                egress_probe: probe(&f.egress),
                // Every fork of one snapshot reads it back alike.
                datasets: if f.digest_volumes {
                    f.volumes
                        .iter()
                        .map(|v| {
                            let digest = v1::DatasetDigest {
                                digest: format!("sha256:{}-{}-{v}", f.from_env, f.from_snapshot),
                                files: 1,
                                bytes: 1,
                            };
                            (v.clone(), digest)
                        })
                        .collect()
                } else {
                    Default::default()
                },
                clock_offset_ms: if f.clock == "frozen" && f.world_instant_ms != 0 {
                    f.world_instant_ms - chrono::Utc::now().timestamp_millis()
                } else {
                    0
                },
                clock_real_services: Default::default(),
            })
        }
        P::EnvRollback(r) => {
            let st = sh.envs.get(&env).ok_or_else(|| missing(&env))?;
            if !st.snapshots.contains(&r.snapshot) {
                return Err((
                    HostErrorCode::NotFound,
                    format!("snapshot {} of {env} not found", r.snapshot),
                ));
            }
            R::EnvRollback(v1::RollbackResult {
                snapshot: r.snapshot.clone(),
                endpoints: endpoints(&st.services, &st.egress),
                clock_offset_ms: 0,
                clock_real_services: Default::default(),
            })
        }
        P::EnvExec(x) => {
            if !sh.envs.contains_key(&env) {
                return Err(missing(&env));
            }
            R::EnvExec(match &opts.exec {
                Some(f) => f(x),
                None => v1::ExecOutput {
                    exit_code: 0,
                    stdout: format!("{}\n", x.cmd.join(" ")),
                    stderr: String::new(),
                    ..Default::default()
                },
            })
        }
        P::EnvPut(x) => {
            let st = sh.envs.get_mut(&env).ok_or_else(|| missing(&env))?;
            st.files
                .insert((x.service.clone(), x.path.clone()), x.tar.clone());
            R::EnvPut(v1::PutResult {
                path: x.path.clone(),
            })
        }
        P::EnvGet(x) => {
            let st = sh.envs.get(&env).ok_or_else(|| missing(&env))?;
            let tar = st
                .files
                .get(&(x.service.clone(), x.path.clone()))
                .cloned()
                .ok_or_else(|| {
                    failed(format!(
                        "{}: {}: no such file or directory",
                        x.service, x.path
                    ))
                })?;
            R::EnvGet(v1::GetResult { tar })
        }
        P::VerifyCollect(v) => {
            if !sh.envs.contains_key(&env) {
                return Err(missing(&env));
            }
            R::VerifyCollect(v1::CollectResult {
                files: v.collect.len() as u32,
                bytes: 42 * v.collect.len() as u64,
                missing: vec![],
                refused: sh.refuse.clone(),
            })
        }
        P::VerifyRun(v) => {
            if v.refused {
                R::VerifyRun(v1::RunResult {
                    reward: Some(0.0),
                    exit_code: 0,
                    stdout: String::new(),
                    stderr: String::new(),
                    source: "refused".into(),
                    ran_for_ms: 0,
                })
            } else {
                R::VerifyRun(v1::RunResult {
                    reward: Some(opts.reward),
                    exit_code: 0,
                    stdout: format!("reward: {}\n", opts.reward),
                    stderr: String::new(),
                    source: "reward.txt".into(),
                    ran_for_ms: 300,
                })
            }
        }
        P::EnvDestroy(_) => {
            sh.envs.remove(&env);
            R::EnvDestroy(v1::DestroyResult { destroyed: env })
        }
        // Played by `fake_logs`; the real read is tested against the engine
        // (crates/denvd/tests/runtime_logs.rs).
        P::EnvLogs(_) => R::EnvLogs(v1::LogsResult::default()),
        P::CommandCancel(_) => {
            return Err((
                HostErrorCode::Invalid,
                "command.cancel is not answered".into(),
            ))
        }
        // Shipping moves real bytes over HTTP: tested with real sidecars
        // (crates/denv-cp/tests/ship.rs).
        P::SnapshotSend(_) | P::SnapshotReceive(_) | P::ImageSend(_) | P::ImageReceive(_) => {
            return Err(failed("the fake sidecar does not ship snapshots or images"))
        }
        // The real build is tested against the engine (crates/denvd/tests/runtime_build.rs).
        P::ImageBuild(b) => R::ImageBuild(v1::BuildResult {
            tag: b.tag.clone(),
            image_id: "sha256:fakebuild".into(),
            cached: false,
            took_ms: 5,
            log_tail: vec![],
        }),
    })
}
