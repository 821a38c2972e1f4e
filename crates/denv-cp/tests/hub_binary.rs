//! The hub and TargetService through the real `denv-cp` binary: REST on its one port,
//! the fake sidecar on the host stream of the same port, and (ignored by default,
//! needs Docker and `target/<profile>/denvd`) the real `denvd` binary joining it.

use denv_testkit::{sibling_binary, CpBinary as Cp, FakeOptions, FakeSidecar, Start, TestDb};
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::time::Duration;

const KEY: &str = "dak_binarytest_0123456789";

/// `denv-cp` (`--addr`…) with the test key and a secret key over a fresh SQLite store.
async fn start_cp() -> Cp {
    let db = TestDb::sqlite();
    let start = Start::new(env!("CARGO_BIN_EXE_denv-cp"), &db)
        .key(KEY)
        .env("DENV_SECRET_KEY", "11".repeat(32))
        .double_dash();
    Cp::start(start).await.holding(db)
}

async fn call(cp: &Cp, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    cp.call(method, path, Some(KEY), body, &[]).await
}

async fn hosts(cp: &Cp) -> Vec<Value> {
    let (s, b) = call(cp, "GET", "/v1/hosts", None).await;
    assert_eq!(s, 200, "{b}");
    b["hosts"].as_array().unwrap().clone()
}

#[tokio::test]
async fn fake_sidecar_joins_the_real_binary_and_rest_shows_it() {
    let cp = start_cp().await;
    let (s, jt) = call(&cp, "POST", "/v1/join-tokens", Some(json!({}))).await;
    assert_eq!(s, 201, "{jt}");
    let token = jt["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("djt_"));
    assert_eq!(jt["expires_in_sec"], 3600);
    assert_eq!(
        jt["command"],
        format!(
            "curl -fsSL {u}/denvd -o /usr/local/bin/denvd && chmod +x /usr/local/bin/denvd && denvd join --server {u} --token {token}",
            u = cp.url
        )
    );

    let sc = FakeSidecar::join(&cp.url, &token, FakeOptions::default())
        .await
        .unwrap();
    let hs = hosts(&cp).await;
    assert_eq!(hs.len(), 1);
    assert_eq!(hs[0]["ID"], sc.host_id());
    assert_eq!(hs[0]["connected"], true);
    assert_eq!(hs[0]["Status"], "connected");
    assert_eq!(hs[0]["Capabilities"]["hostname"], "fake-sidecar");
    assert_eq!(hs[0]["Capabilities"]["storage"], "dir");
    assert!(hs[0]["LastSeenAt"].as_str().unwrap().starts_with("20"));

    let (s, t) = call(&cp, "GET", "/v1/targets", None).await;
    assert_eq!(s, 200);
    assert_eq!(t["targets"][0]["kind"], "sidecar");
    assert_eq!(t["targets"][0]["connected"], true);

    // Single use.
    let err = FakeSidecar::join(&cp.url, &token, FakeOptions::default())
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert_eq!(err.message(), "join: join token already used");

    // Reconnect with the secret after a drop.
    let parked = sc.disconnect().await;
    let mut unreachable = false;
    for _ in 0..100 {
        if hosts(&cp).await[0]["connected"] == false {
            unreachable = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(unreachable);
    assert_eq!(hosts(&cp).await[0]["Status"], "unreachable");
    let sc = parked.reconnect(&cp.url).await.unwrap();
    assert_eq!(hosts(&cp).await[0]["connected"], true);
    drop(sc);

    // Clouds over REST.
    let (s, b) = call(
        &cp,
        "POST",
        "/v1/clouds",
        Some(json!({"provider": "hetzner", "name": "hz"})),
    )
    .await;
    assert_eq!(
        (s, b["error"].as_str()),
        (400, Some("hetzner: config.token is required"))
    );
    let (s, b) = call(&cp, "POST", "/v1/clouds", Some(json!({"provider": "aws"}))).await;
    assert_eq!(s, 400, "{b}");
    let (s, b) = call(
        &cp,
        "POST",
        "/v1/clouds",
        Some(json!({"provider": "daytona", "name": "dt", "config": {"token": "dtn_secret", "api_key": "k"}})),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(b["cloud"]["Config"]["token"], "•••");
    let (s, b) = call(&cp, "GET", "/v1/clouds", None).await;
    assert_eq!(s, 200);
    assert_eq!(b["clouds"][0]["Config"]["api_key"], "•••");
    assert_eq!(b["clouds"][0]["Provider"], "daytona");
    let (s, b) = call(
        &cp,
        "POST",
        "/v1/targets/connect",
        Some(json!({"provider": "e2b", "token": "e2b_x"})),
    )
    .await;
    assert_eq!(
        (s, b["error"].as_str()),
        (503, Some("driver hosts are not available yet"))
    );
}

#[tokio::test]
#[ignore = "needs Docker and target/<profile>/denvd (cargo build -p denvd); run with --ignored"]
async fn real_denvd_joins_saves_its_identity_and_runs_again() {
    let cp = start_cp().await;
    let (_, jt) = call(&cp, "POST", "/v1/join-tokens", Some(json!({}))).await;
    let token = jt["token"].as_str().unwrap();
    let state = cp.dir().join("host.json");
    let data = cp.dir().join("data");
    let spawn = |verb: &str, token: Option<&str>| {
        let mut c = Command::new(sibling_binary("denvd"));
        c.arg(verb)
            .arg("--server")
            .arg(&cp.url)
            .arg("--state")
            .arg(&state)
            .arg("--data")
            .arg(&data)
            .env_remove("DENV_JOIN_TOKEN")
            .env_remove("DENV_SERVER")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(cp.dir().join(format!("denvd-{verb}.log"))).unwrap());
        if let Some(t) = token {
            c.arg("--token").arg(t);
        }
        c.spawn().unwrap()
    };
    let mut d = spawn("join", Some(token));
    let mut host = Value::Null;
    for _ in 0..200 {
        let hs = hosts(&cp).await;
        if hs.first().is_some_and(|h| h["connected"] == true) {
            host = hs[0].clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(host["connected"], true, "denvd did not join");
    assert_eq!(host["Capabilities"]["storage"], "dir");
    assert_ne!(host["Capabilities"]["docker"], "");
    assert_eq!(host["Capabilities"]["denvd_version"], "dev");
    // The control plane counts the host connected when it sends `welcome`; denvd saves
    // the identity when it receives it, a moment later.
    for _ in 0..100 {
        if state.is_file() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let saved: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(saved["host_id"], host["ID"]);
    assert!(saved["secret"].as_str().unwrap().starts_with("dhs_"));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&state).unwrap().permissions().mode() & 0o777,
        0o600
    );
    d.kill().unwrap();
    d.wait().unwrap();

    // `run` with the saved identity: same host, connected again.
    let mut d = spawn("run", None);
    let mut back = false;
    for _ in 0..200 {
        let hs = hosts(&cp).await;
        if hs.len() == 1 && hs[0]["connected"] == true {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    d.kill().unwrap();
    d.wait().unwrap();
    assert!(back, "denvd run did not reconnect");
    assert_eq!(hosts(&cp).await.len(), 1);

    // A used token with no identity: refused, fatal, non-zero exit.
    std::fs::remove_file(&state).unwrap();
    let out = Command::new(sibling_binary("denvd"))
        .args(["join", "--server", &cp.url, "--token", token, "--state"])
        .arg(&state)
        .arg("--data")
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refused by the control plane: join: join token already used"),
        "{err}"
    );
}
