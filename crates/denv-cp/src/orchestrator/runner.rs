//! One runner per deployment: executes the phases of its kind in order, writes each
//! change to the store and publishes it, applies the failure rule, runs the verdict.

use super::link::{Addr, Link};
use super::{repo, Job, Orchestrator};
use crate::domain::{
    Deployment, DeploymentState, DeploymentStatus, EnvStatus, Environment, Phase, PhaseName,
    PhaseStatus, Version,
};
use crate::error::ApiError;
use denv_proto::contract::{EXEC_SLACK, PHASE_TIMEOUT, WARM_TIMEOUT_SEC};
use denv_proto::v1;
use serde_json::{json, Value};
use std::future::Future;
use std::time::{Duration, Instant};
use tokio::sync::watch;

mod promote;

/// The `teardown` evidence of a destroy while the host has no stream.
pub const TEARDOWN_DEFERRED: &str = "host not connected; torn down when it reconnects";

/// `provision`'s refusal while no cloud can create machines.
pub const NO_HOST: &str = "no connected host and no cloud that can provision: connect a cloud or run `denvd join` on a machine";

/// A phase's failure: the error recorded on the phase (and as `<phase>: <error>` on the
/// deployment) and the phase's evidence (`null` unless the phase documents one).
pub(crate) struct PhaseFail {
    error: String,
    evidence: Value,
}

impl From<String> for PhaseFail {
    fn from(error: String) -> Self {
        PhaseFail {
            error,
            evidence: Value::Null,
        }
    }
}

impl From<crate::hub::HubError> for PhaseFail {
    /// A host command's error, recorded as its text.
    fn from(e: crate::hub::HubError) -> Self {
        PhaseFail::from(e.to_string())
    }
}

impl From<ApiError> for PhaseFail {
    fn from(e: ApiError) -> Self {
        PhaseFail::from(e.to_string())
    }
}

/// The phase that failed, and why.
pub(crate) struct Failed {
    phase: PhaseName,
    error: String,
}

type PhaseResult<T> = Result<(Value, T), PhaseFail>;

/// The deployment's bookkeeping: its row, its phase rows, the watch channel.
pub(crate) struct Book {
    orch: Orchestrator,
    team: String,
    dep: Deployment,
    phases: Vec<Phase>,
    tx: watch::Sender<DeploymentState>,
    t0: Instant,
}

impl Book {
    fn publish(&self) {
        self.tx.send_replace(DeploymentState {
            deployment: self.dep.clone(),
            phases: self.phases.clone(),
        });
    }

    fn took_ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    async fn save_dep(&self) {
        if let Err(e) = repo::save_deployment(self.orch.db(), &self.team, &self.dep).await {
            tracing::error!(deployment = %self.dep.id, error = %e, "could not save deployment");
        }
        self.publish();
    }

    async fn set_phase(
        &mut self,
        name: PhaseName,
        status: PhaseStatus,
        evidence: Option<Value>,
        error: &str,
    ) {
        let Some(p) = self.phases.iter_mut().find(|p| p.is(name)) else {
            tracing::error!(deployment = %self.dep.id, phase = %name, "no such phase");
            return;
        };
        let t = repo::now();
        p.status = status;
        if status == PhaseStatus::Running {
            p.started_at = t;
        } else {
            p.finished_at = t;
        }
        if let Some(ev) = evidence {
            // As the store keeps it (whole numbers as integers), so what the watch
            // channel carries and what the store answers compare equal.
            p.evidence = repo::normalize_numbers(ev);
        }
        p.error = error.to_string();
        if let Err(e) = repo::save_phase(self.orch.db(), p).await {
            tracing::error!(deployment = %self.dep.id, phase = %name, error = %e, "could not save phase");
        }
        self.publish();
    }

    async fn begin(&mut self, name: PhaseName) {
        self.set_phase(name, PhaseStatus::Running, None, "").await;
    }

    async fn ok(&mut self, name: PhaseName, evidence: Value) {
        self.set_phase(name, PhaseStatus::Ok, Some(evidence), "")
            .await;
    }

    async fn fail(&mut self, name: PhaseName, error: &str, evidence: Value) {
        self.set_phase(name, PhaseStatus::Failed, Some(evidence), error)
            .await;
    }

    async fn skip(&mut self, name: PhaseName, evidence: Value) {
        self.set_phase(name, PhaseStatus::Skipped, Some(evidence), "")
            .await;
    }

    /// Runs one phase, bounded by the command timeout: `running`, then `ok` with the
    /// evidence or `failed` with the error.
    async fn run<T>(
        &mut self,
        name: PhaseName,
        fut: impl Future<Output = PhaseResult<T>>,
    ) -> Result<T, Failed> {
        self.begin(name).await;
        let out = match tokio::time::timeout(PHASE_TIMEOUT + Duration::from_secs(5), fut).await {
            Ok(r) => r,
            Err(_) => Err(PhaseFail::from(format!(
                "timed out after {} s",
                PHASE_TIMEOUT.as_secs()
            ))),
        };
        match out {
            Ok((evidence, t)) => {
                self.ok(name, evidence).await;
                Ok(t)
            }
            Err(f) => {
                self.fail(name, &f.error, f.evidence).await;
                Err(Failed {
                    phase: name,
                    error: f.error,
                })
            }
        }
    }

    /// The failure rule: every phase still pending before `verdict` becomes `skipped`,
    /// and the deployment's `Error` is `<phase>: <error>`.
    async fn failed(&mut self, f: &Failed) {
        let pending: Vec<PhaseName> = self
            .phases
            .iter()
            .filter(|p| p.status == PhaseStatus::Pending)
            .map(|p| p.name)
            .filter(|n| *n != PhaseName::Verdict)
            .collect();
        for name in pending {
            self.skip(name, Value::Null).await;
        }
        self.dep.error = format!("{}: {}", f.phase, f.error);
        self.save_dep().await;
    }

    async fn event(&self, kind: &str, body: Value) {
        for subject in [
            format!("env:{}", self.dep.env_id),
            format!("dep:{}", self.dep.id),
        ] {
            if let Err(e) = repo::event(self.orch.db(), &self.team, &subject, kind, &body).await {
                tracing::error!(deployment = %self.dep.id, error = %e, "could not append event");
            }
        }
    }

    /// Marks the deployment running; `resumed` (after a control-plane restart) is said
    /// in the `deployment.started` event.
    async fn start(&mut self, resumed: bool) {
        self.t0 = Instant::now();
        let mut body = json!({"kind": self.dep.kind});
        if resumed {
            body["resumed"] = json!(true);
        }
        self.event("deployment.started", body).await;
        self.dep.status = DeploymentStatus::Running;
        self.save_dep().await;
    }

    /// Ends the deployment. The `deployment.finished` event is appended before the
    /// final status is written, so whoever sees the status also finds the event.
    async fn finish(&mut self, final_status: DeploymentStatus) {
        let body = json!({
            "status": final_status.as_str(),
            "took_ms": self.took_ms(),
            "error": self.dep.error,
        });
        self.event("deployment.finished", body).await;
        self.dep.status = final_status;
        self.dep.finished_at = repo::now();
        self.save_dep().await;
        tracing::info!(
            deployment = %self.dep.id,
            kind = %self.dep.kind,
            status = %final_status,
            error = %self.dep.error,
            "deployment finished"
        );
    }

    async fn save_env(&self, env: &Environment) {
        if let Err(e) = repo::save_env(self.orch.db(), &self.team, env).await {
            tracing::error!(env = %env.id, error = %e, "could not save environment");
        }
    }

    async fn save_version(&self, v: &Version) {
        if let Err(e) = repo::save_version(self.orch.db(), &self.team, v).await {
            tracing::error!(version = %v.id, error = %e, "could not save version");
        }
    }

    /// Records `verdict` as `ok` with `ev` and ends the deployment: `succeeded` when
    /// `result` is `Ok`, else (after the failure rule) `failed`.
    async fn conclude(&mut self, result: Result<(), Failed>, ev: Value) {
        match result {
            Ok(()) => {
                self.ok(PhaseName::Verdict, ev).await;
                self.finish(DeploymentStatus::Succeeded).await;
            }
            Err(f) => {
                self.failed(&f).await;
                self.ok(PhaseName::Verdict, ev).await;
                self.finish(DeploymentStatus::Failed).await;
            }
        }
    }

    /// A deployment whose rows cannot be read: every phase before the verdict skipped,
    /// the verdict failed with the reason.
    async fn abort(&mut self, reason: String) {
        let f = Failed {
            phase: PhaseName::Verdict,
            error: reason.clone(),
        };
        self.failed(&f).await;
        self.dep.error = reason.clone();
        self.fail(PhaseName::Verdict, &reason, Value::Null).await;
        self.finish(DeploymentStatus::Failed).await;
    }
}

/// Runs a deployment to its final status. Called with the environment's lock held.
pub(crate) async fn run(
    orch: Orchestrator,
    team: String,
    state: DeploymentState,
    tx: watch::Sender<DeploymentState>,
    job: Job,
) {
    let dep = state.deployment;
    let dep_id = dep.id.clone();
    // A deployment already `running` was started by an earlier process: this run
    // resumes it (its commands are answered from their rows, `crate::hub::replay`).
    let resumed = dep.status == DeploymentStatus::Running;
    let mut phases = state.phases;
    if resumed {
        // It runs its phases again from the first, so they start over as `pending`.
        if let Err(e) = repo::rewind_phases(orch.db(), &dep_id).await {
            tracing::error!(deployment = %dep_id, error = %e, "could not rewind the phases");
        }
        for p in &mut phases {
            p.status = PhaseStatus::Pending;
            p.evidence = Value::Null;
            p.error.clear();
            p.started_at.clear();
            p.finished_at.clear();
        }
    }
    let mut book = Book {
        orch: orch.clone(),
        team,
        dep,
        phases,
        tx,
        t0: Instant::now(),
    };
    book.start(resumed).await;
    // Whether the environment's warm pool may have to change afterwards: its current
    // version moves (deploy, snapshot, rollback) or it goes (destroy).
    // (A promote replaces the target's stack: its pool follows its new version.)
    let pool_sync = !matches!(job, Job::Fork { .. } | Job::Verify { .. });
    crate::hub::replay::scope(&dep_id, async {
        match job {
            Job::Deploy {
                spec,
                warm,
                pin,
                contexts,
            } => deploy(&mut book, *spec, warm, pin, contexts).await,
            Job::Fork { owner_env } => fork(&mut book, owner_env).await,
            Job::Snapshot => snapshot(&mut book).await,
            Job::Rollback => rollback(&mut book).await,
            Job::Verify { resume } => verify(&mut book, resume).await,
            Job::Destroy => destroy(&mut book).await,
            Job::Promote { from_env } => promote::promote(&mut book, from_env).await,
        }
    })
    .await;
    if pool_sync {
        orch.spawn_pool_sync(&book.team, &book.dep.env_id);
    }
}

/// The environment and version the deployment names, or the reason they cannot be read.
async fn load(
    book: &Book,
    env_id: &str,
    version_id: &str,
) -> Result<(Environment, Option<Version>), String> {
    let db = book.orch.db();
    let env = repo::env(db, &book.team, env_id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("environment {env_id} not found"))?;
    let version = if version_id.is_empty() {
        None
    } else {
        Some(
            repo::version(db, &book.team, version_id)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("version {version_id} not found"))?,
        )
    };
    Ok((env, version))
}

fn snapshot_evidence(r: &v1::SnapshotResult) -> Value {
    json!({
        "snapshot": r.snapshot,
        "datasets": r.datasets,
        "frozen_for": r.frozen_for_ms,
        "consistent": r.consistent,
        "clock": clock_evidence(r.world_instant_ms, r.clock_offset_ms),
    })
}

/// The world's clock of a snapshot as evidence: `{world_instant, world_instant_ms,
/// offset_ms}` (`world_instant` RFC 3339 UTC; `offset_ms` the environment's offset
/// against the host's real time, 0 on the real clock); `null` from a sidecar that
/// reports none.
fn clock_evidence(world_instant_ms: i64, offset_ms: i64) -> Value {
    if world_instant_ms == 0 {
        return Value::Null;
    }
    let at = chrono::DateTime::from_timestamp_millis(world_instant_ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default();
    json!({"world_instant": at, "world_instant_ms": world_instant_ms, "offset_ms": offset_ms})
}

/// `version`'s stored spec with [`denv_compose::Spec::world_instant_ms`] set to its
/// snapshot's world instant, so every fork, pool member and grader fork of it is sent
/// that instant. A sidecar that reported none (0) leaves the spec as it was.
fn record_world_instant(version: &mut Version, world_instant_ms: i64) {
    if world_instant_ms != 0 {
        version.spec.world_instant_ms = world_instant_ms;
    }
}

/// A fork's clock as evidence: `{mode: "real"}`, or for `x-denv.clock: frozen`
/// `{mode: "frozen", starts_at, world_instant_ms, offset_ms, real_clock_services}`
/// (`starts_at` RFC 3339 UTC, the instant the fork's clock started at; a version without
/// a recorded instant forks on the real clock and says `starts_at: null`;
/// `real_clock_services` the services the sidecar left on the real clock, service →
/// why, e.g. `musl: /lib/ld-musl-x86_64.so.1`).
fn fork_clock_evidence(
    spec: &denv_compose::Spec,
    offset_ms: i64,
    real: &std::collections::HashMap<String, String>,
) -> Value {
    if !spec.frozen_clock() {
        return json!({"mode": "real"});
    }
    let at = chrono::DateTime::from_timestamp_millis(spec.world_instant_ms)
        .filter(|_| spec.world_instant_ms != 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
    let real: std::collections::BTreeMap<_, _> = real.iter().collect();
    json!({"mode": "frozen", "starts_at": at, "world_instant_ms": spec.world_instant_ms,
           "offset_ms": offset_ms, "real_clock_services": real})
}

fn endpoints_json<'a>(e: impl IntoIterator<Item = (&'a String, &'a String)>) -> Value {
    let sorted: std::collections::BTreeMap<_, _> = e.into_iter().collect();
    json!(sorted)
}

/// The sidecar's egress probe as evidence: `{took_us, from, attempts: [{target, addr,
/// result, took_us}]}`; `null` from a sidecar that sends none.
fn probe_json(p: Option<&v1::EgressProbe>) -> Value {
    match p {
        None => Value::Null,
        Some(p) => json!({
            "took_us": p.took_us,
            "from": p.from,
            "attempts": p.attempts.iter().map(|a| json!({
                "target": a.target,
                "addr": a.addr,
                "result": a.result,
                "took_us": a.took_us,
            })).collect::<Vec<_>>(),
        }),
    }
}

/// The host's capabilities as it reported them at connect (`None` when unknown).
async fn host_capabilities(orch: &super::Orchestrator, host_id: &str) -> Option<Value> {
    if host_id.is_empty() {
        return None;
    }
    let h = crate::store::hosts::get(orch.db(), host_id).await.ok()??;
    serde_json::from_str(&h.capabilities).ok()
}

fn fork_payload(
    owner_env: &str,
    snapshot: &str,
    spec: &denv_compose::Spec,
    expires_at: &str,
) -> v1::EnvFork {
    v1::EnvFork {
        from_env: owner_env.to_string(),
        from_snapshot: snapshot.to_string(),
        services: spec.services.iter().map(Into::into).collect(),
        volumes: spec.volumes.clone(),
        egress: spec.egress.as_str().to_string(),
        agent_service: denv_compose::wire::agent_service(spec),
        disk_mb: spec.disk_mb,
        expires_at: expires_at.to_string(),
        digest_volumes: false,
        clock: denv_compose::wire::clock_wire(spec),
        world_instant_ms: spec.world_instant_ms,
    }
}

/// Runs `cmd` in the first service; a non-zero exit is a failure with `{exit, stderr}`.
async fn exec_first(
    link: &Link,
    to: &Addr,
    spec: &denv_compose::Spec,
    cmd: Vec<String>,
    timeout_sec: u32,
    what: &str,
) -> Result<v1::ExecOutput, PhaseFail> {
    let service = spec
        .first_service()
        .map(|s| s.name.clone())
        .ok_or_else(|| PhaseFail::from("the spec has no services".to_string()))?;
    let out = link
        .exec(
            to,
            v1::EnvExec {
                service,
                cmd,
                timeout_sec,
                ..Default::default()
            },
            Duration::from_secs(u64::from(timeout_sec)) + EXEC_SLACK,
        )
        .await?;
    if out.exit_code != 0 {
        return Err(PhaseFail {
            error: format!("{what} exited {}", out.exit_code),
            evidence: json!({"exit": out.exit_code, "stderr": out.stderr}),
        });
    }
    Ok(out)
}

// ---------------------------------------------------------------- deploy

async fn deploy(
    book: &mut Book,
    spec: denv_compose::Spec,
    warm: Vec<String>,
    pin: Option<super::Pin>,
    contexts: super::builds::Contexts,
) {
    let (env_id, ver_id) = (book.dep.env_id.clone(), book.dep.version_id.clone());
    let (mut env, version) = match load(book, &env_id, &ver_id).await {
        Ok((e, Some(v))) => (e, v),
        Ok((_, None)) => return book.abort("deployment has no version".into()).await,
        Err(e) => return book.abort(e).await,
    };
    let mut version = version;
    let original_host = env.host_id.clone();
    // The version to return to if this deploy fails: the current one, if healthy.
    let previous = if env.current_version_id.is_empty() || env.current_version_id == ver_id {
        None
    } else {
        repo::version(book.orch.db(), &book.team, &env.current_version_id)
            .await
            .ok()
            .flatten()
            .filter(|v| v.healthy && !v.snapshot.is_empty())
    };
    env.status = EnvStatus::Deploying;
    book.save_env(&env).await;

    match deploy_phases(
        book,
        &mut env,
        &mut version,
        &spec,
        &warm,
        pin.as_ref(),
        contexts,
    )
    .await
    {
        Ok(()) => {
            version.healthy = true;
            book.save_version(&version).await;
            env.current_version_id = version.id.clone();
            env.status = EnvStatus::Healthy;
            book.save_env(&env).await;
            book.begin(PhaseName::Verdict).await;
            let ev = json!({"version": version.id, "snapshot": version.snapshot, "took_ms": book.took_ms()});
            book.ok(PhaseName::Verdict, ev).await;
            book.finish(DeploymentStatus::Succeeded).await;
        }
        Err(f) => {
            book.failed(&f).await;
            book.begin(PhaseName::Verdict).await;
            match previous {
                Some(prev) if !original_host.is_empty() => {
                    let to = Addr::new(&book.team, &original_host, &env.id);
                    let link = book.orch.link().clone();
                    let r = match link.require(&original_host) {
                        Ok(()) => {
                            link.rollback(
                                &to,
                                v1::EnvRollback {
                                    snapshot: prev.snapshot.clone(),
                                },
                                PHASE_TIMEOUT,
                            )
                            .await
                        }
                        Err(e) => Err(e),
                    };
                    match r {
                        Ok(r) => {
                            env.host_id = original_host;
                            env.current_version_id = prev.id.clone();
                            env.endpoints = r.endpoints.into_iter().collect();
                            env.status = EnvStatus::Healthy;
                            book.save_env(&env).await;
                            book.ok(PhaseName::Verdict, json!({"reverted_to": prev.id}))
                                .await;
                            book.finish(DeploymentStatus::RolledBack).await;
                        }
                        Err(e) => {
                            env.status = EnvStatus::Failed;
                            book.save_env(&env).await;
                            let why = format!("rollback failed: {e}");
                            book.fail(PhaseName::Verdict, &why, json!({"reverted": why}))
                                .await;
                            book.finish(DeploymentStatus::Failed).await;
                        }
                    }
                }
                _ => {
                    env.status = EnvStatus::Failed;
                    book.save_env(&env).await;
                    book.ok(
                        PhaseName::Verdict,
                        json!({"reverted": "no previous version"}),
                    )
                    .await;
                    book.finish(DeploymentStatus::Failed).await;
                }
            }
        }
    }
}

async fn deploy_phases(
    book: &mut Book,
    env: &mut Environment,
    version: &mut Version,
    spec: &denv_compose::Spec,
    warm: &[String],
    pin: Option<&super::Pin>,
    contexts: super::builds::Contexts,
) -> Result<(), Failed> {
    let orch = book.orch.clone();
    let link = orch.link();
    let team = book.team.clone();

    let ev = json!({
        "version": version.id,
        "number": version.number,
        "services": spec.services.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
        "volumes": spec.volumes,
    });
    book.run(PhaseName::Resolve, async { Ok((ev, ())) }).await?;

    // A new environment goes where it has room (`placement`); its claim on that host is
    // held until this deploy ends.
    let (host, ev, _claim) = if link.is_connected(&env.host_id) {
        let ev = json!({"host": env.host_id, "reason": "environment already on host"});
        (env.host_id.clone(), ev, None)
    } else {
        match super::placement::place(&orch, &team, pin, spec, None).await {
            Ok(p) => (p.host_id, p.evidence, p.claim),
            Err(u) => {
                return book
                    .run(PhaseName::Place, async {
                        Err::<(Value, ()), _>(PhaseFail {
                            error: u.error,
                            evidence: u.evidence,
                        })
                    })
                    .await;
            }
        }
    };
    book.run(PhaseName::Place, async { Ok((ev, ())) }).await?;

    if host.is_empty() {
        book.run(PhaseName::Provision, async {
            Err::<(Value, ()), _>(PhaseFail::from(NO_HOST.to_string()))
        })
        .await?;
    } else {
        book.skip(
            PhaseName::Provision,
            json!({"reason": "host already placed"}),
        )
        .await;
        book.skip(PhaseName::Join, json!({"reason": "host already placed"}))
            .await;
    }
    env.host_id = host.clone();
    book.save_env(env).await;
    let to = Addr::new(&team, &host, &env.id);

    let mut payload = denv_compose::wire::env_create(&version.id, spec);
    payload.expires_at = env.expires_at.clone();
    // The caps the environment runs with (the sandbox request's own are already in the
    // spec; `params.resources` says what it asked for).
    let asked = super::resources::Request::from_params(&book.dep.params);
    let caps_ev = super::resources::evidence(
        spec,
        host_capabilities(&orch, &host).await.as_ref(),
        &asked,
        super::resources::agent_service(spec).as_deref(),
    );
    let created = book
        .run(PhaseName::Prepare, async {
            // Images built on the host first (one image.build per `build:` service, in
            // service order); their output is the command's progress lines.
            let mut builds = serde_json::Map::new();
            for (service, tar) in contexts {
                let Some(b) = spec.builds.get(&service) else {
                    continue;
                };
                let req = v1::ImageBuild {
                    service: service.clone(),
                    tag: b.tag(),
                    context_digest: b.context_digest.clone(),
                    scope: b.scope.clone(),
                    context: tar,
                    dockerfile: b.dockerfile.clone(),
                    args: b.args.clone().into_iter().collect(),
                    target: b.target.clone(),
                };
                let (command, r) = link.build(&to, req, PHASE_TIMEOUT).await;
                let log = format!("/v1/events?subject=cmd:{command}");
                match r {
                    Ok(r) => {
                        // The service runs the image this build made (its id), not
                        // whatever `denv-build/<key>` names when the containers are
                        // created (a concurrent deploy of the same key may retag it).
                        if let Some(s) = payload.services.iter_mut().find(|s| s.name == service) {
                            s.image_id = r.image_id.clone();
                        }
                        builds.insert(
                            service,
                            json!({"tag": r.tag, "image_id": r.image_id, "cached": r.cached,
                                   "took_ms": r.took_ms, "command": command, "log": log}),
                        );
                    }
                    Err(e) => {
                        let e = e.to_string();
                        let mut lines = e.lines();
                        let error = lines.next().unwrap_or_default().to_string();
                        let tail: Vec<&str> = lines.collect();
                        builds.insert(
                            service,
                            json!({"failed": true, "command": command, "log": log, "log_tail": tail}),
                        );
                        return Err(PhaseFail {
                            error,
                            evidence: json!({"version": version.id, "builds": builds}),
                        });
                    }
                }
            }
            let r = link.create(&to, payload, PHASE_TIMEOUT).await?;
            // Beyond the documented {version, endpoints}: what the egress probe found (its
            // verdict and every attempt) and the pinned digests, so the record shows both
            // (spec 19-ref-protections.md).
            let ev = json!({
                "version": version.id,
                "endpoints": endpoints_json(&r.endpoints),
                "egress": r.egress,
                "egress_probe": probe_json(r.egress_probe.as_ref()),
                "digests": r.digests,
                "image_ids": r.image_ids,
                "storage": r.storage,
                "resources": caps_ev,
            });
            let mut ev = ev;
            if !builds.is_empty() {
                ev["builds"] = Value::Object(builds);
            }
            Ok((ev, r))
        })
        .await?;
    // The version is these images from now on: every fork, rollback and pool member of it
    // runs exactly them (by id), whatever the tags name later.
    // A version that could not be pinned would be forked by tag later: that fails the
    // deploy rather than being only logged.
    version.spec = pin_images(spec, &created.image_ids, &created.verifier_image_id);
    let ev = json!({"started_in_ms": created.started_in_ms});
    let (db, team_id, pinned) = (orch.db().clone(), book.team.clone(), version.clone());
    book.run(PhaseName::Start, async move {
        repo::save_version(&db, &team_id, &pinned)
            .await
            .map_err(|e| PhaseFail::from(format!("pinning the version's image ids: {e}")))?;
        Ok((ev, ()))
    })
    .await?;
    env.endpoints = created.endpoints.clone().into_iter().collect();
    book.save_env(env).await;
    let ev = json!({"endpoints": endpoints_json(&created.endpoints)});
    book.run(PhaseName::Health, async { Ok((ev, ())) }).await?;

    let argv: Vec<String> = if warm.is_empty() {
        spec.warm.clone()
    } else {
        warm.to_vec()
    };
    if argv.is_empty() {
        book.skip(PhaseName::Warm, json!({"reason": "no warm command"}))
            .await;
    } else {
        book.run(PhaseName::Warm, async {
            let out = exec_first(link, &to, spec, argv, WARM_TIMEOUT_SEC, "warm command").await?;
            Ok((json!({"exit": out.exit_code}), ()))
        })
        .await?;
    }

    let name = version.id.clone();
    let snap = book
        .run(PhaseName::Snapshot, async {
            let r = link
                .snapshot(
                    &to,
                    v1::EnvSnapshot {
                        name,
                        keep_paused: vec![],
                    },
                    PHASE_TIMEOUT,
                )
                .await?;
            Ok((snapshot_evidence(&r), r))
        })
        .await?;
    version.snapshot = if snap.snapshot.is_empty() {
        version.id.clone()
    } else {
        snap.snapshot
    };
    record_world_instant(version, snap.world_instant_ms);
    book.save_version(version).await;

    book.skip(
        PhaseName::Ingress,
        json!({"endpoints": endpoints_json(&env.endpoints), "names": "pending ingress proxy"}),
    )
    .await;
    Ok(())
}

/// `spec` with each service's `image_id` set from the host's report of what it ran
/// (service → `sha256:…`), and the image verifier's from `verifier_image_id`; what the
/// host did not report keeps what it had.
fn pin_images(
    spec: &denv_compose::Spec,
    image_ids: &std::collections::HashMap<String, String>,
    verifier_image_id: &str,
) -> denv_compose::Spec {
    let mut pinned = spec.clone();
    for s in &mut pinned.services {
        if let Some(id) = image_ids.get(&s.name).filter(|id| !id.is_empty()) {
            s.image_id = id.clone();
        }
    }
    if let Some(v) = pinned.verifier.as_mut().filter(|v| v.image.is_some()) {
        if !verifier_image_id.is_empty() {
            v.image_id = verifier_image_id.to_string();
        }
    }
    pinned
}

// ---------------------------------------------------------------- fork

async fn fork(book: &mut Book, owner_env: String) {
    let (env_id, ver_id) = (book.dep.env_id.clone(), book.dep.version_id.clone());
    let (mut env, version) = match load(book, &env_id, &ver_id).await {
        Ok((e, Some(v))) => (e, v),
        Ok((_, None)) => return book.abort("deployment has no version".into()).await,
        Err(e) => return book.abort(e).await,
    };
    env.status = EnvStatus::Deploying;
    book.save_env(&env).await;

    let result: Result<(), Failed> = async {
        let orch = book.orch.clone();
        let link = orch.link();
        let team = book.team.clone();
        let owner_host = match repo::env(orch.db(), &team, &owner_env).await {
            Ok(Some(o)) => o.host_id,
            _ => env.host_id.clone(),
        };
        // Where the fork goes (`placement`, like a deploy), then the version's snapshot
        // shipped there when the host lacks it (`ship`). The claim is held until the
        // fork ends.
        let (host, _claim) = book
            .run(
                PhaseName::Place,
                place_fork(&orch, &team, &env, &owner_host, &version),
            )
            .await?;
        env.host_id = host.clone();
        book.save_env(&env).await;
        let to = Addr::new(&book.team, &host, &env.id);
        let spec: Result<_, Failed> = Ok(version.spec.clone());
        // The request's own caps (`params.resources`), on top of the version's.
        let caps = super::resources::Request::from_params(&book.dep.params);
        let spec = spec.and_then(|mut s| {
            let to = super::resources::apply(&mut s, &caps).map_err(|e| Failed {
                phase: PhaseName::Clone,
                error: e.to_string(),
            })?;
            Ok((s, to))
        });
        let (spec, applied_to) = match spec {
            Ok(s) => s,
            Err(f) => {
                book.fail(PhaseName::Clone, &f.error, Value::Null).await;
                return Err(f);
            }
        };
        let host_caps = host_capabilities(&orch, &host).await;
        let caps_ev =
            super::resources::evidence(&spec, host_caps.as_ref(), &caps, applied_to.as_deref());
        let payload = fork_payload(&owner_env, &version.snapshot, &spec, &env.expires_at);
        // A fork made for a warm pool (`fill`) or made cold because the pool was empty
        // (`miss`) says so.
        let pool = book.dep.params.get("pool").cloned();
        let r = book
            .run(PhaseName::Clone, async {
                let r = link.fork(&to, payload, PHASE_TIMEOUT).await?;
                let mut ev = json!({"forked_in_ms": r.forked_in_ms, "from": version.id,
                                    "resources": caps_ev,
                                    "clock": fork_clock_evidence(&spec, r.clock_offset_ms,
                                                                 &r.clock_real_services)});
                if let Some(p) = pool {
                    ev["pool"] = p;
                }
                Ok((ev, r))
            })
            .await?;
        env.endpoints = r.endpoints.clone().into_iter().collect();
        book.save_env(&env).await;
        let ev = json!({
            "endpoints": endpoints_json(&r.endpoints),
            "egress": r.egress,
            "egress_probe": probe_json(r.egress_probe.as_ref()),
        });
        book.run(PhaseName::Health, async { Ok((ev, ())) }).await?;
        Ok(())
    }
    .await;

    match result {
        Ok(()) => {
            env.current_version_id = version.id.clone();
            env.status = EnvStatus::Healthy;
            book.save_env(&env).await;
            book.begin(PhaseName::Verdict).await;
            let ev = json!({"env": env.id, "took_ms": book.took_ms()});
            book.ok(PhaseName::Verdict, ev).await;
            book.finish(DeploymentStatus::Succeeded).await;
        }
        Err(f) => {
            book.failed(&f).await;
            env.status = EnvStatus::Failed;
            book.save_env(&env).await;
            book.begin(PhaseName::Verdict).await;
            let ev = json!({"env": env.id, "error": book.dep.error, "took_ms": book.took_ms()});
            book.ok(PhaseName::Verdict, ev).await;
            book.finish(DeploymentStatus::Failed).await;
            if env.stage == super::pool::STAGE {
                // A warm pool fill that failed helps nobody: it goes (not retried until
                // the pool's next sync).
                book.orch
                    .spawn_destroy(&book.team, &env.id, super::lifecycle::reason::FAILED);
            }
        }
    }
}

/// The `place` phase of a fork: the host ([`super::placement::place`] among the team's
/// connected hosts; a fork already placed on another host than the snapshot's, by an
/// earlier attempt of this deployment, stays there; with no connected host or none with
/// room, the snapshot's own host as before), then the snapshot shipped to it when it is
/// another host ([`super::Orchestrator::ship_version`]). Evidence: the placement's
/// `{host, reason, need, free}`, plus `ship: {from_host, to_host, bytes, sha256,
/// took_ms, cached}` when the host is not the snapshot's.
async fn place_fork(
    orch: &super::Orchestrator,
    team: &str,
    env: &Environment,
    owner_host: &str,
    version: &Version,
) -> PhaseResult<(String, Option<crate::hub::Claim>)> {
    let link = orch.link();
    let (host, mut ev, claim) = if env.host_id != owner_host && link.is_connected(&env.host_id) {
        let ev = json!({"host": env.host_id, "reason": "environment already on host"});
        (env.host_id.clone(), ev, None)
    } else {
        let locality = fork_locality(orch, team, owner_host, version).await;
        match super::placement::place(orch, team, None, &version.spec, Some(&locality)).await {
            Ok(p) if !p.host_id.is_empty() => (p.host_id, p.evidence, p.claim),
            placed => {
                let why = match placed {
                    Err(u) => format!("{}; ", u.error),
                    Ok(_) => String::new(),
                };
                let ev = json!({"host": owner_host,
                                "reason": format!("{why}same host as source snapshot")});
                if !link.is_connected(owner_host) {
                    return Err(PhaseFail {
                        error: if owner_host.is_empty() {
                            "the source environment has no host".to_string()
                        } else {
                            format!("host {owner_host} is not connected")
                        },
                        evidence: ev,
                    });
                }
                (owner_host.to_string(), ev, None)
            }
        }
    };
    // Boxed: the shipment's future is large, and the runner's would carry it inline.
    match Box::pin(orch.ship_version(team, version, owner_host, &host)).await {
        Ok(Some(shipped)) => ev["ship"] = shipped.to_json(),
        Ok(None) => {}
        Err(e) => {
            ev["ship"] = json!({"from_host": owner_host, "to_host": host, "error": e});
            return Err(PhaseFail {
                error: format!("shipping snapshot {} to host {host}: {e}", version.snapshot),
                evidence: ev,
            });
        }
    }
    Ok((ev, (host, claim)))
}

/// Where `version`'s data is, for [`place_fork`]: its own host and the hosts holding a
/// copy, and the seconds a shipment to another host is estimated to take (see
/// [`super::placement::Locality`]). A store error is logged and counts as no copies.
async fn fork_locality(
    orch: &super::Orchestrator,
    team: &str,
    owner_host: &str,
    version: &Version,
) -> super::placement::Locality {
    let db = orch.db();
    let copies = crate::store::snapshot_copies::of_version(db, &version.id)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(version = %version.id, error = %e, "listing copies for placement");
            vec![]
        });
    let team_hosts: Vec<String> = crate::store::hosts::list(db, team)
        .await
        .map(|hs| hs.into_iter().map(|h| h.id).collect())
        .unwrap_or_default();
    let recent = crate::store::snapshot_copies::recent(
        db,
        &team_hosts,
        super::placement::RATE_SAMPLES as u64,
    )
    .await
    .unwrap_or_default();
    let mut holders = vec![owner_host.to_string()];
    holders.extend(copies.iter().map(|c| c.host_id.clone()));
    let bytes = copies.first().map(|c| c.bytes.max(0) as u64);
    super::placement::Locality::new(holders, bytes, &recent)
}

// ---------------------------------------------------------------- snapshot

async fn snapshot(book: &mut Book) {
    let (env_id, ver_id) = (book.dep.env_id.clone(), book.dep.version_id.clone());
    let (mut env, mut version) = match load(book, &env_id, &ver_id).await {
        Ok((e, Some(v))) => (e, v),
        Ok((_, None)) => return book.abort("deployment has no version".into()).await,
        Err(e) => return book.abort(e).await,
    };
    let kept = env.current_version_id.clone();
    let result: Result<(), Failed> = async {
        let orch = book.orch.clone();
        let link = orch.link();
        let to = Addr::new(&book.team, &env.host_id, &env.id);
        let name = version.id.clone();
        let r = book
            .run(PhaseName::Snapshot, async {
                link.require(&to.host_id)?;
                let r = link
                    .snapshot(
                        &to,
                        v1::EnvSnapshot {
                            name,
                            keep_paused: vec![],
                        },
                        PHASE_TIMEOUT,
                    )
                    .await?;
                Ok((snapshot_evidence(&r), r))
            })
            .await?;
        version.snapshot = if r.snapshot.is_empty() {
            version.id.clone()
        } else {
            r.snapshot
        };
        record_world_instant(&mut version, r.world_instant_ms);
        book.save_version(&version).await;
        let spec: Result<_, PhaseFail> = Ok(version.spec.clone());
        book.run(PhaseName::Health, async {
            let spec = spec?;
            exec_first(link, &to, &spec, vec!["true".into()], 60, "health check").await?;
            Ok((json!({"answered": true}), ()))
        })
        .await?;
        Ok(())
    }
    .await;

    match result {
        Ok(()) => {
            version.healthy = true;
            book.save_version(&version).await;
            env.current_version_id = version.id.clone();
            book.save_env(&env).await;
            book.begin(PhaseName::Verdict).await;
            let ev = json!({"version": version.id, "snapshot": version.snapshot, "took_ms": book.took_ms()});
            book.ok(PhaseName::Verdict, ev).await;
            book.finish(DeploymentStatus::Succeeded).await;
        }
        Err(f) => {
            book.failed(&f).await;
            book.begin(PhaseName::Verdict).await;
            book.ok(PhaseName::Verdict, json!({"kept": kept})).await;
            book.finish(DeploymentStatus::Failed).await;
        }
    }
}

// ---------------------------------------------------------------- rollback

async fn rollback(book: &mut Book) {
    let (env_id, ver_id) = (book.dep.env_id.clone(), book.dep.version_id.clone());
    let (mut env, version) = match load(book, &env_id, &ver_id).await {
        Ok((e, Some(v))) => (e, v),
        Ok((_, None)) => return book.abort("deployment has no version".into()).await,
        Err(e) => return book.abort(e).await,
    };
    let result: Result<(), Failed> = async {
        let orch = book.orch.clone();
        let link = orch.link();
        let to = Addr::new(&book.team, &env.host_id, &env.id);
        let connected = link.is_connected(&env.host_id);
        let snapshot = version.snapshot.clone();
        let r = book
            .run(PhaseName::Restore, async {
                if !connected {
                    return Err(PhaseFail::from(format!(
                        "host {} is not connected",
                        to.host_id
                    )));
                }
                let r = link
                    .rollback(&to, v1::EnvRollback { snapshot }, PHASE_TIMEOUT)
                    .await?;
                let real: std::collections::BTreeMap<_, _> = r.clock_real_services.iter().collect();
                let mut ev = json!({"snapshot": r.snapshot, "clock_offset_ms": r.clock_offset_ms});
                if !real.is_empty() {
                    ev["real_clock_services"] = json!(real);
                }
                Ok((ev, r))
            })
            .await?;
        env.endpoints = r.endpoints.into_iter().collect();
        book.save_env(&env).await;
        let ev = json!({"restored": version.id});
        book.run(PhaseName::Health, async { Ok((ev, ())) }).await?;
        Ok(())
    }
    .await;
    match result {
        Ok(()) => {
            env.current_version_id = version.id.clone();
            env.status = EnvStatus::Healthy;
            book.save_env(&env).await;
            book.begin(PhaseName::Verdict).await;
            book.ok(PhaseName::Verdict, json!({"version": version.id}))
                .await;
            book.finish(DeploymentStatus::Succeeded).await;
        }
        Err(f) => {
            book.failed(&f).await;
            book.begin(PhaseName::Verdict).await;
            let ev = json!({"version": version.id, "error": book.dep.error});
            book.ok(PhaseName::Verdict, ev).await;
            book.finish(DeploymentStatus::Failed).await;
        }
    }
}

// ---------------------------------------------------------------- verify

/// What a verify learned on its way, for the verdict.
#[derive(Default)]
struct Verified {
    collected: Option<v1::CollectResult>,
    snapshotted: bool,
    grader: Option<Environment>,
    graded: Option<v1::RunResult>,
    /// The submission was refused and the sidecar unpaused the agent (`resume`).
    refused_resumed: bool,
}

async fn verify(book: &mut Book, resume: bool) {
    let (env_id, ver_id) = (book.dep.env_id.clone(), book.dep.version_id.clone());
    let (env, capture) = match load(book, &env_id, &ver_id).await {
        Ok((e, Some(v))) => (e, v),
        Ok((_, None)) => return book.abort("deployment has no version".into()).await,
        Err(e) => return book.abort(e).await,
    };
    let mut seen = Verified::default();
    let result = verify_phases(book, &env, capture, resume, &mut seen).await;
    let orch = book.orch.clone();

    book.begin(PhaseName::Verdict).await;
    // The grader's fork is destroyed whatever happened, after the verdict is recorded
    // (a client waiting for the reward does not wait for the teardown). Until then it
    // is `destroying`; its expiry (set at the fork) makes its host remove it should
    // this process die first.
    let grader = seen.grader.take().map(|mut g| {
        g.status = EnvStatus::Destroying;
        g
    });
    if let Some(g) = &grader {
        book.save_env(g).await;
    }
    let collected = seen.collected.clone().unwrap_or_default();
    let agent_frozen =
        seen.collected.is_some() && !(resume && (seen.snapshotted || seen.refused_resumed));
    let (reward, source, exit_code) = match (&result, &seen.graded) {
        (Ok(()), Some(g)) => (json!(g.reward), json!(g.source), json!(g.exit_code)),
        (_, g) => (
            Value::Null,
            json!("error"),
            g.as_ref()
                .map(|g| json!(g.exit_code))
                .unwrap_or(Value::Null),
        ),
    };
    let ev = json!({
        "reward": reward,
        "source": source,
        "exit_code": exit_code,
        "refused": collected.refused,
        "missing": collected.missing,
        "agent_frozen": agent_frozen,
        "took_ms": book.took_ms(),
    });
    book.conclude(result, ev).await;
    if let Some(mut grader) = grader {
        let to = Addr::new(&book.team, &grader.host_id, &grader.id);
        match orch
            .link()
            .destroy(&to, v1::EnvDestroy {}, PHASE_TIMEOUT)
            .await
        {
            Ok(_) => {
                grader.status = EnvStatus::Destroyed;
                grader.endpoints.clear();
            }
            Err(e) => {
                tracing::warn!(env = %grader.id, error = %e, "could not destroy the grader's fork");
                grader.status = EnvStatus::Failed;
            }
        }
        book.save_env(&grader).await;
    }
}

/// How long a grader's fork may live (its expiry, enforced by its host even while the
/// control plane is away): the clone, the verifier's own timeout (any `u64` the compose
/// file allows), and the teardown; at most the longest TTL, 365 days.
fn grader_lifetime(verifier_timeout_sec: u64) -> chrono::Duration {
    let max = super::lifecycle::MAX_TTL_SEC.unsigned_abs();
    let secs = (2 * PHASE_TIMEOUT.as_secs())
        .saturating_add(verifier_timeout_sec)
        .min(max);
    chrono::Duration::seconds(i64::try_from(secs).unwrap_or(super::lifecycle::MAX_TTL_SEC))
}

async fn verify_phases(
    book: &mut Book,
    env: &Environment,
    mut capture: Version,
    resume: bool,
    seen: &mut Verified,
) -> Result<(), Failed> {
    let orch = book.orch.clone();
    let link = orch.link();
    let team = book.team.clone();
    let dep_id = book.dep.id.clone();
    let to = Addr::new(&team, &env.host_id, &env.id);
    let s = capture.spec.clone();
    let (agent, verifier, spec) = match (s.agent.clone(), s.verifier.clone()) {
        (Some(a), Some(v)) => (a.service, v, s),
        _ => {
            let f = Failed {
                phase: PhaseName::Stop,
                error: "the version declares no x-denv.agent.service and x-denv.verifier".into(),
            };
            book.fail(PhaseName::Stop, &f.error, Value::Null).await;
            return Err(f);
        }
    };

    let ev = json!({"agent_service": agent, "mode": "pause"});
    book.run(PhaseName::Stop, async { Ok((ev, ())) }).await?;

    let payload = v1::VerifyCollect {
        id: dep_id.clone(),
        agent_service: agent.clone(),
        collect: verifier.collect.clone(),
        resume_if_refused: resume,
    };
    let collected = book
        .run(PhaseName::Collect, async {
            link.require(&to.host_id)?;
            let r = link.collect(&to, payload, PHASE_TIMEOUT).await?;
            let ev = json!({"files": r.files, "bytes": r.bytes, "missing": r.missing, "refused": r.refused});
            Ok((ev, r))
        })
        .await;
    // The sidecar pauses the agent inside collect: after a successful collect the
    // agent is frozen (until a `resume` snapshot unpauses it).
    seen.collected = collected.as_ref().ok().cloned();
    let collected = collected?;

    // A refused submission is decided: no snapshot, no fork, no grader. The sidecar
    // already unpaused the agent when `resume` was asked.
    if !collected.refused.is_empty() {
        let why = json!({"reason": "submission refused"});
        book.skip(PhaseName::Snapshot, why.clone()).await;
        book.skip(PhaseName::Clone, why.clone()).await;
        book.skip(PhaseName::Grade, why).await;
        seen.refused_resumed = resume;
        seen.graded = Some(v1::RunResult {
            reward: Some(0.0),
            source: "refused".into(),
            ..Default::default()
        });
        return Ok(());
    }

    let keep_paused = if resume { vec![] } else { vec![agent.clone()] };
    let name = capture.id.clone();
    let snap = book
        .run(PhaseName::Snapshot, async {
            let r = link
                .snapshot(&to, v1::EnvSnapshot { name, keep_paused }, PHASE_TIMEOUT)
                .await?;
            Ok((snapshot_evidence(&r), r))
        })
        .await?;
    seen.snapshotted = true;
    capture.snapshot = if snap.snapshot.is_empty() {
        capture.id.clone()
    } else {
        snap.snapshot
    };
    capture.healthy = true;
    // The grader's fork starts at the capture's world instant (x-denv.clock: frozen).
    record_world_instant(&mut capture, snap.world_instant_ms);
    let mut spec = spec;
    spec.world_instant_ms = capture.spec.world_instant_ms;
    book.save_version(&capture).await;

    // The grader's own environment, forked from the capture. A resumed verify that had
    // made it already forks into the same one (the fork command replays under its id).
    let made = if book.dep.target_env_id.is_empty() {
        None
    } else {
        repo::env(orch.db(), &team, &book.dep.target_env_id)
            .await
            .ok()
            .flatten()
    };
    let fresh = made.is_none();
    let grader = made.unwrap_or_else(|| Environment {
        id: crate::ids::new_id("env"),
        project_id: env.project_id.clone(),
        name: format!("{}-verify-{}", env.name, super::short_id()),
        stage: "verify".into(),
        host_id: env.host_id.clone(),
        parent_version_id: capture.id.clone(),
        current_version_id: String::new(),
        status: EnvStatus::Deploying,
        created_at: repo::now(),
        endpoints: Default::default(),
        expires_at: crate::store::fmt_time(
            chrono::Utc::now() + grader_lifetime(verifier.timeout_sec),
        ),
    });
    let inserted = if fresh {
        repo::insert_envs(orch.db(), &team, std::slice::from_ref(&grader)).await
    } else {
        Ok(())
    };
    if let Err(e) = inserted {
        let f = Failed {
            phase: PhaseName::Clone,
            error: e.to_string(),
        };
        book.fail(PhaseName::Clone, &f.error, Value::Null).await;
        return Err(f);
    }
    seen.grader = Some(grader.clone());
    book.dep.target_env_id = grader.id.clone();
    book.save_dep().await;
    let grader_to = Addr::new(&team, &grader.host_id, &grader.id);
    let payload = fork_payload(&env.id, &capture.snapshot, &spec, &grader.expires_at);
    let forked = book
        .run(PhaseName::Clone, async {
            let r = link.fork(&grader_to, payload, PHASE_TIMEOUT).await?;
            Ok((
                json!({"grader_env": grader.id, "forked_in_ms": r.forked_in_ms,
                       "clock": fork_clock_evidence(&spec, r.clock_offset_ms,
                                                       &r.clock_real_services)}),
                r,
            ))
        })
        .await?;
    if let Some(g) = seen.grader.as_mut() {
        g.status = EnvStatus::Healthy;
        g.current_version_id = capture.id.clone();
        g.endpoints = forked.endpoints.into_iter().collect();
        let g = g.clone();
        book.save_env(&g).await;
    }

    let payload = v1::VerifyRun {
        id: dep_id,
        verifier: Some((&verifier).into()),
        refused: false,
    };
    let graded = book
        .run(PhaseName::Grade, async {
            let r = link
                .run_verifier(&grader_to, payload, PHASE_TIMEOUT)
                .await?;
            let ev = json!({
                "reward": r.reward,
                "exit_code": r.exit_code,
                "stdout": r.stdout,
                "stderr": r.stderr,
                "source": r.source,
                "ran_for": r.ran_for_ms,
            });
            if r.reward.is_none() {
                return Err(PhaseFail {
                    error: format!("verifier wrote no reward (exit {})", r.exit_code),
                    evidence: ev,
                });
            }
            Ok((ev, r))
        })
        .await;
    match graded {
        Ok(r) => {
            seen.graded = Some(r);
            Ok(())
        }
        Err(f) => Err(f),
    }
}

// ---------------------------------------------------------------- destroy

async fn destroy(book: &mut Book) {
    let env_id = book.dep.env_id.clone();
    let mut env = match load(book, &env_id, "").await {
        Ok((e, _)) => e,
        Err(e) => return book.abort(e).await,
    };
    env.status = EnvStatus::Destroying;
    book.save_env(&env).await;
    let orch = book.orch.clone();
    let link = orch.link();
    let deferred = !env.host_id.is_empty() && !link.is_connected_now(&env.host_id).await;
    let result: Result<(), Failed> = if !deferred && !env.host_id.is_empty() {
        let to = Addr::new(&book.team, &env.host_id, &env.id);
        book.run(PhaseName::Teardown, async {
            link.destroy(&to, v1::EnvDestroy {}, PHASE_TIMEOUT).await?;
            Ok((Value::Null, ()))
        })
        .await
    } else {
        // The host removes it when it reconnects (`lifecycle`: `host.report`).
        let why = if env.host_id.is_empty() {
            "never placed on a host"
        } else {
            TEARDOWN_DEFERRED
        };
        book.skip(PhaseName::Teardown, json!({ "reason": why }))
            .await;
        Ok(())
    };
    match result {
        Ok(()) => {
            env.status = EnvStatus::Destroyed;
            env.endpoints.clear();
            book.save_env(&env).await;
            if deferred && link.is_connected_now(&env.host_id).await {
                // The host came back between the check above and this write: its
                // `host.report` may have been read while the environment was still
                // live, so it would keep it. Tear it down now (the host answers a
                // repeat for an environment it no longer has as done).
                let to = Addr::new(&book.team, &env.host_id, &env.id);
                if let Err(e) = link.destroy(&to, v1::EnvDestroy {}, PHASE_TIMEOUT).await {
                    tracing::warn!(env_id = %env.id, host_id = %env.host_id, error = %e, "teardown after the host came back failed; its next report removes it");
                }
            }
            // Copies of its snapshots shipped to other hosts serve no fork any more. (Not
            // while its own teardown waits for its host: until then nothing is removed.)
            let copies_cleared = if deferred {
                0
            } else {
                orch.drop_copies(&book.team, &env.id).await
            };
            book.begin(PhaseName::Verdict).await;
            book.ok(
                PhaseName::Verdict,
                json!({ "copies_cleared": copies_cleared }),
            )
            .await;
            book.finish(DeploymentStatus::Succeeded).await;
            let failed_fill = book.dep.params.get("reason").and_then(Value::as_str)
                == Some(super::lifecycle::reason::FAILED);
            if env.stage == super::pool::STAGE && !failed_fill && !env.host_id.is_empty() {
                orch.spawn_pool_sync_after_member(&book.team, &env.id, &env.host_id);
            }
        }
        Err(f) => {
            book.failed(&f).await;
            env.status = EnvStatus::Failed;
            book.save_env(&env).await;
            book.begin(PhaseName::Verdict).await;
            book.ok(PhaseName::Verdict, json!({"error": book.dep.error}))
                .await;
            book.finish(DeploymentStatus::Failed).await;
        }
    }
}

#[cfg(test)]
mod grader_tests {
    #[test]
    fn grader_lifetime_is_bounded() {
        assert_eq!(super::grader_lifetime(600).num_seconds(), 2 * 900 + 600);
        assert_eq!(super::grader_lifetime(0).num_seconds(), 1800);
        let year = super::super::lifecycle::MAX_TTL_SEC;
        assert_eq!(super::grader_lifetime(u64::MAX).num_seconds(), year);
        // An expiry a year away is a valid time (no overflow in the addition).
        let _ = chrono::Utc::now() + super::grader_lifetime(u64::MAX);
    }
}
