//! Helpers for the cp-api integration tests (`tests/api.rs`, `tests/store.rs`): the
//! real `denv-cp` binary on a fresh database of either backend, and a REST client.
//!
//! Postgres: tests read `DENV_TEST_POSTGRES_DSN` (e.g. from `e2e/lib/postgres.sh
//! start`); each test gets its own fresh database created through that DSN. The
//! Postgres variants are `#[ignore]`d (cargo lists them as ignored, with the reason);
//! run with `--include-ignored` (as `just unit` does) they fail when the DSN is unset,
//! never pass silently.
#![allow(dead_code)]

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Why the Postgres variants are ignored by a plain `cargo test`.
pub const NEEDS_POSTGRES: &str = "needs PostgreSQL: DENV_TEST_POSTGRES_DSN (just unit starts one)";

/// A fresh database: a DSN for `-db`, and the temp dir that holds SQLite files/logs.
pub struct TestDb {
    pub dsn: String,
    pub dir: tempfile::TempDir,
}

/// A fresh database of `backend`.
///
/// Panics when Postgres is asked for and `DENV_TEST_POSTGRES_DSN` is unset: the test
/// was asked to run (`--include-ignored`) and cannot run its real subject.
pub async fn fresh_db(backend: Backend) -> TestDb {
    let dir = tempfile::tempdir().expect("tempdir");
    match backend {
        Backend::Sqlite => TestDb {
            dsn: dir.path().join("denv.db").display().to_string(),
            dir,
        },
        Backend::Postgres => {
            let admin = std::env::var("DENV_TEST_POSTGRES_DSN")
                .unwrap_or_else(|_| panic!("cannot run: this test {NEEDS_POSTGRES}"));
            let name = format!("denv_t_{}", ulid::Ulid::new().to_string().to_lowercase());
            let conn = sea_orm::Database::connect(admin.as_str())
                .await
                .expect("connect to DENV_TEST_POSTGRES_DSN");
            use sea_orm::ConnectionTrait;
            conn.execute_unprepared(&format!("CREATE DATABASE {name}"))
                .await
                .expect("create test database");
            let _ = conn.close().await;
            TestDb {
                dsn: with_database(&admin, &name),
                dir,
            }
        }
    }
}

/// `dsn` with its database name replaced by `name`.
pub fn with_database(dsn: &str, name: &str) -> String {
    let (base, query) = match dsn.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (dsn, String::new()),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let host_part = &base[scheme_end..];
    let prefix = match host_part.find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    format!("{prefix}/{name}{query}")
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `denv-cp`. Killed on drop.
pub struct Cp {
    pub child: Child,
    pub url: String,
    pub port: u16,
    pub log: PathBuf,
    pub http: reqwest::Client,
}

impl Drop for Cp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How to start the binary.
pub struct Start<'a> {
    pub db: &'a str,
    pub dir: &'a std::path::Path,
    /// Extra environment variables.
    pub env: Vec<(&'a str, String)>,
    /// Use `--addr`/`--db` instead of the single-dash spellings.
    pub double_dash: bool,
    /// Log file name inside `dir`.
    pub log_name: &'a str,
}

impl<'a> Start<'a> {
    pub fn new(db: &'a TestDb) -> Self {
        Start {
            db: &db.dsn,
            dir: db.dir.path(),
            env: vec![],
            double_dash: false,
            log_name: "cp.log",
        }
    }

    pub fn env(mut self, k: &'a str, v: impl Into<String>) -> Self {
        self.env.push((k, v.into()));
        self
    }
}

impl Cp {
    /// Spawns `denv-cp` on a free port and waits until it answers `/health`. The port is
    /// picked before the process binds it, so another test's server may take it first:
    /// a server is ours only once its own log says it listens and it is still running;
    /// when it lost the port it is started again on another.
    pub async fn start(s: Start<'_>) -> Cp {
        for _ in 0..5 {
            if let Some(cp) = Cp::try_start(&s).await {
                return cp;
            }
        }
        panic!("denv-cp lost its port five times in a row");
    }

    async fn try_start(s: &Start<'_>) -> Option<Cp> {
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let log = s.dir.join(s.log_name);
        let f = std::fs::File::create(&log).unwrap();
        let dash = if s.double_dash { "--" } else { "-" };
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_denv-cp"));
        cmd.args([
            format!("{dash}addr"),
            format!("127.0.0.1:{port}"),
            format!("{dash}db"),
            s.db.to_string(),
            format!("{dash}public-url"),
            url.clone(),
        ])
        .current_dir(s.dir)
        .env_remove("DENV_BOOTSTRAP_KEY")
        .env_remove("DENV_DEV_LOGIN")
        .env_remove("DENV_CONSOLE_URL")
        .env_remove("DENV_TEAM")
        .env_remove("DENV_DB")
        .env_remove("DENV_ADDR")
        .stdout(Stdio::from(f.try_clone().unwrap()))
        .stderr(Stdio::from(f));
        for (k, v) in &s.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn denv-cp");
        let mut cp = Cp {
            child,
            url,
            port,
            log,
            http: reqwest::Client::new(),
        };
        for _ in 0..300 {
            if let Ok(Some(_)) = cp.child.try_wait() {
                let text = cp.log_text();
                if text.contains("Address already in use") || text.contains("address in use") {
                    return None;
                }
                panic!("denv-cp exited at start; log:\n{text}");
            }
            if cp.log_text().contains("denv-cp listening") {
                if let Ok(r) = cp.http.get(format!("{}/health", cp.url)).send().await {
                    if r.status().is_success() {
                        return Some(cp);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("denv-cp did not answer /health; log:\n{}", cp.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
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

    pub async fn get(&self, path: &str, token: &str) -> (u16, Value) {
        self.call("GET", path, Some(token), None, &[]).await
    }

    pub async fn post(&self, path: &str, token: &str, body: Value) -> (u16, Value) {
        self.call("POST", path, Some(token), Some(body), &[]).await
    }
}
