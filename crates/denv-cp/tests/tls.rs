//! TLS on the one port: the real `denv-cp` binary started with `-tls-cert`/`-tls-key`
//! (a throwaway CA and server certificate from the test kit), reached over `https://`
//! by the Rust client (what the CLI and the Python package use), by REST, and (ignored
//! by default: needs Docker and `target/<profile>/denvd`) by the real `denvd`.

use denv_client::{Client, Code, TRANSPORT_STATUS};
use denv_testkit::{sibling_binary, CpBinary as Cp, Denvd, Start, TestDb, TestTls};
use serde_json::Value;
use std::time::Duration;

const KEY: &str = "dak_tlstest_0123456789";

/// `denv-cp` serving TLS with `tls`'s certificate over a fresh SQLite store.
async fn start_tls(tls: &TestTls, env: &[(&str, &str)]) -> Cp {
    let db = TestDb::sqlite();
    let mut s = Start::new(env!("CARGO_BIN_EXE_denv-cp"), &db)
        .key(KEY)
        .tls(tls);
    for (k, v) in env {
        s = s.env(k, *v);
    }
    Cp::start(s).await.holding(db)
}

#[tokio::test]
async fn grpc_and_rest_are_served_over_tls_to_a_client_trusting_the_ca() {
    let tls = TestTls::new();
    let cp = start_tls(&tls, &[("DENV_RATE_LIMIT_ANON", "2")]).await;
    assert!(cp.url.starts_with("https://127.0.0.1:"), "{}", cp.url);
    assert!(cp.log_text().contains("tls=true"), "{}", cp.log_text());

    // gRPC (h2 over TLS) with the CA file, as `--ca-file`/`DENV_CA_FILE` give it.
    let c = Client::connect_with(&cp.url, Some(KEY), None, Some(&tls.ca())).unwrap();
    let me = c.me(Default::default()).await.unwrap();
    assert_eq!(me.team.unwrap().name, "default");
    let p = c
        .create_project(denv_client::v1::CreateProjectRequest {
            name: "over-tls".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(p.project.unwrap().name, "over-tls");

    // REST on the same port (HTTP/1.1 over TLS), seeing what gRPC made.
    let (st, body) = cp.get("/v1/projects").await;
    assert_eq!(st, 200, "{body}");
    let names: Vec<&str> = body["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["Name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["over-tls"]);

    // The client's address reaches the handlers as on the plain port: the per-address
    // limit of unauthenticated writes counts this one.
    for _ in 0..2 {
        let (st, d) = cp.call("POST", "/v1/device/code", None, None, &[]).await;
        assert_eq!(st, 200, "{d}");
    }
    let (st, d) = cp.call("POST", "/v1/device/code", None, None, &[]).await;
    assert_eq!(st, 429, "{d}");
    assert!(
        d["error"]
            .as_str()
            .unwrap()
            .contains("unauthenticated writes from this address"),
        "{d}"
    );

    // SIGTERM: the TLS server stops as the plain one does.
    let mut cp = cp;
    cp.stop();
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = cp.child.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{}", cp.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status:?}\n{}", cp.log_text());
    assert!(cp.log_text().contains("stopped"), "{}", cp.log_text());
}

#[tokio::test]
async fn an_untrusted_certificate_is_refused_naming_the_url_and_the_tls_problem() {
    let tls = TestTls::new();
    let cp = start_tls(&tls, &[]).await;
    let want = format!(
        "cannot reach {}: tls: invalid peer certificate: UnknownIssuer (the server's certificate is not signed by a CA this client trusts: pass the CA's certificate with --ca-file or DENV_CA_FILE)",
        cp.url
    );
    // No CA file: the built-in and system roots do not hold the test CA.
    let c = Client::connect(&cp.url, Some(KEY), None).unwrap();
    let e = c.me(Default::default()).await.unwrap_err();
    assert_eq!(e.message, want);
    assert_eq!(e.code, Code::Unavailable);
    assert_eq!(e.http_status, Some(TRANSPORT_STATUS));
    // Another CA's file: the same refusal (the file replaces the roots, it is not a
    // second way in).
    let other = TestTls::new();
    let c = Client::connect_with(&cp.url, Some(KEY), None, Some(&other.ca())).unwrap();
    let e = c.me(Default::default()).await.unwrap_err();
    assert_eq!(e.message, want);
    // A CA file that is not one: refused before any call, naming the file.
    let c = Client::connect_with(&cp.url, Some(KEY), None, Some(&tls.key())).unwrap_err();
    assert_eq!(c.code, Code::InvalidArgument);
    assert!(
        c.message.starts_with(&format!(
            "ca file {}: no certificate in it",
            tls.key().display()
        )),
        "{}",
        c.message
    );
    // Cleartext to the TLS port: h2c (the client with an http:// URL) is told to use
    // https, and so is plain HTTP/1.1 (curl), as a REST error; the server goes on.
    let plain = cp.url.replace("https://", "http://");
    let c = Client::connect(&plain, Some(KEY), None).unwrap();
    let e = c.me(Default::default()).await.unwrap_err();
    assert!(
        e.message.starts_with(&format!("cannot reach {plain}: ")),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("this port speaks TLS: use https://"),
        "{}",
        e.message
    );
    let r = reqwest::get(format!("{plain}/health")).await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v,
        serde_json::json!({"error": "this port speaks TLS: use https://"})
    );
    let (st, _) = cp.get("/health").await;
    assert_eq!(st, 200);
}

#[tokio::test]
async fn https_to_a_plain_port_says_the_server_does_not_speak_tls() {
    let db = TestDb::sqlite();
    let cp = Cp::start(Start::new(env!("CARGO_BIN_EXE_denv-cp"), &db).key(KEY)).await;
    let url = cp.url.replace("http://", "https://");
    let c = Client::connect(&url, Some(KEY), None).unwrap();
    let e = c.me(Default::default()).await.unwrap_err();
    assert_eq!(
        e.message,
        format!("cannot reach {url}: tls: received corrupt message of type InvalidContentType (the server does not speak TLS here: is it plain http://?)")
    );
}

/// Runs the binary with `args` and `env` until it exits: (status code, stderr).
fn run_cp(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_denv-cp"));
    cmd.args(["-addr", "127.0.0.1:0", "-db"])
        .arg(dir.join("denv.db"))
        .args(args)
        .current_dir(dir)
        .env_remove("DENV_TLS_CERT")
        .env_remove("DENV_TLS_KEY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_half_or_bad_tls_setting_stops_the_start_with_status_2() {
    let tls = TestTls::new();
    let other = TestTls::new();
    let d = tempfile::tempdir().unwrap();
    let cert = tls.cert().display().to_string();
    let (code, err) = run_cp(d.path(), &["-tls-cert", &cert], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        err.trim(),
        "denv-cp: -tls-cert (DENV_TLS_CERT) is set without -tls-key (DENV_TLS_KEY): TLS needs both"
    );
    // The key of another certificate.
    let (code, err) = run_cp(
        d.path(),
        &[],
        &[
            ("DENV_TLS_CERT", &cert),
            ("DENV_TLS_KEY", &other.key().display().to_string()),
        ],
    );
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        err.trim(),
        format!(
            "denv-cp: tls certificate {cert} with tls key {}: the key is not the certificate's",
            other.key().display()
        )
    );
    // A missing key file; nothing was started (no database made).
    let (code, err) = run_cp(
        d.path(),
        &["--tls-cert", &cert, "--tls-key", "/nonexistent/key.pem"],
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.starts_with("denv-cp: tls key /nonexistent/key.pem: "),
        "{err}"
    );
    assert!(!d.path().join("denv.db").exists());
}

async fn hosts(cp: &Cp) -> Vec<Value> {
    let (s, b) = cp.get("/v1/hosts").await;
    assert_eq!(s, 200, "{b}");
    b["hosts"].as_array().unwrap().clone()
}

#[tokio::test]
#[ignore = "needs Docker and target/<profile>/denvd (just unit runs it)"]
async fn denvd_joins_over_tls_with_the_ca_file_and_names_the_problem_without_it() {
    denv_testkit::require_docker();
    let _ = sibling_binary("denvd");
    let tls = TestTls::new();
    let cp = start_tls(&tls, &[]).await;

    // Without the CA file: not connected, each retry logged with the URL and why.
    let dir = tempfile::tempdir().unwrap();
    let token = cp.join_token().await;
    let d = Denvd::join(&cp.url, &token, dir.path());
    let want = format!(
        "connect {}: tls: invalid peer certificate: UnknownIssuer",
        cp.url
    );
    let t0 = std::time::Instant::now();
    while !d.log_text().contains(&want) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "denvd never said {want:?}:\n{}",
            d.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        !d.log_text().contains("transport error"),
        "{}",
        d.log_text()
    );
    assert!(hosts(&cp).await.is_empty());
    drop(d);

    // With it: joined over TLS, the identity saved with the CA file beside the server.
    let dir = tempfile::tempdir().unwrap();
    let d = Denvd::join_trusting(&cp.url, &token, dir.path(), Some(&tls.ca()));
    let t0 = std::time::Instant::now();
    loop {
        let hs = hosts(&cp).await;
        if hs.len() == 1 && hs[0]["connected"] == true {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "denvd did not connect over TLS:\n{}",
            d.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("host.json")).unwrap())
            .unwrap();
    assert_eq!(saved["server"], cp.url.as_str());
    assert_eq!(saved["ca_file"], tls.ca().display().to_string());
    assert!(saved["host_id"].as_str().unwrap().starts_with("host_"));
}
