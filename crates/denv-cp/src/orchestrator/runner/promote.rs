//! The `promote` deployment (`docs/reference/deployments.md`, "promote"): a version of
//! one environment passes gates on forks of its own, then replaces what another
//! environment of the project runs.
//!
//! Gates, in order, each on forks made for it (stage `gate`, on the host that holds the
//! version's snapshot, with an expiry so their host removes them should the control
//! plane die): `gate.fork` (a fresh fork comes up healthy; its volumes are digested as
//! cloned), `gate.consistency` (a second fork reads every dataset back with the same
//! digest, and the declared consistency checks pass in the first), `gate.replay`
//! (`forks` fresh forks run the declared replay commands; every fork's exit codes and
//! stdout are identical), `gate.invariants` (the declared checks pass in the first
//! fork), `gate.soak` (the first fork keeps running for the declared time and every
//! service still answers). A failed gate skips the rest and `apply`: the target is not
//! touched. `apply` tears the target's stack down and forks the version into it (same
//! environment id). `verdict` removes every gate fork, whatever happened.

use super::{fork_payload, load, Book, Failed, PhaseFail};
use crate::domain::{EnvStatus, Environment, PhaseName, Version};
use crate::hub::HubError;
use crate::orchestrator::link::{Addr, Link};
use crate::orchestrator::{repo, short_id};
use denv_compose::{Check, Spec, CHECK_TIMEOUT_SEC};
use denv_proto::contract::{EXEC_SLACK, PHASE_TIMEOUT};
use denv_proto::v1;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// The stage of the forks the gates make.
pub(crate) const GATE_STAGE: &str = "gate";

/// Bytes of a check's stdout/stderr kept in the evidence.
const TAIL: usize = 2048;

/// What the gates hold: the first fork (consistency checks, invariants, soak) and every
/// fork made (destroyed by the verdict).
struct Gates {
    made: Vec<Environment>,
    /// `apply` started changing the target.
    touched: bool,
    /// The target's own versions whose snapshots went with its old stack (marked not
    /// healthy: they can no longer be forked or rolled back to).
    retired: Vec<String>,
}

pub(super) async fn promote(book: &mut Book, from_env: String) {
    let (target_id, ver_id) = (book.dep.env_id.clone(), book.dep.version_id.clone());
    let (mut target, version) = match load(book, &target_id, &ver_id).await {
        Ok((e, Some(v))) => (e, v),
        Ok((_, None)) => return book.abort("deployment has no version".into()).await,
        Err(e) => return book.abort(e).await,
    };
    let mut gates = Gates {
        made: Vec::new(),
        touched: false,
        retired: Vec::new(),
    };
    let result = phases(book, &mut target, &version, &from_env, &mut gates).await;

    book.begin(PhaseName::Verdict).await;
    let orch = book.orch.clone();
    for g in &mut gates.made {
        g.status = EnvStatus::Destroying;
        book.save_env(g).await;
    }
    let forks: Vec<&str> = gates.made.iter().map(|g| g.id.as_str()).collect();
    let mut ev = json!({
        "version": version.id,
        "target": target.id,
        "gate_forks": forks,
        "took_ms": book.took_ms(),
    });
    if !gates.retired.is_empty() {
        ev["retired_versions"] = json!(gates.retired);
    }
    if let Err(f) = &result {
        ev["failed"] = json!(f.phase);
        ev["error"] = json!(f.error);
        ev["target_unchanged"] = json!(!gates.touched);
    }
    book.conclude(result, ev).await;
    // The gate forks go after the verdict is recorded (a client waiting for it does
    // not wait for the teardown).
    let link = orch.link().clone();
    let team = book.team.clone();
    let gone = futures::future::join_all(gates.made.iter().map(|g| {
        let to = Addr::new(&team, &g.host_id, &g.id);
        let link = link.clone();
        async move { link.destroy(&to, v1::EnvDestroy {}, PHASE_TIMEOUT).await }
    }))
    .await;
    for (mut g, r) in gates.made.into_iter().zip(gone) {
        match r {
            Ok(_) => {
                g.status = EnvStatus::Destroyed;
                g.endpoints.clear();
            }
            Err(e) => {
                tracing::warn!(env = %g.id, error = %e, "could not destroy a promote gate's fork");
                g.status = EnvStatus::Failed;
            }
        }
        book.save_env(&g).await;
    }
}

/// A failure of `phase` before its `run` started (the phase is marked failed here).
async fn failed_at(book: &mut Book, phase: PhaseName, error: String) -> Failed {
    book.fail(phase, &error, Value::Null).await;
    Failed { phase, error }
}

async fn phases(
    book: &mut Book,
    target: &mut Environment,
    version: &Version,
    from_env: &str,
    gates: &mut Gates,
) -> Result<(), Failed> {
    let orch = book.orch.clone();
    let link = orch.link().clone();
    let team = book.team.clone();
    let owner = match repo::env(orch.db(), &team, &version.env_id).await {
        Ok(Some(e)) => e,
        Ok(None) => {
            let why = format!("environment {} not found", version.env_id);
            return Err(failed_at(book, PhaseName::GateFork, why).await);
        }
        Err(e) => return Err(failed_at(book, PhaseName::GateFork, e.to_string()).await),
    };
    let spec = version.spec.clone();
    let cfg = spec.promote.clone().unwrap_or_default();
    let host = owner.host_id.clone();
    // Long enough for every phase and the soak; the host removes a fork past it.
    let lifetime = chrono::Duration::milliseconds(
        i64::try_from(PHASE_TIMEOUT.as_millis() * 7).unwrap_or(i64::MAX / 2)
            + i64::try_from(cfg.soak_ms).unwrap_or(0),
    );
    let expires_at = crate::store::fmt_time(chrono::Utc::now() + lifetime);
    let mk = GateForks {
        link: &link,
        team: &team,
        owner: &owner,
        version,
        spec: &spec,
        expires_at: &expires_at,
        from_env,
    };

    // gate.fork: a fresh fork comes up healthy.
    let first = book
        .run(PhaseName::GateFork, async {
            link.require(&host)?;
            let mut made = mk.make(&orch, 1, gates).await?;
            let (g, r) = made.remove(0);
            let ev = json!({
                "env": g.id,
                "forked_in_ms": r.forked_in_ms,
                "endpoints": super::endpoints_json(&r.endpoints),
                "egress": r.egress,
            });
            Ok((ev, (g, r)))
        })
        .await?;
    let (g1, r1) = first;

    // gate.consistency: a second fork reads the datasets back alike; declared checks.
    let second = book
        .run(PhaseName::GateConsistency, async {
            let mut made = mk.make(&orch, 1, gates).await?;
            let (g2, r2) = made.remove(0);
            let datasets = datasets_json(&r1.datasets);
            let mut ev = json!({
                "datasets": datasets,
                "forks": [g1.id, g2.id],
            });
            if let Some(why) = digests_differ(&r1.datasets, &r2.datasets) {
                return Err(PhaseFail {
                    error: format!("the forks read the snapshot back differently: {why}"),
                    evidence: ev,
                });
            }
            let to = Addr::new(&team, &g1.host_id, &g1.id);
            let (checks, failed) = run_checks(&link, &to, &cfg.consistency).await;
            ev["checks"] = json!(checks);
            if let Some(why) = failed {
                return Err(PhaseFail {
                    error: why,
                    evidence: ev,
                });
            }
            Ok((ev, g2))
        })
        .await?;

    // gate.replay: N fresh forks (the second fork, untouched so far, is one of them).
    if cfg.replay.is_empty() {
        book.skip(
            PhaseName::GateReplay,
            json!({"reason": "no x-denv.promote.replay commands declared"}),
        )
        .await;
    } else {
        let n = cfg.forks() as usize;
        book.run(PhaseName::GateReplay, async {
            let mut forks = vec![second];
            let more = mk.make(&orch, n - 1, gates).await?;
            forks.extend(more.into_iter().map(|(g, _)| g));
            let outs = futures::future::join_all(forks.iter().map(|g| {
                let to = Addr::new(&team, &g.host_id, &g.id);
                let (link, commands) = (&link, &cfg.replay);
                async move {
                    let mut outs = Vec::new();
                    for c in commands {
                        outs.push(run_check(link, &to, c).await);
                    }
                    outs
                }
            }))
            .await;
            replay_verdict(&forks, &cfg.replay, &outs)
        })
        .await?;
    }

    // gate.invariants: declared checks in the first fork.
    if cfg.invariants.is_empty() {
        book.skip(
            PhaseName::GateInvariants,
            json!({"reason": "no x-denv.promote.invariants declared"}),
        )
        .await;
    } else {
        let to = Addr::new(&team, &g1.host_id, &g1.id);
        book.run(PhaseName::GateInvariants, async {
            let (checks, failed) = run_checks(&link, &to, &cfg.invariants).await;
            let ev = json!({"env": g1.id, "checks": checks});
            match failed {
                Some(why) => Err(PhaseFail {
                    error: why,
                    evidence: ev,
                }),
                None => Ok((ev, ())),
            }
        })
        .await?;
    }

    // gate.soak: the first fork runs on; then every service still answers.
    if cfg.soak_ms == 0 {
        book.skip(
            PhaseName::GateSoak,
            json!({"reason": "no x-denv.promote.soak declared"}),
        )
        .await;
    } else {
        let to = Addr::new(&team, &g1.host_id, &g1.id);
        let db = orch.db().clone();
        book.run(PhaseName::GateSoak, async {
            let until = tokio::time::Instant::now() + Duration::from_millis(cfg.soak_ms);
            while tokio::time::Instant::now() < until {
                tokio::time::sleep_until(
                    until.min(tokio::time::Instant::now() + Duration::from_secs(1)),
                )
                .await;
                // The host reports a service that died (its environment turns failed).
                if let Ok(Some(e)) = repo::env(&db, &team, &g1.id).await {
                    if e.status == EnvStatus::Failed {
                        return Err(PhaseFail::from(format!(
                            "the gate's fork {} failed during the soak",
                            g1.id
                        )));
                    }
                }
            }
            let mut answered = BTreeMap::new();
            for s in &spec.services {
                let out = link
                    .exec(
                        &to,
                        v1::EnvExec {
                            service: s.name.clone(),
                            cmd: vec!["true".into()],
                            timeout_sec: 30,
                            ..Default::default()
                        },
                        Duration::from_secs(30) + EXEC_SLACK,
                    )
                    .await;
                match out {
                    Ok(o) if o.exit_code == 0 => {
                        answered.insert(s.name.clone(), json!("answered"));
                    }
                    Ok(o) => {
                        return Err(PhaseFail {
                            error: format!(
                                "service {} did not answer after the soak (exit {})",
                                s.name, o.exit_code
                            ),
                            evidence: json!({"soaked_ms": cfg.soak_ms, "services": answered}),
                        })
                    }
                    Err(e) => {
                        return Err(PhaseFail {
                            error: format!("service {} did not answer after the soak: {e}", s.name),
                            evidence: json!({"soaked_ms": cfg.soak_ms, "services": answered}),
                        })
                    }
                }
            }
            Ok((
                json!({"env": g1.id, "soaked_ms": cfg.soak_ms, "services": answered}),
                (),
            ))
        })
        .await?;
    }

    // apply: the target runs the version from now on. The version's snapshot lives in
    // its owner's environment, which may have been destroyed while the gates ran: the
    // target's stack is only torn down while the snapshot is still there to fork.
    let gone = match repo::env(orch.db(), &team, &owner.id).await {
        Ok(Some(e)) if e.status == EnvStatus::Destroyed || e.status == EnvStatus::Destroying => {
            true
        }
        Ok(Some(_)) => matches!(repo::open_destroy(orch.db(), &owner.id).await, Ok(Some(_))),
        Ok(None) => true,
        Err(e) => return Err(failed_at(book, PhaseName::Apply, e.to_string()).await),
    };
    if gone {
        let why = format!(
            "environment {} holding the version's snapshot was destroyed during the promote; the target is unchanged",
            owner.name
        );
        return Err(failed_at(book, PhaseName::Apply, why).await);
    }
    gates.touched = true;
    let old_host = target.host_id.clone();
    let had_stack = !old_host.is_empty() && target.status != EnvStatus::Destroyed;
    let previous = target.current_version_id.clone();
    target.status = EnvStatus::Deploying;
    book.save_env(target).await;
    let to = Addr::new(&team, &host, &target.id);
    let payload = fork_payload(&owner.id, &version.snapshot, &spec, &target.expires_at);
    let old = Addr::new(&team, &old_host, &target.id);
    let mut torn_down = false;
    let applied = book
        .run(PhaseName::Apply, async {
            link.require(&host)?;
            if had_stack {
                link.require(&old_host)
                    .map_err(|e| format!("the target's host: {e}"))?;
                link.destroy(&old, v1::EnvDestroy {}, PHASE_TIMEOUT).await?;
                torn_down = true;
            }
            let r = link.fork(&to, payload, PHASE_TIMEOUT).await?;
            let ev = json!({
                "target": to.env_id,
                "host": host,
                "replaced": previous,
                "version": version.id,
                "forked_in_ms": r.forked_in_ms,
                "endpoints": super::endpoints_json(&r.endpoints),
                "egress": r.egress,
            });
            Ok((ev, r))
        })
        .await;
    if torn_down {
        // The old stack's snapshots are gone with it: its versions are no longer forks'
        // or rollbacks' to make.
        gates.retired = retire_versions(&orch, &team, &target.id, &version.id).await;
    }
    match applied {
        Ok(r) => {
            target.host_id = host;
            target.current_version_id = version.id.clone();
            target.parent_version_id = version.id.clone();
            target.endpoints = r.endpoints.into_iter().collect();
            target.status = EnvStatus::Healthy;
            book.save_env(target).await;
            Ok(())
        }
        Err(f) => {
            target.status = EnvStatus::Failed;
            book.save_env(target).await;
            Err(f)
        }
    }
}

/// Marks every healthy version of environment `env_id` (but `keep`) not healthy, and
/// returns their ids: their snapshots were removed with the environment's old stack.
async fn retire_versions(
    orch: &crate::orchestrator::Orchestrator,
    team: &str,
    env_id: &str,
    keep: &str,
) -> Vec<String> {
    let mut retired = Vec::new();
    let versions = match repo::versions_of(orch.db(), env_id).await {
        Ok(v) => v,
        Err(e) => {
            tracing::error!(env = %env_id, error = %e, "could not list the replaced versions");
            return retired;
        }
    };
    for mut v in versions.into_iter().filter(|v| v.healthy && v.id != keep) {
        v.healthy = false;
        match repo::save_version(orch.db(), team, &v).await {
            Ok(()) => retired.push(v.id),
            Err(e) => tracing::error!(version = %v.id, error = %e, "could not retire a version"),
        }
    }
    retired
}

/// Makes gate forks of the version.
struct GateForks<'a> {
    link: &'a Link,
    team: &'a str,
    owner: &'a Environment,
    version: &'a Version,
    spec: &'a Spec,
    expires_at: &'a str,
    from_env: &'a str,
}

impl GateForks<'_> {
    /// `n` forks of the version made at once, each digesting its volumes as cloned.
    /// Their rows are recorded in `gates` before any command goes out, so the verdict
    /// removes whatever was made.
    async fn make(
        &self,
        orch: &crate::orchestrator::Orchestrator,
        n: usize,
        gates: &mut Gates,
    ) -> Result<Vec<(Environment, v1::ForkResult)>, PhaseFail> {
        let envs: Vec<Environment> = (0..n)
            .map(|_| Environment {
                id: crate::ids::new_id("env"),
                project_id: self.owner.project_id.clone(),
                name: format!("{}-gate-{}", self.owner.name, short_id()),
                stage: GATE_STAGE.into(),
                host_id: self.owner.host_id.clone(),
                parent_version_id: self.version.id.clone(),
                status: EnvStatus::Deploying,
                created_at: repo::now(),
                expires_at: self.expires_at.to_string(),
                ..Default::default()
            })
            .collect();
        repo::insert_envs(orch.db(), self.team, &envs)
            .await
            .map_err(|e| PhaseFail::from(e.to_string()))?;
        gates.made.extend(envs.iter().cloned());
        let results = futures::future::join_all(envs.iter().map(|g| {
            let to = Addr::new(self.team, &g.host_id, &g.id);
            let mut payload = fork_payload(
                &self.owner.id,
                &self.version.snapshot,
                self.spec,
                self.expires_at,
            );
            payload.digest_volumes = true;
            async move { self.link.fork(&to, payload, PHASE_TIMEOUT).await }
        }))
        .await;
        let mut out = Vec::with_capacity(n);
        for (mut g, r) in envs.into_iter().zip(results) {
            let r =
                r.map_err(|e| PhaseFail::from(format!("fork {} of {}: {e}", g.id, self.from_env)))?;
            g.status = EnvStatus::Healthy;
            g.current_version_id = self.version.id.clone();
            g.endpoints = r.endpoints.clone().into_iter().collect();
            if let Err(e) = repo::save_env(orch.db(), self.team, &g).await {
                tracing::error!(env = %g.id, error = %e, "could not save a gate fork");
            }
            if let Some(m) = gates.made.iter_mut().find(|m| m.id == g.id) {
                *m = g.clone();
            }
            out.push((g, r));
        }
        Ok(out)
    }
}

fn datasets_json(d: &std::collections::HashMap<String, v1::DatasetDigest>) -> Value {
    let sorted: BTreeMap<_, _> = d
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                json!({"digest": v.digest, "files": v.files, "bytes": v.bytes}),
            )
        })
        .collect();
    json!(sorted)
}

/// The first volume whose digest differs between two forks, said in words.
fn digests_differ(
    a: &std::collections::HashMap<String, v1::DatasetDigest>,
    b: &std::collections::HashMap<String, v1::DatasetDigest>,
) -> Option<String> {
    let vols: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for v in vols {
        let (x, y) = (a.get(v), b.get(v));
        if x != y {
            let show = |d: Option<&v1::DatasetDigest>| {
                d.map(|d| format!("{} ({} files, {} bytes)", d.digest, d.files, d.bytes))
                    .unwrap_or_else(|| "nothing".into())
            };
            return Some(format!("volume {v}: {} against {}", show(x), show(y)));
        }
    }
    None
}

/// The last `TAIL` bytes of `s` (on a character boundary).
fn tail(s: &str) -> &str {
    if s.len() <= TAIL {
        return s;
    }
    let mut i = s.len() - TAIL;
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

/// One check's outcome: the exit code and output, or why it could not run.
fn run_check<'a>(
    link: &'a Link,
    to: &'a Addr,
    c: &'a Check,
) -> impl std::future::Future<Output = Result<v1::ExecOutput, HubError>> + 'a {
    link.exec(
        to,
        v1::EnvExec {
            service: c.service.clone(),
            cmd: c.cmd.clone(),
            timeout_sec: CHECK_TIMEOUT_SEC,
            ..Default::default()
        },
        Duration::from_secs(u64::from(CHECK_TIMEOUT_SEC)) + EXEC_SLACK,
    )
}

fn check_json<E: std::fmt::Display>(c: &Check, r: &Result<v1::ExecOutput, E>) -> Value {
    match r {
        Ok(o) => json!({
            "name": c.name, "service": c.service, "exit": o.exit_code,
            "stdout": tail(&o.stdout), "stderr": tail(&o.stderr),
        }),
        Err(e) => json!({"name": c.name, "service": c.service, "error": e.to_string()}),
    }
}

/// Runs `checks` in order (all of them, for the record) and says which failed first.
async fn run_checks(link: &Link, to: &Addr, checks: &[Check]) -> (Vec<Value>, Option<String>) {
    let mut out = Vec::new();
    let mut failed = None;
    for c in checks {
        let r = run_check(link, to, c).await;
        if failed.is_none() {
            failed = match &r {
                Ok(o) if o.exit_code == 0 => None,
                Ok(o) => Some(format!(
                    "check \"{}\" failed (exit {})",
                    c.name, o.exit_code
                )),
                Err(e) => Some(format!("check \"{}\" could not run: {e}", c.name)),
            };
        }
        out.push(check_json(c, &r));
    }
    (out, failed)
}

/// `gate.replay`'s evidence, and its failure when any fork's outputs differ from the
/// first fork's (exit code and stdout of each command) or a command could not run.
fn replay_verdict<E: std::fmt::Display>(
    forks: &[Environment],
    commands: &[Check],
    outs: &[Vec<Result<v1::ExecOutput, E>>],
) -> Result<(Value, ()), PhaseFail> {
    let record: Vec<Value> = commands
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({
                "name": c.name,
                "service": c.service,
                "outputs": outs.iter().map(|o| check_json(c, &o[i])).collect::<Vec<_>>(),
            })
        })
        .collect();
    let ev = |identical: bool| {
        json!({
            "forks": forks.iter().map(|g| g.id.clone()).collect::<Vec<_>>(),
            "commands": record,
            "identical": identical,
        })
    };
    for (i, c) in commands.iter().enumerate() {
        let first = &outs[0][i];
        if let Err(e) = first {
            return Err(PhaseFail {
                error: format!("replay command \"{}\" could not run: {e}", c.name),
                evidence: ev(false),
            });
        }
        for (k, o) in outs.iter().enumerate().skip(1) {
            let same = match (first, &o[i]) {
                (Ok(a), Ok(b)) => a.exit_code == b.exit_code && a.stdout == b.stdout,
                _ => false,
            };
            if !same {
                let show = |r: &Result<v1::ExecOutput, E>| match r {
                    Ok(o) => format!("exit {} {:?}", o.exit_code, tail(&o.stdout)),
                    Err(e) => format!("error {e}"),
                };
                return Err(PhaseFail {
                    error: format!(
                        "replay command \"{}\" is not deterministic: fork 1 gave {}, fork {} gave {}",
                        c.name,
                        show(first),
                        k + 1,
                        show(&o[i])
                    ),
                    evidence: ev(false),
                });
            }
        }
    }
    Ok((ev(true), ()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(exit: i32, stdout: &str) -> Result<v1::ExecOutput, String> {
        Ok(v1::ExecOutput {
            exit_code: exit,
            stdout: stdout.into(),
            ..Default::default()
        })
    }

    fn check(name: &str) -> Check {
        Check {
            name: name.into(),
            service: "db".into(),
            cmd: vec!["true".into()],
        }
    }

    #[test]
    fn replay_compares_exit_and_stdout_of_every_fork() {
        let forks = vec![Environment::default(); 3];
        let cmds = [check("count"), check("sum")];
        let same = vec![vec![out(0, "3\n"), out(1, "x")]; 3];
        let (ev, ()) = replay_verdict(&forks, &cmds, &same)
            .map_err(|f| f.error)
            .unwrap();
        assert_eq!(ev["identical"], true);
        assert_eq!(ev["commands"][1]["outputs"][2]["exit"], 1);

        let mut differ = same.clone();
        differ[2][1] = out(1, "y");
        let e = replay_verdict(&forks, &cmds, &differ).err().unwrap();
        assert_eq!(
            e.error,
            "replay command \"sum\" is not deterministic: fork 1 gave exit 1 \"x\", fork 3 gave exit 1 \"y\""
        );
        assert_eq!(e.evidence["identical"], false);

        let mut exit = same.clone();
        exit[1][0] = out(2, "3\n");
        let e = replay_verdict(&forks, &cmds, &exit).err().unwrap();
        assert!(e.error.contains("fork 2 gave exit 2"), "{}", e.error);

        let mut broken = same;
        broken[0][0] = Err("host gone".into());
        let e = replay_verdict(&forks, &cmds, &broken).err().unwrap();
        assert_eq!(e.error, "replay command \"count\" could not run: host gone");
    }

    #[test]
    fn digests_name_the_volume_that_differs() {
        let d = |s: &str| v1::DatasetDigest {
            digest: s.into(),
            files: 1,
            bytes: 2,
        };
        let a: std::collections::HashMap<_, _> = [
            ("pg".to_string(), d("sha256:a")),
            ("home".to_string(), d("sha256:h")),
        ]
        .into();
        assert_eq!(digests_differ(&a, &a.clone()), None);
        let mut b = a.clone();
        b.insert("pg".into(), d("sha256:b"));
        assert_eq!(
            digests_differ(&a, &b).unwrap(),
            "volume pg: sha256:a (1 files, 2 bytes) against sha256:b (1 files, 2 bytes)"
        );
        b.remove("pg");
        assert!(digests_differ(&a, &b).unwrap().ends_with("against nothing"));
    }

    #[test]
    fn tails_keep_the_end_on_a_char_boundary() {
        let s = format!("{}é{}", "a".repeat(10), "b".repeat(TAIL - 1));
        let t = tail(&s);
        assert!(
            t.len() <= TAIL && t.ends_with('b') && !t.contains('a'),
            "{t}"
        );
        assert_eq!(tail("short"), "short");
    }
}
