//! The orchestrator end to end: the real `denv-cp` binary (on SQLite in a temp dir, and
//! on PostgreSQL) and the fake sidecar speaking the real host stream to it over the
//! network; requests over REST and gRPC. Phases, statuses and evidence keys are those
//! of `16-ref-deployments.md`.

use denv_proto::v1::{
    self, deployment_service_client::DeploymentServiceClient,
    environment_service_client::EnvironmentServiceClient,
};
use denv_testkit::{
    phase, sidecar::ExecFn, Backend, CpBinary as Cp, FakeOptions, FakeSidecar, Start, TestDb,
};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;
use tonic::transport::Channel;

/// Each test runs on SQLite and on PostgreSQL (`sqlite::…`, `postgres::…`; the Postgres
/// variants need `DENV_TEST_POSTGRES_DSN` and are ignored without `--include-ignored`).
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(denv_testkit::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs PostgreSQL: DENV_TEST_POSTGRES_DSN (just unit starts one)"]
                async fn $name() {
                    super::$name(denv_testkit::Backend::Postgres).await
                }
            )*
        }
    };
}

on_both_stores!(
    full_cycle_over_rest_and_grpc,
    first_deploy_failing_fails_the_env_and_no_host_fails_provision,
    warm_failure_records_exit_and_stderr,
    sandboxes_image_and_from_version,
    destroy_with_the_host_away_completes_when_it_returns,
    restart_mid_deployment_resumes_it_and_the_host_runs_each_command_once,
    sigterm_past_the_drain_cancels_the_runner_and_the_next_start_resumes_it,
    restart_resumes_an_environments_deployments_in_their_order,
    restart_mid_deployment_fails_it_when_its_host_does_not_return,
    deployments_of_one_env_run_one_at_a_time,
    target_sandboxes_are_placed_on_the_clouds_hosts,
    ttls_destroy_with_reason_ttl_and_reach_the_host,
    a_sandbox_whose_client_goes_away_is_destroyed,
    a_sandbox_whose_create_failed_is_destroyed,
    a_host_report_marks_dead_environments_failed,
    another_teams_versions_and_envs_are_404_to_sheet_and_promote,
    a_source_destroyed_during_the_gates_leaves_the_target_running,
    promoting_a_version_into_the_environment_holding_its_snapshot_is_refused,
    restart_mid_promote_destroys_its_gate_forks_at_once,
    promote_gates_then_replaces_the_target_and_a_failed_gate_leaves_it,
    build_contexts_travel_to_prepare_and_pin_the_tag,
    a_failed_build_fails_prepare_with_the_log_tail,
    new_environments_go_where_there_is_room_spread_and_fail_without_it,
);

const KEY: &str = "dak_orchestrator_test_0123456789";

const COMPOSE: &str = r#"
x-denv:
  kind: rl-environment
  agent: { service: box }
  verifier:
    image: busybox:1.36
    command: ["sh", "-c", "echo 1 > /logs/verifier/reward.txt"]
    collect: ["/home/agent/answer.txt"]
services:
  db:
    image: redis:7-alpine
    volumes: ["rd:/data"]
  box:
    image: busybox:1.36
    user: "1000:1000"
    command: ["sleep", "infinity"]
    volumes: ["home:/home/agent"]
volumes: { home: {}, rd: {} }
"#;

/// `denv-cp` over the test's SQLite store, with the test key.
async fn start(db: &TestDb) -> Cp {
    Cp::start(Start::new(env!("CARGO_BIN_EXE_denv-cp"), db).key(KEY)).await
}

/// The gRPC clients the tests use, on the kit's server.
trait Clients {
    async fn envs(&self) -> EnvironmentServiceClient<Channel>;
    async fn deployments(&self) -> DeploymentServiceClient<Channel>;
}

impl Clients for Cp {
    async fn envs(&self) -> EnvironmentServiceClient<Channel> {
        EnvironmentServiceClient::new(self.channel().await)
            .max_decoding_message_size(denv_proto::contract::API_MESSAGE_MAX_BYTES)
            .max_encoding_message_size(denv_proto::contract::API_MESSAGE_MAX_BYTES)
    }

    async fn deployments(&self) -> DeploymentServiceClient<Channel> {
        DeploymentServiceClient::new(self.channel().await)
    }
}

fn authed<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {KEY}").parse().unwrap());
    r
}

fn dep_id(d: &Value) -> String {
    d["deployment"]["ID"].as_str().unwrap().to_string()
}

/// `[(name, status)]` of a `{deployment, phases}` body.
fn phases(d: &Value) -> Vec<(String, String)> {
    d["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["Name"].as_str().unwrap().to_string(),
                p["Status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn evidence<'a>(d: &'a Value, name: &str) -> &'a Value {
    &phase(d, name)["Evidence"]
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect()
}

fn set(k: &[&str]) -> BTreeSet<String> {
    k.iter().map(|s| s.to_string()).collect()
}

fn expect_phases(d: &Value, want: &[(&str, &str)]) {
    let got = phases(d);
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(got, want, "{d}");
}

fn tar_of(name: &str, data: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, name, data).unwrap();
    b.into_inner().unwrap()
}

/// The `host.report` event a sidecar sends after its welcome.
fn report(environments: &[&String], failed: &[(&String, &str)]) -> v1::host_event::Event {
    v1::host_event::Event::HostReport(v1::HostReportEvent {
        environments: environments.iter().map(|e| e.to_string()).collect(),
        failed: failed
            .iter()
            .map(|(e, r)| (e.to_string(), r.to_string()))
            .collect(),
    })
}

async fn events(cp: &Cp, subject: &str) -> Vec<(String, Value)> {
    let (s, e) = cp.get(&format!("/v1/events?subject={subject}")).await;
    assert_eq!(s, 200, "{e}");
    let mut v: Vec<(String, Value)> = e["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["Kind"].as_str().unwrap().to_string(), e["Body"].clone()))
        .collect();
    v.reverse(); // oldest first
    v
}

async fn full_cycle_over_rest_and_grpc(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    // Each answer takes a moment, so the watch below sees the phases change.
    let sc = cp
        .sidecar(FakeOptions {
            delay: Duration::from_millis(150),
            ..Default::default()
        })
        .await;
    cp.project("world").await;

    // A refused compose file: 400 with the parser's reason, and no deployment row.
    let (s, e) = cp
        .post(
            "/v1/projects/world/deploy",
            json!({"compose": "services:\n  a:\n    command: [\"true\"]\n"}),
        )
        .await;
    assert_eq!(s, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("has no image"), "{e}");
    let (_, envs) = cp.get("/v1/projects/world/envs").await;
    let alpha = envs["environments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["Name"] == "alpha")
        .expect("alpha env")["ID"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, deps) = cp.get(&format!("/v1/envs/{alpha}/deployments")).await;
    assert_eq!(deps["deployments"], json!([]), "{deps}");

    // ---- deploy, watched over gRPC.
    let started = cp.deploy("world", "alpha", COMPOSE).await;
    assert_eq!(started["deployment"]["Status"], "pending");
    assert_eq!(started["deployment"]["Kind"], "deploy");
    assert!(phases(&started).iter().all(|(_, s)| s == "pending"));
    assert_eq!(phases(&started).len(), 11);
    let dep1 = dep_id(&started);
    let mut watch = cp
        .deployments()
        .await
        .watch_deployment(authed(v1::GetDeploymentRequest { id: dep1.clone() }))
        .await
        .unwrap()
        .into_inner();
    let mut seen = vec![];
    while let Some(m) = tokio::time::timeout(Duration::from_secs(20), watch.message())
        .await
        .expect("watch stalled")
        .unwrap()
    {
        seen.push(m);
    }
    assert!(seen.len() > 2, "watch sent {} messages", seen.len());
    let last = seen.last().unwrap().deployment.clone().unwrap();
    assert_eq!(last.status, "succeeded");

    let d = cp.wait(&dep1).await;
    expect_phases(
        &d,
        &[
            ("resolve", "ok"),
            ("place", "ok"),
            ("provision", "skipped"),
            ("join", "skipped"),
            ("prepare", "ok"),
            ("start", "ok"),
            ("health", "ok"),
            ("warm", "skipped"),
            ("snapshot", "ok"),
            ("ingress", "skipped"),
            ("verdict", "ok"),
        ],
    );
    let v1_id = d["deployment"]["VersionID"].as_str().unwrap().to_string();
    assert_eq!(d["deployment"]["EnvID"], alpha.as_str());
    assert_eq!(
        keys(evidence(&d, "resolve")),
        set(&["version", "number", "services", "volumes"])
    );
    assert_eq!(evidence(&d, "resolve")["services"], json!(["box", "db"]));
    assert_eq!(evidence(&d, "resolve")["number"], 1);
    assert_eq!(
        evidence(&d, "place"),
        &json!({"host": sc.host_id(), "reason": "first connected host in team"})
    );
    assert_eq!(
        evidence(&d, "provision"),
        &json!({"reason": "host already placed"})
    );
    // The documented {version, endpoints}, plus what the probe found, the pins and
    // the effective caps.
    assert_eq!(
        keys(evidence(&d, "prepare")),
        set(&[
            "version",
            "endpoints",
            "egress",
            "egress_probe",
            "digests",
            "image_ids",
            "storage",
            "resources"
        ])
    );
    assert_eq!(evidence(&d, "prepare")["egress"], "denied (verified)");
    let probe = &evidence(&d, "prepare")["egress_probe"];
    assert_eq!(probe["took_us"], 900);
    assert_eq!(
        keys(&probe["attempts"][0]),
        set(&["target", "addr", "result", "took_us"])
    );
    assert_eq!(evidence(&d, "start"), &json!({"started_in_ms": 1200}));
    assert_eq!(keys(evidence(&d, "health")), set(&["endpoints"]));
    assert_eq!(evidence(&d, "warm"), &json!({"reason": "no warm command"}));
    assert_eq!(
        keys(evidence(&d, "snapshot")),
        set(&["snapshot", "datasets", "frozen_for", "consistent", "clock"])
    );
    assert_eq!(evidence(&d, "snapshot")["snapshot"], v1_id.as_str());
    assert_eq!(evidence(&d, "ingress")["names"], "pending ingress proxy");
    assert_eq!(
        keys(evidence(&d, "verdict")),
        set(&["version", "snapshot", "took_ms"])
    );
    let e = cp.env(&alpha).await;
    assert_eq!(e["connected"], true);
    assert_eq!(e["environment"]["Status"], "healthy");
    assert_eq!(e["environment"]["HostID"], sc.host_id());
    assert_eq!(e["environment"]["CurrentVersionID"], v1_id.as_str());
    let ev = events(&cp, &format!("dep:{dep1}")).await;
    assert_eq!(
        ev[0],
        ("deployment.started".into(), json!({"kind": "deploy"}))
    );
    assert_eq!(ev[1].0, "deployment.finished");
    assert_eq!(ev[1].1["status"], "succeeded");
    assert_eq!(ev[1].1["error"], "");
    assert!(ev[1].1["took_ms"].is_u64());
    let env_events = events(&cp, &format!("env:{alpha}")).await;
    assert!(env_events.len() >= 2);

    // ---- fork over gRPC.
    let mut envs = cp.envs().await;
    let f = envs
        .fork(authed(v1::ForkRequest {
            env: alpha.clone(),
            name: "branch-1".into(),
            version: String::new(),
            ttl_sec: 0,
            pool: None,
            resources: None,
        }))
        .await
        .unwrap()
        .into_inner();
    let fork_dep = f.deployment.unwrap();
    let branch = fork_dep.env_id.clone();
    assert_ne!(branch, alpha);
    let d = cp.wait(&fork_dep.id).await;
    expect_phases(
        &d,
        &[
            ("place", "ok"),
            ("clone", "ok"),
            ("health", "ok"),
            ("verdict", "ok"),
        ],
    );
    assert_eq!(
        evidence(&d, "place"),
        // Placed like a deploy; the only host holds the snapshot: nothing shipped.
        &json!({"host": sc.host_id(), "reason": "first connected host in team"})
    );
    assert_eq!(
        keys(evidence(&d, "clone")),
        set(&["forked_in_ms", "from", "resources", "clock"])
    );
    assert_eq!(
        keys(evidence(&d, "health")),
        set(&["endpoints", "egress", "egress_probe"])
    );
    assert_eq!(keys(evidence(&d, "verdict")), set(&["env", "took_ms"]));
    let b = cp.env(&branch).await["environment"].clone();
    assert_eq!(b["Name"], "branch-1");
    assert_eq!(b["Stage"], "fork");
    assert_eq!(b["ParentVersionID"], v1_id.as_str());
    assert_eq!(b["CurrentVersionID"], v1_id.as_str());
    assert_eq!(b["Status"], "healthy");
    // Duplicate name: 409; a version of no lineage: 400; an unknown one: 404.
    let (s, _) = cp
        .post(
            &format!("/v1/envs/{alpha}/fork"),
            json!({"name": "branch-1"}),
        )
        .await;
    assert_eq!(s, 409);
    let (s, _) = cp
        .post(
            &format!("/v1/envs/{alpha}/fork"),
            json!({"version": "ver_nope"}),
        )
        .await;
    assert_eq!(s, 404);

    // ---- snapshot over REST.
    let (s, snap) = cp
        .post(&format!("/v1/envs/{alpha}/snapshot"), json!({}))
        .await;
    assert_eq!(s, 202, "{snap}");
    let v2_id = snap["deployment"]["VersionID"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(v2_id, v1_id);
    let d = cp.wait(&dep_id(&snap)).await;
    expect_phases(
        &d,
        &[("snapshot", "ok"), ("health", "ok"), ("verdict", "ok")],
    );
    assert_eq!(evidence(&d, "health"), &json!({"answered": true}));
    assert_eq!(evidence(&d, "snapshot")["snapshot"], v2_id.as_str());
    assert_eq!(
        keys(evidence(&d, "verdict")),
        set(&["version", "snapshot", "took_ms"])
    );
    assert_eq!(
        cp.env(&alpha).await["environment"]["CurrentVersionID"],
        v2_id.as_str()
    );

    // ---- exec, files.
    let (s, x) = cp
        .post(
            &format!("/v1/envs/{alpha}/exec"),
            json!({"service": "box", "cmd": ["echo", "hi"]}),
        )
        .await;
    assert_eq!(s, 200, "{x}");
    assert_eq!(
        x,
        json!({"exit_code": 0, "stdout": "echo hi\n", "stderr": "",
               "stdout_truncated": false, "stderr_truncated": false, "timed_out": false})
    );
    let last_exec = || match sc
        .received()
        .into_iter()
        .rev()
        .find(|c| c.kind == "env.exec")
        .unwrap()
        .payload
        .unwrap()
    {
        v1::command::Payload::EnvExec(e) => e,
        other => panic!("{other:?}"),
    };
    let e = last_exec();
    assert_eq!(e.timeout_sec, 120);
    assert_eq!((e.user.as_str(), e.workdir.as_str()), ("", ""));
    assert!(e.stdin.is_empty() && e.env_vars.is_empty());
    // user, workdir, stdin (base64 in JSON) and env_vars reach the host as given.
    let (s, x) = cp
        .post(
            &format!("/v1/envs/{alpha}/exec"),
            json!({"service": "box", "cmd": ["cat"], "user": "root", "workdir": "/tmp/../etc",
                   "stdin": "aGVsbG8K", "env_vars": {"A": "1 2"}}),
        )
        .await;
    assert_eq!(s, 200, "{x}");
    let e = last_exec();
    assert_eq!(
        (e.user.as_str(), e.workdir.as_str(), e.stdin.as_slice()),
        ("root", "/tmp/../etc", &b"hello\n"[..])
    );
    assert_eq!(e.env_vars["A"], "1 2");
    // Refused before any host command, naming the field.
    let before = sc.received().len();
    for (body, status, needle) in [
        (json!({"user": "root; id"}), 400, "is not a user"),
        (json!({"user": "0 -u"}), 400, "is not a user"),
        (json!({"user": "a:b:c"}), 400, "is not a user"),
        (json!({"user": "$(id)"}), 400, "is not a user"),
        (json!({"workdir": "tmp"}), 400, "must be an absolute path"),
        (json!({"env_vars": {"A=B": "1"}}), 400, "env_vars"),
        (json!({"env_vars": {"": "1"}}), 400, "env_vars"),
    ] {
        let mut b = json!({"service": "box", "cmd": ["true"]});
        for (k, v) in body.as_object().unwrap() {
            b[k] = v.clone();
        }
        let (s, x) = cp.post(&format!("/v1/envs/{alpha}/exec"), b.clone()).await;
        assert_eq!(s, status, "{b}: {x}");
        assert!(x["error"].as_str().unwrap().contains(needle), "{b}: {x}");
    }
    // Over gRPC (the REST body itself is capped at 32 MiB): stdin over 32 MiB is 413.
    let err = envs
        .exec(authed(v1::ExecRequest {
            env: alpha.clone(),
            service: "box".into(),
            cmd: vec!["true".into()],
            stdin: vec![0u8; denv_proto::contract::EXEC_STDIN_MAX_BYTES + 1],
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("stdin is"), "{err:?}");
    // Base64 that does not decode is a 400 naming the problem, not a crash.
    let (s, x) = cp
        .post(
            &format!("/v1/envs/{alpha}/exec"),
            json!({"service": "box", "cmd": ["true"], "stdin": "!!not base64!!"}),
        )
        .await;
    assert_eq!(s, 400, "{x}");
    assert_eq!(
        sc.received().len(),
        before,
        "no refused exec reached the host"
    );
    let tar = tar_of("a.txt", b"hello");
    let put = envs
        .put_files(authed(v1::PutFilesRequest {
            env: alpha.clone(),
            service: "box".into(),
            path: "/work".into(),
            tar: tar.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(put.ok);
    assert_eq!(put.bytes as usize, tar.len());
    let got = envs
        .get_files(authed(v1::GetFilesRequest {
            env: alpha.clone(),
            service: "box".into(),
            path: "/work".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.tar, tar);
    let missing = envs
        .get_files(authed(v1::GetFilesRequest {
            env: alpha.clone(),
            service: "box".into(),
            path: "/nope".into(),
        }))
        .await
        .unwrap_err();
    assert!(missing.message().contains("no such file"), "{missing:?}");
    let (s, _) = cp
        .get(&format!("/v1/envs/{alpha}/files?service=box&path=/nope"))
        .await;
    assert_eq!(s, 502);
    let big = envs
        .put_files(authed(v1::PutFilesRequest {
            env: alpha.clone(),
            service: "box".into(),
            path: "/work".into(),
            tar: vec![0u8; denv_proto::contract::FILES_ARCHIVE_MAX_BYTES + 1],
        }))
        .await
        .unwrap_err();
    assert_eq!(big.code(), tonic::Code::ResourceExhausted, "{big:?}");

    // ---- verify: reward 1.
    let (s, vr) = cp
        .post(&format!("/v1/envs/{alpha}/verify"), json!({}))
        .await;
    assert_eq!(s, 202, "{vr}");
    let capture = vr["deployment"]["VersionID"].as_str().unwrap().to_string();
    let d = cp.wait(&dep_id(&vr)).await;
    expect_phases(
        &d,
        &[
            ("stop", "ok"),
            ("collect", "ok"),
            ("snapshot", "ok"),
            ("clone", "ok"),
            ("grade", "ok"),
            ("verdict", "ok"),
        ],
    );
    assert_eq!(
        evidence(&d, "stop"),
        &json!({"agent_service": "box", "mode": "pause"})
    );
    assert_eq!(
        keys(evidence(&d, "collect")),
        set(&["files", "bytes", "missing", "refused"])
    );
    assert_eq!(
        keys(evidence(&d, "clone")),
        set(&["grader_env", "forked_in_ms", "clock"])
    );
    assert_eq!(
        keys(evidence(&d, "grade")),
        set(&[
            "reward",
            "exit_code",
            "stdout",
            "stderr",
            "source",
            "ran_for"
        ])
    );
    let verdict = evidence(&d, "verdict");
    assert_eq!(
        keys(verdict),
        set(&[
            "reward",
            "source",
            "exit_code",
            "refused",
            "missing",
            "agent_frozen",
            "took_ms"
        ])
    );
    assert_eq!(verdict["reward"], 1.0);
    assert_eq!(verdict["source"], "reward.txt");
    assert_eq!(verdict["agent_frozen"], true);
    let grader = evidence(&d, "clone")["grader_env"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(d["deployment"]["TargetEnvID"], grader.as_str());
    // The grader's fork goes after the verdict: `destroying`, then `destroyed`.
    let mut g = cp.env(&grader).await["environment"].clone();
    for _ in 0..300 {
        if g["Status"] == "destroyed" {
            break;
        }
        assert_eq!(g["Status"], "destroying", "{g}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        g = cp.env(&grader).await["environment"].clone();
    }
    assert_eq!(g["Stage"], "verify");
    assert_eq!(g["Status"], "destroyed");
    // Its expiry covers the clone, the verifier's timeout and the teardown, so its host
    // removes it should the control plane die before the teardown.
    let expires = chrono::DateTime::parse_from_rfc3339(g["ExpiresAt"].as_str().unwrap())
        .expect("grader expiry");
    let left = expires.with_timezone(&chrono::Utc) - chrono::Utc::now();
    assert!(
        left > chrono::Duration::minutes(30) && left < chrono::Duration::minutes(45),
        "{left}"
    );
    assert!(g["Name"].as_str().unwrap().starts_with("alpha-verify-"));
    assert!(
        !sc.environments().contains(&grader),
        "grader fork still on the host"
    );
    // The collect was the verify id; the agent stayed paused through the snapshot.
    let cmds = sc.received();
    let collect = cmds
        .iter()
        .rev()
        .find(|c| c.kind == "verify.collect")
        .unwrap();
    match collect.payload.clone().unwrap() {
        v1::command::Payload::VerifyCollect(c) => {
            assert_eq!(c.id, dep_id(&vr));
            assert_eq!(c.agent_service, "box");
            assert_eq!(c.collect, vec!["/home/agent/answer.txt"]);
        }
        other => panic!("{other:?}"),
    }
    let snap_cmd = cmds
        .iter()
        .rev()
        .find(|c| c.kind == "env.snapshot")
        .unwrap();
    match snap_cmd.payload.clone().unwrap() {
        v1::command::Payload::EnvSnapshot(s) => {
            assert_eq!(s.name, capture);
            assert_eq!(s.keep_paused, vec!["box"]);
        }
        other => panic!("{other:?}"),
    }
    // The capture is healthy but not current.
    let (_, vs) = cp.get(&format!("/v1/envs/{alpha}/versions")).await;
    let cap = vs["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["ID"] == capture.as_str())
        .unwrap();
    assert_eq!(cap["Healthy"], true);
    assert_eq!(cap["Snapshot"], capture.as_str());
    assert_eq!(
        cp.env(&alpha).await["environment"]["CurrentVersionID"],
        v2_id.as_str()
    );

    // ---- verify with a refused collect: reward 0, source refused, decided at collect:
    // no snapshot, no fork, no grader; the sidecar is asked to resume the agent.
    sc.set_collect_refused(vec!["home/agent/answer.txt: symlink".into()]);
    let before = sc.received().len();
    let (s, vr) = cp
        .post(&format!("/v1/envs/{alpha}/verify"), json!({"resume": true}))
        .await;
    assert_eq!(s, 202, "{vr}");
    let d = cp.wait(&dep_id(&vr)).await;
    assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
    let verdict = evidence(&d, "verdict");
    assert_eq!(verdict["reward"], 0.0);
    assert_eq!(verdict["source"], "refused");
    assert_eq!(
        verdict["refused"],
        json!(["home/agent/answer.txt: symlink"])
    );
    assert_eq!(verdict["agent_frozen"], false);
    for p in ["snapshot", "clone", "grade"] {
        assert_eq!(phase(&d, p)["Status"], "skipped", "{p}: {d}");
        assert_eq!(evidence(&d, p)["reason"], "submission refused", "{p}");
    }
    let sent: Vec<_> = sc.received().into_iter().skip(before).collect();
    let kinds: Vec<&str> = sent.iter().map(|c| c.kind.as_str()).collect();
    assert_eq!(kinds, ["verify.collect"], "nothing after a refused collect");
    match sent[0].payload.clone().unwrap() {
        v1::command::Payload::VerifyCollect(c) => assert!(c.resume_if_refused),
        other => panic!("{other:?}"),
    }
    sc.set_collect_refused(vec![]);

    // A fork's spec has no verifier? It does (same spec); a sandbox has none: 400 below.

    // ---- rollback to v1 over REST; bad versions refused.
    let (s, _) = cp
        .post(
            &format!("/v1/envs/{alpha}/rollback"),
            json!({"version": "ver_nope"}),
        )
        .await;
    assert_eq!(s, 404);
    let (s, e) = cp
        .post(
            &format!("/v1/envs/{branch}/rollback"),
            json!({"version": v1_id}),
        )
        .await;
    assert_eq!(s, 400, "{e}");
    let (s, rb) = cp
        .post(
            &format!("/v1/envs/{alpha}/rollback"),
            json!({"version": v1_id}),
        )
        .await;
    assert_eq!(s, 202, "{rb}");
    let d = cp.wait(&dep_id(&rb)).await;
    expect_phases(
        &d,
        &[("restore", "ok"), ("health", "ok"), ("verdict", "ok")],
    );
    assert_eq!(
        evidence(&d, "restore"),
        &json!({"snapshot": v1_id, "clock_offset_ms": 0})
    );
    assert_eq!(evidence(&d, "health"), &json!({"restored": v1_id}));
    assert_eq!(evidence(&d, "verdict"), &json!({"version": v1_id}));
    assert_eq!(
        cp.env(&alpha).await["environment"]["CurrentVersionID"],
        v1_id.as_str()
    );

    // ---- a second deploy whose prepare fails: rolled back, v1 still current.
    sc.set_failing("env.create", Some("compose up failed: boom"));
    let d2 = cp.deploy("world", "alpha", COMPOSE).await;
    let d = cp.wait(&dep_id(&d2)).await;
    sc.set_failing("env.create", None);
    assert_eq!(d["deployment"]["Status"], "rolled_back", "{d}");
    assert_eq!(d["deployment"]["Error"], "prepare: compose up failed: boom");
    expect_phases(
        &d,
        &[
            ("resolve", "ok"),
            ("place", "ok"),
            ("provision", "skipped"),
            ("join", "skipped"),
            ("prepare", "failed"),
            ("start", "skipped"),
            ("health", "skipped"),
            ("warm", "skipped"),
            ("snapshot", "skipped"),
            ("ingress", "skipped"),
            ("verdict", "ok"),
        ],
    );
    assert_eq!(evidence(&d, "verdict"), &json!({"reverted_to": v1_id}));
    assert_eq!(
        evidence(&d, "place")["reason"],
        "environment already on host"
    );
    let e = cp.env(&alpha).await["environment"].clone();
    assert_eq!(e["CurrentVersionID"], v1_id.as_str());
    assert_eq!(e["Status"], "healthy");
    let last_rollback = sc
        .received()
        .into_iter()
        .rev()
        .find(|c| c.kind == "env.rollback")
        .unwrap();
    assert_eq!(last_rollback.env_id, alpha);
    let ev = events(&cp, &format!("dep:{}", dep_id(&d2))).await;
    assert_eq!(ev[1].1["status"], "rolled_back");
    assert_eq!(ev[1].1["error"], "prepare: compose up failed: boom");

    // ---- another team's environment is 404.
    let other = other_team_key(&cp).await;
    let r = cp
        .http
        .get(format!("{}/v1/envs/{alpha}", cp.url))
        .bearer_auth(&other)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);

    // ---- destroy the fork.
    let r = cp.delete(&format!("/v1/envs/{branch}")).await;
    assert_eq!(r.0, 202, "{}", r.1);
    assert!(r.1.get("phases").is_none());
    let d = cp.wait(&dep_id(&r.1)).await;
    expect_phases(&d, &[("teardown", "ok"), ("verdict", "ok")]);
    assert_eq!(evidence(&d, "teardown"), &Value::Null);
    assert_eq!(evidence(&d, "verdict"), &json!({"copies_cleared": 0}));
    assert_eq!(cp.env(&branch).await["environment"]["Status"], "destroyed");
    assert!(!sc.environments().contains(&branch));
    let (s, _) = cp
        .post(
            &format!("/v1/envs/{branch}/exec"),
            json!({"service": "box", "cmd": ["true"]}),
        )
        .await;
    assert_eq!(s, 409);

    // ---- deployments of alpha, newest first.
    let (_, deps) = cp.get(&format!("/v1/envs/{alpha}/deployments")).await;
    let kinds: Vec<&str> = deps["deployments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["Kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        vec!["deploy", "rollback", "verify", "verify", "snapshot", "deploy"]
    );
}

/// A second team with its own key, written straight into the store.
async fn other_team_key(cp: &Cp) -> String {
    use denv_cp::store::{self, api_keys, teams};
    let db = store::connect(cp.dsn()).await.unwrap();
    let t = teams::create(&db, "other").await.unwrap();
    let secret = "dak_other_team_0123456789".to_string();
    api_keys::insert_with_secret(&db, &t.id, "other", "", &secret)
        .await
        .unwrap();
    secret
}

async fn first_deploy_failing_fails_the_env_and_no_host_fails_provision(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    cp.project("p").await;

    // No host at all: provision fails with the documented message.
    let d = cp.deploy("p", "alpha", COMPOSE).await;
    let d = cp.wait(&dep_id(&d)).await;
    assert_eq!(d["deployment"]["Status"], "failed");
    assert_eq!(
        evidence(&d, "place"),
        &json!({"host": "", "reason": "no connected host; provisioning"})
    );
    assert_eq!(phase(&d, "provision")["Status"], "failed");
    assert_eq!(
        d["deployment"]["Error"],
        "provision: no connected host and no cloud that can provision: connect a cloud or run `denvd join` on a machine"
    );
    assert_eq!(phase(&d, "join")["Status"], "skipped");
    assert_eq!(
        evidence(&d, "verdict"),
        &json!({"reverted": "no previous version"})
    );

    // A host whose env.create fails: the first deploy fails the env.
    let _sc = cp
        .sidecar(FakeOptions::default().failing("env.create", "image busybox:1.36 not found"))
        .await;
    let d = cp.deploy("p", "alpha", COMPOSE).await;
    let env_id = d["deployment"]["EnvID"].as_str().unwrap().to_string();
    let d = cp.wait(&dep_id(&d)).await;
    assert_eq!(d["deployment"]["Status"], "failed");
    assert_eq!(
        d["deployment"]["Error"],
        "prepare: image busybox:1.36 not found"
    );
    assert_eq!(
        phase(&d, "prepare")["Error"],
        "image busybox:1.36 not found"
    );
    assert_eq!(
        evidence(&d, "verdict"),
        &json!({"reverted": "no previous version"})
    );
    let e = cp.env(&env_id).await["environment"].clone();
    assert_eq!(e["Status"], "failed");
    assert_eq!(e["CurrentVersionID"], "");
    // Nothing to verify or fork yet.
    let (s, _) = cp
        .post(&format!("/v1/envs/{env_id}/verify"), json!({}))
        .await;
    assert_eq!(s, 400);
    let (s, _) = cp.post(&format!("/v1/envs/{env_id}/fork"), json!({})).await;
    assert_eq!(s, 400);
}

async fn warm_failure_records_exit_and_stderr(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    let exec: ExecFn = std::sync::Arc::new(|x: &v1::EnvExec| {
        if x.cmd.first().map(String::as_str) == Some("seed") {
            v1::ExecOutput {
                exit_code: 3,
                stdout: String::new(),
                stderr: "seed: no such table".into(),
                ..Default::default()
            }
        } else {
            v1::ExecOutput::default()
        }
    });
    let opts = FakeOptions {
        exec: Some(exec),
        ..Default::default()
    };
    let sc = cp.sidecar(opts).await;
    cp.project("w").await;
    let (s, d) = cp
        .post(
            "/v1/projects/w/deploy",
            json!({"compose": COMPOSE, "warm": ["seed", "--all"]}),
        )
        .await;
    assert_eq!(s, 202, "{d}");
    let d = cp.wait(&dep_id(&d)).await;
    assert_eq!(phase(&d, "warm")["Status"], "failed");
    assert_eq!(
        evidence(&d, "warm"),
        &json!({"exit": 3, "stderr": "seed: no such table"})
    );
    assert_eq!(d["deployment"]["Error"], "warm: warm command exited 3");
    let warm = sc
        .received()
        .into_iter()
        .find(|c| c.kind == "env.exec")
        .unwrap();
    match warm.payload.unwrap() {
        v1::command::Payload::EnvExec(e) => {
            // The first service by name, with the 600 s warm timeout.
            assert_eq!(e.service, "box");
            assert_eq!(e.timeout_sec, 600);
            assert_eq!(e.cmd, vec!["seed", "--all"]);
        }
        other => panic!("{other:?}"),
    }
}

async fn sandboxes_image_and_from_version(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    let sc = cp.sidecar(FakeOptions::default()).await;

    let (s, e) = cp.post("/v1/sandboxes", json!({})).await;
    assert_eq!(s, 400, "{e}");

    let (s, sb) = cp
        .post(
            "/v1/sandboxes",
            json!({"image": "busybox:1.36", "cmd": ["sleep", "infinity"], "name": "ep-1"}),
        )
        .await;
    assert_eq!(s, 201, "{sb}");
    assert_eq!(sb["environment"]["Name"], "ep-1");
    assert_eq!(sb["environment"]["Status"], "healthy");
    assert_eq!(sb["environment"]["Stage"], "sandbox");
    assert_eq!(sb["deployment"]["Status"], "succeeded");
    let create = sc
        .received()
        .into_iter()
        .find(|c| c.kind == "env.create")
        .unwrap();
    match create.payload.unwrap() {
        v1::command::Payload::EnvCreate(c) => {
            assert_eq!(c.services.len(), 1);
            assert_eq!(c.services[0].name, "main");
            assert_eq!(c.volumes, vec!["v0"]);
            assert_eq!(c.services[0].volumes[0].path, "/work");
            assert_eq!(c.egress, "deny");
        }
        other => panic!("{other:?}"),
    }
    let (_, projects) = cp.get("/v1/projects").await;
    assert!(projects["projects"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["Name"] == "sandboxes"));
    // A sandbox declares no verifier: verify is 400.
    let sbx_env = sb["environment"]["ID"].as_str().unwrap().to_string();
    let (s, _) = cp
        .post(&format!("/v1/envs/{sbx_env}/verify"), json!({}))
        .await;
    assert_eq!(s, 400);

    let version = sb["deployment"]["VersionID"].as_str().unwrap();
    let (s, fk) = cp
        .post("/v1/sandboxes", json!({"from_version": version}))
        .await;
    assert_eq!(s, 201, "{fk}");
    assert!(fk["environment"]["Name"]
        .as_str()
        .unwrap()
        .starts_with("sbx-"));
    assert_eq!(fk["environment"]["CurrentVersionID"], version);
    assert_eq!(fk["deployment"]["Kind"], "fork");

    // Ports under the default deny: published, reported, and the env still denied.
    let (s, pt) = cp
        .post(
            "/v1/sandboxes",
            json!({"image": "busybox:1.36", "ports": ["8080"], "name": "ep-ports"}),
        )
        .await;
    assert_eq!(s, 201, "{pt}");
    assert!(pt["environment"]["Endpoints"]["main"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));
    let d = cp.wait(&dep_id(&pt)).await;
    let ev = evidence(&d, "prepare");
    assert_eq!(ev["egress"], "denied (verified)");
    assert_eq!(ev["egress_probe"]["attempts"][2]["target"], "public");

    // A failing deployment is 502 with its error.
    sc.set_failing("env.create", Some("no space left on device"));
    let (s, e) = cp
        .post("/v1/sandboxes", json!({"image": "busybox:1.36"}))
        .await;
    assert_eq!(s, 502, "{e}");
    assert_eq!(e["error"], "prepare: no space left on device");
}

async fn destroy_with_the_host_away_completes_when_it_returns(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    let sc = cp.sidecar(FakeOptions::default()).await;
    cp.project("d").await;
    let d = cp.deploy("d", "alpha", COMPOSE).await;
    let env_id = d["deployment"]["EnvID"].as_str().unwrap().to_string();
    assert_eq!(
        cp.wait(&dep_id(&d)).await["deployment"]["Status"],
        "succeeded"
    );
    let parked = sc.disconnect().await;
    for _ in 0..100 {
        if cp.env(&env_id).await["connected"] == false {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (s, e) = cp
        .post(
            &format!("/v1/envs/{env_id}/exec"),
            json!({"service": "box", "cmd": ["true"]}),
        )
        .await;
    assert_eq!(s, 502, "{e}");
    // A snapshot fails at once (not after the 15 min command timeout) and keeps the
    // current version.
    let current = cp.env(&env_id).await["environment"]["CurrentVersionID"].clone();
    let t0 = std::time::Instant::now();
    let (s, snap) = cp
        .post(&format!("/v1/envs/{env_id}/snapshot"), json!({}))
        .await;
    assert_eq!(s, 202, "{snap}");
    let d = cp.wait(&dep_id(&snap)).await;
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(d["deployment"]["Status"], "failed");
    let host = cp.env(&env_id).await["environment"]["HostID"].clone();
    assert_eq!(
        d["deployment"]["Error"],
        format!("snapshot: host {} is not connected", host.as_str().unwrap())
    );
    expect_phases(
        &d,
        &[
            ("snapshot", "failed"),
            ("health", "skipped"),
            ("verdict", "ok"),
        ],
    );
    assert_eq!(evidence(&d, "verdict"), &json!({"kept": current}));
    let e = cp.env(&env_id).await["environment"].clone();
    assert_eq!(e["CurrentVersionID"], current);
    assert_eq!(e["Status"], "healthy");

    let r = cp.delete(&format!("/v1/envs/{env_id}")).await;
    assert_eq!(r.0, 202);
    let d = cp.wait(&dep_id(&r.1)).await;
    assert_eq!(d["deployment"]["Status"], "succeeded");
    assert_eq!(phase(&d, "teardown")["Status"], "skipped");
    assert_eq!(
        evidence(&d, "teardown"),
        &json!({"reason": "host not connected; torn down when it reconnects"})
    );
    assert_eq!(d["deployment"]["Params"], json!({"reason": "requested"}));
    assert_eq!(cp.env(&env_id).await["environment"]["Status"], "destroyed");

    // Destroying it again is not a dead end: another destroy deployment, same outcome.
    let r2 = cp.delete(&format!("/v1/envs/{env_id}")).await;
    assert_eq!(r2.0, 202, "{}", r2.1);
    assert_ne!(dep_id(&r2.1), dep_id(&r.1));
    let d2 = cp.wait(&dep_id(&r2.1)).await;
    assert_eq!(d2["deployment"]["Status"], "succeeded");

    // The host comes back and reports what it holds: the control plane sends env.destroy
    // for the destroyed environment and for an id it never heard of; a host-side id it
    // knows as live is kept.
    let sc = parked.reconnect(&cp.url).await.unwrap();
    let stranger = "env_01JZZZZZZZZZZZZZZZZZZZZZZZ".to_string();
    sc.send_event(report(&[&env_id, &stranger], &[])).await;
    let mut destroyed: Vec<String> = vec![];
    for _ in 0..100 {
        destroyed = sc
            .received()
            .iter()
            .filter(|c| c.kind == "env.destroy")
            .map(|c| c.env_id.clone())
            .collect();
        if destroyed.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    destroyed.sort();
    let mut want = vec![env_id.clone(), stranger.to_string()];
    want.sort();
    assert_eq!(destroyed, want);
    let mut torn = vec![];
    for _ in 0..100 {
        torn = events(&cp, &format!("env:{env_id}"))
            .await
            .into_iter()
            .filter(|(k, _)| k == "env.torn_down")
            .collect();
        if !torn.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(torn.len(), 1, "{torn:?}");
    assert_eq!(torn[0].1["reason"], "destroyed while the host was away");
    assert_eq!(torn[0].1["host"], json!(sc.host_id()));
}

/// Makes the sidecar hold its commands and deploys `env` of `project`: returns once the
/// deploy is `running` in `prepare` (its `env.create` sent and unanswered), with the
/// deployment id, the environment id and the deployment's body at that point.
async fn hold_a_deploy_in_prepare(
    cp: &Cp,
    sc: &FakeSidecar,
    project: &str,
    env: &str,
) -> (String, String, Value) {
    sc.set_answering(false);
    let held = cp.deploy(project, env, COMPOSE).await;
    let held_id = dep_id(&held);
    let env_id = held["deployment"]["EnvID"].as_str().unwrap().to_string();
    let before = sc.received().len();
    sc.wait_received(before + 1, Duration::from_secs(10)).await;
    for _ in 0..100 {
        let (_, d) = cp.get(&format!("/v1/deployments/{held_id}")).await;
        if phase(&d, "prepare")["Status"] == "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, d) = cp.get(&format!("/v1/deployments/{held_id}")).await;
    assert_eq!(phase(&d, "prepare")["Status"], "running", "{d}");
    (held_id, env_id, d)
}

async fn restart_mid_deployment_resumes_it_and_the_host_runs_each_command_once(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let mut cp = start(&dir).await;
    let sc = cp.sidecar(FakeOptions::default()).await;
    cp.project("r").await;
    let ok = cp.deploy("r", "stable", COMPOSE).await;
    let ok = cp.wait(&dep_id(&ok)).await;
    assert_eq!(ok["deployment"]["Status"], "succeeded");

    let (held_id, alpha, _) = hold_a_deploy_in_prepare(&cp, &sc, "r", "alpha").await;
    let held_cmd = sc
        .received()
        .into_iter()
        .rev()
        .find(|c| c.kind == "env.create" && c.env_id == alpha)
        .unwrap()
        .command_id;

    // The control plane dies; a new one starts; the sidecar (its journal kept) comes
    // back and answers. The deployment ends with what the host did.
    cp.kill();
    cp.restart(&[]).await;
    let sc = sc.reconnect_same(&cp.url).await.unwrap();
    let d = cp.wait(&held_id).await;
    assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
    assert_eq!(d["deployment"]["Error"], "");
    assert_eq!(
        phases(&d),
        phases(&ok),
        "same phases as an uninterrupted deploy"
    );
    let env = cp.env(&alpha).await;
    assert_eq!(env["environment"]["Status"], "healthy");
    assert_eq!(
        env["environment"]["CurrentVersionID"],
        d["deployment"]["VersionID"]
    );
    // env.create went to the host under one id, before and after the restart, and ran
    // once; every command of the deployment ran once.
    let creates: Vec<String> = sc
        .received()
        .iter()
        .filter(|c| c.kind == "env.create" && c.env_id == alpha)
        .map(|c| c.command_id.clone())
        .collect();
    assert!(
        creates.len() >= 2,
        "sent before and after the restart: {creates:?}"
    );
    assert!(creates.iter().all(|c| *c == held_cmd), "{creates:?}");
    let runs = sc.executions();
    assert_eq!(
        runs.iter().filter(|c| **c == held_cmd).count(),
        1,
        "{runs:?}"
    );
    let mine: Vec<&String> = runs.iter().filter(|c| c.contains(&held_id)).collect();
    let unique: std::collections::HashSet<_> = mine.iter().collect();
    assert_eq!(mine.len(), unique.len(), "a command ran twice: {mine:?}");
    // The log says it was resumed.
    let ev = events(&cp, &format!("dep:{held_id}")).await;
    let started: Vec<&Value> = ev
        .iter()
        .filter(|(k, _)| k == "deployment.started")
        .map(|(_, b)| b)
        .collect();
    assert_eq!(started.len(), 2, "{ev:?}");
    assert_eq!(started[1]["resumed"], true);
    assert_eq!(ev.last().unwrap().0, "deployment.finished");
    assert_eq!(ev.last().unwrap().1["status"], "succeeded");
}

/// SIGTERM while a runner waits on its host longer than `DENV_DRAIN`: at the drain's
/// end the runner is cancelled (its deployment stays `running`, its command open), the
/// host streams are closed so they do not hold the shutdown grace, and the process
/// exits; the next start resumes the deployment under the same command id.
async fn sigterm_past_the_drain_cancels_the_runner_and_the_next_start_resumes_it(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let mut cp = Cp::start(
        Start::new(env!("CARGO_BIN_EXE_denv-cp"), &dir)
            .key(KEY)
            .env("DENV_DRAIN", "1"),
    )
    .await;
    let sc = cp.sidecar(FakeOptions::default()).await;
    cp.project("t").await;
    let (held_id, alpha, _) = hold_a_deploy_in_prepare(&cp, &sc, "t", "alpha").await;

    let asked = std::time::Instant::now();
    cp.stop();
    let status = cp.wait_exit(Duration::from_secs(15)).await;
    let took = asked.elapsed();
    let log = cp.log_text();
    assert!(
        status.is_some(),
        "still running 15 s after SIGTERM; log:\n{log}"
    );
    assert!(
        log.contains("deployment runner cancelled by the drain"),
        "{log}"
    );
    assert!(log.contains("closing host streams streams=1"), "{log}");
    // 1 s of drain, then moments: the open host stream no longer holds the 10 s grace.
    assert!(
        took < Duration::from_secs(8),
        "exited after {took:?}; log:\n{log}"
    );

    cp.restart(&[]).await;
    // Nothing of the cancelled runner wrote after it: the deployment is as it was left.
    let sc = sc.reconnect_same(&cp.url).await.unwrap();
    let d = cp.wait(&held_id).await;
    assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
    let creates: std::collections::HashSet<String> = sc
        .received()
        .iter()
        .filter(|c| c.kind == "env.create" && c.env_id == alpha)
        .map(|c| c.command_id.clone())
        .collect();
    assert_eq!(
        creates.len(),
        1,
        "one command id before and after: {creates:?}"
    );
    let ev = events(&cp, &format!("dep:{held_id}")).await;
    let started: Vec<&Value> = ev
        .iter()
        .filter(|(k, _)| k == "deployment.started")
        .map(|(_, b)| b)
        .collect();
    assert_eq!(started.len(), 2, "{ev:?}");
    assert_eq!(started[1]["resumed"], true);
}

async fn restart_resumes_an_environments_deployments_in_their_order(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let mut cp = start(&dir).await;
    let sc = cp.sidecar(FakeOptions::default()).await;
    cp.project("o").await;
    let d = cp.deploy("o", "alpha", COMPOSE).await;
    let env_id = d["deployment"]["EnvID"].as_str().unwrap().to_string();
    assert_eq!(
        cp.wait(&dep_id(&d)).await["deployment"]["Status"],
        "succeeded"
    );

    // A snapshot held by the host, and a destroy queued behind it, when the control
    // plane dies.
    sc.set_answering(false);
    let before = sc.received().len();
    let (s, snap) = cp
        .post(&format!("/v1/envs/{env_id}/snapshot"), json!({}))
        .await;
    assert_eq!(s, 202);
    sc.wait_received(before + 1, Duration::from_secs(10)).await;
    let (s, del) = cp.delete(&format!("/v1/envs/{env_id}")).await;
    assert_eq!(s, 202);
    let (_, queued) = cp.get(&format!("/v1/deployments/{}", dep_id(&del))).await;
    assert_eq!(queued["deployment"]["Status"], "pending", "{queued}");
    cp.kill();
    cp.restart(&[]).await;
    let _sc = sc.reconnect_same(&cp.url).await.unwrap();
    let snap = cp.wait(&dep_id(&snap)).await;
    let del = cp.wait(&dep_id(&del)).await;
    assert_eq!(snap["deployment"]["Status"], "succeeded", "{snap}");
    assert_eq!(del["deployment"]["Status"], "succeeded", "{del}");
    assert!(
        snap["deployment"]["FinishedAt"].as_str().unwrap()
            <= phase(&del, "teardown")["StartedAt"].as_str().unwrap(),
        "the queued destroy ran before the resumed snapshot ended"
    );
    assert_eq!(cp.env(&env_id).await["environment"]["Status"], "destroyed");
    let snap_ver = snap["deployment"]["VersionID"].as_str().unwrap();
    let (_, vs) = cp.get(&format!("/v1/envs/{env_id}/versions")).await;
    let v = vs["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["ID"] == snap_ver)
        .unwrap_or_else(|| panic!("no version {snap_ver}: {vs}"));
    assert_eq!(v["Healthy"], true, "{v}");
}

async fn restart_mid_deployment_fails_it_when_its_host_does_not_return(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let mut cp = start(&dir).await;
    let sc = cp.sidecar(FakeOptions::default()).await;
    cp.project("r").await;

    // A finished deployment that must survive the restart untouched.
    let ok = cp.deploy("r", "stable", COMPOSE).await;
    let ok = cp.wait(&dep_id(&ok)).await;
    assert_eq!(ok["deployment"]["Status"], "succeeded");
    let stable = ok["deployment"]["EnvID"].as_str().unwrap().to_string();
    let stable_env = cp.env(&stable).await;
    let (_, stable_versions) = cp.get(&format!("/v1/envs/{stable}/versions")).await;

    let (held_id, alpha, d) = hold_a_deploy_in_prepare(&cp, &sc, "r", "alpha").await;
    assert_eq!(d["deployment"]["Status"], "running");

    cp.kill();
    cp.restart(&[("DENV_RESUME_WAIT", "1")]).await;
    let d = cp.wait(&held_id).await;
    let why = format!(
        "control plane restarted during prepare; {} did not reconnect within 1s",
        sc.host_id()
    );
    assert_eq!(d["deployment"]["Status"], "failed");
    assert_eq!(d["deployment"]["Error"], why.as_str());
    assert!(!d["deployment"]["FinishedAt"].as_str().unwrap().is_empty());
    expect_phases(
        &d,
        &[
            ("resolve", "ok"),
            ("place", "ok"),
            ("provision", "skipped"),
            ("join", "skipped"),
            ("prepare", "failed"),
            ("start", "skipped"),
            ("health", "skipped"),
            ("warm", "skipped"),
            ("snapshot", "skipped"),
            ("ingress", "skipped"),
            ("verdict", "ok"),
        ],
    );
    assert_eq!(phase(&d, "prepare")["Error"], why.as_str());
    assert_eq!(evidence(&d, "verdict"), &json!({"error": why}));
    // Never healthy: what it left on the host is destroyed (reason `abandoned`), the
    // teardown deferred until the host is back.
    let mut abandoned = Value::Null;
    for _ in 0..100 {
        let (_, ds) = cp.get(&format!("/v1/envs/{alpha}/deployments")).await;
        if let Some(d) = ds["deployments"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["Kind"] == "destroy")
        {
            abandoned = cp.wait(d["ID"].as_str().unwrap()).await;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        abandoned["deployment"]["Status"], "succeeded",
        "{abandoned}"
    );
    assert_eq!(
        abandoned["deployment"]["Params"],
        json!({"reason": "abandoned"})
    );
    assert_eq!(
        evidence(&abandoned, "teardown"),
        &json!({"reason": "host not connected; torn down when it reconnects"})
    );
    assert_eq!(cp.env(&alpha).await["environment"]["Status"], "destroyed");
    let ev = events(&cp, &format!("dep:{held_id}")).await;
    assert_eq!(ev.last().unwrap().0, "deployment.finished");
    assert_eq!(ev.last().unwrap().1["error"], why.as_str());

    // Every other row is as it was.
    assert_eq!(
        cp.get(&format!("/v1/deployments/{}", dep_id(&ok))).await.1,
        ok
    );
    let after = cp.env(&stable).await;
    assert_eq!(after["environment"], stable_env["environment"]);
    assert_eq!(
        cp.get(&format!("/v1/envs/{stable}/versions")).await.1,
        stable_versions
    );

    // The sidecar comes back; the held command is not sent again (recovery failed it),
    // and the environment deploys again.
    let held_cmd = sc
        .received()
        .into_iter()
        .rev()
        .find(|c| c.kind == "env.create" && c.env_id == alpha)
        .unwrap()
        .command_id;
    let sc = sc.reconnect_same(&cp.url).await.unwrap();
    // Its report names the half-made environment: the control plane has it destroyed
    // and sends env.destroy.
    sc.send_event(report(&[&alpha, &stable], &[])).await;
    for _ in 0..100 {
        if sc
            .received()
            .iter()
            .any(|c| c.kind == "env.destroy" && c.env_id == alpha)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let destroys: Vec<String> = sc
        .received()
        .iter()
        .filter(|c| c.kind == "env.destroy")
        .map(|c| c.env_id.clone())
        .collect();
    assert_eq!(destroys, vec![alpha.clone()], "only the abandoned one goes");
    assert_eq!(cp.env(&stable).await["environment"]["Status"], "healthy");
    // The environment deploys again.
    let again = cp.deploy("r", "alpha", COMPOSE).await;
    let again = cp.wait(&dep_id(&again)).await;
    assert_eq!(again["deployment"]["Status"], "succeeded", "{again}");
    assert_eq!(cp.env(&alpha).await["environment"]["Status"], "healthy");
    let repeats = sc
        .received()
        .iter()
        .filter(|c| c.command_id == held_cmd)
        .count();
    assert_eq!(
        repeats, 1,
        "the held env.create was sent again after the restart"
    );
    assert!(!sc.executions().contains(&held_cmd));
    drop(sc);
}

async fn deployments_of_one_env_run_one_at_a_time(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    let _sc = cp
        .sidecar(FakeOptions {
            delay: Duration::from_millis(300),
            ..Default::default()
        })
        .await;
    cp.project("q").await;
    let d = cp.deploy("q", "alpha", COMPOSE).await;
    let env_id = d["deployment"]["EnvID"].as_str().unwrap().to_string();
    assert_eq!(
        cp.wait(&dep_id(&d)).await["deployment"]["Status"],
        "succeeded"
    );

    // A snapshot and a destroy back to back: the destroy waits, pending, for the snapshot.
    let (s, snap) = cp
        .post(&format!("/v1/envs/{env_id}/snapshot"), json!({}))
        .await;
    assert_eq!(s, 202);
    let (s, del) = cp.delete(&format!("/v1/envs/{env_id}")).await;
    assert_eq!(s, 202);
    let (_, queued) = cp.get(&format!("/v1/deployments/{}", dep_id(&del))).await;
    assert_eq!(queued["deployment"]["Status"], "pending", "{queued}");
    let snap = cp.wait(&dep_id(&snap)).await;
    let del = cp.wait(&dep_id(&del)).await;
    assert_eq!(snap["deployment"]["Status"], "succeeded");
    assert_eq!(del["deployment"]["Status"], "succeeded");
    assert!(
        snap["deployment"]["FinishedAt"].as_str().unwrap()
            <= phase(&del, "teardown")["StartedAt"].as_str().unwrap(),
        "destroy started before the snapshot ended"
    );
    let ev: Vec<(String, Value)> = events(&cp, &format!("env:{env_id}")).await;
    let order: Vec<String> = ev
        .iter()
        .map(|(k, b)| {
            format!(
                "{k}:{}",
                b.get("kind").or(b.get("status")).unwrap().as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        order,
        vec![
            "deployment.started:deploy",
            "deployment.finished:succeeded",
            "deployment.started:snapshot",
            "deployment.finished:succeeded",
            "deployment.started:destroy",
            "deployment.finished:succeeded",
        ]
    );
    // A destroyed environment refuses further work with 409.
    let (s, _) = cp
        .post(&format!("/v1/envs/{env_id}/snapshot"), json!({}))
        .await;
    assert_eq!(s, 409);
}

async fn target_sandboxes_are_placed_on_the_clouds_hosts(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    // A host outside any cloud (older, so it would win plain placement) ...
    let loose = cp.sidecar(FakeOptions::default()).await;
    // ... and one joined through the cloud "lab".
    let (s, c) = cp
        .post("/v1/clouds", json!({"provider": "manual", "name": "lab"}))
        .await;
    assert_eq!(s, 201, "{c}");
    let cloud_id = c["cloud"]["ID"].as_str().unwrap().to_string();
    let (s, tok) = cp
        .post("/v1/join-tokens", json!({"cloud_id": cloud_id}))
        .await;
    assert_eq!(s, 201, "{tok}");
    let lab = FakeSidecar::join(
        &cp.url,
        tok["token"].as_str().unwrap(),
        FakeOptions::default(),
    )
    .await
    .unwrap();
    let (s, c) = cp
        .post("/v1/clouds", json!({"provider": "manual", "name": "empty"}))
        .await;
    assert_eq!(s, 201, "{c}");

    let (s, sb) = cp
        .post(
            "/v1/targets/lab/sandboxes",
            json!({"image": "busybox:1.36"}),
        )
        .await;
    assert_eq!(s, 201, "{sb}");
    assert_eq!(sb["target"], "lab");
    assert_eq!(sb["environment"]["HostID"], lab.host_id());
    let (_, d) = cp.get(&format!("/v1/deployments/{}", dep_id(&sb))).await;
    assert_eq!(
        evidence(&d, "place"),
        &json!({"host": lab.host_id(), "reason": "target lab"})
    );
    assert!(loose.received().iter().all(|c| c.kind != "env.create"));

    let (s, e) = cp
        .post(
            "/v1/targets/empty/sandboxes",
            json!({"image": "busybox:1.36"}),
        )
        .await;
    assert_eq!(s, 502, "{e}");
    assert_eq!(
        e["error"],
        "place: target \"empty\" (manual): no connected host"
    );
    let (s, _) = cp
        .post(
            "/v1/targets/nowhere/sandboxes",
            json!({"image": "busybox:1.36"}),
        )
        .await;
    assert_eq!(s, 404);
    let (s, _) = cp
        .post(
            "/v1/targets/lab/sandboxes",
            json!({"from_version": "ver_x"}),
        )
        .await;
    assert_eq!(s, 400);
}

/// The destroy deployments of an environment, oldest first.
async fn destroys_of(cp: &Cp, env_id: &str) -> Vec<Value> {
    let (_, ds) = cp.get(&format!("/v1/envs/{env_id}/deployments")).await;
    let mut v: Vec<Value> = ds["deployments"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["Kind"] == "destroy")
        .cloned()
        .collect();
    v.reverse();
    v
}

/// Waits until the environment is `destroyed` (at most `secs`), returning its last
/// destroy deployment (final).
async fn wait_destroyed(cp: &Cp, env_id: &str, secs: u64) -> Value {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if cp.env(env_id).await["environment"]["Status"] == "destroyed" {
            let last = destroys_of(cp, env_id).await.pop().unwrap();
            return cp.wait(last["ID"].as_str().unwrap()).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "environment {env_id} not destroyed within {secs} s: {}",
        cp.env(env_id).await
    );
}

fn create_expiry(c: &v1::Command) -> String {
    match c.payload.as_ref().unwrap() {
        v1::command::Payload::EnvCreate(p) => p.expires_at.clone(),
        v1::command::Payload::EnvFork(p) => p.expires_at.clone(),
        other => panic!("not a create: {other:?}"),
    }
}

async fn ttls_destroy_with_reason_ttl_and_reach_the_host(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    let sc = cp.sidecar(FakeOptions::default()).await;

    for bad in [-1, 31_536_001] {
        let (s, e) = cp
            .post(
                "/v1/sandboxes",
                json!({"image": "busybox:1.36", "ttl_sec": bad}),
            )
            .await;
        assert_eq!(s, 400, "{e}");
        assert!(
            e.to_string().contains(&format!(
                "ttl_sec must be between 1 and 31536000 (365 days), got {bad}"
            )),
            "{e}"
        );
    }

    // A sandbox with a 3 s TTL: the expiry is on the environment and in env.create.
    let t0 = chrono::Utc::now();
    let (s, sb) = cp
        .post(
            "/v1/sandboxes",
            json!({"image": "busybox:1.36", "cmd": ["sleep", "infinity"], "ttl_sec": 3}),
        )
        .await;
    assert_eq!(s, 201, "{sb}");
    let env_id = sb["environment"]["ID"].as_str().unwrap().to_string();
    let exp = sb["environment"]["ExpiresAt"].as_str().unwrap().to_string();
    let at = chrono::DateTime::parse_from_rfc3339(&exp).unwrap();
    let d = at.with_timezone(&chrono::Utc) - t0;
    assert!(
        d >= chrono::Duration::seconds(2) && d <= chrono::Duration::seconds(4),
        "{exp}"
    );
    let create = sc
        .received()
        .into_iter()
        .find(|c| c.kind == "env.create" && c.env_id == env_id)
        .unwrap();
    assert_eq!(create_expiry(&create), exp);

    // It passes: a destroy deployment with reason ttl, torn down on the host.
    let d = wait_destroyed(&cp, &env_id, 15).await;
    assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
    assert_eq!(d["deployment"]["Params"], json!({"reason": "ttl"}));
    assert_eq!(phase(&d, "teardown")["Status"], "ok");
    assert!(sc
        .received()
        .iter()
        .any(|c| c.kind == "env.destroy" && c.env_id == env_id));
    assert!(!sc.environments().contains(&env_id));
    // Exactly one destroy, however many reaper passes saw it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(destroys_of(&cp, &env_id).await.len(), 1);

    // A fork with a TTL carries it to the host; the host's `env.expired` (it destroyed
    // the fork on its own) is recorded as a ttl destroy at once.
    cp.project("t").await;
    let dep = cp.deploy("t", "alpha", COMPOSE).await;
    let alpha = dep["deployment"]["EnvID"].as_str().unwrap().to_string();
    assert_eq!(
        cp.wait(&dep_id(&dep)).await["deployment"]["Status"],
        "succeeded"
    );
    assert_eq!(cp.env(&alpha).await["environment"]["ExpiresAt"], "");
    let (s, f) = cp
        .post(
            &format!("/v1/envs/{alpha}/fork"),
            json!({"name": "rollout", "ttl_sec": 3600}),
        )
        .await;
    assert_eq!(s, 202, "{f}");
    let fork = f["deployment"]["EnvID"].as_str().unwrap().to_string();
    assert_eq!(
        cp.wait(&dep_id(&f)).await["deployment"]["Status"],
        "succeeded"
    );
    let fexp = cp.env(&fork).await["environment"]["ExpiresAt"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!fexp.is_empty());
    let fc = sc
        .received()
        .into_iter()
        .find(|c| c.kind == "env.fork" && c.env_id == fork)
        .unwrap();
    assert_eq!(create_expiry(&fc), fexp);
    sc.send_event(v1::host_event::Event::EnvExpired(v1::EnvExpired {
        env_id: fork.clone(),
        expires_at: fexp.clone(),
    }))
    .await;
    let d = wait_destroyed(&cp, &fork, 10).await;
    assert_eq!(d["deployment"]["Params"], json!({"reason": "ttl"}));
    // The parent is untouched.
    assert_eq!(cp.env(&alpha).await["environment"]["Status"], "healthy");

    // A deploy with ttl_sec sets the TTL of an existing environment.
    let (s, d) = cp
        .post(
            "/v1/projects/t/deploy",
            json!({"env": "alpha", "compose": COMPOSE, "ttl_sec": 7200}),
        )
        .await;
    assert_eq!(s, 202, "{d}");
    cp.wait(&dep_id(&d)).await;
    let e = cp.env(&alpha).await;
    assert_ne!(e["environment"]["ExpiresAt"], "", "{e}");
    let last_create = sc
        .received()
        .into_iter()
        .rev()
        .find(|c| c.kind == "env.create" && c.env_id == alpha)
        .unwrap();
    assert_eq!(create_expiry(&last_create), e["environment"]["ExpiresAt"]);
}

async fn a_sandbox_whose_client_goes_away_is_destroyed(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    let sc = cp
        .sidecar(FakeOptions {
            delay: Duration::from_secs(2),
            ..Default::default()
        })
        .await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let r = impatient
        .post(format!("{}/v1/sandboxes", cp.url))
        .bearer_auth(KEY)
        .json(&json!({"image": "busybox:1.36", "name": "gone"}))
        .send()
        .await;
    assert!(r.is_err(), "the call answered within 500 ms: {r:?}");
    let (_, envs) = cp.get("/v1/envs?all=true").await;
    let env_id = envs["environments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["Name"] == "gone")
        .unwrap()["ID"]
        .as_str()
        .unwrap()
        .to_string();
    let d = wait_destroyed(&cp, &env_id, 20).await;
    assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
    assert_eq!(d["deployment"]["Params"], json!({"reason": "cancelled"}));
    // The create finished first (one deployment at a time), then the teardown ran.
    assert_eq!(phase(&d, "teardown")["Status"], "ok");
    assert!(sc
        .received()
        .iter()
        .any(|c| c.kind == "env.destroy" && c.env_id == env_id));
    assert!(!sc.environments().contains(&env_id));
}

/// A sandbox whose creation failed answers 502 without an environment, so nobody would
/// destroy what the host half made: the control plane does, with reason `failed`.
async fn a_sandbox_whose_create_failed_is_destroyed(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    let sc = cp
        .sidecar(
            FakeOptions::default().failing("env.create", "service \"main\" exited with code 1"),
        )
        .await;
    let (s, body) = cp
        .post(
            "/v1/sandboxes",
            json!({"image": "busybox:1.36", "name": "broken"}),
        )
        .await;
    assert_eq!(s, 502, "{body}");
    let (_, envs) = cp.get("/v1/envs?all=true").await;
    let env_id = envs["environments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["Name"] == "broken")
        .unwrap()["ID"]
        .as_str()
        .unwrap()
        .to_string();
    let d = wait_destroyed(&cp, &env_id, 20).await;
    assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
    assert_eq!(d["deployment"]["Params"], json!({"reason": "failed"}));
    assert!(sc
        .received()
        .iter()
        .any(|c| c.kind == "env.destroy" && c.env_id == env_id));
}

async fn a_host_report_marks_dead_environments_failed(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    let sc = cp.sidecar(FakeOptions::default()).await;
    cp.project("h").await;
    let mut ids = vec![];
    for name in ["kept", "dead", "gone"] {
        let d = cp.deploy("h", name, COMPOSE).await;
        ids.push(d["deployment"]["EnvID"].as_str().unwrap().to_string());
        assert_eq!(
            cp.wait(&dep_id(&d)).await["deployment"]["Status"],
            "succeeded"
        );
    }
    let (kept, dead, gone) = (&ids[0], &ids[1], &ids[2]);
    let died = "service \"db\" is not running (exited with code 137)";
    sc.send_event(report(&[kept, dead], &[(dead, died)])).await;
    for _ in 0..100 {
        if cp.env(gone).await["environment"]["Status"] == "failed"
            && cp.env(dead).await["environment"]["Status"] == "failed"
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cp.env(kept).await["environment"]["Status"], "healthy");
    assert_eq!(cp.env(dead).await["environment"]["Status"], "failed");
    assert_eq!(cp.env(gone).await["environment"]["Status"], "failed");
    let ev = events(&cp, &format!("env:{dead}")).await;
    let f = ev.iter().find(|(k, _)| k == "env.failed").unwrap();
    assert_eq!(
        f.1["reason"],
        "service \"db\" is not running (exited with code 137)"
    );
    let ev = events(&cp, &format!("env:{gone}")).await;
    let f = ev.iter().find(|(k, _)| k == "env.failed").unwrap();
    assert_eq!(
        f.1["reason"],
        format!("host {} no longer holds it", sc.host_id())
    );
    // Nothing live was destroyed.
    assert!(!sc.received().iter().any(|c| c.kind == "env.destroy"));
    // The report as `GET /v1/events` shows it on the host's subject: the same kind and
    // body as before the events were typed.
    let ev = events(&cp, &format!("host:{}", sc.host_id())).await;
    let r = ev.iter().rev().find(|(k, _)| k == "host.report").unwrap();
    assert_eq!(
        r.1,
        json!({"environments": [kept, dead], "failed": {dead.as_str(): died}})
    );
}

async fn build_contexts_travel_to_prepare_and_pin_the_tag(backend: Backend) {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    let sc = cp.sidecar(FakeOptions::default()).await;
    cp.project("b").await;
    let compose = "services:\n  main:\n    build: {context: ./app, args: {A: \"1\"}, target: run}\n    command: [sleep, infinity]\n  db:\n    image: busybox:1.36\n";
    let ctx = tar_of("Dockerfile", b"FROM busybox:1.36\n");

    // Over REST the context is base64 in the JSON body.
    let (s, d) = cp
        .post(
            "/v1/projects/b/deploy",
            json!({"compose": compose, "contexts": {"./app": b64(&ctx)}}),
        )
        .await;
    assert_eq!(s, 202, "{d}");
    let d = cp.wait(&dep_id(&d)).await;
    assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
    let build = sc
        .received()
        .into_iter()
        .find_map(|c| match c.payload {
            Some(v1::command::Payload::ImageBuild(b)) => Some(b),
            _ => None,
        })
        .expect("an image.build command");
    let want = denv_compose::Build {
        context: "./app".into(),
        dockerfile: "Dockerfile".into(),
        args: [("A".to_string(), "1".to_string())].into(),
        target: "run".into(),
        context_digest: denv_compose::context::digest(&ctx),
        scope: build.scope.clone(),
    };
    assert!(
        build.scope.starts_with("team_"),
        "the team scopes the build: {}",
        build.scope
    );
    assert_eq!(build.tag, want.tag());
    assert_eq!(build.context, ctx);
    assert_eq!(build.context_digest, want.context_digest);
    assert_eq!(
        (build.service.as_str(), build.target.as_str()),
        ("main", "run")
    );
    let create = sc
        .received()
        .into_iter()
        .find_map(|c| match c.payload {
            Some(v1::command::Payload::EnvCreate(e)) => Some(e),
            _ => None,
        })
        .unwrap();
    let main = create.services.iter().find(|s| s.name == "main").unwrap();
    assert_eq!(main.image, want.tag(), "env.create runs the built tag");
    let ev = evidence(&d, "prepare");
    let b = &ev["builds"]["main"];
    assert_eq!(b["tag"], want.tag());
    assert_eq!(b["image_id"], "sha256:fakebuild");
    assert_eq!(b["cached"], false);
    let cmd = b["command"].as_str().unwrap();
    assert!(cmd.starts_with("cmd_"), "{b}");
    assert_eq!(b["log"], format!("/v1/events?subject=cmd:{cmd}"));
    assert!(ev["builds"].get("db").is_none(), "db pulls its image");
    let env_id = d["deployment"]["EnvID"].as_str().unwrap().to_string();
    let (_, versions) = cp.get(&format!("/v1/envs/{env_id}/versions")).await;
    let spec = &versions["versions"][0]["Spec"];
    assert_eq!(spec["services"][1]["image"], want.tag(), "{spec}");
    assert_eq!(
        spec["builds"]["main"]["context_digest"],
        want.context_digest
    );

    // No context for a service without an image; a context nobody builds from; a bad tar.
    let (s, e) = cp
        .post("/v1/projects/b/deploy", json!({"compose": compose}))
        .await;
    assert_eq!(s, 400);
    assert_eq!(e["error"], "compose: service \"main\" builds from context \"./app\", but the deploy carries no build context for it (deploy with `denv deploy` or the Python package, which upload it)");
    let (s, e) = cp
        .post(
            "/v1/projects/b/deploy",
            json!({"compose": compose, "contexts": {"./app": b64(&ctx), "./x": b64(&ctx)}}),
        )
        .await;
    assert_eq!(s, 400);
    assert_eq!(
        e["error"],
        "build context \"./x\" is not the build context of any service"
    );
    // A raw header (the tar builder refuses `..` itself).
    let mut h = tar::Header::new_old();
    h.as_old_mut().name[..13].copy_from_slice(b"../Dockerfile");
    h.set_size(0);
    h.set_cksum();
    let mut evil = h.as_bytes().to_vec();
    evil.extend_from_slice(&[0u8; 1024]);
    let (s, e) = cp
        .post(
            "/v1/projects/b/deploy",
            json!({"compose": compose, "contexts": {"./app": b64(&evil)}}),
        )
        .await;
    assert_eq!(s, 400);
    assert_eq!(e["error"], "build context \"./app\" of service \"main\" has a member \"../Dockerfile\" outside the context");
}

async fn a_failed_build_fails_prepare_with_the_log_tail(backend: Backend) {
    use base64::Engine as _;
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    let sc = cp
        .sidecar(FakeOptions::default().failing(
            "image.build",
            "build of service \"main\" failed: The command '/bin/sh -c exit 3' returned a non-zero code: 3\nStep 2/2 : RUN exit 3\nboom",
        ))
        .await;
    cp.project("f").await;
    let ctx = tar_of("Dockerfile", b"FROM busybox:1.36\nRUN exit 3\n");
    let (s, d) = cp
        .post(
            "/v1/projects/f/deploy",
            json!({"compose": "services:\n  main: {build: .}\n",
                   "contexts": {".": base64::engine::general_purpose::STANDARD.encode(&ctx)}}),
        )
        .await;
    assert_eq!(s, 202, "{d}");
    let d = cp.wait(&dep_id(&d)).await;
    assert_eq!(d["deployment"]["Status"], "failed");
    assert_eq!(
        d["deployment"]["Error"],
        "prepare: build of service \"main\" failed: The command '/bin/sh -c exit 3' returned a non-zero code: 3"
    );
    let b = &evidence(&d, "prepare")["builds"]["main"];
    assert_eq!(b["failed"], true);
    assert_eq!(b["log_tail"], json!(["Step 2/2 : RUN exit 3", "boom"]));
    assert!(
        !sc.received().iter().any(|c| c.kind == "env.create"),
        "nothing is created after a failed build"
    );
}

/// A world whose promote gates run `inv` as their invariant.
fn promote_compose(inv: &str) -> String {
    format!(
        r#"
x-denv:
  promote:
    replay:
      forks: 3
      commands: [{{name: count, service: db, cmd: [count, orders]}}]
    invariants: [{{name: kept, service: db, cmd: [{inv}]}}]
services:
  db:
    image: redis:7-alpine
    volumes: ["rd:/data"]
volumes: {{ rd: {{}} }}
"#
    )
}

/// The fork payloads the fake received, in order: (env id, digest_volumes).
fn forks_received(sc: &FakeSidecar) -> Vec<(String, bool)> {
    sc.received()
        .into_iter()
        .filter_map(|c| match c.payload {
            Some(v1::command::Payload::EnvFork(f)) => Some((c.env_id, f.digest_volumes)),
            _ => None,
        })
        .collect()
}

async fn another_teams_versions_and_envs_are_404_to_sheet_and_promote(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    let _sc = cp.sidecar(FakeOptions::default()).await;
    cp.project("pm").await;
    let alpha = cp.deploy("pm", "alpha", &promote_compose("holds")).await;
    let alpha = cp.wait(&dep_id(&alpha)).await;
    let env = alpha["deployment"]["EnvID"].as_str().unwrap().to_string();
    let version = alpha["deployment"]["VersionID"]
        .as_str()
        .unwrap()
        .to_string();
    let other = other_team_key(&cp).await;
    let as_other = |m: reqwest::Method, path: String, body: Option<Value>| {
        let mut rb = cp
            .http
            .request(m, format!("{}{}", cp.url, path))
            .bearer_auth(&other);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        async move {
            let r = rb.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let get = reqwest::Method::GET;
    let post = reqwest::Method::POST;
    for path in [
        format!("/v1/versions/{version}/sheet"),
        format!("/v1/envs/{env}/sheet"),
    ] {
        let (s, b) = as_other(get.clone(), path.clone(), None).await;
        assert_eq!(s, 404, "{path}: {b}");
        assert!(!b.contains("alpha"), "{path}: {b}");
    }
    let (s, b) = as_other(
        post.clone(),
        "/v1/projects/pm/promote".into(),
        Some(json!({"from": "alpha", "to": "mine"})),
    )
    .await;
    assert_eq!(s, 404, "{b}");
    // Its own project, naming our environment and version.
    let (s, b) = as_other(
        post.clone(),
        "/v1/projects".into(),
        Some(json!({"name": "theirs", "kind": "rl-environment"})),
    )
    .await;
    assert!(s == 200 || s == 201, "{s} {b}");
    for body in [
        json!({"from": env, "to": "mine"}),
        json!({"from": env, "to": "mine", "version": version}),
    ] {
        let (s, b) = as_other(
            post.clone(),
            "/v1/projects/theirs/promote".into(),
            Some(body),
        )
        .await;
        assert_eq!(s, 404, "{b}");
    }
    // Our version is not theirs to read either way, and nothing was made for them.
    let (s, _) = cp.get(&format!("/v1/versions/{version}/sheet")).await;
    assert_eq!(s, 200);
}

async fn a_source_destroyed_during_the_gates_leaves_the_target_running(backend: Backend) {
    // The version's snapshot goes with its environment: apply must not tear the
    // target's stack down for a fork that cannot be made.
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    let sc = cp.sidecar(FakeOptions::default()).await;
    cp.project("pm").await;
    let soaked = "\nx-denv:\n  promote:\n    soak: 3s\nservices:\n  db:\n    image: redis:7-alpine\n    volumes: [\"rd:/data\"]\nvolumes: { rd: {} }\n";
    let alpha = cp.deploy("pm", "alpha", soaked).await;
    let alpha = cp.wait(&dep_id(&alpha)).await;
    let alpha_env = alpha["deployment"]["EnvID"].as_str().unwrap().to_string();
    let staging = cp.deploy("pm", "staging", soaked).await;
    let staging = cp.wait(&dep_id(&staging)).await;
    let staging_env = staging["deployment"]["EnvID"].as_str().unwrap().to_string();
    let staging_version = staging["deployment"]["VersionID"]
        .as_str()
        .unwrap()
        .to_string();
    let (s, d) = cp
        .post(
            "/v1/projects/pm/promote",
            json!({"from": "alpha", "to": "staging"}),
        )
        .await;
    assert_eq!(s, 202, "{d}");
    let held = dep_id(&d);
    for _ in 0..200 {
        let (_, d) = cp.get(&format!("/v1/deployments/{held}")).await;
        if phase(&d, "gate.soak")["Status"] == "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = cp.delete(&format!("/v1/envs/{alpha_env}")).await;
    assert_eq!(r.0, 202, "{}", r.1);
    cp.wait(&dep_id(&r.1)).await;
    let d = cp.wait(&held).await;
    assert_eq!(d["deployment"]["Status"], "failed", "{d}");
    assert_eq!(phase(&d, "apply")["Status"], "failed", "{d}");
    assert_eq!(evidence(&d, "verdict")["target_unchanged"], true, "{d}");
    let e = cp.env(&staging_env).await;
    assert_eq!(e["environment"]["Status"], "healthy", "{e}");
    assert_eq!(
        e["environment"]["CurrentVersionID"],
        staging_version.as_str()
    );
    assert!(
        sc.environments().contains(&staging_env),
        "the target's stack is gone"
    );
}

async fn promoting_a_version_into_the_environment_holding_its_snapshot_is_refused(
    backend: Backend,
) {
    // beta is a fresh fork of alpha: its current version is alpha's, whose snapshot
    // alpha holds. Promoting beta into alpha would tear alpha down (its snapshots with
    // it) and then fork the snapshot just destroyed.
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    let sc = cp.sidecar(FakeOptions::default()).await;
    cp.project("pm").await;
    let alpha = cp.deploy("pm", "alpha", &promote_compose("holds")).await;
    let alpha = cp.wait(&dep_id(&alpha)).await;
    let alpha_env = alpha["deployment"]["EnvID"].as_str().unwrap().to_string();
    let version = alpha["deployment"]["VersionID"]
        .as_str()
        .unwrap()
        .to_string();
    let (s, f) = cp
        .post(
            &format!("/v1/envs/{alpha_env}/fork"),
            json!({"name": "beta"}),
        )
        .await;
    assert_eq!(s, 202, "{f}");
    let f = cp.wait(&dep_id(&f)).await;
    assert_eq!(f["deployment"]["Status"], "succeeded", "{f}");
    let (s, e) = cp
        .post(
            "/v1/projects/pm/promote",
            json!({"from": "beta", "to": "alpha"}),
        )
        .await;
    assert_eq!(s, 400, "{e}");
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("holds the version's snapshot"),
        "{e}"
    );
    let a = cp.env(&alpha_env).await;
    assert_eq!(a["environment"]["Status"], "healthy", "{a}");
    assert_eq!(a["environment"]["CurrentVersionID"], version.as_str());
    assert!(sc.environments().contains(&alpha_env));
}

async fn restart_mid_promote_destroys_its_gate_forks_at_once(backend: Backend) {
    // A control plane killed while a promote's gate fork is being made: nobody will use
    // that fork again, so recovery destroys it instead of leaving it to its expiry
    // (7 x 15 minutes and the soak of running stack on the host).
    let dir = TestDb::fresh(backend).await;
    let mut cp = start(&dir).await;
    let sc = cp.sidecar(FakeOptions::default()).await;
    cp.project("pm").await;
    let alpha = cp.deploy("pm", "alpha", &promote_compose("holds")).await;
    let alpha = cp.wait(&dep_id(&alpha)).await;
    assert_eq!(alpha["deployment"]["Status"], "succeeded");
    sc.set_answering(false);
    let before = forks_received(&sc).len();
    let (s, d) = cp
        .post(
            "/v1/projects/pm/promote",
            json!({"from": "alpha", "to": "staging"}),
        )
        .await;
    assert_eq!(s, 202, "{d}");
    let held = dep_id(&d);
    let mut gate = String::new();
    for _ in 0..200 {
        if let Some((e, _)) = forks_received(&sc).get(before) {
            gate = e.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!gate.is_empty(), "no gate fork was sent");
    assert_eq!(cp.env(&gate).await["environment"]["Stage"], "gate");

    cp.kill();
    cp.restart(&[]).await;
    let d = cp.wait(&held).await;
    assert_eq!(d["deployment"]["Status"], "failed");
    assert_eq!(
        d["deployment"]["Error"],
        "control plane restarted during gate.fork; a promote's gates are not resumed: promote again"
    );
    let mut destroy = Value::Null;
    for _ in 0..100 {
        let (_, ds) = cp.get(&format!("/v1/envs/{gate}/deployments")).await;
        if let Some(x) = ds["deployments"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["Kind"] == "destroy")
        {
            destroy = cp.wait(x["ID"].as_str().unwrap()).await;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        destroy["deployment"]["Params"],
        json!({"reason": "abandoned"}),
        "{destroy}"
    );
    assert_eq!(cp.env(&gate).await["environment"]["Status"], "destroyed");
    drop(sc);
}

async fn promote_gates_then_replaces_the_target_and_a_failed_gate_leaves_it(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    let exec: ExecFn = std::sync::Arc::new(|x: &v1::EnvExec| v1::ExecOutput {
        exit_code: if x.cmd.first().map(String::as_str) == Some("broken") {
            1
        } else {
            0
        },
        stdout: x.cmd.join(" ") + "\n",
        ..Default::default()
    });
    let sc = cp
        .sidecar(FakeOptions {
            exec: Some(exec),
            ..Default::default()
        })
        .await;
    cp.project("pm").await;
    let alpha = cp.deploy("pm", "alpha", &promote_compose("holds")).await;
    let alpha = cp.wait(&dep_id(&alpha)).await;
    let alpha_env = alpha["deployment"]["EnvID"].as_str().unwrap().to_string();
    let version = alpha["deployment"]["VersionID"]
        .as_str()
        .unwrap()
        .to_string();
    let staging = cp.deploy("pm", "staging", &promote_compose("holds")).await;
    let staging = cp.wait(&dep_id(&staging)).await;
    let staging_env = staging["deployment"]["EnvID"].as_str().unwrap().to_string();
    let staging_version = staging["deployment"]["VersionID"]
        .as_str()
        .unwrap()
        .to_string();

    // Refusals before anything starts.
    let (s, e) = cp
        .post(
            "/v1/projects/pm/promote",
            json!({"from": "alpha", "to": "alpha"}),
        )
        .await;
    assert_eq!(
        (s, e["error"].as_str()),
        (400, Some("cannot promote environment alpha to itself")),
        "{e}"
    );
    let (s, e) = cp
        .post(
            "/v1/projects/pm/promote",
            json!({"from": "nope", "to": "staging"}),
        )
        .await;
    assert_eq!(s, 404, "{e}");
    let (s, e) = cp
        .post(
            "/v1/projects/pm/promote",
            json!({"from": "alpha", "to": ""}),
        )
        .await;
    assert_eq!(s, 400, "{e}");

    // A sound version.
    let before = forks_received(&sc).len();
    let (s, d) = cp
        .post(
            "/v1/projects/pm/promote",
            json!({"from": "alpha", "to": "staging"}),
        )
        .await;
    assert_eq!(s, 202, "{d}");
    assert_eq!(d["deployment"]["Kind"], "promote");
    assert_eq!(
        d["deployment"]["EnvID"],
        staging_env.as_str(),
        "the target's deployment"
    );
    let d = cp.wait(&dep_id(&d)).await;
    expect_phases(
        &d,
        &[
            ("gate.fork", "ok"),
            ("gate.consistency", "ok"),
            ("gate.replay", "ok"),
            ("gate.invariants", "ok"),
            ("gate.soak", "skipped"),
            ("apply", "ok"),
            ("verdict", "ok"),
        ],
    );
    let forks = forks_received(&sc)[before..].to_vec();
    // Gate forks (digested): the first, the second (consistency), two more for the
    // three replays; then the target itself, not digested.
    assert_eq!(forks.len(), 5, "{forks:?}");
    assert!(
        forks[..4].iter().all(|(e, d)| *d && *e != staging_env),
        "{forks:?}"
    );
    assert_eq!(forks[4], (staging_env.clone(), false));
    let ev = evidence(&d, "gate.consistency");
    assert_eq!(
        ev["datasets"]["rd"]["digest"],
        format!("sha256:{alpha_env}-{version}-rd")
    );
    let replay = evidence(&d, "gate.replay");
    assert_eq!(replay["identical"], true);
    assert_eq!(replay["forks"].as_array().unwrap().len(), 3);
    assert_eq!(
        replay["commands"][0]["outputs"][2]["stdout"],
        "count orders\n"
    );
    // The old stack went before the new one came: a destroy of the target precedes its fork.
    let kinds: Vec<(String, String)> = sc
        .received()
        .into_iter()
        .map(|c| (c.kind, c.env_id))
        .filter(|(_, e)| *e == staging_env)
        .collect();
    let n = kinds.len();
    assert_eq!(
        kinds[n - 2..].to_vec(),
        vec![
            ("env.destroy".to_string(), staging_env.clone()),
            ("env.fork".to_string(), staging_env.clone())
        ]
    );
    let e = cp.env(&staging_env).await;
    assert_eq!(e["environment"]["CurrentVersionID"], version.as_str());
    assert_eq!(e["environment"]["Status"], "healthy");
    // Staging's own version went with its old stack: retired, and refused as a fork.
    assert_eq!(
        evidence(&d, "verdict")["retired_versions"],
        json!([staging_version])
    );
    let (_, vs) = cp.get(&format!("/v1/envs/{staging_env}/versions")).await;
    assert_eq!(vs["versions"][0]["ID"], staging_version.as_str());
    assert_eq!(vs["versions"][0]["Healthy"], false);
    let (s, e) = cp
        .post(
            &format!("/v1/envs/{staging_env}/fork"),
            json!({"version": staging_version}),
        )
        .await;
    assert_eq!(s, 400, "{e}");
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("is not a healthy snapshot"),
        "{e}"
    );
    // Every gate fork was destroyed by the verdict.
    let gate_ids: Vec<String> = evidence(&d, "verdict")["gate_forks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(gate_ids.len(), 4);
    // (The verdict is recorded first; the teardown follows it.)
    for g in &gate_ids {
        let mut e = cp.env(g).await;
        for _ in 0..100 {
            if e["environment"]["Status"] == "destroyed" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            e = cp.env(g).await;
        }
        assert_eq!(e["environment"]["Status"], "destroyed", "{e}");
        assert_eq!(e["environment"]["Stage"], "gate", "{e}");
        assert!(
            !sc.environments().contains(g),
            "gate fork {g} still on the host"
        );
    }
    // The sheet shows the record.
    let (s, sheet) = cp.get(&format!("/v1/versions/{version}/sheet")).await;
    assert_eq!(s, 200, "{sheet}");
    assert_eq!(sheet["sheet"]["gates"]["status"], "succeeded");
    assert_eq!(sheet["sheet"]["gates"]["target"], "staging");
    assert_eq!(sheet["sheet"]["datasets"]["rd"]["files"], 1.0);
    assert_eq!(sheet["sheet"]["clock"], "real");
    assert_eq!(sheet["sheet"]["version"]["env_name"], "alpha");
    let (s, by_env) = cp.get(&format!("/v1/envs/{staging_env}/sheet")).await;
    assert_eq!(s, 200, "{by_env}");
    assert_eq!(by_env["sheet"]["version"]["id"], version.as_str());

    // A broken invariant: failed at gate.invariants, the target untouched.
    let bad = cp.deploy("pm", "bad", &promote_compose("broken")).await;
    let bad = cp.wait(&dep_id(&bad)).await;
    let bad_version = bad["deployment"]["VersionID"].as_str().unwrap().to_string();
    let sent_before = sc.received().len();
    let (s, d) = cp
        .post(
            "/v1/projects/pm/promote",
            json!({"from": "bad", "to": "staging"}),
        )
        .await;
    assert_eq!(s, 202, "{d}");
    let d = cp.wait(&dep_id(&d)).await;
    assert_eq!(d["deployment"]["Status"], "failed");
    assert_eq!(
        d["deployment"]["Error"],
        "gate.invariants: check \"kept\" failed (exit 1)"
    );
    expect_phases(
        &d,
        &[
            ("gate.fork", "ok"),
            ("gate.consistency", "ok"),
            ("gate.replay", "ok"),
            ("gate.invariants", "failed"),
            ("gate.soak", "skipped"),
            ("apply", "skipped"),
            ("verdict", "ok"),
        ],
    );
    assert_eq!(evidence(&d, "verdict")["target_unchanged"], true);
    let touched: Vec<String> = sc.received()[sent_before..]
        .iter()
        .filter(|c| c.env_id == staging_env)
        .map(|c| c.kind.clone())
        .collect();
    assert!(touched.is_empty(), "the target got {touched:?}");
    let e = cp.env(&staging_env).await;
    assert_eq!(e["environment"]["CurrentVersionID"], version.as_str());
    assert_ne!(staging_version, version);
    let (_, sheet) = cp.get(&format!("/v1/versions/{bad_version}/sheet")).await;
    assert_eq!(sheet["sheet"]["gates"]["status"], "failed");
    assert_eq!(sheet["sheet"]["gates"]["phases"][3]["status"], "failed");

    // A new target name: created, then runs the version.
    let (s, d) = cp
        .post(
            "/v1/projects/pm/promote",
            json!({"from": "alpha", "to": "prod"}),
        )
        .await;
    assert_eq!(s, 202, "{d}");
    let d = cp.wait(&dep_id(&d)).await;
    assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
    let prod = d["deployment"]["EnvID"].as_str().unwrap();
    let e = cp.env(prod).await;
    assert_eq!(e["environment"]["Name"], "prod");
    assert_eq!(e["environment"]["CurrentVersionID"], version.as_str());
}

/// The load a fake host reports: `memory_free_mb` free, 100000 MiB of disk, 1.5 CPUs.
fn load(memory_free_mb: u64) -> v1::HostLoad {
    v1::HostLoad {
        memory_free_mb,
        memory_total_mb: 24_000,
        disk_free_mb: 100_000,
        cpus: 1.5,
        ..Default::default()
    }
}

/// Returns once the control plane has handled every frame `sc` sent so far (its latest
/// load among them): an event sent after them is stored (one stream's frames are
/// handled in order).
async fn settled(cp: &Cp, sc: &FakeSidecar) {
    let mark = ulid::Ulid::new().to_string();
    // An `env.failed` for an environment nobody has: stored, nothing else done.
    let nobody = format!("env_settled{mark}");
    sc.send_event(v1::host_event::Event::EnvFailed(v1::EnvFailed {
        env_id: nobody.clone(),
        reason: mark.clone(),
    }))
    .await;
    let subject = format!("host:{}", sc.host_id());
    for _ in 0..200 {
        if events(cp, &subject)
            .await
            .iter()
            .any(|(k, b)| k == "env.failed" && b["env_id"] == nobody.as_str())
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "the control plane did not handle the frames of {}",
        sc.host_id()
    );
}

async fn new_environments_go_where_there_is_room_spread_and_fail_without_it(backend: Backend) {
    let dir = TestDb::fresh(backend).await;
    let cp = start(&dir).await;
    // The older host reports less free memory than the younger. Each command takes a
    // while, so the deploys of a group are under way together.
    let opts = |name: &str, free: u64| FakeOptions {
        hostname: name.into(),
        load: Some(load(free)),
        delay: Duration::from_millis(1500),
        ..Default::default()
    };
    // One after the other: a join's admission is a SQLite transaction that a concurrent
    // write (the other host's first heartbeat) can make fail with "database is locked"
    // (the sidecar retries that; the fake's join does not).
    let small = cp.sidecar(opts("small", 8192)).await;
    settled(&cp, &small).await;
    let roomy = cp.sidecar(opts("roomy", 10240)).await;
    settled(&cp, &roomy).await;
    let sandbox = |body: Value| {
        let cp = &cp;
        async move { cp.post("/v1/sandboxes", body).await }
    };

    // One sandbox (one service on the default caps: 2 CPUs, 4096 MiB): the roomier
    // host, though younger; the evidence names the need and what the host had free.
    let (s, sb) = sandbox(json!({"image": "busybox:1.36"})).await;
    assert_eq!(s, 201, "{sb}");
    assert_eq!(sb["environment"]["HostID"], roomy.host_id());
    let d = cp.wait(&dep_id(&sb)).await;
    assert_eq!(
        evidence(&d, "place"),
        &json!({
            "host": roomy.host_id(), "reason": "most room in team",
            "need": {"cpus": 2, "memory_mb": 4096, "largest_memory_mb": 4096, "disk_mb": 10240},
            "free": {"memory_mb": 10240, "disk_mb": 100000, "cpus": 1.5, "environments": 0},
        })
    );

    // Three at once: each placement counts the ones under way (roomy 10240, then small
    // 8192 against roomy's 6144 left, then roomy's 6144 against small's 4096), so the
    // group spreads instead of piling on the roomier host.
    let (a, b, c) = tokio::join!(
        sandbox(json!({"image": "busybox:1.36"})),
        sandbox(json!({"image": "busybox:1.36"})),
        sandbox(json!({"image": "busybox:1.36"})),
    );
    let mut on = BTreeSet::new();
    let mut counts = (0, 0);
    for (s, sb) in [a, b, c] {
        assert_eq!(s, 201, "{sb}");
        let host = sb["environment"]["HostID"].as_str().unwrap().to_string();
        if host == roomy.host_id() {
            counts.0 += 1;
        } else {
            assert_eq!(host, small.host_id());
            counts.1 += 1;
        }
        on.insert(dep_id(&sb));
    }
    assert_eq!(counts, (2, 1), "two on roomy, one on small");
    for dep in &on {
        assert_eq!(cp.wait(dep).await["deployment"]["Status"], "succeeded");
    }

    // The figures are kept current: roomy now reports little free memory, so the next
    // environment goes to small.
    roomy.report_load(load(5000)).await;
    settled(&cp, &roomy).await;
    let (s, sb) = sandbox(json!({"image": "busybox:1.36"})).await;
    assert_eq!(s, 201, "{sb}");
    assert_eq!(sb["environment"]["HostID"], small.host_id());

    // More memory than any host has free (though within their size): a sandbox is 503
    // before anything is made, naming the need and each host's free figures ...
    let want = format!(
        "no host has capacity for 2 CPUs, 12288 MiB memory, 10240 MiB disk: \
         {} (small): 8192 MiB memory, 100000 MiB disk free; \
         {} (roomy): 5000 MiB memory, 100000 MiB disk free",
        small.host_id(),
        roomy.host_id()
    );
    let (s, e) =
        sandbox(json!({"image": "busybox:1.36", "name": "huge", "resources": {"memory": "12g"}}))
            .await;
    assert_eq!(s, 503, "{e}");
    assert_eq!(e["error"], want);
    let (_, envs) = cp.get("/v1/envs?all=true").await;
    assert!(
        !envs.to_string().contains("\"huge\""),
        "nothing made for a refused sandbox: {envs}"
    );
    // ... and a deploy fails its place phase with the same message.
    cp.project("p").await;
    let d = cp
        .deploy(
            "p",
            "huge",
            "services:\n  app:\n    image: busybox:1.36\n    mem_limit: 12g\n",
        )
        .await;
    let d = cp.wait(&dep_id(&d)).await;
    assert_eq!(d["deployment"]["Status"], "failed");
    assert_eq!(d["deployment"]["Error"], format!("place: {want}"));
    assert_eq!(phase(&d, "place")["Status"], "failed");
    let ev = evidence(&d, "place");
    assert_eq!(ev["need"]["memory_mb"], 12288);
    assert_eq!(ev["hosts"][1]["memory_free_mb"], 5000);
    assert!(small
        .received()
        .iter()
        .chain(roomy.received().iter())
        .all(|c| c.env_id != d["deployment"]["EnvID"].as_str().unwrap()));
}
