//! The orchestrator: deployments as rows with ordered phase rows, run by one tokio task
//! per deployment (spec pages `16-ref-deployments.md`, `17-ref-targets.md`).
//!
//! # Shape
//!
//! A request is checked and turned into rows first (Restate's *apply, then side
//! effects*): new environments and versions, the deployment (`pending`) and every phase
//! of its kind (`pending`) are inserted in one transaction; only then is the runner
//! spawned. The runner executes the phases in order, each one hub command (or derived
//! from the previous command's result), storing the phase's evidence with exactly the
//! keys of `16-ref-deployments.md`. Every change is written to the store and published
//! on a [`tokio::sync::watch`] channel per deployment, which `WatchDeployment` streams.
//!
//! | kind | phases |
//! |---|---|
//! | deploy | `resolve, place, provision, join, prepare, start, health, warm, snapshot, ingress, verdict` |
//! | fork | `place, clone, health, verdict` |
//! | snapshot | `snapshot, health, verdict` |
//! | rollback | `restore, health, verdict` |
//! | verify | `stop, collect, snapshot, clone, grade, verdict` |
//! | destroy | `teardown, verdict` |
//! | promote | `gate.fork, gate.consistency, gate.replay, gate.invariants, gate.soak, apply, verdict` |
//!
//! Kinds, phase names and every status are the enums of [`crate::domain`]
//! ([`Kind::phases`] is the table above); the moves between statuses the runners make
//! are the `can_become` tables there, and [`repo`] (the one repository of environments,
//! versions, deployments and phases) refuses any other.
//!
//! # Placement (`place`, deploys only)
//!
//! 1. the environment's own host if connected (`environment already on host`);
//! 2. with a [`Pin`] (target sandboxes): among the connected hosts that joined through
//!    that cloud, by [`placement`] (`target <name>`), else `place` fails
//!    `target "<name>" (<provider>): no connected host`;
//! 3. among the team's connected hosts, the one with the most room that fits
//!    ([`placement`]: `most room in team`; `no host has capacity for …` when none fits);
//! 4. none: `place` records `no connected host; provisioning` and `provision` fails with
//!    `no connected host and no cloud that can provision: …` (clouds cannot provision yet).
//!
//! Fork, snapshot, rollback, verify and destroy run on the environment's own host and
//! fail at once (`host … is not connected`) when it has no stream, rather than waiting
//! in the hub for the 15 minute command timeout; destroy then defers `teardown` until the
//! host reconnects ([`lifecycle`]).
//!
//! # Decisions
//!
//! - **One deployment at a time per environment: later ones wait.** A deployment
//!   accepted while another of the same environment runs is created `pending` (the
//!   202 answer says so) and starts when the earlier one ends, in arrival order (a fair
//!   per-environment `tokio::sync::Mutex`). Nothing is refused with 409 for being busy;
//!   a destroyed environment refuses fork/snapshot/rollback/verify/exec with
//!   `409 environment … is destroyed` (a deploy to it starts it again; a destroy runs
//!   again, see [`lifecycle`]).
//! - **Version rows are created with the deployment** (deploy, snapshot, verify), so
//!   `deployment.VersionID` is known in the 202 answer; `resolve` records them.
//! - **Restart recovery resumes (wanted state against observed state).** At start
//!   ([`Orchestrator::recover`]) every deployment still `pending` or `running` is taken
//!   over: its job is rebuilt from its rows, and its runner waits (holding the
//!   environment's lock) for the environment's host to reconnect, then runs from the
//!   first phase. Each command it sends has the id it had in the earlier run
//!   ([`crate::hub::replay`]: `cmd_<deployment>_<n>`), so a command that finished is
//!   answered from its row and one without a result goes to the host again under that
//!   id, where the sidecar's journal answers it or joins the run still going: the
//!   deployment reaches the outcome the host produced, and nothing runs twice. Not
//!   resumed, and failed with `control plane restarted during <phase>; <why>`: a
//!   promote, a deploy with build contexts (their bytes were never stored), a deploy to
//!   a target not placed yet, and any deployment whose host is not back within
//!   [`RESUME_WAIT`] (`DENV_RESUME_WAIT`). Failing one marks its running phase `failed`,
//!   later phases `skipped`, the verdict `ok` with `{"error"}`, the environment of a
//!   deploy, fork, rollback or destroy `failed`, and its open commands `failed` (so the
//!   hub does not re-send them); what it left that nobody can use is then destroyed
//!   ([`Orchestrator::destroy_env`]): environments never healthy (first deploy, fork,
//!   grader fork) with reason `abandoned`, environments whose destroy was cut short with
//!   that destroy's reason, a promote's gate forks.
//! - **Runners are owned.** Every runner counts towards [`Orchestrator::drain`] and
//!   stops at its cancellation: on SIGTERM the server refuses new deployments (`503`),
//!   waits for its runners (`DENV_DRAIN`, 20 s) while the host streams stay up, then
//!   cancels the ones still going (each stops at its next await, its deployment left
//!   `running` in the store, its open commands left open) and leaves them to the next
//!   start's recovery. Nothing of a cancelled runner writes after [`Orchestrator::drain`]
//!   returns.
//! - **Replicas** (replica mode, [`crate::replica`]): a deployment is run under a lease
//!   ([`lease`]) by one replica at a time; a replica's runner stops when its lease is
//!   lost; every replica takes over deployments without a live lease every third of
//!   the TTL with [`Orchestrator::recover`] (which, at start too, takes only those);
//!   deployments of one environment also take the environment's turn in the store
//!   ([`lease::take_turn`]) so they run one at a time across replicas.
//! - A failed phase's verdict is `ok` when it recorded the outcome (including a
//!   successful rollback); it is `failed` only when the deploy's rollback itself failed.
//! - Destroy whose teardown fails leaves the environment `failed` (not `destroyed`).

mod builds;
pub mod lease;
pub mod lifecycle;
pub mod link;
pub mod placement;
pub mod pool;
pub mod projects;
pub mod repo;
pub mod resources;
mod runner;
pub mod sandbox;
pub mod sheet;
pub mod ship;

use crate::auth::Caller;
use crate::domain::{
    Deployment, DeploymentState, DeploymentStatus, EnvStatus, Environment, Kind, Phase, PhaseName,
    PhaseStatus, Version,
};
use crate::error::ApiError;
use crate::hub::Hub;
use denv_proto::contract;
use denv_proto::v1;
use link::{Addr, Link};
use repo::{now, NewRows};
use sea_orm::DatabaseConnection;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The control plane's deployment engine. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct Orchestrator {
    inner: Arc<Inner>,
}

struct Inner {
    db: DatabaseConnection,
    link: Link,
    /// Live deployments: id → latest state. Removed when the runner ends.
    watchers: Mutex<HashMap<String, watch::Sender<DeploymentState>>>,
    /// One lock per environment: deployments of an environment run one at a time.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Serialises row creation (version numbers, environment names).
    create: tokio::sync::Mutex<()>,
    /// How long a deployment resumed after a restart waits for its host (ms).
    resume_wait_ms: AtomicU64,
    /// Runners of this process that have not ended, and a wake-up when none is left.
    running: AtomicUsize,
    idle: tokio::sync::Notify,
    /// Cancelled at the end of [`Orchestrator::drain`]: every runner stops.
    cancel: tokio_util::sync::CancellationToken,
    /// Set by [`Orchestrator::drain`]: new deployments are refused (503).
    draining: AtomicBool,
    /// The turns of shipments of a version to a host ([`ship`]).
    lanes: ship::Lanes,
}

/// A deploy pinned to a target (`POST /v1/targets/{name}/sandboxes`): placement takes a
/// connected host that joined through this cloud (`17-ref-targets.md`, step 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    /// The cloud's name (the `{name}` of the route).
    pub name: String,
    /// The cloud's provider (`manual`, `hetzner`, ...).
    pub provider: String,
    /// The cloud's id (`cloud_…`), matched against the hosts' `CloudID`.
    pub cloud_id: String,
}

/// What a runner does, beyond what its deployment row says.
pub(crate) enum Job {
    Deploy {
        spec: Box<denv_compose::Spec>,
        warm: Vec<String>,
        pin: Option<Pin>,
        /// Service → build context tar, for the services `prepare` builds.
        contexts: builds::Contexts,
    },
    /// The version to fork is `deployment.VersionID`; its snapshot lives in `owner_env`.
    Fork {
        owner_env: String,
    },
    Snapshot,
    Rollback,
    Verify {
        resume: bool,
    },
    Destroy,
    /// The version to promote is `deployment.VersionID` (a version of `from_env`); the
    /// target is `deployment.EnvID`.
    Promote {
        from_env: String,
    },
}

/// The short random suffix of generated names (`sbx-…`, `…-fork-…`, `…-verify-…`):
/// the last 6 characters of a fresh ULID, lowercase.
pub fn short_id() -> String {
    let u = ulid::Ulid::new().to_string().to_lowercase();
    u[u.len() - 6..].to_string()
}

fn ensure_live(env: &Environment) -> Result<(), ApiError> {
    if env.status == EnvStatus::Destroyed {
        return Err(ApiError::Conflict(format!(
            "environment {} is destroyed",
            env.id
        )));
    }
    Ok(())
}

impl Orchestrator {
    /// An orchestrator over the store and the hub. Call [`Orchestrator::recover`] once
    /// before serving.
    pub fn new(db: DatabaseConnection, hub: Hub) -> Self {
        Orchestrator {
            inner: Arc::new(Inner {
                db,
                link: Link::new(hub),
                watchers: Mutex::new(HashMap::new()),
                locks: Mutex::new(HashMap::new()),
                create: tokio::sync::Mutex::new(()),
                resume_wait_ms: AtomicU64::new(RESUME_WAIT.as_millis() as u64),
                running: AtomicUsize::new(0),
                idle: tokio::sync::Notify::new(),
                cancel: tokio_util::sync::CancellationToken::new(),
                draining: AtomicBool::new(false),
                lanes: ship::Lanes::default(),
            }),
        }
    }

    /// Sets how long [`Orchestrator::recover`] lets an interrupted deployment wait for
    /// its host to reconnect (default [`RESUME_WAIT`], `DENV_RESUME_WAIT`).
    pub fn with_resume_wait(self, wait: Duration) -> Self {
        self.inner
            .resume_wait_ms
            .store(wait.as_millis() as u64, Ordering::Relaxed);
        self
    }

    /// Stops taking deployments and waits up to `within` for this process's runners to
    /// end (SIGTERM). New deployments are refused with 503 `the control plane is
    /// stopping; try again` from the moment it is called. Runners still going at the
    /// deadline are cancelled and awaited (they stop at their next await point, so this
    /// takes moments); their deployments stay `running` in the store and the next
    /// process resumes them ([`Orchestrator::recover`]). Returns how many were
    /// cancelled.
    pub async fn drain(&self, within: Duration) -> usize {
        self.inner.draining.store(true, Ordering::SeqCst);
        if self.wait_idle(tokio::time::Instant::now() + within).await {
            return 0;
        }
        let cancelled = self.inner.running.load(Ordering::SeqCst);
        self.inner.cancel.cancel();
        // A cancelled runner ends at its next await; one stuck in blocking code would
        // keep this waiting, so the wait is bounded too.
        if !self
            .wait_idle(tokio::time::Instant::now() + CANCEL_WAIT)
            .await
        {
            tracing::warn!(
                runners = self.inner.running.load(Ordering::SeqCst),
                "runners still going after their cancellation"
            );
        }
        cancelled
    }

    /// Waits until no runner is left (`true`) or `deadline` passes (`false`).
    async fn wait_idle(&self, deadline: tokio::time::Instant) -> bool {
        loop {
            let idle = self.inner.idle.notified();
            if self.inner.running.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.inner.running.load(Ordering::SeqCst) == 0;
            }
        }
    }

    /// The store.
    pub fn db(&self) -> &DatabaseConnection {
        &self.inner.db
    }

    /// Typed host commands.
    pub fn link(&self) -> &Link {
        &self.inner.link
    }

    fn env_lock(&self, env_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.inner.locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(env_id.to_string()).or_default().clone()
    }

    /// A receiver of a running deployment's state (`None` when no runner has it: it is
    /// final, or was recovered). Subscribe before reading the store to miss nothing.
    pub fn subscribe(&self, deployment_id: &str) -> Option<watch::Receiver<DeploymentState>> {
        let w = self
            .inner
            .watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        w.get(deployment_id).map(|tx| tx.subscribe())
    }

    fn unregister(&self, deployment_id: &str) {
        let mut w = self
            .inner
            .watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        w.remove(deployment_id);
    }

    /// Waits until the deployment is final or `timeout` passes; returns its last state
    /// (final or not). `NotFound` when it is not the team's.
    pub async fn wait_final(
        &self,
        team_id: &str,
        deployment_id: &str,
        timeout: Duration,
    ) -> Result<DeploymentState, ApiError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let rx = self.subscribe(deployment_id);
        let mut last = repo::deployment(self.db(), team_id, deployment_id)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("deployment {deployment_id} not found")))?;
        let is_final = |s: &DeploymentState| s.deployment.status.is_final();
        if is_final(&last) {
            return Ok(last);
        }
        if let Some(mut rx) = rx {
            loop {
                let cur = rx.borrow_and_update().clone();
                if is_final(&cur) {
                    return Ok(cur);
                }
                last = cur;
                match tokio::time::timeout_at(deadline, rx.changed()).await {
                    Ok(Ok(())) => continue,
                    Ok(Err(_)) => break,
                    Err(_) => return Ok(last),
                }
            }
        }
        // The runner is gone (or never was in this process): the store has the answer.
        loop {
            let cur = repo::deployment(self.db(), team_id, deployment_id)
                .await?
                .unwrap_or(last);
            if is_final(&cur) || tokio::time::Instant::now() >= deadline {
                return Ok(cur);
            }
            last = cur;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn new_deployment(
        kind: Kind,
        project_id: &str,
        env_id: &str,
        version_id: &str,
        params: Value,
    ) -> (Deployment, Vec<Phase>) {
        let id = crate::ids::new_id("dep");
        // As the store keeps them: an object, whole numbers as integers.
        let params = match repo::normalize_numbers(params) {
            p @ Value::Object(_) => p,
            _ => json!({}),
        };
        let dep = Deployment {
            id: id.clone(),
            project_id: project_id.to_string(),
            env_id: env_id.to_string(),
            version_id: version_id.to_string(),
            params,
            created_at: now(),
            ..Deployment::new(kind)
        };
        let phases = kind
            .phases()
            .iter()
            .enumerate()
            .map(|(i, name)| Phase {
                deployment_id: id.clone(),
                seq: i as i32 + 1,
                name: *name,
                status: PhaseStatus::Pending,
                evidence: Value::Null,
                error: String::new(),
                started_at: String::new(),
                finished_at: String::new(),
            })
            .collect();
        (dep, phases)
    }

    /// Inserts the rows, registers the watch channel, spawns the runner (which waits for
    /// the environment `lock_env`), and returns the 202 answer.
    async fn launch(
        &self,
        team_id: &str,
        rows: NewRows,
        lock_env: &str,
        job: Job,
    ) -> Result<DeploymentState, ApiError> {
        if self.inner.draining.load(Ordering::SeqCst) {
            return Err(ApiError::Stopping(
                "the control plane is stopping; try again".into(),
            ));
        }
        if let Some(rep) = self.replica() {
            // Before the rows exist, so no other replica's takeover ever sees the
            // deployment without its lease.
            let dep_id = &rows.deployment.id;
            if !lease::take(&rep, dep_id, lock_env)
                .await
                .map_err(repo::db_err)?
            {
                return Err(ApiError::Internal(format!(
                    "the lease of new deployment {dep_id} is taken"
                )));
            }
        }
        repo::insert_rows(self.db(), team_id, &rows).await?;
        let state = DeploymentState {
            deployment: rows.deployment,
            phases: rows.phases,
        };
        self.spawn_runner(team_id, state.clone(), lock_env, job);
        Ok(state)
    }

    /// Registers the watch channel and spawns the runner of `state`, which waits for the
    /// environment lock `lock_env`. The runner counts towards [`Orchestrator::drain`].
    fn spawn_runner(&self, team_id: &str, state: DeploymentState, lock_env: &str, job: Job) {
        let queued = Queued {
            team: team_id.to_string(),
            state,
            job,
            resume: None,
        };
        self.spawn_queue(lock_env, vec![queued], Turn::Wait(self.env_lock(lock_env)));
    }

    /// The lock row creation (version numbers, environment names) runs under: this
    /// process's mutex, and in replica mode also a PostgreSQL advisory lock held by an
    /// open transaction, so replicas create rows one at a time too.
    pub(crate) async fn create_lock(&self) -> Result<CreateGuard<'_>, ApiError> {
        let local = self.inner.create.lock().await;
        let store = self.store_lock("denv-create").await?;
        Ok(CreateGuard {
            _local: local,
            _store: store,
        })
    }

    /// Replica mode: a PostgreSQL advisory lock on `key` across replicas, held until the
    /// returned guard is dropped; `None` without replica mode (the caller's in-process
    /// lock is enough).
    pub(crate) async fn store_lock(&self, key: &str) -> Result<Option<StoreLock>, ApiError> {
        if self.replica().is_none() {
            return Ok(None);
        }
        use sea_orm::{ConnectionTrait, TransactionTrait};
        let tx = self.db().begin().await.map_err(repo::db_err)?;
        tx.execute(sea_orm::Statement::from_sql_and_values(
            sea_orm::DatabaseBackend::Postgres,
            "SELECT pg_advisory_xact_lock(hashtext($1))",
            vec![key.into()],
        ))
        .await
        .map_err(repo::db_err)?;
        Ok(Some(StoreLock(Some(tx))))
    }

    /// This process as a replica (`None`: the only control plane).
    fn replica(&self) -> Option<Arc<crate::replica::Replica>> {
        self.link().hub().replica().cloned()
    }

    /// Replica mode: every third of the lease TTL, takes over the deployments whose
    /// lease expired (their replica died) with [`Orchestrator::recover`]. Does nothing
    /// without replica mode.
    pub fn spawn_takeover(&self) {
        let Some(rep) = self.replica() else { return };
        let orch = self.clone();
        let cancel = self.inner.cancel.clone();
        tokio::spawn(async move {
            let every = rep.lease_ttl / 3;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = cancel.cancelled() => return,
                }
                if orch.inner.draining.load(Ordering::SeqCst) {
                    return;
                }
                match orch.recover().await {
                    Ok(0) => {}
                    Ok(n) => tracing::warn!(
                        deployments = n,
                        "took over deployments of a replica that stopped"
                    ),
                    Err(e) => tracing::error!(error = %e, "deployment takeover failed"),
                }
            }
        });
    }

    /// Replica mode, after the drain: lets go of this replica's leases, so the other
    /// replicas take its unfinished deployments over at their next look. Returns how
    /// many were let go.
    pub async fn release_leases(&self) -> u64 {
        let Some(rep) = self.replica() else { return 0 };
        match lease::release_all(&rep).await {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(error = %e, "releasing the leases failed; they expire");
                0
            }
        }
    }

    /// Waits until this replica's lease of `dep_id` holds the environment's turn
    /// across replicas ([`lease::take_turn`]).
    async fn await_turn(&self, rep: &crate::replica::Replica, dep_id: &str, env_id: &str) {
        let mut logged = false;
        loop {
            match lease::take_turn(rep, dep_id, env_id).await {
                Ok(true) => return,
                Ok(false) if !logged => {
                    tracing::info!(deployment = %dep_id, env = %env_id, "waiting for a deployment of the environment on another replica");
                    logged = true;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(deployment = %dep_id, error = %e, "taking the environment's turn")
                }
            }
            tokio::time::sleep(TURN_POLL).await;
        }
    }

    /// Spawns one task that runs `queue` (deployments of one environment) in order,
    /// holding the environment's turn throughout; a resumed one first waits for its
    /// host ([`Self::await_host`]). A task that panics fails what it had not finished.
    fn spawn_queue(&self, env_id: &str, queue: Vec<Queued>, turn: Turn) {
        let mut ids = Vec::with_capacity(queue.len());
        let mut runs = Vec::with_capacity(queue.len());
        for q in queue {
            let dep_id = q.state.deployment.id.clone();
            let (tx, _rx) = watch::channel(q.state.clone());
            self.inner
                .watchers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(dep_id.clone(), tx.clone());
            ids.push((q.team.clone(), dep_id.clone()));
            runs.push((q, tx, dep_id));
        }
        let orch = self.clone();
        self.inner.running.fetch_add(1, Ordering::SeqCst);
        let cancel = self.inner.cancel.clone();
        let rep = self.replica();
        // Replica mode: the leases this task holds (one per deployment not finished).
        let held: Arc<Mutex<Vec<String>>> =
            Arc::new(Mutex::new(ids.iter().map(|(_, d)| d.clone()).collect()));
        let env_id = env_id.to_string();
        let all_ids = ids.clone();
        let handle = tokio::spawn(async move {
            let run_all = async {
                let _turn = match turn {
                    Turn::Wait(lock) => lock.lock_owned().await,
                    Turn::Held(guard) => guard,
                };
                for (q, tx, dep_id) in runs {
                    if let Some(rep) = &rep {
                        orch.await_turn(rep, &dep_id, &env_id).await;
                    }
                    let state = match q.resume {
                        None => Some(q.state),
                        Some(r) => orch.await_host(&q.team, q.state, r).await,
                    };
                    if let Some(state) = state {
                        runner::run(orch.clone(), q.team, state, tx, q.job).await;
                    }
                    // Final (or failed by `await_host`): followers read the store from now.
                    orch.unregister(&dep_id);
                    if let Some(rep) = &rep {
                        held.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .retain(|d| *d != dep_id);
                        if let Err(e) = lease::release(rep, &dep_id).await {
                            tracing::warn!(deployment = %dep_id, error = %e, "releasing the lease failed; it expires");
                        }
                    }
                }
            };
            let keep = async {
                match &rep {
                    Some(rep) => lease::keep(rep, &held).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = run_all => {}
                // The drain's end: what is unfinished stays `running` for the next
                // process to resume.
                _ = cancel.cancelled() => {
                    tracing::info!("deployment runner cancelled by the drain");
                }
                // Another replica has it now (or the store cannot say it is ours): stop
                // at once, writing nothing more.
                why = keep => {
                    tracing::warn!(reason = %why, "deployment runner stopped: its lease is lost");
                    for (_, dep_id) in &all_ids {
                        orch.unregister(dep_id);
                    }
                }
            }
        });
        // A panicking runner must not leave the deployment running forever.
        let orch = self.clone();
        tokio::spawn(async move {
            if let Err(e) = handle.await {
                for (team, dep_id) in &ids {
                    tracing::error!(deployment = %dep_id, error = %e, "deployment runner ended abnormally");
                    if let Err(e) = orch
                        .fail_unfinished(team, dep_id, "internal error: deployment runner stopped")
                        .await
                    {
                        tracing::error!(deployment = %dep_id, error = %e, "could not fail the deployment");
                    }
                    orch.unregister(dep_id);
                }
            }
            if orch.inner.running.fetch_sub(1, Ordering::SeqCst) == 1 {
                orch.inner.idle.notify_waiters();
            }
        });
    }

    // ------------------------------------------------------------ starting deployments

    /// Starts a deploy of `compose_text` to environment `env_name` (created when
    /// missing; stage `alpha` for `alpha`, else `branch`) of the caller's project
    /// `project` (id or name). The text is parsed first: a refusal is
    /// `ApiError::BadRequest(<parser message>)` and creates nothing. `warm`, when
    /// non-empty, overrides `x-denv.warm`. Returns the 202 `{deployment, phases}`.
    pub async fn start_deploy(
        &self,
        caller: &Caller,
        project: &str,
        env_name: &str,
        compose_text: &str,
        warm: Vec<String>,
        ttl_sec: i64,
    ) -> Result<DeploymentState, ApiError> {
        self.start_deploy_with_contexts(
            caller,
            project,
            env_name,
            compose_text,
            warm,
            ttl_sec,
            HashMap::new(),
        )
        .await
    }

    /// [`Self::start_deploy`] with the request's build contexts (context as written →
    /// uncompressed tar, `13-ref-compose.md` "Builds"): each `build:` service's context
    /// is checked and its image becomes `denv-build/<key>` in the version's spec; the
    /// tars go to the host in `prepare`. Errors as in `start_deploy`, plus a `400` for a
    /// missing, unused or invalid context.
    #[allow(clippy::too_many_arguments)]
    pub async fn start_deploy_with_contexts(
        &self,
        caller: &Caller,
        project: &str,
        env_name: &str,
        compose_text: &str,
        warm: Vec<String>,
        ttl_sec: i64,
        contexts: HashMap<String, Vec<u8>>,
    ) -> Result<DeploymentState, ApiError> {
        let expires_at = lifecycle::expiry_from_ttl(ttl_sec)?;
        let mut spec =
            denv_compose::parse(compose_text).map_err(|e| ApiError::BadRequest(e.to_string()))?;
        let contexts = builds::resolve(&mut spec, contexts, &caller.team_id)?;
        let team_id = caller.team_id.as_str();
        let project = repo::project(self.db(), team_id, project)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("project {project} not found")))?;
        let env_name = if env_name.is_empty() {
            "alpha"
        } else {
            env_name
        };
        let stage = if env_name == "alpha" {
            "alpha"
        } else {
            "branch"
        };
        self.start_deploy_built(
            team_id,
            &project.id,
            env_name,
            stage,
            spec,
            warm,
            None,
            &expires_at,
            contexts,
        )
        .await
    }

    /// Starts a deploy of an already validated spec (the sandbox image form uses this
    /// with stage `sandbox`). The environment is created when the project has none of
    /// that name. `pin` restricts placement to hosts of one cloud. `expires_at` (RFC 3339,
    /// from [`lifecycle::expiry_from_ttl`]) sets the environment's TTL; `""` keeps the
    /// TTL of an existing environment (a destroyed one deployed again loses its old one).
    #[allow(clippy::too_many_arguments)]
    pub async fn start_deploy_spec(
        &self,
        team_id: &str,
        project_id: &str,
        env_name: &str,
        stage: &str,
        spec: denv_compose::Spec,
        warm: Vec<String>,
        pin: Option<Pin>,
        expires_at: &str,
    ) -> Result<DeploymentState, ApiError> {
        self.start_deploy_built(
            team_id,
            project_id,
            env_name,
            stage,
            spec,
            warm,
            pin,
            expires_at,
            builds::Contexts::new(),
        )
        .await
    }

    /// [`Self::start_deploy_spec`] with the build contexts `prepare` sends (service →
    /// tar, from [`builds::resolve`]). A service left without an image is a `400`.
    #[allow(clippy::too_many_arguments)]
    async fn start_deploy_built(
        &self,
        team_id: &str,
        project_id: &str,
        env_name: &str,
        stage: &str,
        spec: denv_compose::Spec,
        warm: Vec<String>,
        pin: Option<Pin>,
        expires_at: &str,
        contexts: builds::Contexts,
    ) -> Result<DeploymentState, ApiError> {
        builds::require_images(&spec)?;
        let _create = self.create_lock().await?;
        let mut envs = Vec::new();
        let env = match repo::env_by_name(self.db(), team_id, project_id, env_name).await? {
            Some(e) => {
                if !expires_at.is_empty() || e.status == EnvStatus::Destroyed {
                    repo::set_expiry(self.db(), &e.id, expires_at).await?;
                }
                e
            }
            None => {
                let e = Environment {
                    id: crate::ids::new_id("env"),
                    project_id: project_id.to_string(),
                    name: env_name.to_string(),
                    stage: stage.to_string(),
                    status: EnvStatus::Pending,
                    created_at: now(),
                    expires_at: expires_at.to_string(),
                    ..Default::default()
                };
                envs.push(e.clone());
                e
            }
        };
        let number = repo::next_version_number(self.db(), &env.id).await?;
        let version = Version {
            id: crate::ids::new_id("ver"),
            project_id: project_id.to_string(),
            env_id: env.id.clone(),
            number,
            spec: spec.clone(),
            snapshot: String::new(),
            healthy: false,
            created_at: now(),
        };
        let mut params = json!({"env": env_name, "warm": warm});
        if let Some(p) = &pin {
            params["target"] = json!(p.name);
        }
        let (dep, phases) =
            Self::new_deployment(Kind::Deploy, project_id, &env.id, &version.id, params);
        let rows = NewRows {
            envs,
            versions: vec![version],
            deployment: dep,
            phases,
        };
        self.launch(
            team_id,
            rows,
            &env.id,
            Job::Deploy {
                spec: Box::new(spec),
                warm,
                pin,
                contexts,
            },
        )
        .await
    }

    /// Starts a fork of `env` at `version` (default: its current version) into a new
    /// environment `name` (default `<env name>-fork-<short>`) of `stage` (`fork`).
    /// The version must be a healthy snapshot of `env` or of its lineage (400), and
    /// exist in the team (404). The new environment's id is `deployment.EnvID`.
    /// `expires_at` as in [`Self::start_deploy_spec`] (`""` = no TTL). `caps`: the
    /// request's `resources` ([`resources`]), applied to the fork only.
    #[allow(clippy::too_many_arguments)]
    pub async fn start_fork(
        &self,
        team_id: &str,
        env: &Environment,
        version_id: &str,
        name: &str,
        stage: &str,
        expires_at: &str,
        caps: &resources::Request,
    ) -> Result<DeploymentState, ApiError> {
        ensure_live(env)?;
        let version_id = if version_id.is_empty() {
            env.current_version_id.as_str()
        } else {
            version_id
        };
        if version_id.is_empty() {
            return Err(ApiError::BadRequest(format!(
                "environment {} has no version to fork",
                env.id
            )));
        }
        let version = repo::version(self.db(), team_id, version_id)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("version {version_id} not found")))?;
        if !self.in_lineage(team_id, env, &version).await? {
            return Err(ApiError::BadRequest(format!(
                "version {} is not a snapshot of environment {} or its lineage",
                version.id, env.id
            )));
        }
        if !version.healthy || version.snapshot.is_empty() {
            return Err(ApiError::BadRequest(format!(
                "version {} is not a healthy snapshot",
                version.id
            )));
        }
        let name = if name.is_empty() {
            format!("{}-fork-{}", env.name, short_id())
        } else {
            name.to_string()
        };
        self.fork_version(team_id, &version, &name, stage, expires_at, caps)
            .await
    }

    /// Starts a fork of a healthy version (checked by the caller) into a new environment
    /// of the version's project, on the host of the environment that owns its snapshot.
    /// `expires_at`: the fork's TTL (`""` = none). A healthy member of the version's warm
    /// pool is handed out instead when there is one ([`pool`]): the answer is then the
    /// already `succeeded` deployment, unless `caps` asks for caps of its own: such a
    /// fork is always made cold, with the version's spec changed by
    /// [`resources::apply`] (`400` when the caps are invalid for the spec or above the
    /// capacity of the host the fork goes to, see [`resources::check_host`]).
    pub async fn fork_version(
        &self,
        team_id: &str,
        version: &Version,
        name: &str,
        stage: &str,
        expires_at: &str,
        caps: &resources::Request,
    ) -> Result<DeploymentState, ApiError> {
        self.fork_version_with(team_id, version, name, stage, expires_at, true, caps)
            .await
    }

    /// Refuses `caps` (`400`) when they ask for more than host `host_id` reported at
    /// connect. A host with no row (or no capabilities) is not checked: placement fails
    /// later on its own.
    pub async fn check_caps_on_host(
        &self,
        host_id: &str,
        caps: &resources::Request,
    ) -> Result<(), ApiError> {
        if caps.is_empty() || host_id.is_empty() {
            return Ok(());
        }
        let Some(h) = crate::store::hosts::get(self.db(), host_id)
            .await
            .map_err(|e| ApiError::Internal(format!("store: {e}")))?
        else {
            return Ok(());
        };
        let c: Value = serde_json::from_str(&h.capabilities).unwrap_or(Value::Null);
        resources::check_host(caps, &h.name, &c)
    }

    /// [`Self::fork_version`]; `from_pool` false always forks cold (a pool's own fill).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn fork_version_with(
        &self,
        team_id: &str,
        version: &Version,
        name: &str,
        stage: &str,
        expires_at: &str,
        from_pool: bool,
        caps: &resources::Request,
    ) -> Result<DeploymentState, ApiError> {
        let from_pool = from_pool && caps.is_empty();
        if !caps.is_empty() {
            let mut spec = version.spec.clone();
            resources::apply(&mut spec, caps)?;
        }
        let t0 = std::time::Instant::now();
        let owner = repo::env(self.db(), team_id, &version.env_id)
            .await?
            .ok_or_else(|| {
                ApiError::NotFound(format!("environment {} not found", version.env_id))
            })?;
        let _create = self.create_lock().await?;
        let name = if name.is_empty() {
            format!("{}-fork-{}", owner.name, short_id())
        } else {
            name.to_string()
        };
        if let Some(e) = repo::env_by_name(self.db(), team_id, &owner.project_id, &name).await? {
            if e.status != EnvStatus::Destroyed {
                return Err(ApiError::Conflict(format!(
                    "environment \"{name}\" already exists"
                )));
            }
        }
        self.check_caps_on_host(&owner.host_id, caps).await?;
        if from_pool {
            if let Some(handed) = self
                .take_from_pool(team_id, version, &owner, &name, stage, expires_at, t0)
                .await?
            {
                return Ok(handed);
            }
        }
        let new_env = Environment {
            id: crate::ids::new_id("env"),
            project_id: owner.project_id.clone(),
            name: name.clone(),
            stage: stage.to_string(),
            host_id: owner.host_id.clone(),
            parent_version_id: version.id.clone(),
            status: EnvStatus::Pending,
            created_at: now(),
            expires_at: expires_at.to_string(),
            ..Default::default()
        };
        let mut params = json!({"from_env": owner.id, "version": version.id, "name": name});
        if !caps.is_empty() {
            params["resources"] = caps.to_json();
        }
        if stage == pool::STAGE {
            params["pool"] = json!("fill");
        } else if from_pool && self.has_pool(&owner.id, &version.id).await {
            params["pool"] = json!("miss");
        }
        let (dep, phases) = Self::new_deployment(
            Kind::Fork,
            &owner.project_id,
            &new_env.id,
            &version.id,
            params,
        );
        let lock = new_env.id.clone();
        let rows = NewRows {
            envs: vec![new_env],
            versions: vec![],
            deployment: dep,
            phases,
        };
        self.launch(
            team_id,
            rows,
            &lock,
            Job::Fork {
                owner_env: owner.id,
            },
        )
        .await
    }

    /// Whether `version` belongs to `env` or to an environment it descends from
    /// (through `ParentVersionID`), or is its current version.
    async fn in_lineage(
        &self,
        team_id: &str,
        env: &Environment,
        version: &Version,
    ) -> Result<bool, ApiError> {
        if version.id == env.current_version_id || version.env_id == env.id {
            return Ok(true);
        }
        let mut parent = env.parent_version_id.clone();
        for _ in 0..64 {
            if parent.is_empty() {
                break;
            }
            let Some(p) = repo::version(self.db(), team_id, &parent).await? else {
                break;
            };
            if p.id == version.id || p.env_id == version.env_id {
                return Ok(true);
            }
            let Some(pe) = repo::env(self.db(), team_id, &p.env_id).await? else {
                break;
            };
            parent = pe.parent_version_id;
        }
        Ok(false)
    }

    /// A new version row of `env` with the spec of its current version.
    async fn capture_version(
        &self,
        team_id: &str,
        env: &Environment,
    ) -> Result<(Version, denv_compose::Spec), ApiError> {
        let current = if env.current_version_id.is_empty() {
            None
        } else {
            repo::version(self.db(), team_id, &env.current_version_id).await?
        };
        let Some(current) = current else {
            return Err(ApiError::BadRequest(format!(
                "environment {} has no current version",
                env.id
            )));
        };
        let spec = current.spec.clone();
        let number = repo::next_version_number(self.db(), &env.id).await?;
        Ok((
            Version {
                id: crate::ids::new_id("ver"),
                project_id: env.project_id.clone(),
                env_id: env.id.clone(),
                number,
                spec: current.spec,
                snapshot: String::new(),
                healthy: false,
                created_at: now(),
            },
            spec,
        ))
    }

    /// Starts a snapshot of `env`: a new version with the current version's spec
    /// (`deployment.VersionID`). 400 when the environment has no current version.
    pub async fn start_snapshot(
        &self,
        team_id: &str,
        env: &Environment,
    ) -> Result<DeploymentState, ApiError> {
        ensure_live(env)?;
        let _create = self.create_lock().await?;
        let (version, _) = self.capture_version(team_id, env).await?;
        let (dep, phases) = Self::new_deployment(
            Kind::Snapshot,
            &env.project_id,
            &env.id,
            &version.id,
            json!({}),
        );
        let rows = NewRows {
            envs: vec![],
            versions: vec![version],
            deployment: dep,
            phases,
        };
        self.launch(team_id, rows, &env.id, Job::Snapshot).await
    }

    /// Starts a rollback of `env` to `version_id`, which must be a healthy snapshot of
    /// this environment (400; 404 when no such version in the team).
    pub async fn start_rollback(
        &self,
        team_id: &str,
        env: &Environment,
        version_id: &str,
    ) -> Result<DeploymentState, ApiError> {
        ensure_live(env)?;
        if version_id.is_empty() {
            return Err(ApiError::BadRequest("version is required".into()));
        }
        let version = repo::version(self.db(), team_id, version_id)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("version {version_id} not found")))?;
        if version.env_id != env.id {
            return Err(ApiError::BadRequest(format!(
                "version {} is not a snapshot of environment {}",
                version.id, env.id
            )));
        }
        if !version.healthy || version.snapshot.is_empty() {
            return Err(ApiError::BadRequest(format!(
                "version {} is not a healthy snapshot",
                version.id
            )));
        }
        let params = json!({"version": version.id});
        let (dep, phases) = Self::new_deployment(
            Kind::Rollback,
            &env.project_id,
            &env.id,
            &version.id,
            params,
        );
        let rows = NewRows {
            envs: vec![],
            versions: vec![],
            deployment: dep,
            phases,
        };
        self.launch(team_id, rows, &env.id, Job::Rollback).await
    }

    /// Starts a verify of `env`. Its current version's spec must declare
    /// `x-denv.agent.service` and `x-denv.verifier` (400 otherwise). The capture version
    /// (`deployment.VersionID`) becomes healthy but not current.
    pub async fn start_verify(
        &self,
        team_id: &str,
        env: &Environment,
        resume: bool,
    ) -> Result<DeploymentState, ApiError> {
        ensure_live(env)?;
        let _create = self.create_lock().await?;
        let (version, spec) = self.capture_version(team_id, env).await?;
        if spec.agent.is_none() || spec.verifier.is_none() {
            return Err(ApiError::BadRequest(
                "verify needs x-denv.agent.service and x-denv.verifier in the environment's current version"
                    .into(),
            ));
        }
        let params = json!({"resume": resume});
        let (dep, phases) =
            Self::new_deployment(Kind::Verify, &env.project_id, &env.id, &version.id, params);
        let rows = NewRows {
            envs: vec![],
            versions: vec![version],
            deployment: dep,
            phases,
        };
        self.launch(team_id, rows, &env.id, Job::Verify { resume })
            .await
    }

    /// Starts a promote (`docs/reference/deployments.md`, "promote") of environment
    /// `from` (id or name) of project `project` (id or name) to environment `to` (a name
    /// of the same project; created, as `pending` with no version, when the project has
    /// none of that name). The version promoted is `version` when set (a healthy
    /// snapshot of `from` or its lineage), else `from`'s current version. The
    /// deployment is the target's (`deployment.EnvID`), so it waits for the target's
    /// other deployments.
    ///
    /// Errors: `404` for an unknown project, source environment or version; `400` when
    /// `to` is empty or names `from`, when the source has no version, or when the
    /// version is not a healthy snapshot of its lineage; `409` when `from` is destroyed.
    pub async fn start_promote(
        &self,
        team_id: &str,
        project: &str,
        from: &str,
        to: &str,
        version: &str,
    ) -> Result<DeploymentState, ApiError> {
        let project = repo::project(self.db(), team_id, project)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("project {project} not found")))?;
        if to.trim().is_empty() {
            return Err(ApiError::BadRequest(
                "the target environment (to) is required".into(),
            ));
        }
        let source = match repo::env(self.db(), team_id, from).await? {
            Some(e) if e.project_id == project.id => Some(e),
            _ => repo::env_by_name(self.db(), team_id, &project.id, from).await?,
        }
        .ok_or_else(|| {
            ApiError::NotFound(format!(
                "environment {from} not found in project {}",
                project.name
            ))
        })?;
        ensure_live(&source)?;
        if to == source.name || to == source.id {
            return Err(ApiError::BadRequest(format!(
                "cannot promote environment {} to itself",
                source.name
            )));
        }
        let version_id = if version.is_empty() {
            source.current_version_id.as_str()
        } else {
            version
        };
        if version_id.is_empty() {
            return Err(ApiError::BadRequest(format!(
                "environment {} has no version to promote",
                source.name
            )));
        }
        let version = repo::version(self.db(), team_id, version_id)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("version {version_id} not found")))?;
        if !self.in_lineage(team_id, &source, &version).await? {
            return Err(ApiError::BadRequest(format!(
                "version {} is not a snapshot of environment {} or its lineage",
                version.id, source.name
            )));
        }
        if !version.healthy || version.snapshot.is_empty() {
            return Err(ApiError::BadRequest(format!(
                "version {} is not a healthy snapshot",
                version.id
            )));
        }
        let _create = self.create_lock().await?;
        let mut envs = Vec::new();
        let target = match repo::env_by_name(self.db(), team_id, &project.id, to).await? {
            Some(e) => e,
            None => {
                let e = Environment {
                    id: crate::ids::new_id("env"),
                    project_id: project.id.clone(),
                    name: to.to_string(),
                    stage: if to == "alpha" { "alpha" } else { "branch" }.to_string(),
                    status: EnvStatus::Pending,
                    created_at: now(),
                    ..Default::default()
                };
                envs.push(e.clone());
                e
            }
        };
        // Apply tears the target down, snapshots included, before forking the version.
        if target.id == version.env_id {
            return Err(ApiError::BadRequest(format!(
                "environment {to} holds the version's snapshot: promoting {} into it would destroy that snapshot with its old stack; roll {to} back to the version instead",
                version.id
            )));
        }
        let params =
            json!({"from_env": source.id, "from": source.name, "to": to, "version": version.id});
        let (dep, phases) =
            Self::new_deployment(Kind::Promote, &project.id, &target.id, &version.id, params);
        let rows = NewRows {
            envs,
            versions: vec![],
            deployment: dep,
            phases,
        };
        self.launch(
            team_id,
            rows,
            &target.id,
            Job::Promote {
                from_env: source.id,
            },
        )
        .await
    }

    /// Starts a destroy of `env` with `reason` (`params.reason`: one of
    /// [`lifecycle::reason`]). A destroyed environment is destroyed again (its host may
    /// still hold it: the teardown runs again, and is a no-op on the host when nothing is
    /// left). Callers that want one destroy per environment use
    /// [`Self::destroy_env`].
    pub async fn start_destroy(
        &self,
        team_id: &str,
        env: &Environment,
        reason: &str,
    ) -> Result<DeploymentState, ApiError> {
        let (dep, phases) = Self::new_deployment(
            Kind::Destroy,
            &env.project_id,
            &env.id,
            "",
            json!({"reason": reason}),
        );
        let rows = NewRows {
            envs: vec![],
            versions: vec![],
            deployment: dep,
            phases,
        };
        self.launch(team_id, rows, &env.id, Job::Destroy).await
    }

    // ------------------------------------------------------------ direct host calls

    fn addr(team_id: &str, env: &Environment) -> Result<Addr, ApiError> {
        ensure_live(env)?;
        if env.host_id.is_empty() {
            return Err(ApiError::BadGateway(format!(
                "environment {} has no host",
                env.id
            )));
        }
        Ok(Addr::new(team_id, &env.host_id, &env.id))
    }

    /// [`Self::addr`] for a call that answers now: a host without a stream is
    /// `BadGateway` (`host … is not connected`) at once instead of a queued command.
    fn live_addr(&self, team_id: &str, env: &Environment) -> Result<Addr, ApiError> {
        let to = Self::addr(team_id, env)?;
        self.link().require(&to.host_id)?;
        Ok(to)
    }

    /// `env.exec` in `service` of `env` (`timeout_sec` 0 = 120 s; the hub waits 10 s
    /// more), with the request's `user`, `workdir`, `stdin` and `env_vars` handed to the
    /// engine's exec (spec `12-ref-rest-api.md`). A non-zero exit is `Ok`; a host that
    /// cannot run it answers with the host's error and the status of its code (404 for an
    /// environment or service the host does not hold, 503 for an engine that does not
    /// answer, `BadGateway` for its other failures; [`crate::error`]), and no answer
    /// within the hub's wait is `Timeout` (504, `DEADLINE_EXCEEDED`).
    ///
    /// Refused with `BadRequest` naming the field: no service or cmd, a `user` that is
    /// not one user ([`denv_compose::is_valid_user`]), a `workdir` that is not absolute,
    /// an `env_vars` name that is empty or has `=`/NUL (or a value with NUL); stdin over
    /// 32 MiB is `PayloadTooLarge`. An explicit `user: "root"` runs as root even in an
    /// agent service: the API caller is the trainer or framework, not the agent.
    pub async fn exec(
        &self,
        team_id: &str,
        env: &Environment,
        mut req: v1::EnvExec,
    ) -> Result<v1::ExecOutput, ApiError> {
        let (to, wait) = self.prepare_exec(team_id, env, &mut req).await?;
        Ok(self.link().exec(&to, req, wait).await?)
    }

    /// Where `env.logs` commands for `env` go and the services to read (spec: our
    /// manual's `docs/reference/rest-api.md`, "Logs"): `service` when set (it must be a
    /// service of the current version, else `BadRequest` naming the services), else
    /// every service of the current version, sorted by name. `Conflict` for a destroyed
    /// environment or one without a version yet; `BadGateway` when its host has no
    /// stream now.
    pub async fn prepare_logs(
        &self,
        team_id: &str,
        env: &Environment,
        service: &str,
    ) -> Result<(Addr, Vec<String>), ApiError> {
        ensure_live(env)?;
        if env.current_version_id.is_empty() {
            return Err(ApiError::Conflict(format!(
                "environment {} has no version yet: nothing was deployed",
                env.id
            )));
        }
        let names = self.service_names(team_id, env).await?;
        let services = if service.is_empty() {
            names
        } else {
            check_service(env, &names, service)?;
            vec![service.to_string()]
        };
        Ok((self.live_addr(team_id, env)?, services))
    }

    /// The service names of `env`'s current version, sorted by name (empty when it has
    /// no version yet).
    async fn service_names(
        &self,
        team_id: &str,
        env: &Environment,
    ) -> Result<Vec<String>, ApiError> {
        if env.current_version_id.is_empty() {
            return Ok(vec![]);
        }
        let version = repo::version(self.db(), team_id, &env.current_version_id)
            .await?
            .ok_or_else(|| {
                ApiError::Internal(format!("version {} not found", env.current_version_id))
            })?;
        Ok(version
            .spec
            .services
            .iter()
            .map(|s| s.name.clone())
            .collect())
    }

    /// The checks of [`Orchestrator::exec`] and the default timeout, applied to `req`;
    /// returns where the command goes and how long the hub waits. Used before a
    /// streamed exec starts, so a refusal is an error status, not a stream item: a
    /// service that is not one of the current version's is `BadRequest` naming them.
    pub async fn prepare_exec(
        &self,
        team_id: &str,
        env: &Environment,
        req: &mut v1::EnvExec,
    ) -> Result<(Addr, Duration), ApiError> {
        if req.service.is_empty() {
            return Err(ApiError::BadRequest("service is required".into()));
        }
        if req.cmd.is_empty() {
            return Err(ApiError::BadRequest("cmd is required".into()));
        }
        check_exec(req)?;
        let to = self.live_addr(team_id, env)?;
        let names = self.service_names(team_id, env).await?;
        if !names.is_empty() {
            check_service(env, &names, &req.service)?;
        }
        if req.timeout_sec == 0 {
            req.timeout_sec = contract::EXEC_TIMEOUT_SEC;
        }
        Ok((
            to,
            Duration::from_secs(u64::from(req.timeout_sec)) + contract::EXEC_SLACK,
        ))
    }

    /// `env.put`: extracts the tar archive `tar` (at most 32 MiB, else `PayloadTooLarge`)
    /// into `path` of `service`. Returns the archive's size in bytes.
    pub async fn put_files(
        &self,
        team_id: &str,
        env: &Environment,
        service: &str,
        path: &str,
        tar: Vec<u8>,
    ) -> Result<i64, ApiError> {
        if tar.len() > contract::FILES_ARCHIVE_MAX_BYTES {
            return Err(ApiError::PayloadTooLarge(format!(
                "archive is {} bytes; the limit is 32 MiB",
                tar.len()
            )));
        }
        if service.is_empty() || path.is_empty() {
            return Err(ApiError::BadRequest("service and path are required".into()));
        }
        let to = self.live_addr(team_id, env)?;
        let n = tar.len() as i64;
        self.link()
            .put(
                &to,
                v1::EnvPut {
                    service: service.to_string(),
                    path: path.to_string(),
                    tar,
                },
                contract::PHASE_TIMEOUT,
            )
            .await?;
        Ok(n)
    }

    /// `env.get`: a tar archive of `path` in `service`. A missing path is `BadGateway`
    /// with the host's error.
    pub async fn get_files(
        &self,
        team_id: &str,
        env: &Environment,
        service: &str,
        path: &str,
    ) -> Result<Vec<u8>, ApiError> {
        if service.is_empty() || path.is_empty() {
            return Err(ApiError::BadRequest("service and path are required".into()));
        }
        let to = self.live_addr(team_id, env)?;
        let r = self
            .link()
            .get(
                &to,
                v1::EnvGet {
                    service: service.to_string(),
                    path: path.to_string(),
                },
                contract::PHASE_TIMEOUT,
            )
            .await?;
        Ok(r.tar)
    }

    // ------------------------------------------------------------ recovery

    /// Takes over every deployment left `pending` or `running` by an earlier process (see
    /// the module docs, "Restarts"): one that can be run again is resumed (its runner
    /// waits for the environment's host, then runs from the start, and every command it
    /// had sent is answered from its row or by the host's journal, [`crate::hub::replay`]);
    /// the others are failed with `control plane restarted during <phase>; <why>`.
    /// Returns how many deployments were taken over.
    pub async fn recover(&self) -> Result<usize, ApiError> {
        let open = repo::unfinished(self.db()).await?;
        let mut n = 0;
        // (team, env, reason) to destroy once every interrupted deployment is failed.
        let mut teardown: Vec<(String, String, String)> = Vec::new();
        // Per environment, its resumable deployments in their order (oldest first, as
        // the earlier process ran them); one host deadline for all.
        let mut queues: Vec<(String, Vec<Queued>)> = Vec::new();
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(self.inner.resume_wait_ms.load(Ordering::Relaxed));
        let rep = self.replica();
        for (team_id, state) in open {
            let (team_id, state) = match &rep {
                None => (team_id, state),
                Some(rep) => {
                    let dep = &state.deployment;
                    // Running here already, or another live replica's.
                    if self.subscribe(&dep.id).is_some()
                        || !lease::take(rep, &dep.id, &dep.env_id)
                            .await
                            .map_err(repo::db_err)?
                    {
                        continue;
                    }
                    // Ours now: read it again. Its owner may have finished it (and then
                    // released the lease) since the list was read, or moved it on.
                    match repo::unfinished_one(self.db(), &dep.id).await? {
                        Some(now) => now,
                        None => {
                            lease::release(rep, &dep.id).await.map_err(repo::db_err)?;
                            continue;
                        }
                    }
                }
            };
            let dep = &state.deployment;
            n += 1;
            let during = interrupted_during(&state);
            match self.job_to_resume(&team_id, dep).await? {
                Ok((job, host)) => {
                    tracing::warn!(deployment = %dep.id, kind = %dep.kind, %during, "resuming an interrupted deployment");
                    let queued = Queued {
                        team: team_id.clone(),
                        job,
                        resume: Some(Resume {
                            host,
                            during,
                            deadline,
                        }),
                        state: state.clone(),
                    };
                    match queues.iter_mut().find(|(e, _)| *e == dep.env_id) {
                        Some((_, q)) => q.push(queued),
                        None => queues.push((dep.env_id.clone(), vec![queued])),
                    }
                }
                Err(why) => {
                    let reason = format!("{during}; {why}");
                    teardown.extend(
                        self.fail_interrupted(&team_id, state.clone(), &reason)
                            .await?,
                    );
                    if let Some(rep) = &rep {
                        lease::release(rep, &dep.id).await.map_err(repo::db_err)?;
                    }
                }
            }
        }
        // Each environment's turn is taken here, before anything is served, so no new
        // deployment goes before the ones resumed.
        for (env_id, queue) in queues {
            let lock = self.env_lock(&env_id);
            let turn = match lock.clone().try_lock_owned() {
                Ok(guard) => Turn::Held(guard),
                Err(_) => Turn::Wait(lock),
            };
            self.spawn_queue(&env_id, queue, turn);
        }
        self.tear_down(teardown).await;
        Ok(n)
    }

    /// The job a runner needs to run `dep` again, rebuilt from its rows, and the host it
    /// waits for (`None`: any connected host of the team, for a deploy not placed yet);
    /// `Err(why)` when the deployment cannot be resumed.
    async fn job_to_resume(
        &self,
        team_id: &str,
        dep: &Deployment,
    ) -> Result<Result<(Job, Option<String>), String>, ApiError> {
        let Some(env) = repo::env(self.db(), team_id, &dep.env_id).await? else {
            return Ok(Err(format!("environment {} is gone", dep.env_id)));
        };
        let host = Some(env.host_id.clone()).filter(|h| !h.is_empty());
        let params = &dep.params;
        let job = match dep.kind {
            Kind::Deploy => {
                let Some(version) = repo::version(self.db(), team_id, &dep.version_id).await?
                else {
                    return Ok(Err(format!("version {} is gone", dep.version_id)));
                };
                let spec = version.spec;
                if !spec.builds.is_empty() {
                    return Ok(Err(
                        "a deploy's build contexts are not kept across restarts: deploy again"
                            .into(),
                    ));
                }
                if host.is_none() && params.get("target").is_some_and(|t| t != "") {
                    return Ok(Err(
                        "a target's placement is not resumed before it chose a host: deploy again"
                            .into(),
                    ));
                }
                let warm = params
                    .get("warm")
                    .and_then(Value::as_array)
                    .map(|w| {
                        w.iter()
                            .filter_map(|c| c.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                Job::Deploy {
                    spec: Box::new(spec),
                    warm,
                    pin: None,
                    contexts: Default::default(),
                }
            }
            Kind::Fork => match params.get("from_env").and_then(Value::as_str) {
                Some(owner) => Job::Fork {
                    owner_env: owner.to_string(),
                },
                None => return Ok(Err("the fork's source is not recorded".into())),
            },
            Kind::Snapshot => Job::Snapshot,
            Kind::Rollback => Job::Rollback,
            Kind::Verify => Job::Verify {
                resume: params
                    .get("resume")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            },
            Kind::Destroy => Job::Destroy,
            Kind::Promote => {
                return Ok(Err(
                    "a promote's gates are not resumed: promote again".into()
                ))
            }
        };
        Ok(Ok((job, host)))
    }

    /// Waits (holding the environment's lock) until the host a resumed deployment needs
    /// has a stream, at most the resume wait; then returns the deployment's rows as
    /// they are now. `None` when it did not come back: the deployment has been failed
    /// and what it left destroyed.
    async fn await_host(
        &self,
        team_id: &str,
        state: DeploymentState,
        resume: Resume,
    ) -> Option<DeploymentState> {
        let wait = Duration::from_millis(self.inner.resume_wait_ms.load(Ordering::Relaxed));
        let deadline = resume.deadline;
        let link = self.link();
        loop {
            let back = match &resume.host {
                Some(h) => link.is_connected(h),
                None => link.first_connected_host(team_id).is_some(),
            };
            if back {
                let id = &state.deployment.id;
                return match repo::deployment(self.db(), team_id, id).await {
                    Ok(Some(now)) => Some(now),
                    _ => Some(state),
                };
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let host = resume.host.as_deref().unwrap_or("no host of the team");
        let reason = format!(
            "{}; {host} did not reconnect within {}",
            resume.during,
            crate::hub::go_duration(wait)
        );
        match self.fail_interrupted(team_id, state, &reason).await {
            Ok(teardown) => {
                // The destroys wait for this environment's lock: let it go first.
                let orch = self.clone();
                tokio::spawn(async move { orch.tear_down(teardown).await });
            }
            Err(e) => tracing::error!(error = %e, "could not fail an interrupted deployment"),
        }
        None
    }

    /// Fails an interrupted deployment with `reason` and its open commands, and returns
    /// what it left that nobody can use, to destroy: an environment never healthy (a
    /// first deploy, a fork, a grader's fork), one whose destroy was cut short, a
    /// promote's gate forks.
    async fn fail_interrupted(
        &self,
        team_id: &str,
        state: DeploymentState,
        reason: &str,
    ) -> Result<Vec<(String, String, String)>, ApiError> {
        let mut teardown = Vec::new();
        let dep = state.deployment.clone();
        let never_healthy = match repo::env(self.db(), team_id, &dep.env_id).await? {
            Some(e) => e.current_version_id.is_empty(),
            None => false,
        };
        match dep.kind {
            Kind::Deploy | Kind::Fork if never_healthy => teardown.push((
                team_id.to_string(),
                dep.env_id.clone(),
                lifecycle::reason::ABANDONED.into(),
            )),
            Kind::Destroy => {
                let again = dep
                    .params
                    .get("reason")
                    .and_then(|r| r.as_str())
                    .filter(|r| !r.is_empty())
                    .unwrap_or(lifecycle::reason::REQUESTED)
                    .to_string();
                teardown.push((team_id.to_string(), dep.env_id.clone(), again));
            }
            // Its gate forks: no promote runs at startup, so none is in use.
            Kind::Promote => {
                for g in repo::live_gate_forks(self.db(), team_id, &dep.version_id).await? {
                    teardown.push((
                        team_id.to_string(),
                        g.id,
                        lifecycle::reason::ABANDONED.into(),
                    ));
                }
            }
            _ => {}
        }
        if !dep.target_env_id.is_empty() {
            teardown.push((
                team_id.to_string(),
                dep.target_env_id.clone(),
                lifecycle::reason::ABANDONED.into(),
            ));
        }
        self.fail_state(team_id, state, reason).await?;
        // Its commands must not run after the fact when the host reconnects.
        let envs = [dep.env_id.clone(), dep.target_env_id.clone()];
        let cancelled = repo::fail_open_commands(self.db(), &envs, reason).await?;
        tracing::warn!(
            deployment = %dep.id,
            %reason,
            open_commands_failed = cancelled,
            "failed an interrupted deployment"
        );
        Ok(teardown)
    }

    /// Starts the destroys [`Self::fail_interrupted`] asked for.
    async fn tear_down(&self, teardown: Vec<(String, String, String)>) {
        for (team_id, env_id, reason) in teardown {
            match self.destroy_env(&team_id, &env_id, &reason).await {
                Ok(d) => tracing::warn!(
                    env = %env_id,
                    %reason,
                    deployment = %d.map(|d| d.deployment.id).unwrap_or_default(),
                    "destroying what an interrupted deployment left"
                ),
                Err(e) => tracing::error!(env = %env_id, error = %e, "could not start its destroy"),
            }
        }
    }

    /// Fails one deployment if it is still unfinished (used when its runner died).
    async fn fail_unfinished(
        &self,
        team_id: &str,
        deployment_id: &str,
        reason: &str,
    ) -> Result<(), ApiError> {
        if let Some(state) = repo::deployment(self.db(), team_id, deployment_id).await? {
            if !state.deployment.status.is_final() {
                self.fail_state(team_id, state, reason).await?;
            }
        }
        Ok(())
    }

    async fn fail_state(
        &self,
        team_id: &str,
        state: DeploymentState,
        reason: &str,
    ) -> Result<(), ApiError> {
        let db = self.db();
        let DeploymentState {
            deployment: mut dep,
            mut phases,
        } = state;
        let t = now();
        for p in &mut phases {
            let open = matches!(p.status, PhaseStatus::Running | PhaseStatus::Pending);
            if !open {
                continue;
            }
            if p.is(PhaseName::Verdict) {
                // The verdict always runs: it records the outcome.
                if p.status == PhaseStatus::Pending {
                    p.status = PhaseStatus::Running;
                    p.started_at = t.clone();
                    repo::save_phase(db, p).await?;
                }
                p.status = PhaseStatus::Ok;
                p.evidence = json!({"error": reason});
            } else if p.status == PhaseStatus::Running {
                p.status = PhaseStatus::Failed;
                p.error = reason.to_string();
            } else {
                p.status = PhaseStatus::Skipped;
            }
            p.finished_at = t.clone();
            repo::save_phase(db, p).await?;
        }

        if let Some(mut env) = repo::env(db, team_id, &dep.env_id).await? {
            let fail_env = matches!(
                dep.kind,
                Kind::Deploy | Kind::Fork | Kind::Rollback | Kind::Destroy
            );
            if fail_env && env.status != EnvStatus::Destroyed {
                env.status = EnvStatus::Failed;
                repo::save_env(db, team_id, &env).await?;
            }
        }
        if !dep.target_env_id.is_empty() {
            if let Some(mut grader) = repo::env(db, team_id, &dep.target_env_id).await? {
                if grader.status != EnvStatus::Destroyed {
                    grader.status = EnvStatus::Failed;
                    repo::save_env(db, team_id, &grader).await?;
                }
            }
        }
        let took_ms = chrono::DateTime::parse_from_rfc3339(&dep.created_at)
            .map(|c| (chrono::Utc::now() - c.with_timezone(&chrono::Utc)).num_milliseconds())
            .unwrap_or(0)
            .max(0);
        let body = json!({"status": DeploymentStatus::Failed, "took_ms": took_ms, "error": reason});
        for subject in [format!("env:{}", dep.env_id), format!("dep:{}", dep.id)] {
            repo::event(db, team_id, &subject, "deployment.finished", &body).await?;
        }
        // Last: once the status is final, everything above is in place.
        dep.status = DeploymentStatus::Failed;
        dep.error = reason.to_string();
        dep.finished_at = t;
        repo::save_deployment(db, team_id, &dep).await?;
        Ok(())
    }
}

/// Held while rows are created ([`Orchestrator::create_lock`]).
pub(crate) struct CreateGuard<'a> {
    _local: tokio::sync::MutexGuard<'a, ()>,
    _store: Option<StoreLock>,
}

/// An advisory lock across replicas ([`Orchestrator::store_lock`]): the transaction
/// holding it ends (letting it go) when this is dropped.
pub(crate) struct StoreLock(Option<sea_orm::DatabaseTransaction>);

impl Drop for StoreLock {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(async move {
                        if let Err(e) = tx.commit().await {
                            tracing::warn!(error = %e, "ending an advisory lock");
                        }
                    });
                }
                Err(_) => drop(tx),
            }
        }
    }
}

/// What a deployment resumed after a restart waits for.
struct Resume {
    /// The environment's host; `None`: any connected host of the team.
    host: Option<String>,
    /// `control plane restarted during <phase>` (or `… before the deployment started`).
    during: String,
    /// When waiting for the host ends (the start plus the resume wait).
    deadline: tokio::time::Instant,
}

/// A deployment for a runner task to run.
struct Queued {
    team: String,
    state: DeploymentState,
    job: Job,
    /// Set for a deployment taken over from an earlier process.
    resume: Option<Resume>,
}

/// How a runner task gets its environment's turn.
enum Turn {
    /// Waits for it (in arrival order).
    Wait(Arc<tokio::sync::Mutex<()>>),
    /// Already has it (taken by recovery before serving).
    Held(tokio::sync::OwnedMutexGuard<()>),
}

/// Where a restart interrupted a deployment: `control plane restarted during <phase>`,
/// or `control plane restarted before the deployment started`.
fn interrupted_during(state: &DeploymentState) -> String {
    let running = state.deployment.status == DeploymentStatus::Running;
    match state
        .phases
        .iter()
        .find(|p| p.status == PhaseStatus::Running || (running && p.status == PhaseStatus::Pending))
    {
        Some(p) => format!("control plane restarted during {}", p.name),
        None => "control plane restarted before the deployment started".to_string(),
    }
}

/// How long a deployment interrupted by a restart waits for its host to reconnect
/// before it is failed (a sidecar retries within seconds; the hub's grace is 60 s).
pub const RESUME_WAIT: Duration = Duration::from_secs(60);

/// How often a deployment waiting for its environment's turn across replicas looks again.
const TURN_POLL: Duration = Duration::from_millis(500);

/// How long [`Orchestrator::drain`] waits for cancelled runners to stop.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// `BadRequest` unless `service` is one of `names` (the services of `env`'s current
/// version): `unknown service "x": the services of env_… are a, b`.
fn check_service(env: &Environment, names: &[String], service: &str) -> Result<(), ApiError> {
    if names.iter().any(|n| n == service) {
        return Ok(());
    }
    Err(ApiError::BadRequest(format!(
        "unknown service {service:?}: the services of {} are {}",
        env.id,
        names.join(", ")
    )))
}

/// The request checks of [`Orchestrator::exec`] beyond service and cmd.
fn check_exec(req: &v1::EnvExec) -> Result<(), ApiError> {
    if !req.user.is_empty() && !denv_compose::is_valid_user(&req.user) {
        return Err(ApiError::BadRequest(format!(
            "user {:?} is not a user (name, uid, name:group or uid:gid; letters, digits, \
             _ - . only, at most 64 characters)",
            req.user
        )));
    }
    if !req.workdir.is_empty()
        && (!req.workdir.starts_with('/') || req.workdir.contains('\0') || req.workdir.len() > 4096)
    {
        return Err(ApiError::BadRequest(format!(
            "workdir {:?} must be an absolute path (at most 4096 bytes, no NUL)",
            req.workdir
        )));
    }
    for (k, v) in &req.env_vars {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(ApiError::BadRequest(format!(
                "env_vars: variable {k:?} is invalid (a name without = or NUL, a value without NUL)"
            )));
        }
    }
    if req.stdin.len() > contract::EXEC_STDIN_MAX_BYTES {
        return Err(ApiError::PayloadTooLarge(format!(
            "stdin is {} bytes; the limit is 32 MiB",
            req.stdin.len()
        )));
    }
    Ok(())
}
