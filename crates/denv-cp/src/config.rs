//! `denv-cp` configuration: flags, each falling back to an environment variable, plus
//! the environment-only settings (spec `18-ref-config.md`).
//!
//! | flag | env | default |
//! |---|---|---|
//! | `-addr` | `DENV_ADDR` | `:8080` (all interfaces) |
//! | `-db` | `DENV_DB` (or assembled from `DENV_DB_HOST`, `DENV_DB_PORT`, `DENV_DB_NAME`, `DENV_DB_USER`, `DENV_DB_PASSWORD`, `DENV_DB_SSLMODE`) | `denv.db` |
//! | `-public-url` | `DENV_PUBLIC_URL` | `http://localhost:8080` (`https://…` with TLS) |
//! | `-denvd-url` | `DENV_DENVD_URL` | `/denvd` |
//! | `-tls-cert` | `DENV_TLS_CERT` | — (plain HTTP/1.1 and h2c) |
//! | `-tls-key` | `DENV_TLS_KEY` | — |
//! | `-replica-url` | `DENV_REPLICA_URL` | — (one replica) |
//! | `-replica-ca-file` | `DENV_REPLICA_CA_FILE` | — (built-in and system roots) |
//! | `-v` | — | off |
//!
//! `-tls-cert` (a PEM certificate chain, the server's own certificate first) and
//! `-tls-key` (its PEM private key) come together: with both the one port speaks TLS
//! only ([`crate::tls`]).
//!
//! `-replica-url` and `DENV_REPLICA_SECRET` come together too: with both the process is
//! one of several replicas on one PostgreSQL ([`crate::replica`]); `DENV_LEASE_TTL`
//! (Go-style duration, default `15s`) is how long a dead replica's deployments stay
//! its own.
//!
//! Flags are accepted in Go's single-dash spelling (`-addr :8080`, `-db=x.db`) as well as
//! `--addr`: [`normalize_args`] rewrites the former before clap parses.

use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Command-line flags (`denv-cp -addr :8080 -db ./denv.db -public-url http://…`).
#[derive(Debug, Parser)]
#[command(name = "denv-cp", version, about = "denv control plane")]
pub struct Flags {
    /// Listen address (`:8080` means all interfaces) [env: DENV_ADDR]
    #[arg(long)]
    pub addr: Option<String>,
    /// SQLite file path or `postgres://` DSN [env: DENV_DB]
    #[arg(long)]
    pub db: Option<String>,
    /// URL sidecars and cloud-init use to reach this server [env: DENV_PUBLIC_URL]
    #[arg(long = "public-url")]
    pub public_url: Option<String>,
    /// Where cloud-init downloads the sidecar [env: DENV_DENVD_URL]
    #[arg(long = "denvd-url")]
    pub denvd_url: Option<String>,
    /// PEM certificate chain (the server's certificate first): serve TLS [env: DENV_TLS_CERT]
    #[arg(long = "tls-cert")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of that certificate [env: DENV_TLS_KEY]
    #[arg(long = "tls-key")]
    pub tls_key: Option<PathBuf>,
    /// URL the other replicas reach this one at (`http://10.0.0.5:8080`, `https://…`
    /// with TLS): replica mode [env: DENV_REPLICA_URL]
    #[arg(long = "replica-url")]
    pub replica_url: Option<String>,
    /// PEM CA certificates the other replicas' https:// certificates must chain to,
    /// instead of the built-in and system roots [env: DENV_REPLICA_CA_FILE]
    #[arg(long = "replica-ca-file")]
    pub replica_ca_file: Option<PathBuf>,
    /// Debug logging (request lines at debug)
    #[arg(short = 'v')]
    pub verbose: bool,
}

/// Long flag names that may be written with one dash.
const LONG_FLAGS: &[&str] = &[
    "addr",
    "db",
    "public-url",
    "denvd-url",
    "tls-cert",
    "tls-key",
    "replica-url",
    "replica-ca-file",
    "help",
    "version",
];

/// Rewrite Go-style `-addr`/`-addr=x` to `--addr`/`--addr=x` for the known long names;
/// everything else is left as is.
pub fn normalize_args<I: IntoIterator<Item = String>>(args: I) -> Vec<String> {
    args.into_iter()
        .map(|a| {
            if a.starts_with("--") || !a.starts_with('-') {
                return a;
            }
            let body = &a[1..];
            let name = body.split('=').next().unwrap_or(body);
            if LONG_FLAGS.contains(&name) {
                format!("-{a}")
            } else {
                a
            }
        })
        .collect()
}

/// The resolved configuration.
#[derive(Clone)]
pub struct Config {
    /// Socket address to listen on.
    pub addr: SocketAddr,
    /// SQLite path or Postgres DSN (contains the password: log [`Config::db_redacted`]).
    pub db: String,
    /// Public base URL, no trailing slash.
    pub public_url: String,
    /// Where cloud-init downloads the sidecar.
    pub denvd_url: String,
    /// `-tls-cert`/`DENV_TLS_CERT` and `-tls-key`/`DENV_TLS_KEY`: the port serves TLS
    /// with this certificate chain and key (both PEM files); `None`: plain HTTP.
    pub tls: Option<TlsFiles>,
    /// Debug logging.
    pub verbose: bool,
    /// `DENV_TEAM`: name of the bootstrap team (default `default`).
    pub team_name: String,
    /// `DENV_BOOTSTRAP_KEY`: the bootstrap key to install (else one is generated).
    pub bootstrap_key: Option<String>,
    /// `DENV_CONSOLE_URL`: the console origin, no trailing slash (enables CORS).
    pub console_url: Option<String>,
    /// `DENV_DEV_LOGIN=1`.
    pub dev_login: bool,
    /// `DENV_GITHUB_CLIENT_ID`.
    pub github_client_id: Option<String>,
    /// `DENV_GITHUB_CLIENT_SECRET`.
    pub github_client_secret: Option<String>,
    /// `DENV_GITHUB_APP_ID`.
    pub github_app_id: Option<String>,
    /// `DENV_GITHUB_APP_PRIVATE_KEY` (PEM text or a file path).
    pub github_app_private_key: Option<String>,
    /// `DENV_GITHUB_WEBHOOK_SECRET`.
    pub github_webhook_secret: Option<String>,
    /// `DENV_GITHUB_API_URL` (default `https://api.github.com`).
    pub github_api_url: String,
    /// `DENV_RELEASES_DIR` (default `bin`).
    pub releases_dir: String,
    /// `DENV_RATE_LIMIT_KEY`: requests per second per credential, bursts of twice that
    /// (default 500; `0` = off). See [`crate::ratelimit`].
    pub rate_limit_key: u32,
    /// `DENV_RATE_LIMIT_IP`: requests per second per client address, bursts of twice that
    /// (default 1000; `0` = off).
    pub rate_limit_ip: u32,
    /// `DENV_RATE_LIMIT_ANON`: unauthenticated writes per minute per client address
    /// (default 20; `0` = off).
    pub rate_limit_anon: u32,
    /// `DENV_SECRET_KEY`: 32 bytes (64 hex digits or base64) that encrypt cloud provider
    /// tokens at rest; without it, clouds that carry a token cannot be created.
    pub secret_key: Option<[u8; 32]>,
    /// `DENV_RESUME_WAIT`: seconds a deployment interrupted by a restart waits for its
    /// host to reconnect before it is failed instead of resumed (default 60).
    pub resume_wait_sec: u32,
    /// `DENV_DRAIN`: seconds a stopping control plane (SIGTERM, SIGINT) waits for its
    /// running deployments to end before it exits and leaves the rest to the next
    /// start (default 20).
    pub drain_sec: u32,
    /// `-replica-url`/`DENV_REPLICA_URL` with `DENV_REPLICA_SECRET`: this process is one
    /// of several replicas on one PostgreSQL; `None`: the only one.
    pub replica: Option<ReplicaSettings>,
    /// `DENV_LEASE_TTL`: how long a deployment's lease lasts without renewal (renewed
    /// every third of it; default 15 s). Only replica mode uses it.
    pub lease_ttl: std::time::Duration,
}

/// Replica mode's settings ([`crate::replica`]).
#[derive(Clone, PartialEq, Eq)]
pub struct ReplicaSettings {
    /// The URL the other replicas reach this one at (its own port), no trailing slash.
    pub url: String,
    /// The secret every replica shares: the bearer of relay calls.
    pub secret: String,
    /// `-replica-ca-file`/`DENV_REPLICA_CA_FILE`: the CA certificates an `https://`
    /// replica URL must chain to (`None`: the built-in and system roots). Checked to
    /// hold at least one PEM certificate when the settings are read.
    pub ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for ReplicaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaSettings")
            .field("url", &self.url)
            .field("secret", &"set")
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// A Go-style duration (`15s`, `1m30s`, `500ms`, `2h`); the error names `name`.
pub fn parse_go_duration(name: &str, v: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("{name}={v:?}: want a duration like 15s, 1m30s or 500ms");
    let s = v.trim();
    if s.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let n: f64 = rest[..num_end].parse().map_err(|_| bad())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let ms = match &rest[..unit_end] {
            "ms" => 1.0,
            "s" => 1000.0,
            "m" => 60_000.0,
            "h" => 3_600_000.0,
            _ => return Err(bad()),
        };
        total += n * ms;
        rest = &rest[unit_end..];
    }
    Ok(std::time::Duration::from_millis(total.round() as u64))
}

/// The PEM files the port's TLS is served with (read at start by [`crate::tls::load`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain: the server's certificate first, then intermediates.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |o: &Option<String>| if o.is_some() { "set" } else { "unset" };
        f.debug_struct("Config")
            .field("addr", &self.addr)
            .field("db", &self.db_redacted())
            .field("public_url", &self.public_url)
            .field("denvd_url", &self.denvd_url)
            .field("tls", &self.tls)
            .field("verbose", &self.verbose)
            .field("team_name", &self.team_name)
            .field("bootstrap_key", &set(&self.bootstrap_key))
            .field("console_url", &self.console_url)
            .field("dev_login", &self.dev_login)
            .field("github_oauth", &self.github_oauth_configured())
            .field("github_app", &self.github_app_configured())
            .field("github_webhook_secret", &set(&self.github_webhook_secret))
            .field("github_api_url", &self.github_api_url)
            .field("releases_dir", &self.releases_dir)
            .field(
                "rate_limits",
                &(
                    self.rate_limit_key,
                    self.rate_limit_ip,
                    self.rate_limit_anon,
                ),
            )
            .field(
                "secret_key",
                &if self.secret_key.is_some() {
                    "set"
                } else {
                    "unset"
                },
            )
            .field("resume_wait_sec", &self.resume_wait_sec)
            .field("drain_sec", &self.drain_sec)
            .field("replica", &self.replica)
            .field("lease_ttl", &self.lease_ttl)
            .finish()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::resolve(Flags::parse_from(["denv-cp"]), |_| None).expect("defaults resolve")
    }
}

/// Parse a listen address: `:8080` → `0.0.0.0:8080`, `localhost:80` → `127.0.0.1:80`,
/// `127.0.0.1:0`, `[::]:8080`.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    let full = if let Some(port) = s.strip_prefix(':') {
        format!("0.0.0.0:{port}")
    } else if let Some(port) = s.strip_prefix("localhost:") {
        format!("127.0.0.1:{port}")
    } else {
        s.to_string()
    };
    full.parse()
        .map_err(|_| format!("invalid listen address {s:?}: want host:port or :port"))
}

/// The Postgres DSN assembled from `DENV_DB_HOST`, `DENV_DB_PORT` (5432), `DENV_DB_NAME`
/// (`denv`), `DENV_DB_USER` (`denv`), `DENV_DB_PASSWORD`, `DENV_DB_SSLMODE` (`require`);
/// `None` without `DENV_DB_HOST`.
pub fn assembled_dsn(env: &impl Fn(&str) -> Option<String>) -> Option<String> {
    let host = env("DENV_DB_HOST")?;
    let port = env("DENV_DB_PORT").unwrap_or_else(|| "5432".into());
    let name = env("DENV_DB_NAME").unwrap_or_else(|| "denv".into());
    let user = env("DENV_DB_USER").unwrap_or_else(|| "denv".into());
    let ssl = env("DENV_DB_SSLMODE").unwrap_or_else(|| "require".into());
    let auth = match env("DENV_DB_PASSWORD") {
        Some(p) => format!("{}:{}", pct(&user), pct(&p)),
        None => pct(&user),
    };
    Some(format!(
        "postgres://{auth}@{host}:{port}/{}?sslmode={}",
        pct(&name),
        pct(&ssl)
    ))
}

/// RFC 3986 unreserved characters stay; everything else is percent-encoded.
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encode everything outside the URL-unreserved set (query values, DSN parts).
pub fn pct(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, UNRESERVED).to_string()
}

/// A non-negative count from `name` (default `default`); the error names the variable.
fn count(env: &impl Fn(&str) -> Option<String>, name: &str, default: u32) -> Result<u32, String> {
    whole(env, name, default, "a whole number (0 turns the limit off)")
}

/// A whole number of seconds from `name` (`default` when unset; `0`: no wait).
fn seconds(env: &impl Fn(&str) -> Option<String>, name: &str, default: u32) -> Result<u32, String> {
    whole(env, name, default, "a whole number of seconds")
}

fn whole(
    env: &impl Fn(&str) -> Option<String>,
    name: &str,
    default: u32,
    want: &str,
) -> Result<u32, String> {
    match env(name) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{name}={v:?}: want {want}")),
    }
}

/// `DENV_SECRET_KEY`: 64 hex digits or the base64 of 32 bytes.
pub fn parse_secret_key(v: &str) -> Result<[u8; 32], String> {
    use base64::Engine;
    let v = v.trim();
    let bytes = hex::decode(v)
        .ok()
        .or_else(|| base64::engine::general_purpose::STANDARD.decode(v).ok())
        .ok_or("DENV_SECRET_KEY: want 64 hex digits or base64")?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
        format!(
            "DENV_SECRET_KEY: want 32 bytes, got {} (make one with `openssl rand -hex 32`)",
            bytes.len()
        )
    })
}

impl Config {
    /// Parse `argv` (with Go-style single-dash flags) and the process environment.
    pub fn from_args_and_env<I: IntoIterator<Item = String>>(args: I) -> Result<Config, String> {
        let flags = Flags::try_parse_from(normalize_args(args)).map_err(|e| e.to_string())?;
        Config::resolve(flags, |k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// Resolve parsed flags against an environment lookup (flags win).
    pub fn resolve(flags: Flags, env: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let addr = flags
            .addr
            .or_else(|| env("DENV_ADDR"))
            .unwrap_or_else(|| ":8080".into());
        let db = flags
            .db
            .or_else(|| env("DENV_DB"))
            .or_else(|| assembled_dsn(&env))
            .unwrap_or_else(|| "denv.db".into());
        let trim = |s: String| s.trim_end_matches('/').to_string();
        let path = |flag: Option<PathBuf>, var: &str| {
            flag.filter(|p| !p.as_os_str().is_empty())
                .or_else(|| env(var).map(PathBuf::from))
        };
        let tls = match (
            path(flags.tls_cert, "DENV_TLS_CERT"),
            path(flags.tls_key, "DENV_TLS_KEY"),
        ) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            (None, None) => None,
            (Some(_), None) => return Err(
                "-tls-cert (DENV_TLS_CERT) is set without -tls-key (DENV_TLS_KEY): TLS needs both"
                    .into(),
            ),
            (None, Some(_)) => return Err(
                "-tls-key (DENV_TLS_KEY) is set without -tls-cert (DENV_TLS_CERT): TLS needs both"
                    .into(),
            ),
        };
        let replica_ca_file = flags
            .replica_ca_file
            .filter(|p| !p.as_os_str().is_empty())
            .or_else(|| env("DENV_REPLICA_CA_FILE").map(PathBuf::from));
        let replica = match (
            flags
                .replica_url
                .filter(|u| !u.is_empty())
                .or_else(|| env("DENV_REPLICA_URL")),
            env("DENV_REPLICA_SECRET"),
        ) {
            (Some(url), Some(secret)) => Some(ReplicaSettings {
                url: trim(url),
                secret,
                ca_file: replica_ca_file,
            }),
            (None, None) => None,
            (Some(_), None) => return Err(
                "-replica-url (DENV_REPLICA_URL) is set without DENV_REPLICA_SECRET: replica mode needs both"
                    .into(),
            ),
            (None, Some(_)) => return Err(
                "DENV_REPLICA_SECRET is set without -replica-url (DENV_REPLICA_URL): replica mode needs both"
                    .into(),
            ),
        };
        if replica.is_some() && !crate::store::is_postgres(&db) {
            return Err(format!(
                "replica mode (-replica-url/DENV_REPLICA_URL) needs PostgreSQL: the replicas share leases and host streams through the store, and {} is SQLite, which only one process can use",
                crate::store::redact_dsn(&db)
            ));
        }
        if let Some(r) = &replica {
            // The URL's scheme must be what this port speaks: the others dial it as given.
            let want = if tls.is_some() { "https://" } else { "http://" };
            if !r.url.starts_with(want) {
                return Err(format!(
                    "-replica-url (DENV_REPLICA_URL) {:?}: want an {want} URL (this port {})",
                    r.url,
                    if tls.is_some() {
                        "serves TLS"
                    } else {
                        "serves plain HTTP/2 and HTTP/1.1"
                    }
                ));
            }
            if let Some(p) = &r.ca_file {
                denv_client::transport::Trust::from_ca_file(p)
                    .map_err(|e| format!("-replica-ca-file (DENV_REPLICA_CA_FILE): {e}"))?;
            }
        }
        let lease_ttl = match env("DENV_LEASE_TTL") {
            None => std::time::Duration::from_secs(15),
            Some(v) => {
                let d = parse_go_duration("DENV_LEASE_TTL", &v)?;
                if d < std::time::Duration::from_secs(1) {
                    return Err(format!("DENV_LEASE_TTL={v:?}: want at least 1s"));
                }
                d
            }
        };
        let default_public = if tls.is_some() {
            "https://localhost:8080"
        } else {
            "http://localhost:8080"
        };
        Ok(Config {
            addr: parse_addr(&addr)?,
            db,
            public_url: trim(
                flags
                    .public_url
                    .or_else(|| env("DENV_PUBLIC_URL"))
                    .unwrap_or_else(|| default_public.into()),
            ),
            denvd_url: flags
                .denvd_url
                .or_else(|| env("DENV_DENVD_URL"))
                .unwrap_or_else(|| "/denvd".into()),
            tls,
            verbose: flags.verbose,
            team_name: env("DENV_TEAM").unwrap_or_else(|| "default".into()),
            bootstrap_key: env("DENV_BOOTSTRAP_KEY"),
            console_url: env("DENV_CONSOLE_URL").map(trim),
            dev_login: env("DENV_DEV_LOGIN").as_deref() == Some("1"),
            github_client_id: env("DENV_GITHUB_CLIENT_ID"),
            github_client_secret: env("DENV_GITHUB_CLIENT_SECRET"),
            github_app_id: env("DENV_GITHUB_APP_ID"),
            github_app_private_key: env("DENV_GITHUB_APP_PRIVATE_KEY"),
            github_webhook_secret: env("DENV_GITHUB_WEBHOOK_SECRET"),
            github_api_url: trim(
                env("DENV_GITHUB_API_URL").unwrap_or_else(|| "https://api.github.com".into()),
            ),
            releases_dir: env("DENV_RELEASES_DIR").unwrap_or_else(|| "bin".into()),
            rate_limit_key: count(&env, "DENV_RATE_LIMIT_KEY", 500)?,
            rate_limit_ip: count(&env, "DENV_RATE_LIMIT_IP", 1000)?,
            rate_limit_anon: count(&env, "DENV_RATE_LIMIT_ANON", 20)?,
            secret_key: env("DENV_SECRET_KEY")
                .map(|v| parse_secret_key(&v))
                .transpose()?,
            resume_wait_sec: seconds(&env, "DENV_RESUME_WAIT", 60)?,
            drain_sec: seconds(&env, "DENV_DRAIN", 20)?,
            replica,
            lease_ttl,
        })
    }

    /// The database setting with any password replaced by `***`.
    pub fn db_redacted(&self) -> String {
        crate::store::redact_dsn(&self.db)
    }

    /// GitHub sign-in (OAuth app) is configured: both id and secret set.
    pub fn github_oauth_configured(&self) -> bool {
        self.github_client_id.is_some() && self.github_client_secret.is_some()
    }

    /// The GitHub App (push-to-deploy) is configured: app id and private key set.
    pub fn github_app_configured(&self) -> bool {
        self.github_app_id.is_some() && self.github_app_private_key.is_some()
    }

    /// The console origin, or `""` (paths like `/app/device/` are then relative).
    pub fn console_base(&self) -> &str {
        self.console_url.as_deref().unwrap_or("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(args: &[&str], env: &[(&str, &str)]) -> Config {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let flags = Flags::try_parse_from(normalize_args(args.iter().map(|s| s.to_string())))
            .expect("flags parse");
        Config::resolve(flags, |k| env.get(k).cloned()).expect("config resolves")
    }

    #[test]
    fn resume_wait_and_drain_are_seconds() {
        let d = cfg(&["denv-cp"], &[]);
        assert_eq!((d.resume_wait_sec, d.drain_sec), (60, 20));
        let c = cfg(
            &["denv-cp"],
            &[("DENV_RESUME_WAIT", "3"), ("DENV_DRAIN", "0")],
        );
        assert_eq!((c.resume_wait_sec, c.drain_sec), (3, 0));
        let flags = Flags::try_parse_from(["denv-cp"]).unwrap();
        let e =
            Config::resolve(flags, |k| (k == "DENV_DRAIN").then(|| "20s".to_string())).unwrap_err();
        assert_eq!(e, "DENV_DRAIN=\"20s\": want a whole number of seconds");
    }

    #[test]
    fn single_dash_flags_work_as_written() {
        let c = cfg(
            &[
                "denv-cp",
                "-addr",
                ":8080",
                "-db",
                "./denv.db",
                "-public-url",
                "http://127.0.0.1:8080",
                "-v",
            ],
            &[],
        );
        assert_eq!(c.addr.to_string(), "0.0.0.0:8080");
        assert_eq!(c.db, "./denv.db");
        assert_eq!(c.public_url, "http://127.0.0.1:8080");
        assert!(c.verbose);
        let c = cfg(&["denv-cp", "--addr=127.0.0.1:9", "-denvd-url=/x"], &[]);
        assert_eq!(c.addr.to_string(), "127.0.0.1:9");
        assert_eq!(c.denvd_url, "/x");
    }

    #[test]
    fn flags_win_over_env_and_defaults_apply() {
        let c = cfg(
            &["denv-cp", "-db", "a.db"],
            &[("DENV_DB", "b.db"), ("DENV_ADDR", "127.0.0.1:7")],
        );
        assert_eq!(c.db, "a.db");
        assert_eq!(c.addr.to_string(), "127.0.0.1:7");
        let c = cfg(&["denv-cp"], &[]);
        assert_eq!(c.db, "denv.db");
        assert_eq!(c.addr.to_string(), "0.0.0.0:8080");
        assert_eq!(c.public_url, "http://localhost:8080");
        assert_eq!(c.denvd_url, "/denvd");
        assert_eq!(c.team_name, "default");
        assert_eq!(c.releases_dir, "bin");
        assert!(!c.dev_login);
    }

    #[test]
    fn assembles_a_postgres_dsn_and_redacts_it() {
        let c = cfg(
            &["denv-cp"],
            &[
                ("DENV_DB_HOST", "db.internal"),
                ("DENV_DB_PASSWORD", "p@ss word"),
            ],
        );
        assert_eq!(
            c.db,
            "postgres://denv:p%40ss%20word@db.internal:5432/denv?sslmode=require"
        );
        assert_eq!(
            c.db_redacted(),
            "postgres://denv:***@db.internal:5432/denv?sslmode=require"
        );
        assert!(!format!("{c:?}").contains("p%40ss"));
    }

    #[test]
    fn tls_takes_a_certificate_and_a_key_together() {
        let c = cfg(&["denv-cp"], &[]);
        assert_eq!(c.tls, None);
        let want = Some(TlsFiles {
            cert: "/etc/denv/cert.pem".into(),
            key: "/etc/denv/key.pem".into(),
        });
        let c = cfg(
            &[
                "denv-cp",
                "-tls-cert",
                "/etc/denv/cert.pem",
                "-tls-key=/etc/denv/key.pem",
            ],
            &[],
        );
        assert_eq!(c.tls, want);
        // With TLS the default public URL is https.
        assert_eq!(c.public_url, "https://localhost:8080");
        let c = cfg(
            &["denv-cp", "--tls-key", "/etc/denv/key.pem"],
            &[
                ("DENV_TLS_CERT", "/etc/denv/cert.pem"),
                ("DENV_TLS_KEY", "/other.pem"),
            ],
        );
        assert_eq!(c.tls, want);
        let c = cfg(
            &["denv-cp", "-public-url", "https://cp.example"],
            &[("DENV_TLS_CERT", "/c.pem"), ("DENV_TLS_KEY", "/k.pem")],
        );
        assert_eq!(c.public_url, "https://cp.example");
        assert_eq!(c.tls.unwrap().key, PathBuf::from("/k.pem"));

        let half = |env: &[(&str, &str)]| {
            let env: HashMap<String, String> = env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Config::resolve(Flags::try_parse_from(["denv-cp"]).unwrap(), |k| {
                env.get(k).cloned()
            })
            .unwrap_err()
        };
        assert_eq!(
            half(&[("DENV_TLS_CERT", "/c.pem")]),
            "-tls-cert (DENV_TLS_CERT) is set without -tls-key (DENV_TLS_KEY): TLS needs both"
        );
        assert_eq!(
            half(&[("DENV_TLS_KEY", "/k.pem")]),
            "-tls-key (DENV_TLS_KEY) is set without -tls-cert (DENV_TLS_CERT): TLS needs both"
        );
    }

    #[test]
    fn replica_mode_needs_url_secret_and_postgres() {
        let run = |env: &[(&str, &str)]| {
            let env: HashMap<String, String> = env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Config::resolve(Flags::try_parse_from(["denv-cp"]).unwrap(), |k| {
                env.get(k).cloned()
            })
        };
        let pg = ("DENV_DB", "postgres://denv@db/denv");
        let c = run(&[pg]).unwrap();
        assert_eq!(c.replica, None);
        assert_eq!(c.lease_ttl, std::time::Duration::from_secs(15));
        let c = run(&[
            pg,
            ("DENV_REPLICA_URL", "http://10.0.0.5:8080/"),
            ("DENV_REPLICA_SECRET", "s3cret"),
            ("DENV_LEASE_TTL", "1m30s"),
        ])
        .unwrap();
        let r = c.replica.clone().unwrap();
        assert_eq!(
            (r.url.as_str(), r.secret.as_str(), r.ca_file.as_deref()),
            ("http://10.0.0.5:8080", "s3cret", None)
        );
        assert_eq!(c.lease_ttl, std::time::Duration::from_secs(90));
        assert!(!format!("{c:?}").contains("s3cret"));
        assert_eq!(
            run(&[pg, ("DENV_REPLICA_URL", "http://a:1")]).unwrap_err(),
            "-replica-url (DENV_REPLICA_URL) is set without DENV_REPLICA_SECRET: replica mode needs both"
        );
        assert_eq!(
            run(&[pg, ("DENV_REPLICA_SECRET", "x")]).unwrap_err(),
            "DENV_REPLICA_SECRET is set without -replica-url (DENV_REPLICA_URL): replica mode needs both"
        );
        let e = run(&[
            ("DENV_REPLICA_URL", "http://a:1"),
            ("DENV_REPLICA_SECRET", "x"),
        ])
        .unwrap_err();
        assert!(
            e.starts_with("replica mode (-replica-url/DENV_REPLICA_URL) needs PostgreSQL"),
            "{e}"
        );
        // With TLS the replica URL is https://, and its CA file must hold a certificate.
        let ca = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../denv-client/testdata/test-ca.pem"
        );
        let tls = [
            pg,
            ("DENV_TLS_CERT", ca),
            ("DENV_TLS_KEY", ca),
            ("DENV_REPLICA_SECRET", "x"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = tls.to_vec();
            v.extend_from_slice(extra);
            run(&v)
        };
        let c = with(&[
            ("DENV_REPLICA_URL", "https://10.0.0.5:8080"),
            ("DENV_REPLICA_CA_FILE", ca),
        ])
        .unwrap();
        assert_eq!(
            c.replica.unwrap().ca_file.as_deref(),
            Some(std::path::Path::new(ca))
        );
        assert_eq!(
            with(&[("DENV_REPLICA_URL", "http://10.0.0.5:8080")]).unwrap_err(),
            "-replica-url (DENV_REPLICA_URL) \"http://10.0.0.5:8080\": want an https:// URL (this port serves TLS)"
        );
        assert_eq!(
            run(&[pg, ("DENV_REPLICA_URL", "https://a:1"), ("DENV_REPLICA_SECRET", "x")]).unwrap_err(),
            "-replica-url (DENV_REPLICA_URL) \"https://a:1\": want an http:// URL (this port serves plain HTTP/2 and HTTP/1.1)"
        );
        let e = with(&[
            ("DENV_REPLICA_URL", "https://a:1"),
            ("DENV_REPLICA_CA_FILE", "/nonexistent/ca.pem"),
        ])
        .unwrap_err();
        assert!(
            e.starts_with("-replica-ca-file (DENV_REPLICA_CA_FILE): ca file /nonexistent/ca.pem: "),
            "{e}"
        );
        assert_eq!(
            run(&[pg, ("DENV_LEASE_TTL", "15")]).unwrap_err(),
            "DENV_LEASE_TTL=\"15\": want a duration like 15s, 1m30s or 500ms"
        );
        assert_eq!(
            parse_go_duration("X", "500ms").unwrap(),
            std::time::Duration::from_millis(500)
        );
    }
}
