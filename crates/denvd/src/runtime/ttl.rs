//! Environment TTLs, enforced on the host (issue 11, "TTLs"; spec `15-ref-protocol.md`,
//! `env.create`/`env.fork` field `expires_at`).
//!
//! The control plane sends an environment's expiry (RFC 3339) with `env.create` and
//! `env.fork`. [`Runtime::set_expiry`] stores it in `<data>/envs/<env>/expires_at`
//! (one line, written atomically before anything of the environment is created, so a
//! sidecar restart, even a `kill -9` mid-create, keeps it) and refuses an expiry that
//! has already passed. [`Runtime::watch_expiry`] checks every [`REAP_EVERY`] and
//! destroys each environment whose expiry passed, under its command lock, whether or
//! not the control plane is reachable; each one is reported once on the channel (the
//! sidecar sends it as an `env.expired` event when the stream is up).

use super::{fail, Result, Runtime, RuntimeError};
use std::time::Duration;

/// The file holding an environment's expiry: `<data>/envs/<env>/expires_at`.
pub const EXPIRES_FILE: &str = "expires_at";

/// How often the sidecar looks for expired environments.
pub const REAP_EVERY: Duration = Duration::from_secs(1);

/// An environment destroyed because its TTL passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    /// The environment id.
    pub env_id: String,
    /// Its expiry as stored (RFC 3339).
    pub expires_at: String,
}

fn parse(s: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_rfc3339(s.trim())
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

impl Runtime {
    fn expires_path(&self, env_id: &str) -> std::path::PathBuf {
        self.inner
            .cfg
            .data_dir
            .join("envs")
            .join(env_id)
            .join(EXPIRES_FILE)
    }

    /// Records `env_id`'s expiry (`""` removes it: no TTL). Errors: `expires_at "x" is
    /// not an RFC 3339 time`, `environment <env> expired at <t> (ttl)` when it has
    /// passed (nothing is created then), an invalid environment id, the file system's.
    pub fn set_expiry(&self, env_id: &str, expires_at: &str) -> Result<()> {
        crate::storage::validate_name("environment id", env_id)?;
        let path = self.expires_path(env_id);
        if expires_at.trim().is_empty() {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(RuntimeError::io(format!("remove {}", path.display()), e))
                }
                _ => Ok(()),
            };
        }
        let Some(at) = parse(expires_at) else {
            return Err(RuntimeError::Invalid(format!(
                "expires_at {expires_at:?} is not an RFC 3339 time"
            )));
        };
        if at <= chrono::Utc::now() {
            return fail(format!(
                "environment {env_id} expired at {expires_at} (ttl)"
            ));
        }
        let dir = path.parent().expect("expires_at has a parent");
        std::fs::create_dir_all(dir)
            .map_err(|e| RuntimeError::io(format!("create {}", dir.display()), e))?;
        crate::config::write_private(&path, format!("{}\n", expires_at.trim()).as_bytes())
            .map_err(|e| RuntimeError::io(format!("write {}", path.display()), e))
    }

    /// `env_id`'s recorded expiry (RFC 3339), if any.
    pub fn expiry(&self, env_id: &str) -> Option<String> {
        let s = std::fs::read_to_string(self.expires_path(env_id)).ok()?;
        let s = s.trim().to_string();
        parse(&s).map(|_| s)
    }

    /// Destroys every environment of this data directory whose expiry has passed (each
    /// checked again under its command lock). Returns the ones destroyed; failures are
    /// logged and tried again on the next call.
    pub async fn reap_expired(&self) -> Vec<Expired> {
        let now = chrono::Utc::now();
        let mut due: Vec<String> = std::fs::read_dir(self.inner.cfg.data_dir.join("envs"))
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().to_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        due.retain(|env| {
            self.expiry(env)
                .and_then(|s| parse(&s))
                .is_some_and(|t| t <= now)
        });
        due.sort();
        let mut out = Vec::new();
        for env in due {
            let _g = self.lock_env(&env).await;
            // A deploy may have set a new expiry meanwhile.
            let Some(at) = self.expiry(&env) else {
                continue;
            };
            if parse(&at).is_none_or(|t| t > chrono::Utc::now()) {
                continue;
            }
            match self.destroy_locked(&env).await {
                Ok(_) => {
                    tracing::info!("environment {env} expired at {at} (ttl): destroyed");
                    out.push(Expired {
                        env_id: env,
                        expires_at: at,
                    });
                }
                Err(e) => tracing::warn!("destroying expired environment {env}: {e}"),
            }
        }
        out
    }

    /// Runs [`Runtime::reap_expired`] every [`REAP_EVERY`] forever, sending each
    /// destroyed environment on `tx`. Returns when `tx` is closed.
    pub async fn watch_expiry(self, tx: tokio::sync::mpsc::UnboundedSender<Expired>) {
        let mut tick = tokio::time::interval(REAP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if tx.is_closed() {
                return;
            }
            for e in self.reap_expired().await {
                if tx.send(e).is_err() {
                    return;
                }
            }
        }
    }
}
