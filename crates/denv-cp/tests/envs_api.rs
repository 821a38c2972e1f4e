//! `GET /v1/envs` (environments across projects), `DELETE /v1/projects/{project}` and
//! `GET /v1/envs/{env}/logs`, end to end: the real `denv-cp` binary on a fresh SQLite
//! file and on a fresh Postgres database, with the fake sidecar speaking the real host
//! stream to it. Every test runs on both backends (`sqlite::…`, `postgres::…`). The
//! engine's side of `env.logs` is tested in `crates/denvd/tests/runtime_logs.rs`.

use denv_proto::v1::{self, environment_service_client::EnvironmentServiceClient};
use denv_testkit::{on_both_backends, Backend, CpBinary, FakeOptions, FakeSidecar, Start, TestDb};
use serde_json::{json, Value};
use std::time::Duration;

const KEY: &str = "dak_envs_api_test_key_0123456789";

const COMPOSE: &str = r#"
services:
  db:
    image: redis:7-alpine
  box:
    image: busybox:1.36
    command: ["sleep", "infinity"]
"#;

on_both_backends!(
    env_list_spans_projects_and_validates_its_filters,
    project_delete_is_refused_while_envs_live_and_forced_through_destroys,
    logs_are_attributed_by_command_bounded_and_a_follow_is_cancelled_on_the_host,
    exec_to_a_service_the_version_lacks_is_refused_before_the_host,
    exec_past_its_timeout_answers_504_and_deadline_exceeded,
    a_host_failure_answers_the_status_of_its_code,
);

struct T {
    _db: TestDb,
    cp: CpBinary,
    sidecar: FakeSidecar,
}

async fn start(backend: Backend) -> T {
    let db = TestDb::fresh(backend).await;
    let cp = CpBinary::start(Start::new(env!("CARGO_BIN_EXE_denv-cp"), &db).key(KEY)).await;
    let sidecar = cp.sidecar(FakeOptions::default()).await;
    T {
        _db: db,
        cp,
        sidecar,
    }
}

impl T {
    async fn get(&self, path: &str) -> (u16, Value) {
        self.cp.get(path).await
    }

    async fn delete(&self, path: &str) -> (u16, Value) {
        self.cp.delete(path).await
    }

    /// Creates the project; returns the id of its first environment.
    async fn project(&self, name: &str) -> String {
        let (s, v) = self.cp.post("/v1/projects", json!({ "name": name })).await;
        assert_eq!(s, 201, "{v}");
        v["environments"][0]["ID"].as_str().unwrap().to_string()
    }

    /// Deploys COMPOSE to the project's alpha and waits for `succeeded`.
    async fn deploy(&self, project: &str) {
        let (s, v) = self
            .cp
            .post(
                &format!("/v1/projects/{project}/deploy"),
                json!({ "compose": COMPOSE }),
            )
            .await;
        assert_eq!(s, 202, "{v}");
        let dep = v["deployment"]["ID"].as_str().unwrap().to_string();
        assert_eq!(self.wait(&dep).await, "succeeded");
    }

    async fn wait(&self, dep: &str) -> String {
        let d = self.cp.wait(dep).await;
        d["deployment"]["Status"].as_str().unwrap().to_string()
    }

    async fn channel(&self) -> tonic::transport::Channel {
        self.cp.channel().await
    }
}

fn authed<M>(m: M) -> tonic::Request<M> {
    let mut r = tonic::Request::new(m);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {KEY}").parse().unwrap());
    r
}

fn ids(v: &Value) -> Vec<String> {
    v["environments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["ID"].as_str().unwrap().to_string())
        .collect()
}

async fn env_list_spans_projects_and_validates_its_filters(backend: Backend) {
    let t = start(backend).await;
    let a = t.project("alpha-world").await;
    let b = t.project("beta-world").await;
    t.deploy("alpha-world").await;

    let (s, v) = t.get("/v1/envs").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        ids(&v),
        vec![a.clone(), b.clone()],
        "oldest first, across projects"
    );
    let ea = &v["environments"][0];
    assert_eq!(ea["Name"], "alpha");
    assert_eq!(ea["Project"], "alpha-world");
    assert_eq!(ea["Status"], "healthy");
    assert!(ea["CurrentVersionID"].as_str().unwrap().starts_with("ver_"));
    assert!(ea["ProjectID"].as_str().unwrap().starts_with("prj_"));
    let eb = &v["environments"][1];
    assert_eq!(eb["Project"], "beta-world");
    assert_eq!(eb["Status"], "pending");
    assert_eq!(eb["CurrentVersionID"], "");

    // Filters: a project by name or id, a status.
    let (_, v) = t.get("/v1/envs?project=beta-world").await;
    assert_eq!(ids(&v), vec![b.clone()]);
    let pid = ea["ProjectID"].as_str().unwrap().to_string();
    let (_, v) = t.get(&format!("/v1/envs?project={pid}")).await;
    assert_eq!(ids(&v), vec![a.clone()]);
    let (_, v) = t.get("/v1/envs?status=healthy").await;
    assert_eq!(ids(&v), vec![a.clone()]);
    let (_, v) = t.get("/v1/envs?status=healthy&project=beta-world").await;
    assert!(ids(&v).is_empty());

    // Refusals name the problem and the allowed values.
    let (s, v) = t.get("/v1/envs?status=running").await;
    assert_eq!(s, 400);
    assert_eq!(
        v["error"],
        "unknown status \"running\": use one of pending, deploying, healthy, failed, destroying, destroyed"
    );
    let (s, v) = t.get("/v1/envs?project=nope").await;
    assert_eq!(s, 404);
    assert_eq!(v["error"], "project nope not found");
    let (s, v) = t.get("/v1/envs?all=perhaps").await;
    assert_eq!(s, 400);
    assert_eq!(v["error"], "invalid all \"perhaps\": use true or false");
    let (s, _) = t.cp.get_as("/v1/envs", "dak_wrong").await;
    assert_eq!(s, 401);

    // Destroyed environments only with all or status=destroyed.
    let (s, v) = t.delete(&format!("/v1/envs/{a}")).await;
    assert_eq!(s, 202, "{v}");
    assert_eq!(
        t.wait(v["deployment"]["ID"].as_str().unwrap()).await,
        "succeeded"
    );
    let (_, v) = t.get("/v1/envs").await;
    assert_eq!(ids(&v), vec![b.clone()]);
    let (_, v) = t.get("/v1/envs?all=true").await;
    assert_eq!(ids(&v), vec![a.clone(), b.clone()]);
    let (_, v) = t.get("/v1/envs?status=destroyed").await;
    assert_eq!(ids(&v), vec![a.clone()]);

    // gRPC answers the same.
    let mut g = EnvironmentServiceClient::new(t.channel().await);
    let r = g
        .list_all_envs(authed(v1::ListAllEnvsRequest {
            project: String::new(),
            status: String::new(),
            all: true,
        }))
        .await
        .unwrap()
        .into_inner();
    let got: Vec<_> = r.environments.iter().map(|e| e.id.clone()).collect();
    assert_eq!(got, vec![a, b]);
    let e = g
        .list_all_envs(authed(v1::ListAllEnvsRequest {
            status: "ok".into(),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
}

async fn project_delete_is_refused_while_envs_live_and_forced_through_destroys(backend: Backend) {
    let t = start(backend).await;
    let env = t.project("doomed").await;
    let other = t.project("kept").await;
    t.deploy("doomed").await;
    t.deploy("kept").await;

    let (s, v) = t.delete("/v1/projects/doomed").await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(
        v["error"],
        format!(
            "project doomed has 1 environment(s) that are not destroyed: alpha ({env}, healthy); destroy them first or pass force"
        )
    );
    // Nothing was touched.
    let (_, v) = t.get("/v1/envs").await;
    assert_eq!(ids(&v), vec![env.clone(), other.clone()]);
    let destroys = |sc: &FakeSidecar| {
        sc.received()
            .iter()
            .filter(|c| c.kind == "env.destroy")
            .map(|c| c.env_id.clone())
            .collect::<Vec<_>>()
    };
    assert!(destroys(&t.sidecar).is_empty());

    let (s, v) = t.delete("/v1/projects/doomed?force=maybe").await;
    assert_eq!(s, 400, "{v}");

    // force: each environment through its normal destroy deployment, then the record.
    let (s, v) = t.delete("/v1/projects/doomed?force=true").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["deleted"], true);
    assert_eq!(v["project"]["Name"], "doomed");
    let d = &v["destroyed"][0];
    assert_eq!(d["Kind"], "destroy");
    assert_eq!(d["Status"], "succeeded");
    assert_eq!(d["EnvID"], env.as_str());
    assert_eq!(d["Params"]["reason"], "project deleted");
    assert_eq!(
        destroys(&t.sidecar),
        vec![env.clone()],
        "the host tore it down"
    );

    // Gone from every list; the other project untouched; the name is free again.
    let (_, v) = t.get("/v1/projects").await;
    let names: Vec<_> = v["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["Name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, vec!["kept"]);
    let (_, v) = t.get("/v1/envs?all=true").await;
    assert_eq!(ids(&v), vec![other.clone()]);
    let (s, _) = t.get(&format!("/v1/envs/{env}")).await;
    assert_eq!(s, 404);
    let (s, _) = t.delete("/v1/projects/doomed").await;
    assert_eq!(s, 404);
    let again = t.project("doomed").await;
    assert_ne!(again, env);

    // A project whose environments are all destroyed is deleted without force; one
    // whose alpha was never deployed (pending) is live and refused.
    let (s, v) = t.delete("/v1/projects/doomed").await;
    assert_eq!(s, 409, "a pending alpha is not destroyed: {v}");
    let (s, v) = t.delete(&format!("/v1/envs/{other}")).await;
    assert_eq!(s, 202);
    t.wait(v["deployment"]["ID"].as_str().unwrap()).await;
    let (s, v) = t.delete("/v1/projects/kept").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["destroyed"], json!([]));
}

/// Reads JSON lines from a streaming response until `done` holds for the lines so far
/// (at most 20 s); returns them.
async fn read_lines(resp: &mut reqwest::Response, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let mut lines = vec![];
    let mut buf = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done(&lines) {
        let chunk = tokio::time::timeout_at(deadline, resp.chunk())
            .await
            .expect("lines in time")
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

fn texts(lines: &[Value], service: &str) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l["service"] == service)
        .map(|l| {
            format!(
                "{}:{}",
                l["stream"].as_str().unwrap(),
                l["line"].as_str().unwrap()
            )
        })
        .collect()
}

async fn exec_to_a_service_the_version_lacks_is_refused_before_the_host(backend: Backend) {
    let t = start(backend).await;
    let env = t.project("shelly").await;
    t.deploy("shelly").await;
    let want = format!("unknown service \"web\": the services of {env} are box, db");
    for path in ["exec", "exec/stream"] {
        let (s, v) =
            t.cp.post_as(
                &format!("/v1/envs/{env}/{path}"),
                KEY,
                json!({"service": "web", "cmd": ["true"]}),
            )
            .await;
        assert_eq!(s, 400, "{path}: {v}");
        assert_eq!(v["error"], want.as_str(), "{path}");
    }
    let mut g = EnvironmentServiceClient::new(t.channel().await);
    let err = g
        .exec_stream(authed(v1::ExecRequest {
            env: env.clone(),
            service: "web".into(),
            cmd: vec!["true".into()],
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(err.message(), want);
    // Nothing reached the host; a service the version has does.
    let execs = |t: &T| {
        t.sidecar
            .received()
            .iter()
            .filter(|c| matches!(&c.payload, Some(v1::command::Payload::EnvExec(_))))
            .count()
    };
    assert_eq!(execs(&t), 0);
    let (s, v) =
        t.cp.post_as(
            &format!("/v1/envs/{env}/exec"),
            KEY,
            json!({"service": "box", "cmd": ["true"]}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(execs(&t), 1);
}

/// The host acks an exec and never answers: past `timeout_sec` + 10 s the hub gives up,
/// and every way in says so with the hub's own status (504 / `DEADLINE_EXCEEDED`), not
/// as a host that refused the command (502).
async fn exec_past_its_timeout_answers_504_and_deadline_exceeded(backend: Backend) {
    let t = start(backend).await;
    let env = t.project("sleepy").await;
    t.deploy("sleepy").await;
    t.sidecar.set_answering(false);
    let req = v1::ExecRequest {
        env: env.clone(),
        service: "box".into(),
        cmd: vec!["sleep".into(), "60".into()],
        timeout_sec: 1,
        ..Default::default()
    };
    let want = "timed out after 11s";
    let rest = async {
        t.cp.post_as(
            &format!("/v1/envs/{env}/exec"),
            KEY,
            json!({"service": "box", "cmd": ["sleep", "60"], "timeout_sec": 1}),
        )
        .await
    };
    let grpc = async {
        let mut g = EnvironmentServiceClient::new(t.channel().await);
        g.exec(authed(req.clone())).await.unwrap_err()
    };
    let stream = async {
        use futures::StreamExt;
        let mut g = EnvironmentServiceClient::new(t.channel().await);
        let mut s = g
            .exec_stream(authed(req.clone()))
            .await
            .unwrap()
            .into_inner();
        loop {
            match s.next().await {
                Some(Ok(c)) => assert!(c.result.is_none(), "a result from a silent host"),
                Some(Err(e)) => return e,
                None => panic!("the stream ended without the hub's error"),
            }
        }
    };
    let client = async {
        let c = denv_client::Client::connect(&t.cp.url, Some(KEY), None).unwrap();
        c.exec(req.clone()).await.unwrap_err()
    };
    let started = std::time::Instant::now();
    let ((s, v), g, st, c) = tokio::join!(rest, grpc, stream, client);
    assert!(started.elapsed() >= Duration::from_secs(11));
    assert_eq!(s, 504, "{v}");
    assert_eq!(v["error"], want);
    for e in [&g, &st] {
        assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");
        assert_eq!(e.message(), want);
        assert_eq!(e.metadata().get("x-denv-http-status").unwrap(), "504");
    }
    assert_eq!(c.code, tonic::Code::DeadlineExceeded);
    assert_eq!(c.http_status, Some(504));
    assert_eq!(c.message, want);

    // A refusal by the host is still the host's error, 502.
    t.sidecar.set_answering(true);
    t.sidecar
        .set_failing("env.exec", Some("service box is paused"));
    let (s, v) =
        t.cp.post_as(
            &format!("/v1/envs/{env}/exec"),
            KEY,
            json!({"service": "box", "cmd": ["true"]}),
        )
        .await;
    assert_eq!(s, 502, "{v}");
    assert_eq!(v["error"], "service box is paused");

    // A host without a stream is refused at once: 502 / UNAVAILABLE, naming the host.
    let host = t.sidecar.host_id().to_string();
    let _parked = t.sidecar.disconnect().await;
    for _ in 0..100 {
        let (_, v) = t.cp.get(&format!("/v1/envs/{env}")).await;
        if v["connected"] == false {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let want = format!("host {host} is not connected");
    let (s, v) =
        t.cp.post_as(
            &format!("/v1/envs/{env}/exec"),
            KEY,
            json!({"service": "box", "cmd": ["true"]}),
        )
        .await;
    assert_eq!(s, 502, "{v}");
    assert_eq!(v["error"], want.as_str());
    let c = denv_client::Client::connect(&t.cp.url, Some(KEY), None).unwrap();
    let e = c.exec(req).await.unwrap_err();
    assert_eq!(
        (e.code, e.http_status),
        (tonic::Code::Unavailable, Some(502))
    );
    assert_eq!(e.message, want);
}

/// What the sidecar answers a failed command with carries a code, and the code picks the
/// status (mapped once, `crates/denv-cp/src/error.rs`): an exec on an environment its host
/// does not hold (the host came back without it) is `404` / `NOT_FOUND`, not `502`; the
/// other codes answer 409, 413, 400, 503, and a plain failure stays 502. The message is
/// the sidecar's, verbatim.
async fn a_host_failure_answers_the_status_of_its_code(backend: Backend) {
    let T { _db, cp, sidecar } = {
        let t = start(backend).await;
        let _ = t.project("amnesia").await;
        t.deploy("amnesia").await;
        t
    };
    let (s, v) = cp.get("/v1/projects/amnesia/envs").await;
    assert_eq!(s, 200, "{v}");
    let env = v["environments"][0]["ID"].as_str().unwrap().to_string();
    // The host restarts with nothing of it (a fresh fake under the same identity).
    let id = sidecar.disconnect().await.identity();
    let sidecar = FakeSidecar::reconnect(&cp.url, &id, FakeOptions::default())
        .await
        .unwrap();
    assert!(sidecar.environments().is_empty());
    for _ in 0..100 {
        if cp.get(&format!("/v1/envs/{env}")).await.1["connected"] == true {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = json!({"service": "box", "cmd": ["true"]});
    let want = format!("environment {env} not found");
    let (s, v) = cp
        .post_as(&format!("/v1/envs/{env}/exec"), KEY, body.clone())
        .await;
    assert_eq!((s, v["error"].as_str()), (404, Some(want.as_str())), "{v}");
    let req = v1::ExecRequest {
        env: env.clone(),
        service: "box".into(),
        cmd: vec!["true".into()],
        ..Default::default()
    };
    let mut g = EnvironmentServiceClient::new(cp.channel().await);
    let e = g.exec(authed(req.clone())).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (tonic::Code::NotFound, want.as_str())
    );
    assert_eq!(e.metadata().get("x-denv-http-status").unwrap(), "404");
    let c = denv_client::Client::connect(&cp.url, Some(KEY), None).unwrap();
    let e = c.exec(req).await.unwrap_err();
    assert_eq!(
        (e.code, e.http_status, e.message.as_str()),
        (tonic::Code::NotFound, Some(404), want.as_str())
    );

    // Every code, as the host answers it.
    use v1::HostErrorCode as H;
    for (code, msg, status) in [
        (H::Conflict, "snapshot \"s1\" of env_x already exists", 409),
        (H::TooLarge, "/big: archive larger than 32 MiB", 413),
        (
            H::Invalid,
            "exec: workdir \"w\" must be an absolute path",
            400,
        ),
        (H::Unavailable, "docker: connection refused", 503),
        (H::Failed, "service \"box\" of env_x is paused", 502),
        (H::Unspecified, "an older sidecar's error", 502),
    ] {
        sidecar.set_failing_with("env.exec", code, msg);
        let (s, v) = cp
            .post_as(&format!("/v1/envs/{env}/exec"), KEY, body.clone())
            .await;
        assert_eq!(
            (s, v["error"].as_str()),
            (status, Some(msg)),
            "{code:?}: {v}"
        );
    }
}

async fn logs_are_attributed_by_command_bounded_and_a_follow_is_cancelled_on_the_host(
    backend: Backend,
) {
    let t = start(backend).await;
    let env = t.project("chatty").await;
    let (s, v) = t.get(&format!("/v1/envs/{env}/logs")).await;
    assert_eq!(s, 409, "nothing deployed yet: {v}");
    t.deploy("chatty").await;

    let url = |q: &str| format!("{}/v1/envs/{env}/logs{q}", t.cp.url);
    let http = &t.cp.http;
    let mut r = http
        .get(url("?tail=2"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let lines = read_lines(&mut r, |_| false).await;
    // Each service's own lines, split at newlines, a piece without one joined to the
    // rest; the forged `web | …` line is box's, whatever it says.
    assert_eq!(
        texts(&lines, "box"),
        vec![
            "stdout:box line 1",
            "stdout:box line 2",
            "stdout:web | forged by box",
            "stderr:box oops"
        ]
    );
    assert_eq!(
        texts(&lines, "db"),
        vec!["stdout:db line 1", "stdout:db line 2", "stderr:db oops"]
    );
    assert_eq!(lines.len(), 7, "{lines:?}");
    assert!(lines
        .iter()
        .all(|l| l["timestamp"] == "" && l["truncated"] == false));
    // The host got one env.logs per service, with the bounds.
    let sent: Vec<v1::EnvLogs> = t
        .sidecar
        .received()
        .iter()
        .filter_map(|c| match &c.payload {
            Some(v1::command::Payload::EnvLogs(l)) => Some(l.clone()),
            _ => None,
        })
        .collect();
    let mut svcs: Vec<_> = sent.iter().map(|l| l.service.clone()).collect();
    svcs.sort();
    assert_eq!(svcs, vec!["box", "db"]);
    assert!(sent
        .iter()
        .all(|l| l.tail == 2 && !l.follow && l.max_bytes == 8 << 20));

    // One service; the default tail is 100.
    let mut r = http
        .get(url("?service=box"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    let lines = read_lines(&mut r, |_| false).await;
    assert!(lines.iter().all(|l| l["service"] == "box"));
    assert_eq!(lines.len(), 5, "{lines:?}");

    // Refusals before any line, as JSON errors naming the problem.
    for (q, status, msg) in [
        (
            "?service=web",
            400,
            format!("unknown service \"web\": the services of {env} are box, db"),
        ),
        (
            "?tail=lots",
            400,
            "invalid tail \"lots\": use a number of lines".to_string(),
        ),
        (
            "?tail=10001",
            400,
            "invalid tail 10001: use 1..10000 lines, 0 for the default 100, or -1 for none"
                .to_string(),
        ),
        (
            "?follow=sometimes",
            400,
            "invalid follow \"sometimes\": use true or false".to_string(),
        ),
    ] {
        let (s, v) = t.get(&format!("/v1/envs/{env}/logs{q}")).await;
        assert_eq!(s, status, "{q}: {v}");
        assert_eq!(v["error"], msg.as_str(), "{q}");
    }
    let (s, _) = t.get("/v1/envs/env_nope/logs").await;
    assert_eq!(s, 404);

    // A follow streams the backlog and the live lines, and stays open; when the caller
    // leaves, the host is told to stop each command.
    let mut r = http
        .get(url("?follow=true&tail=1"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    let lines = read_lines(&mut r, |ls| {
        ls.iter()
            .filter(|l| l["line"].as_str().unwrap_or("").ends_with(" live"))
            .count()
            == 2
    })
    .await;
    assert!(texts(&lines, "db").contains(&"stdout:db live".to_string()));
    assert!(texts(&lines, "box").contains(&"stdout:box live".to_string()));
    let follows: Vec<String> = t
        .sidecar
        .received()
        .iter()
        .filter(|c| matches!(&c.payload, Some(v1::command::Payload::EnvLogs(l)) if l.follow))
        .map(|c| c.command_id.clone())
        .collect();
    assert_eq!(follows.len(), 2);
    let cancels = |sc: &FakeSidecar| {
        let mut v: Vec<String> = sc
            .received()
            .iter()
            .filter_map(|c| match &c.payload {
                Some(v1::command::Payload::CommandCancel(x)) => Some(x.command_id.clone()),
                _ => None,
            })
            .collect();
        v.sort();
        v
    };
    assert!(cancels(&t.sidecar).is_empty(), "still following");
    drop(r);
    let mut want = follows.clone();
    want.sort();
    let mut got = vec![];
    for _ in 0..200 {
        got = cancels(&t.sidecar);
        if got.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(got, want, "each follow cancelled on the host");

    // gRPC: the same entries; tail -1 without follow is nothing at all.
    let mut g = EnvironmentServiceClient::new(t.channel().await);
    let mut s = g
        .logs(authed(v1::LogsRequest {
            env: env.clone(),
            service: "db".into(),
            tail: 1,
            follow: false,
            timestamps: false,
        }))
        .await
        .unwrap()
        .into_inner();
    let mut got = vec![];
    while let Some(e) = s.message().await.unwrap() {
        got.push(format!("{}:{}:{}", e.service, e.stream, e.line));
    }
    assert_eq!(got, vec!["db:stdout:db line 1", "db:stderr:db oops"]);
    let mut s = g
        .logs(authed(v1::LogsRequest {
            env: env.clone(),
            tail: -1,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(s.message().await.unwrap().is_none());

    // A destroyed environment has no logs to read.
    let (_, v) = t.delete(&format!("/v1/envs/{env}")).await;
    t.wait(v["deployment"]["ID"].as_str().unwrap()).await;
    let (s, v) = t.get(&format!("/v1/envs/{env}/logs")).await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(v["error"], format!("environment {env} is destroyed"));
}
