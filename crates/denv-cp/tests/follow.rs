//! `GET /v1/deployments/{id}/events` against a real stack: the real `denv-cp` binary
//! (SQLite in a temp dir) and the real `denvd` binary (dir storage) on this machine's
//! Docker engine. The stream is read while deployments run, followers join at staggered
//! moments of a deploy (the window between the first state and the live ones), and a
//! finished deployment is replayed. Needs Docker and `target/<profile>/denvd`.

use denv_testkit::{require_docker, CpBinary, Denvd, Start, TestDb};
use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};

const KEY: &str = "dak_follow_test_0123456789abcdef";

const COMPOSE: &str = r#"
services:
  box:
    image: busybox:1.36
    command: ["sleep", "1000000"]
    volumes: ["w:/work"]
    healthcheck:
      test: ["CMD", "true"]
      interval: 1s
  side:
    image: busybox:1.36
    command: ["sleep", "1000000"]
    depends_on: { box: { condition: service_healthy } }
volumes: { w: {} }
"#;

struct Stack {
    url: String,
    http: reqwest::Client,
    // Dropped in order: denvd first, then the control plane.
    denvd: Denvd,
    cp: CpBinary,
}

async fn start() -> Stack {
    require_docker();
    let db = TestDb::sqlite();
    let cp = CpBinary::start(Start::new(env!("CARGO_BIN_EXE_denv-cp"), &db).key(KEY)).await;
    let denvd = Denvd::join(&cp.url, &cp.join_token().await, db.path());
    let stack = Stack {
        url: cp.url.clone(),
        http: cp.http.clone(),
        denvd,
        cp: cp.holding(db),
    };
    for _ in 0..300 {
        let (_, hs) = stack.call("GET", "/v1/hosts", None).await;
        if hs["hosts"][0]["connected"] == true {
            return stack;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("denvd did not join: {}", stack.logs());
}

impl Stack {
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.cp.call(method, path, Some(KEY), body, &[]).await
    }

    fn logs(&self) -> String {
        format!(
            "--- cp.log\n{}\n--- denvd.log\n{}",
            self.cp.log_text(),
            self.denvd.log_text()
        )
    }
}

/// One item of a followed stream, with when it arrived.
#[derive(Debug, Clone)]
struct Item {
    event: String,
    id: String,
    data: Value,
    at: Instant,
}

/// What a follower read: the items and the response's content type.
#[derive(Debug)]
struct Followed {
    content_type: String,
    items: Vec<Item>,
    ended_at: Instant,
}

/// Reads `GET /v1/deployments/{dep}/events` (SSE, or JSON lines with `jsonl`) to its end.
/// Panics when the stream is still open after `limit`.
async fn follow(url: &str, dep: &str, jsonl: bool, limit: Duration) -> Followed {
    let mut req = reqwest::Client::new()
        .get(format!("{url}/v1/deployments/{dep}/events"))
        .bearer_auth(KEY);
    if jsonl {
        req = req.header("accept", "application/x-ndjson");
    }
    let mut r = req.send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let content_type = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let mut buf = String::new();
    let mut items = Vec::new();
    let deadline = Instant::now() + limit;
    loop {
        let chunk = tokio::time::timeout_at(deadline.into(), r.chunk())
            .await
            .unwrap_or_else(|_| panic!("stream of {dep} still open after {limit:?}: {items:?}"))
            .unwrap();
        let Some(chunk) = chunk else { break };
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
        let sep = if jsonl { "\n" } else { "\n\n" };
        while let Some(i) = buf.find(sep) {
            let block: String = buf.drain(..i + sep.len()).collect();
            let at = Instant::now();
            if jsonl {
                let line = block.trim();
                if line.is_empty() {
                    continue;
                }
                let data: Value = serde_json::from_str(line).unwrap();
                let event = if data.get("error").is_some() {
                    "error"
                } else {
                    "deployment"
                };
                items.push(Item {
                    event: event.into(),
                    id: String::new(),
                    data,
                    at,
                });
            } else {
                let (mut event, mut id, mut data) = (String::new(), String::new(), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().into();
                    } else if let Some(v) = line.strip_prefix("id:") {
                        id = v.trim().into();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if event.is_empty() && data.is_empty() {
                    continue; // keep-alive comment
                }
                items.push(Item {
                    event,
                    id,
                    data: serde_json::from_str(&data).unwrap(),
                    at,
                });
            }
        }
    }
    Followed {
        content_type,
        items,
        ended_at: Instant::now(),
    }
}

fn status(state: &Value) -> &str {
    state["deployment"]["Status"].as_str().unwrap()
}

fn is_final(s: &str) -> bool {
    matches!(s, "succeeded" | "failed" | "rolled_back")
}

fn phase_rank(s: &str) -> u8 {
    match s {
        "pending" => 0,
        "running" => 1,
        "ok" | "failed" | "skipped" => 2,
        other => panic!("unknown phase status {other}"),
    }
}

fn dep_rank(s: &str) -> u8 {
    match s {
        "pending" => 0,
        "running" => 1,
        s if is_final(s) => 2,
        other => panic!("unknown deployment status {other}"),
    }
}

/// The rules every followed stream keeps: only `deployment` items; SSE ids 1, 2, …;
/// consecutive states differ; no status (deployment or phase) goes back and an ended
/// phase never changes again; the last state is final and equals `GET`; nothing after it.
fn check_stream(f: &Followed, get: &Value, sse: bool) {
    assert!(!f.items.is_empty(), "no state at all");
    for (i, it) in f.items.iter().enumerate() {
        assert_eq!(it.event, "deployment", "item {i}: {:?}", it.data);
        if sse {
            assert_eq!(it.id, (i + 1).to_string());
        }
        if i > 0 {
            assert_ne!(
                it.data,
                f.items[i - 1].data,
                "item {i} repeats the previous state"
            );
            let (prev, cur) = (&f.items[i - 1].data, &it.data);
            assert!(dep_rank(status(cur)) >= dep_rank(status(prev)));
            let (pp, cp) = (
                prev["phases"].as_array().unwrap(),
                cur["phases"].as_array().unwrap(),
            );
            assert_eq!(pp.len(), cp.len(), "the phase list changed");
            for (a, b) in pp.iter().zip(cp) {
                assert_eq!(a["Name"], b["Name"]);
                let (sa, sb) = (a["Status"].as_str().unwrap(), b["Status"].as_str().unwrap());
                assert!(phase_rank(sb) >= phase_rank(sa), "{a} went back to {b}");
                if phase_rank(sa) == 2 {
                    assert_eq!(a, b, "an ended phase changed");
                }
            }
        }
    }
    let last = &f.items.last().unwrap().data;
    assert!(is_final(status(last)), "stream ended before a final status");
    assert_eq!(last, get, "the last state differs from GET");
    for p in last["phases"].as_array().unwrap() {
        assert_eq!(phase_rank(p["Status"].as_str().unwrap()), 2, "{p}");
    }
}

async fn get_dep(s: &Stack, dep: &str) -> Value {
    let (code, d) = s.call("GET", &format!("/v1/deployments/{dep}"), None).await;
    assert_eq!(code, 200, "{d}");
    d
}

#[tokio::test]
#[ignore = "needs Docker and target/<profile>/denvd (cargo build -p denvd); run with --include-ignored"]
async fn follow_a_deployment_live_replayed_and_as_json_lines() {
    let s = start().await;
    let limit = Duration::from_secs(300);

    // Refusals come before any stream, as ordinary JSON errors.
    let (code, body) = s.call("GET", "/v1/deployments/dep_nope/events", None).await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["error"], "deployment dep_nope not found");
    let r = s
        .http
        .get(format!("{}/v1/deployments/dep_nope/events", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);

    let (code, _) = s
        .call("POST", "/v1/projects", Some(json!({"name": "follow"})))
        .await;
    assert_eq!(code, 201);
    let (code, started) = s
        .call(
            "POST",
            "/v1/projects/follow/deploy",
            Some(json!({"env": "alpha", "compose": COMPOSE})),
        )
        .await;
    assert_eq!(code, 202, "{started}");
    let dep = started["deployment"]["ID"].as_str().unwrap().to_string();
    let env = started["deployment"]["EnvID"].as_str().unwrap().to_string();
    let (code, body) = s
        .call(
            "GET",
            &format!("/v1/deployments/{dep}/events?format=xml"),
            None,
        )
        .await;
    assert_eq!(code, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("xml"), "{body}");

    // One follower from the start, and followers joining every 150 ms while it runs:
    // each must reach the final state (a change lost between a follower's first state
    // and its live ones would leave it hanging) and keep the stream rules.
    let t0 = Instant::now();
    let main = {
        let (url, dep) = (s.url.clone(), dep.clone());
        tokio::spawn(async move { follow(&url, &dep, false, limit).await })
    };
    let mut late = Vec::new();
    for i in 0..20u64 {
        let (url, dep) = (s.url.clone(), dep.clone());
        late.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150 * i)).await;
            follow(&url, &dep, i % 2 == 1, limit).await
        }));
    }
    let main = main.await.unwrap();
    let done_at = main.ended_at;
    let fin = get_dep(&s, &dep).await;
    assert_eq!(status(&fin), "succeeded", "{fin}\n{}", s.logs());
    assert!(main.content_type.starts_with("text/event-stream"));
    check_stream(&main, &fin, true);
    // It was followed live: the first state came long before the end, several phases
    // were seen running, and the stream closed right after the final state.
    let first = &main.items[0];
    assert!(!is_final(status(&first.data)), "{:?}", first.data);
    assert!(first.at.duration_since(t0) < Duration::from_secs(2));
    assert!(
        main.items.len() >= 4,
        "only {} states seen for a deploy of {:?}: {:?}",
        main.items.len(),
        done_at.duration_since(t0),
        main.items
    );
    let running_seen: std::collections::BTreeSet<String> = main
        .items
        .iter()
        .flat_map(|it| it.data["phases"].as_array().unwrap().clone())
        .filter(|p| p["Status"] == "running")
        .map(|p| p["Name"].as_str().unwrap().to_string())
        .collect();
    assert!(running_seen.contains("prepare"), "{running_seen:?}");
    let last_at = main.items.last().unwrap().at;
    assert!(done_at.duration_since(last_at) < Duration::from_secs(1));
    for (i, h) in late.into_iter().enumerate() {
        let f = h.await.unwrap();
        let jsonl = i % 2 == 1;
        if jsonl {
            assert!(f.content_type.starts_with("application/x-ndjson"));
        }
        check_stream(&f, &fin, !jsonl);
    }

    // A finished deployment: its final state once, then the end, at once.
    for jsonl in [false, true] {
        let t = Instant::now();
        let f = follow(&s.url, &dep, jsonl, Duration::from_secs(5)).await;
        assert_eq!(f.items.len(), 1, "{:?}", f.items);
        check_stream(&f, &fin, !jsonl);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }

    // A deploy that fails (its service never passes its healthcheck) is followed to
    // `rolled_back`. (A service without a healthcheck that exits at once fails only when
    // it has exited by the end of bring-up, which a loaded machine can outrun.)
    let broken = "services:\n  box:\n    image: busybox:1.36\n    command: [\"sleep\", \"1000000\"]\n    healthcheck: { test: [\"CMD\", \"false\"], interval: 1s, retries: 2 }\n";
    let (code, started) = s
        .call(
            "POST",
            "/v1/projects/follow/deploy",
            Some(json!({"env": "alpha", "compose": broken})),
        )
        .await;
    assert_eq!(code, 202, "{started}");
    let bdep = started["deployment"]["ID"].as_str().unwrap().to_string();
    let f = follow(&s.url, &bdep, false, limit).await;
    let bfin = get_dep(&s, &bdep).await;
    assert_eq!(status(&bfin), "rolled_back", "{bfin}");
    check_stream(&f, &bfin, true);
    assert!(
        bfin["phases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["Status"] == "failed"),
        "{bfin}"
    );

    // A snapshot followed as JSON lines, then the destroy as SSE.
    let (code, snap) = s
        .call("POST", &format!("/v1/envs/{env}/snapshot"), None)
        .await;
    assert_eq!(code, 202, "{snap}");
    let sdep = snap["deployment"]["ID"].as_str().unwrap().to_string();
    let f = follow(&s.url, &sdep, true, limit).await;
    let sfin = get_dep(&s, &sdep).await;
    assert_eq!(status(&sfin), "succeeded", "{sfin}");
    check_stream(&f, &sfin, false);
    let (code, d) = s.call("DELETE", &format!("/v1/envs/{env}"), None).await;
    assert_eq!(code, 202, "{d}");
    let ddep = d["deployment"]["ID"].as_str().unwrap().to_string();
    let f = follow(&s.url, &ddep, false, limit).await;
    let dfin = get_dep(&s, &ddep).await;
    assert_eq!(status(&dfin), "succeeded", "{dfin}");
    check_stream(&f, &dfin, true);
    let left = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label=denv.env={env}")])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&left.stdout).trim().is_empty(),
        "containers left after destroy"
    );
}
