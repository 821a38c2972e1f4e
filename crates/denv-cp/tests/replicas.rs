//! Several `denv-cp` replicas on one PostgreSQL (`docs/explanation/replicas.md`): two
//! real binaries with replica URLs and one secret, the fake sidecar connected to one of
//! them. The PostgreSQL tests are ignored without `--include-ignored`
//! (`DENV_TEST_POSTGRES_DSN`; `just unit` runs them).

use denv_proto::v1::{self, relay_client::RelayClient};
use denv_testkit::{free_port, Backend, CpBinary as Cp, FakeOptions, FakeSidecar, Start, TestDb};
use sea_orm::{ConnectionTrait, Statement};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::{Duration, Instant};

const KEY: &str = "dak_replicas_test_0123456789abcdef";
const SECRET: &str = "replica-secret-for-tests";

const COMPOSE: &str = r#"
services:
  box:
    image: busybox:1.36
    command: ["sleep", "infinity"]
"#;

/// A replica over `db` with its URL and the shared secret; the lease TTL is 3 s so a
/// takeover happens within seconds.
async fn replica(db: &TestDb, name: &str, extra: &[(&str, &str)]) -> Cp {
    let port = free_port();
    let mut s = Start::new(env!("CARGO_BIN_EXE_denv-cp"), db)
        .key(KEY)
        .port(port)
        .log_name(&format!("{name}.log"))
        .env("DENV_REPLICA_URL", format!("http://127.0.0.1:{port}"))
        .env("DENV_REPLICA_SECRET", SECRET)
        .env("DENV_LEASE_TTL", "3s");
    for (k, v) in extra {
        s = s.env(k, *v);
    }
    Cp::start(s).await
}

fn dep_id(d: &Value) -> String {
    d["deployment"]["ID"].as_str().unwrap().to_string()
}

/// Waits until `cp` lists `host_id` as connected (a replica learns of the hosts the
/// others hold with its heartbeat, every 2 s).
async fn sees_host(cp: &Cp, host_id: &str) {
    for _ in 0..200 {
        let (_, hs) = cp.get("/v1/hosts").await;
        let found = hs["hosts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|h| h["ID"] == host_id && h["connected"] == true);
        if found {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, hs) = cp.get("/v1/hosts").await;
    panic!(
        "{} never saw {host_id} connected: {hs}\n{}",
        cp.url,
        cp.log_text()
    );
}

async fn store(db: &TestDb) -> sea_orm::DatabaseConnection {
    sea_orm::Database::connect(db.dsn.as_str()).await.unwrap()
}

async fn strings(
    db: &sea_orm::DatabaseConnection,
    sql: &str,
    args: Vec<sea_orm::Value>,
) -> Vec<String> {
    db.query_all(Statement::from_sql_and_values(
        db.get_database_backend(),
        sql,
        args,
    ))
    .await
    .unwrap()
    .iter()
    .map(|r| r.try_get_by_index::<String>(0).unwrap())
    .collect()
}

async fn progress_events(cp: &Cp, command_id: &str) -> usize {
    let (s, e) = cp
        .get(&format!("/v1/events?subject=cmd:{command_id}"))
        .await;
    assert_eq!(s, 200, "{e}");
    e["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["Kind"] == "progress")
        .count()
}

fn creates(sc: &FakeSidecar, env_id: &str) -> Vec<String> {
    sc.received()
        .into_iter()
        .filter(|c| c.kind == "env.create" && c.env_id == env_id)
        .map(|c| c.command_id)
        .collect()
}

/// (1) A deploy started through replica A reaches the host on replica B, finishes, and
/// its commands are recorded once (by B); an exec through A answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: DENV_TEST_POSTGRES_DSN (just unit starts one)"]
async fn a_deploy_through_one_replica_reaches_a_host_on_the_other() {
    let db = TestDb::fresh(Backend::Postgres).await;
    let a = replica(&db, "a", &[]).await;
    let b = replica(&db, "b", &[]).await;
    let sc = b.sidecar(FakeOptions::default()).await;
    sees_host(&a, sc.host_id()).await;
    a.project("p").await;
    let d = a.deploy("p", "alpha", COMPOSE).await;
    let d = a.wait(&dep_id(&d)).await;
    assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
    let env_id = d["deployment"]["EnvID"].as_str().unwrap().to_string();
    let ids = creates(&sc, &env_id);
    assert_eq!(ids.len(), 1, "{ids:?}");
    // The holder recorded the command's progress lines, once.
    assert_eq!(progress_events(&a, &ids[0]).await, 2);
    let conn = store(&db).await;
    let rows = strings(
        &conn,
        "SELECT status FROM commands WHERE id = $1",
        vec![ids[0].clone().into()],
    )
    .await;
    assert_eq!(rows, vec!["done".to_string()]);
    assert!(b.log_text().contains("host connected"));
    assert!(!a.log_text().contains("host connected"), "the host is B's");

    let (s, x) = a
        .post(
            &format!("/v1/envs/{env_id}/exec"),
            json!({"service": "box", "cmd": ["echo", "hi"]}),
        )
        .await;
    assert_eq!(s, 200, "{x}");
    assert_eq!(x["stdout"], "echo hi\n", "{x}");
    assert_eq!(x["exit_code"], 0, "{x}");
    for cp in [&a, &b] {
        let log = cp.log_text();
        assert!(!log.contains("replica heartbeat failed"), "{log}");
    }
}

/// (2) Replica A is killed (SIGKILL) while its deploy waits on a host command relayed
/// to B: B takes the lease over within the TTL and resumes the deploy under the same
/// command id; one outcome, one `env.create` command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: DENV_TEST_POSTGRES_DSN (just unit starts one)"]
async fn a_killed_replicas_deploy_is_taken_over_under_the_same_command_id() {
    let db = TestDb::fresh(Backend::Postgres).await;
    let mut a = replica(&db, "a", &[]).await;
    let b = replica(&db, "b", &[]).await;
    let sc = b.sidecar(FakeOptions::default()).await;
    sees_host(&a, sc.host_id()).await;
    a.project("p").await;
    sc.set_answering(false);
    let d = a.deploy("p", "alpha", COMPOSE).await;
    let held = dep_id(&d);
    let env_id = d["deployment"]["EnvID"].as_str().unwrap().to_string();
    for _ in 0..200 {
        if !creates(&sc, &env_id).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = creates(&sc, &env_id);
    assert_eq!(first.len(), 1, "env.create reached the host via B");
    let conn = store(&db).await;
    let a_id = strings(
        &conn,
        "SELECT id FROM replicas WHERE url = $1",
        vec![a.url.clone().into()],
    )
    .await;
    let leased_by = strings(
        &conn,
        "SELECT replica_id FROM leases WHERE deployment_id = $1",
        vec![held.clone().into()],
    )
    .await;
    assert_eq!(leased_by, a_id, "A runs its deploy");

    a.kill();
    let killed = Instant::now();
    sc.set_answering(true);
    // B resumes: the command goes to the host again, under its id.
    for _ in 0..400 {
        if creates(&sc, &env_id).len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let took = killed.elapsed();
    let again = creates(&sc, &env_id);
    assert_eq!(again.len(), 2, "resent once; B log:\n{}", b.log_text());
    println!("takeover: the command reached the host again {took:?} after the SIGKILL (TTL 3s)");
    // The TTL (3 s), a takeover look (every 1 s) and the resume: well under 3 TTLs.
    assert!(took < Duration::from_secs(9), "took {took:?}");
    let d = b.wait(&held).await;
    assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
    let ids: HashSet<String> = creates(&sc, &env_id).into_iter().collect();
    assert_eq!(ids.len(), 1, "one command id before and after: {ids:?}");
    let rows = strings(
        &conn,
        "SELECT id FROM commands WHERE env_id = $1 AND id LIKE $2",
        vec![env_id.clone().into(), format!("cmd_{held}_%").into()],
    )
    .await;
    let unique: HashSet<&String> = rows.iter().collect();
    assert_eq!(unique.len(), rows.len());
    assert!(rows.contains(&first[0]), "{rows:?}");
    let b_id = strings(
        &conn,
        "SELECT id FROM replicas WHERE url = $1",
        vec![b.url.clone().into()],
    )
    .await;
    assert_ne!(b_id, a_id);
    // The lease is gone with the runner.
    let left = strings(
        &conn,
        "SELECT replica_id FROM leases WHERE deployment_id = $1",
        vec![held.clone().into()],
    )
    .await;
    assert!(left.is_empty(), "{left:?}");
    assert!(b.log_text().contains("resuming an interrupted deployment"));
}

/// (3) The relay refuses a wrong secret (and none) with UNAUTHENTICATED; the right one
/// is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: DENV_TEST_POSTGRES_DSN (just unit starts one)"]
async fn the_relay_refuses_a_wrong_secret() {
    let db = TestDb::fresh(Backend::Postgres).await;
    let a = replica(&db, "a", &[]).await;
    let call = |bearer: Option<&'static str>| {
        let url = a.url.clone();
        async move {
            let mut client = RelayClient::connect(url).await.unwrap();
            let mut req = tonic::Request::new(v1::RelayRequest {
                team_id: "team_x".into(),
                host_id: "host_nope".into(),
                command: Some(v1::Command {
                    command_id: "cmd_relay_test".into(),
                    kind: "host.report".into(),
                    env_id: String::new(),
                    payload: Some(v1::command::Payload::HostReport(Default::default())),
                }),
                timeout_ms: 1000,
                ..Default::default()
            });
            if let Some(b) = bearer {
                req.metadata_mut()
                    .insert("authorization", b.parse().unwrap());
            }
            match client.send(req).await {
                Err(s) => Err(s.code()),
                Ok(r) => {
                    let mut st = r.into_inner();
                    Ok(st.message().await.unwrap().unwrap())
                }
            }
        }
    };
    assert_eq!(
        call(Some("Bearer wrong-secret")).await.unwrap_err(),
        tonic::Code::Unauthenticated
    );
    assert_eq!(call(None).await.unwrap_err(), tonic::Code::Unauthenticated);
    let f = call(Some("Bearer replica-secret-for-tests")).await.unwrap();
    match f.frame {
        Some(v1::relay_frame::Frame::Result(r)) => {
            assert_eq!(r.error_kind, "unknown_host", "{r:?}");
            assert!(r.before_recorded);
        }
        other => panic!("{other:?}"),
    }
}

/// (4) Replica mode on SQLite exits 2 naming why; without replica mode the relay is
/// not served at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_mode_on_sqlite_exits_2_and_the_relay_is_off_without_it() {
    let db = TestDb::sqlite();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_denv-cp"))
        .args(["-addr", "127.0.0.1:0", "-db"])
        .arg(db.path())
        .env("DENV_REPLICA_URL", "http://127.0.0.1:1")
        .env("DENV_REPLICA_SECRET", SECRET)
        .env_remove("DENV_DB")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("replica mode (-replica-url/DENV_REPLICA_URL) needs PostgreSQL"),
        "{err}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_denv-cp"))
        .args(["-addr", "127.0.0.1:0", "-db", "postgres://x@127.0.0.1:1/x"])
        .env("DENV_REPLICA_URL", "http://127.0.0.1:1")
        .env_remove("DENV_REPLICA_SECRET")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("replica mode needs both"));

    let cp = Cp::start(Start::new(env!("CARGO_BIN_EXE_denv-cp"), &db).key(KEY)).await;
    let mut client = RelayClient::connect(cp.url.clone()).await.unwrap();
    let mut req = tonic::Request::new(v1::RelayRequest::default());
    req.metadata_mut()
        .insert("authorization", format!("Bearer {SECRET}").parse().unwrap());
    let code = client.send(req).await.unwrap_err().code();
    assert_eq!(code, tonic::Code::Unimplemented);
}

/// (5) A second replica started while the first runs a deployment does not take it:
/// the lease stays the first's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: DENV_TEST_POSTGRES_DSN (just unit starts one)"]
async fn a_second_replica_does_not_take_a_running_deployment() {
    let db = TestDb::fresh(Backend::Postgres).await;
    let a = replica(&db, "a", &[]).await;
    let sc = a.sidecar(FakeOptions::default()).await;
    a.project("p").await;
    sc.set_answering(false);
    let d = a.deploy("p", "alpha", COMPOSE).await;
    let held = dep_id(&d);
    let env_id = d["deployment"]["EnvID"].as_str().unwrap().to_string();
    for _ in 0..200 {
        if !creates(&sc, &env_id).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(creates(&sc, &env_id).len(), 1);
    let b = replica(&db, "b", &[]).await;
    let conn = store(&db).await;
    let a_id = strings(
        &conn,
        "SELECT id FROM replicas WHERE url = $1",
        vec![a.url.clone().into()],
    )
    .await;
    // Three lease TTLs: A renews every second, B looks every second.
    sees_host(&b, sc.host_id()).await;
    tokio::time::sleep(Duration::from_secs(9)).await;
    let leased_by = strings(
        &conn,
        "SELECT replica_id FROM leases WHERE deployment_id = $1",
        vec![held.clone().into()],
    )
    .await;
    assert_eq!(leased_by, a_id);
    let log = b.log_text();
    assert!(!log.contains("resuming an interrupted deployment"), "{log}");
    assert!(!log.contains("recovered unfinished deployments"), "{log}");
    assert_eq!(creates(&sc, &env_id).len(), 1, "nothing re-sent");
    let (_, now) = b.get(&format!("/v1/deployments/{held}")).await;
    assert_eq!(now["deployment"]["Status"], "running", "{now}");
}

/// Waits until the fake has received an `env.create` for `env_id`.
async fn create_reached(sc: &FakeSidecar, env_id: &str) {
    for _ in 0..200 {
        if !creates(sc, env_id).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no env.create for {env_id} reached the host");
}

/// (6) SIGTERM: after its drain a replica lets go of its leases, so another takes its
/// deployment over at its next look, long before the lease would have expired (TTL 30 s
/// here; the others look every 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: DENV_TEST_POSTGRES_DSN (just unit starts one)"]
async fn a_stopped_replica_releases_its_leases_after_the_drain() {
    let db = TestDb::fresh(Backend::Postgres).await;
    let slow = [("DENV_LEASE_TTL", "30s"), ("DENV_DRAIN", "1")];
    let mut a = replica(&db, "a", &slow).await;
    let b = replica(&db, "b", &slow).await;
    let sc = b.sidecar(FakeOptions::default()).await;
    sees_host(&a, sc.host_id()).await;
    a.project("p").await;
    sc.set_answering(false);
    let d = a.deploy("p", "alpha", COMPOSE).await;
    let held = dep_id(&d);
    let env_id = d["deployment"]["EnvID"].as_str().unwrap().to_string();
    create_reached(&sc, &env_id).await;

    a.stop();
    let stopped = Instant::now();
    assert!(a.wait_exit(Duration::from_secs(20)).await.is_some());
    let log = a.log_text();
    assert!(log.contains("leases released leases=1"), "{log}");
    sc.set_answering(true);
    let d = b.wait_for(&held, Duration::from_secs(60)).await;
    let took = stopped.elapsed();
    assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
    println!("takeover after SIGTERM: {took:?} (TTL 30s, looks every 10s)");
    assert!(
        took < Duration::from_secs(25),
        "took {took:?}: the lease was not released"
    );
    let ids: HashSet<String> = creates(&sc, &env_id).into_iter().collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
}

/// (7) Deployments of one environment run one at a time across replicas: a deploy
/// accepted by B while A runs one of the same environment waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: DENV_TEST_POSTGRES_DSN (just unit starts one)"]
async fn one_deployment_of_an_environment_at_a_time_across_replicas() {
    let db = TestDb::fresh(Backend::Postgres).await;
    let a = replica(&db, "a", &[]).await;
    let b = replica(&db, "b", &[]).await;
    let sc = b.sidecar(FakeOptions::default()).await;
    sees_host(&a, sc.host_id()).await;
    a.project("p").await;
    sc.set_answering(false);
    let first = a.deploy("p", "alpha", COMPOSE).await;
    let first_id = dep_id(&first);
    let env_id = first["deployment"]["EnvID"].as_str().unwrap().to_string();
    create_reached(&sc, &env_id).await;

    let second = b.deploy("p", "alpha", COMPOSE).await;
    let second_id = dep_id(&second);
    assert_eq!(second["deployment"]["EnvID"], env_id.as_str());
    for _ in 0..200 {
        if b.log_text()
            .contains("waiting for a deployment of the environment on another replica")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = b.log_text();
    assert!(
        log.contains("waiting for a deployment of the environment on another replica"),
        "{log}"
    );
    let (_, now) = b.get(&format!("/v1/deployments/{second_id}")).await;
    assert_eq!(now["deployment"]["Status"], "pending", "{now}");
    let prefix = format!("cmd_{second_id}_");
    assert!(
        !sc.received()
            .iter()
            .any(|c| c.command_id.starts_with(&prefix)),
        "the second deploy sent nothing yet"
    );

    // The host comes back answering: the open command is sent again and answered.
    sc.set_answering(true);
    let sc = sc.reconnect_same(&b.url).await.unwrap();
    let one = a.wait(&first_id).await;
    let two = b.wait(&second_id).await;
    assert_eq!(one["deployment"]["Status"], "succeeded", "{one}");
    assert_eq!(two["deployment"]["Status"], "succeeded", "{two}");
    let first_end = one["deployment"]["FinishedAt"].as_str().unwrap();
    let second_start = two["phases"][0]["StartedAt"].as_str().unwrap();
    assert!(
        first_end <= second_start,
        "the second started at {second_start}, before the first ended at {first_end}"
    );
    assert!(sc
        .received()
        .iter()
        .any(|c| c.command_id.starts_with(&prefix)));
}

/// Reads JSON lines from a streaming response until `done` holds for the lines so far,
/// or the response ends.
async fn read_lines(resp: &mut reqwest::Response, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let mut lines = vec![];
    let mut buf = Vec::new();
    while !done(&lines) {
        let chunk = tokio::time::timeout(Duration::from_secs(30), resp.chunk())
            .await
            .expect("a chunk within 30 s")
            .unwrap();
        let Some(chunk) = chunk else { break };
        buf.extend_from_slice(&chunk);
        while let Some(i) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            if line.len() > 1 {
                lines.push(serde_json::from_slice(&line[..line.len() - 1]).unwrap());
            }
        }
    }
    lines
}

/// (8) Streamed output through the relay: `env.logs` asked on A for a host on B comes
/// back line by line; a follow whose caller leaves A is cancelled on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: DENV_TEST_POSTGRES_DSN (just unit starts one)"]
async fn logs_stream_through_the_relay_and_a_follow_is_cancelled_when_its_caller_leaves() {
    let db = TestDb::fresh(Backend::Postgres).await;
    let a = replica(&db, "a", &[]).await;
    let b = replica(&db, "b", &[]).await;
    let sc = b.sidecar(FakeOptions::default()).await;
    sees_host(&a, sc.host_id()).await;
    a.project("p").await;
    let d = a.deploy("p", "alpha", COMPOSE).await;
    let d = a.wait(&dep_id(&d)).await;
    assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
    let env = d["deployment"]["EnvID"].as_str().unwrap().to_string();
    let url = |q: &str| format!("{}/v1/envs/{env}/logs{q}", a.url);

    let mut r = a
        .http
        .get(url("?tail=2"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let lines = read_lines(&mut r, |_| false).await;
    let box_lines: Vec<String> = lines
        .iter()
        .filter(|l| l["service"] == "box")
        .map(|l| {
            format!(
                "{}:{}",
                l["stream"].as_str().unwrap(),
                l["line"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        box_lines,
        vec![
            "stdout:box line 1",
            "stdout:box line 2",
            "stdout:web | forged by box",
            "stderr:box oops"
        ],
        "{lines:?}"
    );

    let mut r = a
        .http
        .get(url("?follow=true&tail=1"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    let lines = read_lines(&mut r, |ls| {
        ls.iter()
            .any(|l| l["line"].as_str().unwrap_or("").ends_with(" live"))
    })
    .await;
    assert!(lines.iter().any(|l| l["line"] == "box live"), "{lines:?}");
    let follow: Vec<String> = sc
        .received()
        .iter()
        .filter(|c| matches!(&c.payload, Some(v1::command::Payload::EnvLogs(l)) if l.follow))
        .map(|c| c.command_id.clone())
        .collect();
    assert_eq!(follow.len(), 1);
    let cancelled = |sc: &FakeSidecar| {
        sc.received().iter().any(|c| {
            matches!(&c.payload, Some(v1::command::Payload::CommandCancel(x)) if x.command_id == follow[0])
        })
    };
    assert!(!cancelled(&sc), "still following");
    drop(r);
    for _ in 0..200 {
        if cancelled(&sc) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(cancelled(&sc), "the follow was not cancelled on the host");
    let conn = store(&db).await;
    let err = strings(
        &conn,
        "SELECT error FROM commands WHERE id = $1",
        vec![follow[0].clone().into()],
    )
    .await;
    assert_eq!(err, vec!["cancelled: the caller left".to_string()]);
}

/// (9) Two replicas started at the same moment on an empty database both come up: they
/// migrate and bootstrap one after the other (one team, one schema).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: DENV_TEST_POSTGRES_DSN (just unit starts one)"]
async fn replicas_started_together_on_an_empty_database_migrate_in_turn() {
    let db = TestDb::fresh(Backend::Postgres).await;
    let (a, b) = tokio::join!(replica(&db, "a", &[]), replica(&db, "b", &[]));
    let conn = store(&db).await;
    let teams = strings(&conn, "SELECT id FROM teams", vec![]).await;
    assert_eq!(teams.len(), 1, "{teams:?}");
    let urls = strings(&conn, "SELECT url FROM replicas ORDER BY url", vec![]).await;
    let mut want = vec![a.url.clone(), b.url.clone()];
    want.sort();
    assert_eq!(urls, want);
    let (s, _) = b.get("/v1/projects").await;
    assert_eq!(s, 200);
}

/// (10) The device flow needs no particular replica: a code made on A, approved on B,
/// is handed out once by A, and the key works on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: DENV_TEST_POSTGRES_DSN (just unit starts one)"]
async fn a_device_login_approved_on_one_replica_is_picked_up_on_the_other() {
    let db = TestDb::fresh(Backend::Postgres).await;
    let dev = [("DENV_DEV_LOGIN", "1")];
    let a = replica(&db, "a", &dev).await;
    let b = replica(&db, "b", &dev).await;
    let (st, d) = a.call("POST", "/v1/device/code", None, None, &[]).await;
    assert_eq!(st, 200, "{d}");
    let dc = d["device_code"].as_str().unwrap().to_string();
    let uc = d["user_code"].as_str().unwrap().to_string();
    let (st, v) = b
        .call(
            "POST",
            "/auth/dev-login",
            None,
            Some(json!({"email": "dev@example.com"})),
            &[],
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let sess = v["token"].as_str().unwrap().to_string();
    let (_, me) = b.get_as("/v1/me", &sess).await;
    let team = me["team"]["ID"].as_str().unwrap().to_string();
    let (st, ap) = b
        .post_as(
            "/v1/device/approve",
            &sess,
            json!({"user_code": uc, "team_id": team}),
        )
        .await;
    assert_eq!(st, 200, "{ap}");
    let token = |cp: &Cp| {
        let (url, http, dc) = (cp.url.clone(), cp.http.clone(), dc.clone());
        async move {
            let r = http
                .post(format!("{url}/v1/device/token"))
                .json(&json!({"device_code": dc}))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (st, t) = token(&a).await;
    assert_eq!(st, 200, "{t}");
    let key = t["api_key"].as_str().unwrap().to_string();
    let (st, _) = token(&b).await;
    assert_eq!(st, 410, "handed out once, across replicas");
    for cp in [&a, &b] {
        let (st, me) = cp.get_as("/v1/me", &key).await;
        assert_eq!(st, 200, "{me}");
        assert_eq!(me["team"]["ID"], team.as_str());
    }
}

/// (11) The replica holding the host dies while a relayed command is open: the host
/// dials again, to the replica that asked, which sends the command again under its id
/// (the row is still open) and the waiting deploy gets its result from the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: DENV_TEST_POSTGRES_DSN (just unit starts one)"]
async fn a_relayed_command_survives_the_death_of_the_replica_holding_the_host() {
    let db = TestDb::fresh(Backend::Postgres).await;
    let a = replica(&db, "a", &[]).await;
    let mut b = replica(&db, "b", &[]).await;
    let sc = b.sidecar(FakeOptions::default()).await;
    sees_host(&a, sc.host_id()).await;
    a.project("p").await;
    sc.set_answering(false);
    let d = a.deploy("p", "alpha", COMPOSE).await;
    let held = dep_id(&d);
    let env_id = d["deployment"]["EnvID"].as_str().unwrap().to_string();
    create_reached(&sc, &env_id).await;

    b.kill();
    let sc = sc.reconnect_same(&a.url).await.unwrap();
    let d = a.wait(&held).await;
    assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
    let ids: HashSet<String> = creates(&sc, &env_id).into_iter().collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let log = a.log_text();
    assert!(
        log.contains("relay broke; watching the command's row"),
        "{log}"
    );
    assert!(log.contains("re-sending open command"), "{log}");
}
