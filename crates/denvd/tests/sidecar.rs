//! The sidecar process without Docker: the journal (idempotency, per-environment
//! serialisation), the identity file and flag resolution, the `denvd` binary's verbs,
//! and the host stream against an in-test `HostStream` server on a local port.

use denv_proto::v1::{
    self, command, command_result, control_frame,
    host_stream_server::{HostStream, HostStreamServer},
    sidecar_frame, Command, ControlFrame, SidecarFrame,
};
use denvd::config::{self, State};
use denvd::journal::{CommandError, Executor, Journal, Outcome, Progress};
use denvd::stream::{self, StreamError, StreamOptions};
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Counts executions and the largest number running at once, per environment and in
/// total; each execution sleeps `delay` and echoes its argv.
#[derive(Default)]
struct Counting {
    delay: Duration,
    runs: AtomicUsize,
    running: Mutex<HashMap<String, usize>>,
    max_per_env: Mutex<HashMap<String, usize>>,
    total_running: AtomicUsize,
    max_total: AtomicUsize,
    /// What [`Executor::load`] answers.
    load: Option<v1::HostLoad>,
}

#[tonic::async_trait]
impl Executor for Counting {
    async fn capabilities(&self) -> v1::Capabilities {
        v1::Capabilities {
            hostname: "test-host".into(),
            storage: "dir".into(),
            ..Default::default()
        }
    }

    async fn load(&self) -> Option<v1::HostLoad> {
        self.load
    }

    async fn execute(
        &self,
        cmd: &Command,
        progress: &Progress,
    ) -> Result<command_result::Payload, CommandError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        {
            let mut r = self.running.lock().unwrap();
            let n = r.entry(cmd.env_id.clone()).or_default();
            *n += 1;
            let mut m = self.max_per_env.lock().unwrap();
            let mx = m.entry(cmd.env_id.clone()).or_default();
            *mx = (*mx).max(*n);
        }
        let t = self.total_running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_total.fetch_max(t, Ordering::SeqCst);
        let _ = progress.send(format!("running {}", cmd.command_id));
        tokio::time::sleep(self.delay).await;
        self.total_running.fetch_sub(1, Ordering::SeqCst);
        *self.running.lock().unwrap().get_mut(&cmd.env_id).unwrap() -= 1;
        match &cmd.payload {
            Some(command::Payload::EnvExec(x))
                if x.cmd.first().map(String::as_str) == Some("fail") =>
            {
                Err(CommandError::new(v1::HostErrorCode::NotFound, "exec: boom"))
            }
            Some(command::Payload::EnvExec(x)) => {
                Ok(command_result::Payload::EnvExec(v1::ExecOutput {
                    exit_code: 0,
                    stdout: x.cmd.join(" "),
                    stderr: String::new(),
                    ..Default::default()
                }))
            }
            Some(command::Payload::EnvSnapshot(x)) => {
                Ok(command_result::Payload::EnvSnapshot(v1::SnapshotResult {
                    snapshot: x.name.clone(),
                    ..Default::default()
                }))
            }
            _ => Err(format!("unknown command kind {}", cmd.kind).into()),
        }
    }
}

fn snapshot_cmd(id: &str, env: &str) -> Command {
    Command {
        command_id: id.into(),
        kind: "env.snapshot".into(),
        env_id: env.into(),
        payload: Some(command::Payload::EnvSnapshot(v1::EnvSnapshot {
            name: id.into(),
            ..Default::default()
        })),
    }
}

fn exec_cmd(id: &str, env: &str, argv: &[&str]) -> Command {
    Command {
        command_id: id.into(),
        kind: "env.exec".into(),
        env_id: env.into(),
        payload: Some(command::Payload::EnvExec(v1::EnvExec {
            service: "box".into(),
            cmd: argv.iter().map(|s| s.to_string()).collect(),
            timeout_sec: 0,
            ..Default::default()
        })),
    }
}

fn progress() -> Progress {
    mpsc::unbounded_channel().0
}

#[tokio::test]
async fn a_repeated_command_id_is_answered_from_the_journal_without_running_again() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::open(dir.path()).unwrap();
    let ex = Counting::default();
    let c = exec_cmd("cmd_01A", "env_1", &["echo", "hi"]);
    let first = j.run(&c, &ex, &progress()).await;
    assert!(matches!(first, Outcome::Ran(_)));
    let r = first.result();
    assert!(r.ok);
    assert_eq!(
        r.payload,
        Some(command_result::Payload::EnvExec(v1::ExecOutput {
            exit_code: 0,
            stdout: "echo hi".into(),
            stderr: String::new(),
            ..Default::default()
        }))
    );
    // Written to <data>/commands/<id>.json, mode 0600.
    let path = dir.path().join("commands/cmd_01A.json");
    let stored: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(stored["command_id"], "cmd_01A");
    assert_eq!(stored["env_exec"]["stdout"], "echo hi");
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let again = j.run(&c, &ex, &progress()).await;
    assert!(matches!(again, Outcome::Replayed(_)), "{again:?}");
    assert_eq!(again.result(), first.result());
    assert_eq!(ex.runs.load(Ordering::SeqCst), 1);

    // A new journal over the same directory (a restarted sidecar) still answers it.
    let j2 = Journal::open(dir.path()).unwrap();
    assert!(matches!(
        j2.run(&c, &ex, &progress()).await,
        Outcome::Replayed(_)
    ));
    assert_eq!(ex.runs.load(Ordering::SeqCst), 1);

    // Failures are journalled too, with their code.
    let f = exec_cmd("cmd_01B", "env_1", &["fail"]);
    let r = j.run(&f, &ex, &progress()).await.into_result();
    assert!(!r.ok);
    assert_eq!(r.error, "exec: boom");
    assert_eq!(r.code(), v1::HostErrorCode::NotFound);
    let r2 = j.run(&f, &ex, &progress()).await;
    assert!(matches!(r2, Outcome::Replayed(_)));
    assert_eq!(r2.result(), &r);
    assert_eq!(ex.runs.load(Ordering::SeqCst), 2);
    // A success carries no code.
    assert_eq!(first.result().code(), v1::HostErrorCode::Unspecified);

    // An id that cannot be a file name is refused without running.
    let bad = exec_cmd("../x", "env_1", &["echo"]);
    let r = j.run(&bad, &ex, &progress()).await.into_result();
    assert!(!r.ok);
    assert_eq!(r.code(), v1::HostErrorCode::Invalid);
    assert_eq!(ex.runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_command_id_seen_while_running_is_not_started_twice() {
    let dir = tempfile::tempdir().unwrap();
    let j = Arc::new(Journal::open(dir.path()).unwrap());
    let ex = Arc::new(Counting {
        delay: Duration::from_millis(300),
        ..Default::default()
    });
    let c = exec_cmd("cmd_02", "env_1", &["echo", "once"]);
    let (a, b) = tokio::join!(
        {
            let (j, ex, c) = (j.clone(), ex.clone(), c.clone());
            async move { j.run(&c, ex.as_ref(), &progress()).await }
        },
        {
            let (j, ex, c) = (j.clone(), ex.clone(), c.clone());
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                j.run(&c, ex.as_ref(), &progress()).await
            }
        }
    );
    assert!(matches!(a, Outcome::Ran(_)), "{a:?}");
    assert!(matches!(b, Outcome::Joined(_)), "{b:?}");
    assert_eq!(a.result(), b.result());
    assert_eq!(ex.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn one_lifecycle_command_at_a_time_per_environment_and_environments_in_parallel() {
    let dir = tempfile::tempdir().unwrap();
    let j = Arc::new(Journal::open(dir.path()).unwrap());
    let ex = Arc::new(Counting {
        delay: Duration::from_millis(200),
        ..Default::default()
    });
    let t0 = Instant::now();
    let mut tasks = vec![];
    for (i, env) in ["env_a", "env_a", "env_a", "env_b", "env_b", "env_b"]
        .iter()
        .enumerate()
    {
        let (j, ex) = (j.clone(), ex.clone());
        let c = snapshot_cmd(&format!("cmd_03{i}"), env);
        tasks.push(tokio::spawn(async move {
            j.run(&c, ex.as_ref(), &progress()).await
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap().result().ok);
    }
    let took = t0.elapsed();
    let max = ex.max_per_env.lock().unwrap().clone();
    assert_eq!(max["env_a"], 1);
    assert_eq!(max["env_b"], 1);
    assert_eq!(
        ex.max_total.load(Ordering::SeqCst),
        2,
        "the two environments overlapped"
    );
    assert_eq!(ex.runs.load(Ordering::SeqCst), 6);
    // Three in a row per environment: at least 600 ms.
    assert!(took >= Duration::from_millis(600), "{took:?}");
}

#[tokio::test]
async fn execs_on_one_environment_run_together_and_a_lifecycle_command_waits_for_them() {
    let dir = tempfile::tempdir().unwrap();
    let j = Arc::new(Journal::open(dir.path()).unwrap());
    let ex = Arc::new(Counting {
        delay: Duration::from_millis(300),
        ..Default::default()
    });
    let t0 = Instant::now();
    let mut execs = vec![];
    for i in 0..5 {
        let (j, ex) = (j.clone(), ex.clone());
        let c = exec_cmd(&format!("cmd_04{i}"), "env_a", &["echo", &i.to_string()]);
        execs.push(tokio::spawn(async move {
            let o = j.run(&c, ex.as_ref(), &progress()).await;
            (o, Instant::now())
        }));
    }
    // The snapshot is sent while the execs run: it must start after all of them ended,
    // and execs sent while it runs must wait for it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (j2, ex2) = (j.clone(), ex.clone());
    let snap = tokio::spawn(async move {
        let o = j2
            .run(&snapshot_cmd("cmd_049", "env_a"), ex2.as_ref(), &progress())
            .await;
        (o, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (j3, ex3) = (j.clone(), ex.clone());
    let late = tokio::spawn(async move {
        let o = j3
            .run(
                &exec_cmd("cmd_048", "env_a", &["late"]),
                ex3.as_ref(),
                &progress(),
            )
            .await;
        (o, Instant::now())
    });
    let mut last_exec = t0;
    for t in execs {
        let (o, at) = t.await.unwrap();
        assert!(o.result().ok);
        last_exec = last_exec.max(at);
    }
    let (so, snap_at) = snap.await.unwrap();
    assert!(so.result().ok, "{:?}", so.result());
    let (lo, late_at) = late.await.unwrap();
    assert!(lo.result().ok);
    // Five execs of 300 ms together: one 300 ms slot, not 1.5 s.
    assert!(
        last_exec - t0 < Duration::from_millis(1000),
        "{:?}",
        last_exec - t0
    );
    assert_eq!(ex.max_per_env.lock().unwrap()["env_a"], 5);
    // The snapshot ran alone after them, the late exec after it.
    assert!(snap_at >= last_exec + Duration::from_millis(300));
    assert!(late_at >= snap_at + Duration::from_millis(300));
    assert_eq!(ex.runs.load(Ordering::SeqCst), 7);
}

#[test]
fn state_file_is_private_and_saved_state_wins_unless_the_flag_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let state_path = dir.path().join("etc/host.json");
    let saved = State {
        server: "http://saved:8080".into(),
        host_id: "host_01SAVED".into(),
        secret: "dhs_saved".into(),
        data_dir: "/srv/saved-data".into(),
        zfs_pool: "tank".into(),
        ca_file: String::new(),
    };
    saved.save(&state_path).unwrap();
    assert_eq!(
        std::fs::metadata(&state_path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(State::load(&state_path).unwrap(), Some(saved.clone()));

    let flags_of = |args: &[&str]| {
        let mut v = vec!["denvd", "run", "--state", state_path.to_str().unwrap()];
        v.extend_from_slice(args);
        match config::parse(v).unwrap().verb {
            config::Verb::Run(f) => f,
            other => panic!("{other:?}"),
        }
    };
    // Nothing given: the saved state.
    let r = config::resolve(&flags_of(&[]), false).unwrap();
    assert_eq!(r.server, "http://saved:8080");
    assert_eq!(r.data_dir, std::path::PathBuf::from("/srv/saved-data"));
    assert_eq!(r.zfs_pool, "tank");
    assert_eq!(r.state, Some(saved.clone()));
    // Flags given: they win.
    let r = config::resolve(
        &flags_of(&[
            "--server",
            "http://flag:9090/",
            "--data",
            "/srv/flag",
            "--zfs-pool",
            "pool2",
        ]),
        false,
    )
    .unwrap();
    assert_eq!(r.server, "http://flag:9090");
    assert_eq!(r.data_dir, std::path::PathBuf::from("/srv/flag"));
    assert_eq!(r.zfs_pool, "pool2");

    // No state file: defaults by user.
    let none = dir.path().join("none.json");
    let f = match config::parse(["denvd", "join", "--state", none.to_str().unwrap()])
        .unwrap()
        .verb
    {
        config::Verb::Join(f) => f,
        other => panic!("{other:?}"),
    };
    let r = config::resolve(&f, true).unwrap();
    assert_eq!(r.data_dir, std::path::PathBuf::from("/var/lib/denv"));
    assert_eq!(r.probe_image, "busybox:1.36");

    // A relative --data (the quickstart's `--data ./data`) becomes absolute: Docker
    // refuses relative bind sources.
    let f = match config::parse([
        "denvd",
        "join",
        "--state",
        none.to_str().unwrap(),
        "--data",
        "./data",
    ])
    .unwrap()
    .verb
    {
        config::Verb::Join(f) => f,
        other => panic!("{other:?}"),
    };
    let r = config::resolve(&f, true).unwrap();
    assert_eq!(r.data_dir, std::env::current_dir().unwrap().join("data"));
    assert!(r.state.is_none());
    assert_eq!(
        config::default_state_path(true),
        std::path::PathBuf::from("/etc/denv/host.json")
    );
}

#[test]
fn the_ca_file_is_saved_with_the_server_and_goes_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let state_path = dir.path().join("host.json");
    let saved = State {
        server: "https://saved:8443".into(),
        host_id: "host_01SAVED".into(),
        secret: "dhs_saved".into(),
        ca_file: "/etc/denv/ca.pem".into(),
        ..Default::default()
    };
    saved.save(&state_path).unwrap();
    let text = std::fs::read_to_string(&state_path).unwrap();
    assert!(text.contains(r#""ca_file": "/etc/denv/ca.pem""#), "{text}");
    assert_eq!(State::load(&state_path).unwrap(), Some(saved));
    // A state file without the key (an older denvd's, or one for a public CA) reads as
    // no CA file, and is written back without it.
    let plain = State {
        ca_file: String::new(),
        ..State::load(&state_path).unwrap().unwrap()
    };
    plain.save(&dir.path().join("plain.json")).unwrap();
    assert!(!std::fs::read_to_string(dir.path().join("plain.json"))
        .unwrap()
        .contains("ca_file"));

    let resolve = |args: &[&str]| {
        let mut v = vec!["denvd", "run", "--state", state_path.to_str().unwrap()];
        v.extend_from_slice(args);
        match config::parse(v).unwrap().verb {
            config::Verb::Run(f) => config::resolve(&f, false).unwrap(),
            other => panic!("{other:?}"),
        }
    };
    // The saved server: its CA file.
    let r = resolve(&[]);
    assert_eq!(r.server, "https://saved:8443");
    assert_eq!(
        r.ca_file,
        Some(std::path::PathBuf::from("/etc/denv/ca.pem"))
    );
    // Another server on the command line: not the saved server's CA file.
    let r = resolve(&["--server", "https://other:8443"]);
    assert_eq!(r.ca_file, None);
    // --ca-file wins, made absolute.
    let r = resolve(&["--ca-file", "rel/ca.pem"]);
    assert_eq!(
        r.ca_file,
        Some(std::env::current_dir().unwrap().join("rel/ca.pem"))
    );
    let r = resolve(&["--server", "https://other:8443", "--ca-file", "/x/ca.pem"]);
    assert_eq!(r.ca_file, Some(std::path::PathBuf::from("/x/ca.pem")));

    // `install --ca-file` puts DENV_CA_FILE (absolute) in the env file.
    let flags = config::Flags {
        server: Some("https://cp:8443".into()),
        ca_file: Some("/etc/denv/ca.pem".into()),
        ..Default::default()
    };
    assert_eq!(
        config::env_file_text(&flags),
        "DENV_SERVER=https://cp:8443\nDENV_JOIN_TOKEN=\nDENV_DATA_DIR=\nDENV_ZFS_POOL=\nDENV_CA_FILE=/etc/denv/ca.pem\n"
    );
}

#[test]
fn install_writes_the_env_file_and_the_unit() {
    let dir = tempfile::tempdir().unwrap();
    let paths = config::InstallPaths::under(dir.path());
    let exe = dir.path().join("src-denvd");
    std::fs::write(&exe, b"#!/bin/sh\n").unwrap();
    let flags = config::Flags {
        server: Some("http://cp:8080/".into()),
        token: Some("djt_abc".into()),
        zfs_pool: Some("tank".into()),
        ..Default::default()
    };
    config::install_files(&flags, &exe, &paths).unwrap();
    assert_eq!(std::fs::read(&paths.bin).unwrap(), b"#!/bin/sh\n");
    assert_eq!(
        std::fs::metadata(&paths.bin).unwrap().permissions().mode() & 0o777,
        0o755
    );
    assert_eq!(
        std::fs::read_to_string(&paths.env_file).unwrap(),
        "DENV_SERVER=http://cp:8080\nDENV_JOIN_TOKEN=djt_abc\nDENV_DATA_DIR=\nDENV_ZFS_POOL=tank\n"
    );
    assert_eq!(
        std::fs::metadata(&paths.env_file)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    let unit = std::fs::read_to_string(&paths.unit).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/denvd join --state /etc/denv/host.json\n"));
    assert!(unit.contains("EnvironmentFile=/etc/denv/denvd.env\n"));
    assert!(unit.contains("LimitNOFILE=1048576\n"));
    let err = config::install_files(&config::Flags::default(), &exe, &paths).unwrap_err();
    assert_eq!(err, "install: --server (or DENV_SERVER) is required");
}

fn denvd() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_denvd"));
    for v in [
        "DENV_SERVER",
        "DENV_JOIN_TOKEN",
        "DENV_DATA_DIR",
        "DENV_ZFS_POOL",
        "DENV_CA_FILE",
    ] {
        c.env_remove(v);
    }
    c
}

#[test]
fn version_prints_the_build_version() {
    let out = denvd().arg("version").output().unwrap();
    assert!(out.status.success());
    let expected = option_env!("DENVD_VERSION").unwrap_or("dev");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{expected}\n")
    );
}

#[test]
fn run_refuses_without_a_saved_identity_and_join_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("host.json");
    let out = denvd()
        .args(["run", "--server", "http://127.0.0.1:9", "--state"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no saved identity in"), "{err}");

    let out = denvd()
        .args(["join", "--server", "http://127.0.0.1:9", "--state"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("a join token is required for the first join"),
        "{err}"
    );

    // --env-file is read before the flags resolve.
    let env_file = dir.path().join("join.env");
    std::fs::write(&env_file, "DENV_SERVER=http://127.0.0.1:9\n").unwrap();
    let out = denvd()
        .args(["run", "--state"])
        .arg(&state)
        .arg("--env-file")
        .arg(&env_file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Past the server check: it fails on the identity instead.
    assert!(err.contains("no saved identity in"), "{err}");
}

#[test]
fn a_bad_server_url_or_ca_file_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = denvd()
            .args(["join", "--token", "djt_x", "--state"])
            .arg(dir.path().join("host.json"))
            .arg("--data")
            .arg(dir.path().join("data"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert_eq!(
        run(&[
            "--server",
            "https://127.0.0.1:9",
            "--ca-file",
            "/nonexistent/ca.pem"
        ]),
        "denvd: ca file /nonexistent/ca.pem: no such file or directory (os error 2)\n"
    );
    assert_eq!(
        run(&["--server", "ftp://127.0.0.1:9"]),
        "denvd: server \"ftp://127.0.0.1:9\": want http://host:port or https://host:port\n"
    );
}

// ------------------------------------------------------------ the stream, in-test server

/// A scripted control plane: admits `djt_ok` (welcome with a secret) and the secret it
/// gave; refuses anything else with PERMISSION_DENIED; chooses `protocol` in the welcome
/// (0: a control plane older than the negotiation); sends `commands` after the welcome
/// and forwards every sidecar frame to the test.
#[derive(Clone)]
struct Script {
    commands: Vec<Command>,
    frames: mpsc::UnboundedSender<SidecarFrame>,
    protocol: u32,
}

#[tonic::async_trait]
impl HostStream for Script {
    type OpenStream = ReceiverStream<Result<ControlFrame, tonic::Status>>;

    async fn open(
        &self,
        req: tonic::Request<tonic::Streaming<SidecarFrame>>,
    ) -> Result<tonic::Response<Self::OpenStream>, tonic::Status> {
        let mut inbound = req.into_inner();
        let hello = match inbound.message().await? {
            Some(SidecarFrame {
                frame: Some(sidecar_frame::Frame::Hello(h)),
                ..
            }) => h,
            _ => return Err(tonic::Status::permission_denied("hello expected")),
        };
        let _ = self.frames.send(SidecarFrame {
            sent_at: String::new(),
            frame: Some(sidecar_frame::Frame::Hello(hello.clone())),
        });
        let secret = match (hello.host_id.as_str(), hello.token.as_str()) {
            ("", "djt_ok") => "dhs_given".to_string(),
            ("host_01T", "dhs_given") => String::new(),
            ("", _) => {
                return Err(tonic::Status::permission_denied(
                    "join: join token already used",
                ))
            }
            _ => return Err(tonic::Status::permission_denied("host secret rejected")),
        };
        let (tx, rx) = mpsc::channel(64);
        tx.send(Ok(ControlFrame {
            sent_at: String::new(),
            frame: Some(control_frame::Frame::Welcome(v1::Welcome {
                host_id: "host_01T".into(),
                secret,
                protocol: self.protocol,
            })),
        }))
        .await
        .unwrap();
        for c in &self.commands {
            tx.send(Ok(ControlFrame {
                sent_at: String::new(),
                frame: Some(control_frame::Frame::Command(c.clone())),
            }))
            .await
            .unwrap();
        }
        let frames = self.frames.clone();
        tokio::spawn(async move {
            let _keep = tx;
            while let Ok(Some(f)) = inbound.message().await {
                let _ = frames.send(f);
            }
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }
}

async fn serve(script: Script) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(HostStreamServer::new(script))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn joins_saves_the_identity_acks_and_answers_repeats_once() {
    let dir = tempfile::tempdir().unwrap();
    let (ftx, mut frx) = mpsc::unbounded_channel();
    let cmd = exec_cmd("cmd_04", "env_s", &["echo", "s"]);
    let url = serve(Script {
        commands: vec![cmd.clone(), cmd.clone()],
        frames: ftx,
        protocol: 1,
    })
    .await;
    let state_path = dir.path().join("host.json");
    let mut opts = StreamOptions::new(&url, "djt_ok", state_path.clone(), State::default());
    opts.heartbeat = Duration::from_millis(100);
    let ex = Arc::new(Counting::default());
    let journal = Arc::new(Journal::open(&dir.path().join("data")).unwrap());
    let task = tokio::spawn(stream::run(opts, ex.clone(), journal));

    let mut hello = None;
    let (mut acks, mut progress, mut results, mut heartbeats) = (0, 0, vec![], 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && (results.len() < 2 || heartbeats < 2) {
        let Ok(Some(f)) = tokio::time::timeout(Duration::from_secs(5), frx.recv()).await else {
            break;
        };
        match f.frame.unwrap() {
            sidecar_frame::Frame::Hello(h) => hello = Some(h),
            sidecar_frame::Frame::Ack(a) => {
                assert_eq!(a.command_id, "cmd_04");
                acks += 1
            }
            sidecar_frame::Frame::Progress(p) => {
                assert_eq!(p.message, "running cmd_04");
                progress += 1
            }
            sidecar_frame::Frame::Result(r) => results.push(r),
            sidecar_frame::Frame::Heartbeat(_) => heartbeats += 1,
            sidecar_frame::Frame::Event(_) => {}
        }
    }
    task.abort();
    let hello = hello.expect("hello");
    assert_eq!(hello.host_id, "");
    assert_eq!(hello.token, "djt_ok");
    assert_eq!((hello.min_protocol, hello.protocol), (1, 1));
    assert_eq!(hello.capabilities.unwrap().hostname, "test-host");
    assert_eq!(acks, 2);
    assert_eq!(progress, 1, "progress only from the one execution");
    assert_eq!(results.len(), 2);
    assert!(results.iter().all(|r| r.ok && r.command_id == "cmd_04"));
    assert_eq!(results[0], results[1]);
    assert!(heartbeats >= 2);
    assert_eq!(ex.runs.load(Ordering::SeqCst), 1);

    // The identity was saved, 0600, with the server.
    let st = State::load(&state_path).unwrap().unwrap();
    assert_eq!(
        (st.host_id.as_str(), st.secret.as_str()),
        ("host_01T", "dhs_given")
    );
    assert_eq!(st.server, url);
    assert_eq!(
        std::fs::metadata(&state_path).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[tokio::test]
async fn a_refusal_is_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let (ftx, _frx) = mpsc::unbounded_channel();
    let url = serve(Script {
        commands: vec![],
        frames: ftx,
        protocol: 1,
    })
    .await;
    let opts = StreamOptions::new(
        &url,
        "djt_used",
        dir.path().join("host.json"),
        State::default(),
    );
    let journal = Arc::new(Journal::open(dir.path()).unwrap());
    let res = tokio::time::timeout(
        Duration::from_secs(5),
        stream::run(opts, Arc::new(Counting::default()), journal),
    )
    .await
    .expect("returns promptly");
    match res {
        Err(StreamError::Refused(m)) => assert_eq!(m, "join: join token already used"),
        other => panic!("{other:?}"),
    }
    assert!(!dir.path().join("host.json").exists());

    // With a saved identity the secret is presented, not the token.
    let st = State {
        host_id: "host_01T".into(),
        secret: "dhs_wrong".into(),
        ..Default::default()
    };
    let opts = StreamOptions::new(&url, "djt_ok", dir.path().join("host.json"), st);
    let journal = Arc::new(Journal::open(dir.path()).unwrap());
    let res = stream::run(opts, Arc::new(Counting::default()), journal).await;
    assert_eq!(
        res.unwrap_err().to_string(),
        "refused by the control plane: host secret rejected"
    );
}

#[tokio::test]
async fn a_welcome_choosing_a_protocol_this_denvd_does_not_speak_is_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let (ftx, mut frx) = mpsc::unbounded_channel();
    let url = serve(Script {
        commands: vec![exec_cmd("cmd_p", "env_p", &["echo", "p"])],
        frames: ftx,
        protocol: 7,
    })
    .await;
    let state_path = dir.path().join("host.json");
    let opts = StreamOptions::new(&url, "djt_ok", state_path.clone(), State::default());
    let ex = Arc::new(Counting::default());
    let journal = Arc::new(Journal::open(dir.path()).unwrap());
    let res = tokio::time::timeout(
        Duration::from_secs(5),
        stream::run(opts, ex.clone(), journal),
    )
    .await
    .expect("returns promptly, without retrying");
    let e = res.unwrap_err();
    assert!(
        matches!(
            e,
            StreamError::Protocol {
                chosen: 7,
                min: 1,
                max: 1
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "the control plane chose protocol 7, which this denvd does not speak (it speaks 1); upgrade denvd or the control plane"
    );
    // The hello said which versions it speaks; the command after the welcome was not run.
    let mut hello = None;
    while let Ok(f) = frx.try_recv() {
        if let Some(sidecar_frame::Frame::Hello(h)) = f.frame {
            hello = Some(h);
        }
    }
    let hello = hello.expect("hello");
    assert_eq!((hello.min_protocol, hello.protocol), (1, 1));
    assert_eq!(ex.runs.load(Ordering::SeqCst), 0);
    // The identity of the first join was saved before giving up.
    let st = State::load(&state_path).unwrap().unwrap();
    assert_eq!(st.host_id, "host_01T");

    // A control plane older than the negotiation sends no version: 1, accepted (the
    // session goes on: heartbeats follow the welcome).
    let (ftx, mut frx) = mpsc::unbounded_channel();
    let url = serve(Script {
        commands: vec![],
        frames: ftx,
        protocol: 0,
    })
    .await;
    let mut opts = StreamOptions::new(&url, "", state_path.clone(), st);
    opts.heartbeat = Duration::from_millis(100);
    let journal = Arc::new(Journal::open(dir.path()).unwrap());
    let res = tokio::time::timeout(
        Duration::from_millis(700),
        stream::run(opts, Arc::new(Counting::default()), journal),
    )
    .await;
    assert!(res.is_err(), "still connected: {res:?}");
    let mut heartbeats = 0;
    while let Ok(f) = frx.try_recv() {
        if let Some(sidecar_frame::Frame::Heartbeat(_)) = f.frame {
            heartbeats += 1;
        }
    }
    assert!(heartbeats >= 2, "{heartbeats} heartbeats");
}

#[tokio::test]
async fn the_first_heartbeat_follows_the_welcome_at_once_with_the_load() {
    let dir = tempfile::tempdir().unwrap();
    let (ftx, mut frx) = mpsc::unbounded_channel();
    let url = serve(Script {
        commands: vec![],
        frames: ftx,
        protocol: 1,
    })
    .await;
    let mut opts = StreamOptions::new(
        &url,
        "djt_ok",
        dir.path().join("host.json"),
        State::default(),
    );
    // Only the first heartbeat can come within the test: the next is an hour away.
    opts.heartbeat = Duration::from_secs(3600);
    let load = v1::HostLoad {
        memory_free_mb: 3000,
        memory_total_mb: 4000,
        disk_free_mb: 50_000,
        cpus: 1.5,
        environments: 2,
        reserved_cpus: 3.0,
        reserved_memory_mb: 8192,
        reserved_disk_mb: 20480,
    };
    let ex = Arc::new(Counting {
        load: Some(load),
        ..Default::default()
    });
    let journal = Arc::new(Journal::open(&dir.path().join("data")).unwrap());
    let task = tokio::spawn(stream::run(opts, ex, journal));
    let mut beats = vec![];
    let deadline = Instant::now() + Duration::from_secs(5);
    while beats.is_empty() && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(5), frx.recv()).await {
            Ok(Some(SidecarFrame {
                frame: Some(sidecar_frame::Frame::Heartbeat(h)),
                ..
            })) => beats.push(h),
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    task.abort();
    assert_eq!(beats, vec![v1::Heartbeat { load: Some(load) }]);
}

#[tokio::test]
async fn an_unreachable_server_is_retried_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = StreamOptions::new(
        "http://127.0.0.1:9",
        "djt_ok",
        dir.path().join("host.json"),
        State::default(),
    );
    opts.backoff_min = Duration::from_millis(50);
    opts.backoff_max = Duration::from_millis(100);
    let journal = Arc::new(Journal::open(dir.path()).unwrap());
    let res = tokio::time::timeout(
        Duration::from_millis(700),
        stream::run(opts, Arc::new(Counting::default()), journal),
    )
    .await;
    assert!(res.is_err(), "still retrying: {res:?}");
}
