//! The real `denv-cp` binary, started on a free port over a [`TestDb`].

use crate::db::{free_port, TestDb};
use crate::sidecar::{FakeOptions, FakeSidecar};
use crate::tls::TestTls;
use serde_json::{json, Value};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How to start the binary: build with [`Start::new`] and the methods below.
#[derive(Clone)]
pub struct Start {
    bin: PathBuf,
    db: String,
    dir: PathBuf,
    key: Option<String>,
    env: Vec<(String, String)>,
    double_dash: bool,
    log_name: String,
    port: Option<u16>,
    /// `-tls-cert`, `-tls-key` and the CA's PEM the helpers trust.
    tls: Option<(PathBuf, PathBuf, String)>,
}

impl Start {
    /// `bin` (the caller's `env!("CARGO_BIN_EXE_denv-cp")`) over `db`; the log goes to
    /// `cp.log` in the database's temp dir.
    pub fn new(bin: impl Into<PathBuf>, db: &TestDb) -> Start {
        Start::in_dir(bin, &db.dsn, db.dir.path())
    }

    /// `bin` over the store `dsn`, running (and logging) in `dir`: for a test that keeps
    /// its dir past its end.
    pub fn in_dir(bin: impl Into<PathBuf>, dsn: &str, dir: &Path) -> Start {
        Start {
            bin: bin.into(),
            db: dsn.to_string(),
            dir: dir.to_path_buf(),
            key: None,
            env: vec![],
            double_dash: false,
            log_name: "cp.log".into(),
            port: None,
            tls: None,
        }
    }

    /// The bootstrap key (`DENV_BOOTSTRAP_KEY`); the REST helpers of [`CpBinary`] send it.
    pub fn key(mut self, key: &str) -> Start {
        self.key = Some(key.to_string());
        self.env("DENV_BOOTSTRAP_KEY", key)
    }

    /// An extra environment variable.
    pub fn env(mut self, k: &str, v: impl Into<String>) -> Start {
        self.env.push((k.to_string(), v.into()));
        self
    }

    /// `--addr`/`--db`/`--public-url` instead of the single-dash spellings.
    pub fn double_dash(mut self) -> Start {
        self.double_dash = true;
        self
    }

    /// The log file's name inside the database's temp dir (default `cp.log`).
    pub fn log_name(mut self, name: &str) -> Start {
        self.log_name = name.to_string();
        self
    }

    /// A fixed port (default: a free one, picked again when another process takes it).
    pub fn port(mut self, port: u16) -> Start {
        self.port = Some(port);
        self
    }

    /// Serve TLS with `tls`'s certificate (`-tls-cert`, `-tls-key`): the URL is then
    /// `https://127.0.0.1:<port>` and the REST helpers and [`CpBinary::channel`] trust
    /// `tls`'s CA. The caller keeps `tls` (its files) alive.
    pub fn tls(mut self, tls: &TestTls) -> Start {
        self.tls = Some((tls.cert(), tls.key(), tls.ca_pem().to_string()));
        self
    }

    fn url(&self, port: u16) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{port}")
    }

    fn http_client(&self) -> reqwest::Client {
        match &self.tls {
            None => reqwest::Client::new(),
            Some((_, _, ca)) => reqwest::Client::builder()
                .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
                .build()
                .unwrap(),
        }
    }
}

/// A running `denv-cp`. Killed on drop; `DENV_TEST_LOGS=<dir>` keeps its log there.
pub struct CpBinary {
    /// The process.
    pub child: Child,
    /// `http://127.0.0.1:<port>` (`https://` with [`Start::tls`]): REST, gRPC and the
    /// host stream.
    pub url: String,
    /// The port it listens on.
    pub port: u16,
    /// Its log file (stdout and stderr; appended to across restarts).
    pub log: PathBuf,
    /// A client for REST calls.
    pub http: reqwest::Client,
    /// The bootstrap key, if it was started with one.
    pub key: Option<String>,
    start: Start,
    log_from: u64,
    held: Option<TestDb>,
}

impl Drop for CpBinary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Ok(keep) = std::env::var("DENV_TEST_LOGS") {
            let _ = std::fs::create_dir_all(&keep);
            let _ = std::fs::copy(
                &self.log,
                Path::new(&keep).join(format!("cp-{}.log", self.port)),
            );
        }
    }
}

impl CpBinary {
    /// Spawns `denv-cp` and waits until it answers `/health`. On a picked port, another
    /// test's server may take it first: a server is ours only once its own log says it
    /// listens and it is still running; when it lost the port it is started again on
    /// another.
    pub async fn start(s: Start) -> CpBinary {
        for _ in 0..5 {
            let port = s.port.unwrap_or_else(free_port);
            if let Some(cp) = CpBinary::try_start(&s, port).await {
                return cp;
            }
            assert!(s.port.is_none(), "port {port} is taken");
        }
        panic!("denv-cp lost its port five times in a row");
    }

    /// Starts it again on the same port over the same store, with `env` added to the
    /// variables it was started with (after [`CpBinary::kill`] or [`CpBinary::stop`]).
    pub async fn restart(&mut self, env: &[(&str, &str)]) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut s = self.start.clone();
        for (k, v) in env {
            s = s.env(k, *v);
        }
        let (child, log_from) = CpBinary::spawn(&s, self.port);
        self.child = child;
        self.log_from = log_from;
        if !self.wait_up().await {
            panic!("denv-cp lost port {} on restart", self.port);
        }
    }

    fn spawn(s: &Start, port: u16) -> (Child, u64) {
        let url = s.url(port);
        let log = s.dir.join(&s.log_name);
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let log_from = f.metadata().map(|m| m.len()).unwrap_or(0);
        let dash = if s.double_dash { "--" } else { "-" };
        let mut cmd = Command::new(&s.bin);
        cmd.args([
            format!("{dash}addr"),
            format!("127.0.0.1:{port}"),
            format!("{dash}db"),
            s.db.clone(),
            format!("{dash}public-url"),
            url,
        ])
        .current_dir(&s.dir)
        .env_remove("DENV_BOOTSTRAP_KEY")
        .env_remove("DENV_DEV_LOGIN")
        .env_remove("DENV_CONSOLE_URL")
        .env_remove("DENV_TEAM")
        .env_remove("DENV_DB")
        .env_remove("DENV_ADDR")
        .env_remove("DENV_TLS_CERT")
        .env_remove("DENV_TLS_KEY")
        .env("RUST_LOG", "info")
        .stdout(Stdio::from(f.try_clone().unwrap()))
        .stderr(Stdio::from(f));
        if let Some((cert, key, _)) = &s.tls {
            cmd.arg(format!("{dash}tls-cert"))
                .arg(cert)
                .arg(format!("{dash}tls-key"))
                .arg(key);
        }
        for (k, v) in &s.env {
            cmd.env(k, v);
        }
        (cmd.spawn().expect("spawn denv-cp"), log_from)
    }

    async fn try_start(s: &Start, port: u16) -> Option<CpBinary> {
        let (child, log_from) = CpBinary::spawn(s, port);
        let mut cp = CpBinary {
            child,
            url: s.url(port),
            port,
            log: s.dir.join(&s.log_name),
            http: s.http_client(),
            key: s.key.clone(),
            start: s.clone(),
            log_from,
            held: None,
        };
        cp.wait_up().await.then_some(cp)
    }

    /// Waits for `/health`; false when the process exited because its port was taken.
    async fn wait_up(&mut self) -> bool {
        for _ in 0..300 {
            if let Ok(Some(_)) = self.child.try_wait() {
                let text = self.log_text();
                if text.contains("Address already in use") || text.contains("address in use") {
                    return false;
                }
                panic!("denv-cp exited at start; log:\n{text}");
            }
            if self.log_text().contains("denv-cp listening") {
                if let Ok(r) = self.http.get(format!("{}/health", self.url)).send().await {
                    if r.status().is_success() {
                        return true;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("denv-cp did not answer /health; log:\n{}", self.log_text());
    }

    /// Owns `db` from now on (removed after the process is killed, on drop): for a
    /// helper that returns the server alone.
    pub fn holding(mut self, db: TestDb) -> CpBinary {
        self.held = Some(db);
        self
    }

    /// The dir it runs in (the database's temp dir: its log, a SQLite file).
    pub fn dir(&self) -> &Path {
        &self.start.dir
    }

    /// The store's DSN (what it was started with `-db`).
    pub fn dsn(&self) -> &str {
        &self.start.db
    }

    /// Kills the process hard (SIGKILL, no graceful shutdown), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM (a graceful shutdown) and returns without waiting.
    pub fn stop(&mut self) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM).expect("SIGTERM denv-cp");
    }

    /// Waits up to `within` for the process to exit (after [`CpBinary::stop`]): its exit
    /// status, or `None` while it still runs.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What this run of the process logged (since its latest start).
    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.seek(SeekFrom::Start(self.log_from));
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Every `dak_…` token printed in the log.
    pub fn printed_keys(&self) -> Vec<String> {
        self.log_text()
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("dak_"))
            .map(str::to_string)
            .collect()
    }

    /// A REST call: `(status, json body)` (a non-JSON body becomes a string).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut rb = self.http.request(m, format!("{}{}", self.url, path));
        if let Some(t) = token {
            rb = rb.bearer_auth(t);
        }
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let r = rb.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// `GET path` with the bootstrap key.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, self.key.as_deref(), None, &[]).await
    }

    /// `POST path` with the bootstrap key and a JSON body.
    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call("POST", path, self.key.as_deref(), Some(body), &[])
            .await
    }

    /// `DELETE path` with the bootstrap key.
    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.call("DELETE", path, self.key.as_deref(), None, &[])
            .await
    }

    /// `GET path` with `token`.
    pub async fn get_as(&self, path: &str, token: &str) -> (u16, Value) {
        self.call("GET", path, Some(token), None, &[]).await
    }

    /// `POST path` with `token` and a JSON body.
    pub async fn post_as(&self, path: &str, token: &str, body: Value) -> (u16, Value) {
        self.call("POST", path, Some(token), Some(body), &[]).await
    }

    /// Creates project `name` (201); returns its id.
    pub async fn project(&self, name: &str) -> String {
        let (s, p) = self.post("/v1/projects", json!({"name": name})).await;
        assert_eq!(s, 201, "{p}");
        p["project"]["ID"].as_str().unwrap().to_string()
    }

    /// `POST /v1/projects/{project}/deploy` of `compose` to `env` (202); returns the body.
    pub async fn deploy(&self, project: &str, env: &str, compose: &str) -> Value {
        let (s, d) = self
            .post(
                &format!("/v1/projects/{project}/deploy"),
                json!({"env": env, "compose": compose}),
            )
            .await;
        assert_eq!(s, 202, "{d}");
        d
    }

    /// Polls `GET /v1/deployments/{id}` (for up to 30 s) until a final status; returns
    /// the `{deployment, phases}` body.
    pub async fn wait(&self, dep: &str) -> Value {
        self.wait_for(dep, Duration::from_secs(30)).await
    }

    /// [`CpBinary::wait`] for up to `limit` (a real engine pulling images takes longer).
    pub async fn wait_for(&self, dep: &str, limit: Duration) -> Value {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < limit {
            let (s, d) = self.get(&format!("/v1/deployments/{dep}")).await;
            assert_eq!(s, 200, "{d}");
            let st = d["deployment"]["Status"].as_str().unwrap_or_default();
            if ["succeeded", "failed", "rolled_back"].contains(&st) {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("deployment {dep} did not finish");
    }

    /// `GET /v1/envs/{id}` (200).
    pub async fn env(&self, id: &str) -> Value {
        let (s, e) = self.get(&format!("/v1/envs/{id}")).await;
        assert_eq!(s, 200, "{e}");
        e
    }

    /// A new join token (`POST /v1/join-tokens`, 201).
    pub async fn join_token(&self) -> String {
        let (s, tok) = self.post("/v1/join-tokens", json!({})).await;
        assert_eq!(s, 201, "{tok}");
        tok["token"].as_str().unwrap().to_string()
    }

    /// A [`FakeSidecar`] joined with a new join token.
    pub async fn sidecar(&self, opts: FakeOptions) -> FakeSidecar {
        let token = self.join_token().await;
        FakeSidecar::join(&self.url, &token, opts).await.unwrap()
    }

    /// A gRPC channel to the server (trusting its test CA when it serves TLS).
    pub async fn channel(&self) -> tonic::transport::Channel {
        let mut e = tonic::transport::Endpoint::from_shared(self.url.clone()).unwrap();
        if let Some((_, _, ca)) = &self.start.tls {
            e = e
                .tls_config(
                    tonic::transport::ClientTlsConfig::new()
                        .ca_certificate(tonic::transport::Certificate::from_pem(ca)),
                )
                .unwrap();
        }
        e.connect().await.unwrap()
    }
}
