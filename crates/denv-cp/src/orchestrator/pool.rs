//! The warm pool: forks of an environment's current version made ahead of time, handed
//! out on `POST /v1/envs/{env}/fork` and `POST /v1/sandboxes` `from_version` without
//! waiting for a clone (issue 12; `docs/reference/deployments.md` "Warm pool").
//!
//! - **Members are ordinary forks.** A member is an environment of stage [`STAGE`]
//!   (`pool`), no TTL, forked from the owner's current version by an ordinary `fork`
//!   deployment (`params.pool = "fill"`): its own network, its own datasets, its egress
//!   proven by the sidecar like any fork. It is listed with the project's environments
//!   under that stage.
//! - **Size.** The owner's `pool` column when a request set it (`pool` on a fork or
//!   sandbox request: `0..=`[`denv_compose::MAX_POOL`]), else the current version's
//!   `x-denv.pool` for environments that were deployed (stages other than `fork`,
//!   `verify` and `pool`: a fork's forks are not pooled by the file, or every fork of a
//!   GRPO group would fill a pool). Only a version the owner itself holds (its deploy or
//!   snapshot) is pooled.
//! - **Host capacity.** A host holds at most [`max_per_host`] members (all teams):
//!   `DENV_POOL_MAX_PER_HOST`, default [`DEFAULT_MAX_PER_HOST`]. Members being drained
//!   (a destroy deployment recorded, even if not started) do not count. A fill that
//!   would pass it is not started (logged); the pool stays short until room frees: the
//!   end of a member's destroy (unless it was a failed fill) syncs the pools of its
//!   team's environments on that host.
//! - **Hand-out.** A fork of version V whose owner has a healthy member of V on a
//!   connected host takes the oldest one: in one transaction the member becomes the
//!   requester's environment (name, stage `fork`, TTL) and a `fork` deployment is
//!   recorded already `succeeded`, its phases saying where it came from (`place`
//!   `{reason: "warm pool"}`, `clone` `{pool: "hit", member, filled_by}`, `health` the
//!   member's own proof from its fill). A refill starts in the background. No member
//!   ready: a cold fork, `params.pool = "miss"` when the version has a pool. A member's
//!   TTL (from the request) is kept by the control plane's reaper only (its host never
//!   learned one).
//! - **Sync** ([`Orchestrator::pool_sync`], one at a time per owner, across replicas
//!   too): after every deploy,
//!   snapshot, rollback and destroy of the owner, after a hand-out, when a request sets
//!   the size, and when the host reports in (`host.report`). Members of any other
//!   version than the current one, members beyond the size, and every member of an
//!   owner being destroyed are destroyed with reason `drained`; failed members with
//!   reason `failed`; then the pool is filled up to its size (owner `healthy`, host
//!   connected, within the host cap). A fill that fails is destroyed (reason `failed`)
//!   and not retried until the next sync.
//! - **Frozen clock.** A version with `x-denv.clock: frozen` is never pooled (size 0
//!   whatever was asked; existing members are drained): a member's clock would start at
//!   the snapshot's instant when it was filled, not when it is handed out.
//! - **Restarts.** Members are rows: after a control plane restart the healthy ones are
//!   still the pool, a fill cut short is destroyed (`abandoned`) by recovery, and the
//!   host's `host.report` triggers the sync that refills.

use super::lifecycle::reason;
use super::repo::{self, now, NewRows};
use super::{short_id, Orchestrator};
use crate::domain::{
    DeploymentState, DeploymentStatus, EnvRow, EnvStatus, Environment, Kind, PhaseName,
    PhaseStatus, Version,
};
use crate::error::ApiError;
use crate::store::environments;
use serde_json::{json, Value};
use std::sync::OnceLock;

/// The stage of a pool member.
pub const STAGE: &str = "pool";

/// Members a host holds at most when `DENV_POOL_MAX_PER_HOST` is not set.
pub const DEFAULT_MAX_PER_HOST: u64 = 8;

/// The per-host cap on pool members: `DENV_POOL_MAX_PER_HOST` (a whole number), else
/// [`DEFAULT_MAX_PER_HOST`]. Read once.
pub fn max_per_host() -> u64 {
    static CAP: OnceLock<u64> = OnceLock::new();
    *CAP.get_or_init(|| {
        std::env::var("DENV_POOL_MAX_PER_HOST")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_MAX_PER_HOST)
    })
}

/// A request's `pool` value checked: `0..=MAX_POOL`, else `400 pool must be between 0
/// and 64, got N`.
pub fn check_size(n: i32) -> Result<i32, ApiError> {
    if !(0..=denv_compose::MAX_POOL as i32).contains(&n) {
        return Err(ApiError::BadRequest(format!(
            "pool must be between 0 and {}, got {n}",
            denv_compose::MAX_POOL
        )));
    }
    Ok(n)
}

impl Orchestrator {
    /// Checks that a request may set the pool of `version` (it must be the current
    /// version of the environment that owns it: `400` otherwise) and returns that owner's
    /// id. Call [`Self::set_pool_size`] with it once the request is accepted.
    pub async fn pool_owner_for(
        &self,
        team_id: &str,
        version_id: &str,
        n: i32,
    ) -> Result<String, ApiError> {
        check_size(n)?;
        let version = repo::version(self.db(), team_id, version_id)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("version {version_id} not found")))?;
        let owner = repo::env(self.db(), team_id, &version.env_id)
            .await?
            .ok_or_else(|| {
                ApiError::NotFound(format!("environment {} not found", version.env_id))
            })?;
        if owner.current_version_id != version.id {
            return Err(ApiError::BadRequest(format!(
                "version {} is not the current version of environment {}; a warm pool keeps forks of the current version only",
                version.id, owner.id
            )));
        }
        Ok(owner.id)
    }

    /// Sets the pool size of environment `owner_id` (checked by [`Self::pool_owner_for`])
    /// and syncs its pool in the background.
    pub async fn set_pool_size(
        &self,
        team_id: &str,
        owner_id: &str,
        n: i32,
    ) -> Result<(), ApiError> {
        repo::set_pool(self.db(), owner_id, check_size(n)?).await?;
        self.spawn_pool_sync(team_id, owner_id);
        Ok(())
    }

    /// The version `owner` pools and how many members it wants (`("", 0)`: none).
    async fn pool_target(&self, owner: &environments::Model) -> (String, u32) {
        if owner.stage == STAGE
            || owner.status() == EnvStatus::Destroyed
            || owner.status() == EnvStatus::Destroying
            || owner.current_version_id.is_empty()
        {
            return (String::new(), 0);
        }
        let Ok(Some(v)) = repo::version(self.db(), &owner.team_id, &owner.current_version_id).await
        else {
            return (String::new(), 0);
        };
        if v.env_id != owner.id || !v.healthy || v.snapshot.is_empty() {
            return (String::new(), 0);
        }
        // A member's clock would start at the snapshot's instant when it is filled, not
        // when it is handed out: a frozen-clock version is never kept warm (its forks
        // are cold, so each starts at the instant).
        if v.spec.frozen_clock() {
            return (String::new(), 0);
        }
        let size = if owner.pool >= 0 {
            owner.pool as u32
        } else if matches!(owner.stage.as_str(), "fork" | "verify") {
            0
        } else {
            v.spec.pool
        };
        (v.id, size.min(denv_compose::MAX_POOL))
    }

    /// Runs [`Self::destroy_env`] in the background (errors are logged).
    pub fn spawn_destroy(&self, team_id: &str, env_id: &str, why: &'static str) {
        let (orch, team, env) = (self.clone(), team_id.to_string(), env_id.to_string());
        tokio::spawn(async move {
            if let Err(e) = orch.destroy_env(&team, &env, why).await {
                tracing::error!(env = %env, reason = why, error = %e, "destroy");
            }
        });
    }

    /// Runs [`Self::pool_sync`] in the background.
    pub fn spawn_pool_sync(&self, team_id: &str, owner_id: &str) {
        let (orch, team, env) = (self.clone(), team_id.to_string(), owner_id.to_string());
        tokio::spawn(async move {
            if let Err(e) = orch.pool_sync(&team, &env).await {
                tracing::error!(env = %env, error = %e, "warm pool sync");
            }
        });
    }

    /// After pool member `member_id` of `host_id` was destroyed for another reason than
    /// a failed fill: syncs the pools of the team's environments on that host in the
    /// background, since the host's cap ([`max_per_host`]) may have held a fill back
    /// that now fits. (After a failed fill it waits for the next sync, so a fill that
    /// keeps failing is not retried in a loop.)
    pub fn spawn_pool_sync_after_member(&self, team_id: &str, member_id: &str, host_id: &str) {
        let (orch, team, host) = (self.clone(), team_id.to_string(), host_id.to_string());
        tracing::debug!(env = %member_id, host = %host, "pool member gone; syncing the host's pools");
        tokio::spawn(async move { orch.pool_sync_host(&team, &host).await });
    }

    /// Brings the pool of environment `owner_id` to what it should be (see the module
    /// docs): drains what is stale, fills what is missing. Returns how many fills it
    /// started.
    pub async fn pool_sync(&self, team_id: &str, owner_id: &str) -> Result<usize, ApiError> {
        let lock = self.env_lock(&format!("pool:{owner_id}"));
        let _one = lock.lock().await;
        // Replica mode: one sync per owner across replicas too.
        let _everywhere = self.store_lock(&format!("denv-pool:{owner_id}")).await?;
        let db = self.db();
        let Some(owner) = repo::env_row(db, owner_id)
            .await
            .map_err(|e| ApiError::Internal(format!("store: {e}")))?
            .filter(|e| e.team_id == team_id)
        else {
            return Ok(0);
        };
        if owner.stage == STAGE {
            return Ok(0);
        }
        let (want, size) = self.pool_target(&owner).await;
        let members = repo::pool_members(db, team_id, owner_id).await?;
        let mut kept = 0u32;
        for m in &members {
            if m.status() == EnvStatus::Destroying || repo::open_destroy(db, &m.id).await?.is_some()
            {
                continue;
            }
            let why = if m.parent_version_id != want {
                Some(reason::DRAINED)
            } else if m.status() == EnvStatus::Failed {
                Some(reason::FAILED)
            } else if kept >= size {
                Some(reason::DRAINED)
            } else {
                kept += 1;
                None
            };
            if let Some(why) = why {
                tracing::info!(env = %m.id, owner = %owner_id, reason = why, "draining a pool member");
                self.destroy_env(team_id, &m.id, why).await?;
            }
        }
        if kept >= size
            || owner.status() != EnvStatus::Healthy
            || !self.link().is_connected(&owner.host_id)
        {
            return Ok(0);
        }
        let on_host = repo::pool_count_on_host(db, &owner.host_id).await?;
        let room = max_per_host().saturating_sub(on_host);
        let missing = u64::from(size - kept);
        let n = missing.min(room);
        if n < missing {
            tracing::warn!(
                owner = %owner_id,
                host = %owner.host_id,
                missing,
                cap = max_per_host(),
                "warm pool held short by the host's cap (DENV_POOL_MAX_PER_HOST)"
            );
        }
        let Some(version) = repo::version(db, team_id, &want).await? else {
            return Ok(0);
        };
        for _ in 0..n {
            let name = format!("{}-pool-{}", owner.name, short_id());
            self.fork_version_with(
                team_id,
                &version,
                &name,
                STAGE,
                "",
                false,
                &super::resources::Request::default(),
            )
            .await?;
        }
        Ok(n as usize)
    }

    /// Syncs the pool of every environment of `team_id` on `host_id` (after its
    /// `host.report`).
    pub async fn pool_sync_host(&self, team_id: &str, host_id: &str) {
        let rows = match repo::envs_on_host(self.db(), host_id).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(host_id, error = %e, "listing the host's environments");
                return;
            }
        };
        for e in rows {
            if e.team_id == team_id && e.stage != STAGE && e.status() != EnvStatus::Destroyed {
                if let Err(err) = self.pool_sync(team_id, &e.id).await {
                    tracing::error!(env = %e.id, error = %err, "warm pool sync");
                }
            }
        }
    }

    /// Hands out a healthy member of `version` as environment `name` (see the module
    /// docs), or `None` when none is ready. Called with the creation lock held, after
    /// the name was checked. `t0`: when the request was taken (for `took_ms`).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn take_from_pool(
        &self,
        team_id: &str,
        version: &Version,
        owner: &Environment,
        name: &str,
        stage: &str,
        expires_at: &str,
        t0: std::time::Instant,
    ) -> Result<Option<DeploymentState>, ApiError> {
        if stage == STAGE || !self.link().is_connected(&owner.host_id) {
            return Ok(None);
        }
        let db = self.db();
        for m in repo::pool_ready(db, team_id, &version.id, &owner.host_id).await? {
            if repo::open_destroy(db, &m.id).await?.is_some() {
                continue;
            }
            // The member's own fill: its proof (endpoints, egress) is the hand-out's.
            let fill = repo::deployments_of(db, &m.id)
                .await?
                .into_iter()
                .find(|d| d.kind == Kind::Fork && d.status == DeploymentStatus::Succeeded);
            let (fill_id, health) = match &fill {
                Some(d) => {
                    let ev = repo::deployment(db, team_id, &d.id)
                        .await?
                        .and_then(|s| s.phases.into_iter().find(|p| p.is(PhaseName::Health)))
                        .map(|p| p.evidence)
                        .unwrap_or(Value::Null);
                    (d.id.clone(), ev)
                }
                None => continue,
            };
            let mut health = match health {
                Value::Object(o) => Value::Object(o),
                _ => json!({}),
            };
            health["pool"] = json!("hit");
            let (mut dep, mut phases) = Orchestrator::new_deployment(
                Kind::Fork,
                &owner.project_id,
                &m.id,
                &version.id,
                json!({"from_env": owner.id, "version": version.id, "name": name, "pool": "hit"}),
            );
            let t = now();
            let took_ms = t0.elapsed().as_millis() as u64;
            for p in &mut phases {
                let ev = match p.name {
                    PhaseName::Place => json!({"host": m.host_id, "reason": "warm pool"}),
                    PhaseName::Clone => json!({
                        "pool": "hit",
                        "member": m.id,
                        "filled_by": fill_id,
                        "from": version.id,
                        "filled_at": m.created_at,
                    }),
                    PhaseName::Health => health.clone(),
                    _ => json!({"env": m.id, "took_ms": took_ms, "pool": "hit"}),
                };
                p.status = PhaseStatus::Ok;
                p.evidence = ev;
                p.started_at = t.clone();
                p.finished_at = t.clone();
            }
            dep.status = DeploymentStatus::Succeeded;
            dep.finished_at = t.clone();
            let events = vec![
                (
                    format!("env:{}", m.id),
                    "deployment.started",
                    json!({"kind": "fork"}),
                ),
                (
                    format!("dep:{}", dep.id),
                    "deployment.started",
                    json!({"kind": "fork"}),
                ),
                (
                    format!("env:{}", m.id),
                    "deployment.finished",
                    json!({"status": DeploymentStatus::Succeeded, "took_ms": took_ms, "error": ""}),
                ),
                (
                    format!("dep:{}", dep.id),
                    "deployment.finished",
                    json!({"status": DeploymentStatus::Succeeded, "took_ms": took_ms, "error": ""}),
                ),
            ];
            let rows = NewRows {
                envs: vec![],
                versions: vec![],
                deployment: dep,
                phases,
            };
            if !repo::claim_pool_member(db, team_id, &m.id, name, stage, expires_at, &rows, &events)
                .await?
            {
                continue;
            }
            tracing::info!(env = %m.id, name, version = %version.id, took_ms, "handed out from the warm pool");
            self.spawn_pool_sync(team_id, &owner.id);
            return Ok(Some(DeploymentState {
                deployment: rows.deployment,
                phases: rows.phases,
            }));
        }
        Ok(None)
    }

    /// Whether `version` has a pool (its owner wants members of it): for the cold
    /// fork's `params.pool = "miss"`.
    pub(super) async fn has_pool(&self, owner_id: &str, version_id: &str) -> bool {
        match repo::env_row(self.db(), owner_id).await {
            Ok(Some(o)) => {
                let (v, n) = self.pool_target(&o).await;
                n > 0 && v == version_id
            }
            _ => false,
        }
    }
}
