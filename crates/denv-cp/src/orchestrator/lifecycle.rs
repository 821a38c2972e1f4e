//! Lifecycle: every environment ends, and the control plane and its hosts agree on
//! which ones exist (issue 11; spec pages `16-ref-deployments.md` "destroy",
//! `15-ref-protocol.md` `host.report`, `12-ref-rest-api.md` `ttl_sec`).
//!
//! - **Destroys with a reason.** Every destroy is a `destroy` deployment whose
//!   `params.reason` says why: [`reason::REQUESTED`] (`DELETE /v1/envs/{env}`),
//!   [`reason::TTL`] (its `expires_at` passed), [`reason::CANCELLED`] (the client of
//!   `POST /v1/sandboxes` went away before the answer), [`reason::ABANDONED`] (a control
//!   plane restart interrupted its first deploy or fork, or its destroy),
//!   [`reason::FAILED`] (a sandbox create or a warm pool fill that failed),
//!   [`reason::DRAINED`] (a warm pool member no longer wanted, [`super::pool`]).
//!   [`Orchestrator::destroy_env`] starts at most one at a time per environment.
//! - **Deferred teardown.** A destroy while the environment's host has no stream marks
//!   the environment `destroyed` at once (teardown skipped with
//!   `{reason: "host not connected; torn down when it reconnects"}`); the host removes it
//!   when it is back (below).
//! - **Reconcile on connect.** After every welcome denvd sends a `host.report` event
//!   `{environments: [id…], failed: {id: reason}}`: everything it holds. The control
//!   plane answers with an `env.destroy` command for each held environment that it has
//!   as `destroyed`, does not know (no row, or another team's), or has placed on another
//!   host (each checked again under the environment's deployment lock, so a deploy that
//!   starts it again is never undone), appending `env.torn_down` `{host, reason}` to
//!   `env:<id>` (or `env.reaped` to `host:<id>` for an unknown id). A `healthy`
//!   environment of that host that the host does not hold, or reports failed, becomes
//!   `failed` with an `env.failed` `{reason}` event.
//! - **TTLs.** `ttl_sec` on a deploy, fork or sandbox sets the environment's
//!   `expires_at` ([`expiry_from_ttl`]); the host gets it in `env.create`/`env.fork` and
//!   destroys the environment then on its own, connected or not (and says so with an
//!   `env.expired` event). The control plane checks every [`REAP_EVERY`] for expired
//!   environments and destroys them with reason `ttl` (teardown deferred when the host is
//!   away), so the record shows the expiry as a deployment.

use super::link::Addr;
use super::{repo, Orchestrator};
use crate::domain::{DeploymentState, EnvRow, EnvStatus};
use crate::error::ApiError;
use crate::hub::{HostNotice, Notice};
use crate::store::environments;
use denv_proto::contract::PHASE_TIMEOUT;
use denv_proto::v1;
use serde_json::json;
use std::collections::{HashMap, HashSet};

/// How long finished command rows are kept (then deleted, checked every hour).
pub const COMMAND_RETENTION: chrono::Duration = chrono::Duration::days(7);
use std::time::{Duration, Instant};

/// Why an environment was destroyed (`params.reason` of its destroy deployment).
pub mod reason {
    /// `DELETE /v1/envs/{env}` (or the CLI/Python/adapters calling it).
    pub const REQUESTED: &str = "requested";
    /// Its TTL passed.
    pub const TTL: &str = "ttl";
    /// The client of `POST /v1/sandboxes` disconnected before the sandbox was returned.
    pub const CANCELLED: &str = "cancelled";
    /// A control plane restart interrupted its creation (or its destroy).
    pub const ABANDONED: &str = "abandoned";
    /// `POST /v1/sandboxes` answered `502`: the sandbox's creation failed, and the caller,
    /// who got no environment back, cannot be expected to destroy what was half made.
    pub const FAILED: &str = "failed";
    /// A warm pool member no longer wanted: its version stopped being current, its owner
    /// is destroyed, or the pool was made smaller ([`super::pool`]).
    pub const DRAINED: &str = "drained";
    /// `DELETE /v1/projects/{project}?force=true` destroyed the project's environments.
    pub const PROJECT_DELETED: &str = "project deleted";
}

/// The longest TTL accepted: 365 days, in seconds.
pub const MAX_TTL_SEC: i64 = 365 * 24 * 3600;

/// How often the control plane looks for expired environments.
pub const REAP_EVERY: Duration = Duration::from_secs(2);

/// A failed destroy of an expired environment is retried after this long.
const REAP_RETRY: Duration = Duration::from_secs(60);

/// `expires_at` for a TTL in seconds from now: `""` for 0 (no TTL); RFC 3339 in the
/// store's format otherwise. `400 ttl_sec must be between 1 and 31536000 (365 days), got
/// N` for a negative or larger value.
pub fn expiry_from_ttl(ttl_sec: i64) -> Result<String, ApiError> {
    if ttl_sec == 0 {
        return Ok(String::new());
    }
    if !(1..=MAX_TTL_SEC).contains(&ttl_sec) {
        return Err(ApiError::BadRequest(format!(
            "ttl_sec must be between 1 and {MAX_TTL_SEC} (365 days), got {ttl_sec}"
        )));
    }
    Ok(crate::store::fmt_time(
        chrono::Utc::now() + chrono::Duration::seconds(ttl_sec),
    ))
}

impl Orchestrator {
    /// Destroys the team's environment `env_id` with `reason` (see [`reason`]), at most
    /// one destroy at a time: an unfinished destroy of it is returned as is. A destroyed
    /// environment is destroyed again only for [`reason::REQUESTED`] (the teardown runs
    /// again on its host); for the other reasons `Ok(None)`. `404` when the team has no
    /// such environment.
    pub async fn destroy_env(
        &self,
        team_id: &str,
        env_id: &str,
        why: &str,
    ) -> Result<Option<DeploymentState>, ApiError> {
        let _create = self.create_lock().await?;
        let env = repo::env(self.db(), team_id, env_id)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("environment {env_id} not found")))?;
        if let Some(open) = repo::open_destroy(self.db(), env_id).await? {
            return repo::deployment(self.db(), team_id, &open.id).await;
        }
        if env.status == EnvStatus::Destroyed && why != reason::REQUESTED {
            return Ok(None);
        }
        self.start_destroy(team_id, &env, why).await.map(Some)
    }

    /// Starts a `ttl` destroy of every environment whose `expires_at` passed (skipping
    /// ones in `retry` tried less than a minute ago). Returns how many were started.
    async fn reap_expired(&self, retry: &mut HashMap<String, Instant>) -> usize {
        let now = crate::store::now();
        let expired = match repo::expired_envs(self.db(), &now).await {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, "listing expired environments");
                return 0;
            }
        };
        retry.retain(|_, t| t.elapsed() < REAP_RETRY);
        let mut n = 0;
        for e in expired {
            if retry.contains_key(&e.id) {
                continue;
            }
            retry.insert(e.id.clone(), Instant::now());
            match self.destroy_env(&e.team_id, &e.id, reason::TTL).await {
                Ok(Some(d)) => {
                    let dep = d.deployment.id;
                    tracing::info!(env = %e.id, expires_at = %e.expires_at, deployment = %dep, "TTL passed; destroying");
                    n += 1;
                }
                Ok(None) => {}
                Err(err) => tracing::error!(env = %e.id, error = %err, "TTL destroy"),
            }
        }
        n
    }

    /// Acts on one [`HostNotice`] (see the module docs).
    pub async fn on_notice(&self, n: HostNotice) {
        match &n.notice {
            Notice::Report(r) => {
                self.reconcile_host(&n.team_id, &n.host_id, r).await;
                // Pools refill (after a restart, or a host that was away) once the host
                // and the record agree.
                self.pool_sync_host(&n.team_id, &n.host_id).await;
            }
            Notice::Expired(x) => {
                let env_id = x.env_id.as_str();
                match repo::env_row(self.db(), env_id).await {
                    Ok(Some(e)) if e.team_id == n.team_id && e.host_id == n.host_id => {
                        if let Err(err) = self.destroy_env(&e.team_id, &e.id, reason::TTL).await {
                            tracing::error!(env = %env_id, error = %err, "recording a TTL expiry");
                        }
                    }
                    Ok(_) => {}
                    Err(err) => tracing::error!(env = %env_id, error = %err, "loading environment"),
                }
            }
        }
    }

    /// The control plane's answer to a host's `host.report` (see the module docs).
    pub async fn reconcile_host(&self, team_id: &str, host_id: &str, report: &v1::HostReportEvent) {
        let (held, failed) = (&report.environments, &report.failed);
        tracing::info!(
            host_id,
            held = held.len(),
            failed = failed.len(),
            "host report"
        );
        let db = self.db();
        for env_id in held {
            let row = match repo::env_row(db, env_id).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(env = %env_id, error = %e, "loading environment");
                    continue;
                }
            };
            // A destroy in flight may have skipped its teardown just before the host
            // came back: check again once it is done.
            let destroying = row
                .as_ref()
                .is_some_and(|e| e.status() == EnvStatus::Destroying);
            let why = must_go(row.as_ref(), team_id, host_id)
                .or(destroying.then_some("destroyed while the host was away"));
            if let Some(why) = why {
                let (orch, team, host, env) = (
                    self.clone(),
                    team_id.to_string(),
                    host_id.to_string(),
                    env_id.clone(),
                );
                tokio::spawn(async move { orch.teardown_held(&team, &host, &env, why).await });
                continue;
            }
            if let (Some(reason), Some(e)) = (failed.get(env_id), row.as_ref()) {
                self.mark_env_failed(e, reason).await;
            }
        }
        let held: HashSet<&String> = held.iter().collect();
        match repo::envs_on_host(db, host_id).await {
            Ok(rows) => {
                for e in rows {
                    if e.team_id == team_id && !held.contains(&e.id) {
                        let why = format!("host {host_id} no longer holds it");
                        self.mark_env_failed(&e, &why).await;
                    }
                }
            }
            Err(e) => tracing::error!(host_id, error = %e, "listing the host's environments"),
        }
    }

    /// `healthy` → `failed` with an `env.failed` `{reason}` event on `env:<id>`.
    async fn mark_env_failed(&self, e: &environments::Model, why: &str) {
        if e.status() != EnvStatus::Healthy {
            return;
        }
        let db = self.db();
        if let Err(err) = repo::set_env_status(db, &e.id, EnvStatus::Failed).await {
            tracing::error!(env = %e.id, error = %err, "marking environment failed");
            return;
        }
        tracing::warn!(env = %e.id, reason = why, "environment failed on its host");
        let subject = format!("env:{}", e.id);
        if let Err(err) = repo::event(
            db,
            &e.team_id,
            &subject,
            "env.failed",
            &json!({"reason": why}),
        )
        .await
        {
            tracing::error!(env = %e.id, error = %err, "appending env.failed");
        }
    }

    /// Sends `env.destroy` for an environment the host holds and no live record owns,
    /// under the environment's deployment lock (checked again there).
    async fn teardown_held(&self, team_id: &str, host_id: &str, env_id: &str, why: &'static str) {
        let lock = self.env_lock(env_id);
        let _turn = lock.lock().await;
        let row = repo::env_row(self.db(), env_id).await.ok().flatten();
        if must_go(row.as_ref(), team_id, host_id).is_none() {
            return;
        }
        let to = Addr::new(team_id, host_id, env_id);
        let r = self
            .link()
            .destroy(&to, v1::EnvDestroy {}, PHASE_TIMEOUT)
            .await;
        let body = match &r {
            Ok(_) => json!({"host": host_id, "reason": why}),
            Err(e) => json!({"host": host_id, "reason": why, "error": e.to_string()}),
        };
        let (kind, subject, team) = match (&r, &row) {
            (Ok(_), Some(e)) if e.team_id == team_id => {
                ("env.torn_down", format!("env:{env_id}"), e.team_id.clone())
            }
            (Ok(_), _) => ("env.reaped", format!("host:{host_id}"), team_id.to_string()),
            (Err(_), _) => (
                "env.teardown_failed",
                format!("host:{host_id}"),
                team_id.to_string(),
            ),
        };
        match &r {
            Ok(_) => tracing::info!(env = %env_id, host_id, reason = why, "removed from its host"),
            Err(e) => {
                tracing::warn!(env = %env_id, host_id, reason = why, error = %e, "teardown on reconnect failed")
            }
        }
        let mut body = body;
        body["env_id"] = json!(env_id);
        if let Err(e) = repo::event(self.db(), &team, &subject, kind, &body).await {
            tracing::error!(env = %env_id, error = %e, "appending {kind}");
        }
    }

    /// Runs the lifecycle in the background (on the current tokio runtime): the TTL
    /// reaper every [`REAP_EVERY`] and the answers to the hosts' notices. Call once.
    pub fn spawn_lifecycle(&self) {
        let orch = self.clone();
        let mut rx = self.link().hub().notices();
        tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(n) => {
                        let o = orch.clone();
                        tokio::spawn(async move { o.on_notice(n).await });
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(k)) => {
                        tracing::warn!(skipped = k, "host notices lagged");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        let orch = self.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(3600));
            loop {
                every.tick().await;
                let cutoff = chrono::Utc::now() - COMMAND_RETENTION;
                let cutoff = cutoff.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
                match crate::store::commands::prune_finished(orch.db(), &cutoff).await {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!(deleted = n, "finished commands older than 7 days deleted")
                    }
                    Err(e) => tracing::warn!(error = %e, "pruning old commands failed"),
                }
            }
        });
        let orch = self.clone();
        tokio::spawn(async move {
            let mut retry = HashMap::new();
            let mut tick = tokio::time::interval(REAP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                orch.reap_expired(&mut retry).await;
            }
        });
    }
}

/// Why a host must not keep `row` (`None`: it may).
fn must_go(
    row: Option<&environments::Model>,
    team_id: &str,
    host_id: &str,
) -> Option<&'static str> {
    match row {
        None => Some("unknown to the control plane"),
        Some(e) if e.team_id != team_id => Some("unknown to the control plane"),
        Some(e) if e.status() == EnvStatus::Destroyed => Some("destroyed while the host was away"),
        Some(e) if !e.host_id.is_empty() && e.host_id != host_id => Some("placed on another host"),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_bounds() {
        assert_eq!(expiry_from_ttl(0).unwrap(), "");
        let t = expiry_from_ttl(60).unwrap();
        let at = crate::store::parse_time(&t).unwrap();
        let d = at - chrono::Utc::now();
        assert!(d.num_seconds() > 55 && d.num_seconds() <= 60, "{d:?}");
        for bad in [-1, MAX_TTL_SEC + 1] {
            let e = expiry_from_ttl(bad).unwrap_err().to_string();
            assert!(e.contains("ttl_sec must be between 1 and 31536000"), "{e}");
        }
    }
}
