//! Noticing environments that died behind denvd's back: a container killed, OOM-killed,
//! or stopped by an engine restart (issue 11, "Engine restart").
//!
//! [`Runtime::watch_engine`] follows the engine's event stream (containers labelled
//! `denv.managed=true`, event `die`). After each `die` it waits for the environment's
//! command lock (so a rollback, recreate or destroy that stops containers itself is not
//! mistaken for a death) and then checks the environment: when a service container of its
//! saved spec is missing or not running, the environment is recorded as failed in
//! `<data>/envs/<env>/failed.json` (`{"reason": …, "at": <RFC 3339>}`) and reported once
//! on the channel. When the event stream breaks (the engine stopped or restarted), it
//! reconnects every second and, once the engine answers, checks every environment with a
//! saved spec; so does the first connect (a denvd restart).
//!
//! A successful create, fork or rollback clears the record.
//!
//! [`Runtime::reconcile`] (run by the watcher on its first connect, i.e. when denvd
//! starts) removes what belongs to no live environment of this data directory: an
//! environment is live when `<data>/envs/<env>/spec.json` exists (written before any
//! container is created, removed last by destroy). Service containers and copy-up
//! helpers carry the label `denv.data=<data dir>`, so runtimes with other data
//! directories on the same engine are never touched; containers created before that
//! label existed are left alone. Snapshots received from another host (marked by
//! [`crate::storage::RECEIVED_MARK`], with no volumes of their environment here) are kept.

use super::{container_name, fail, Result, Runtime, RuntimeError};
use bollard::models::ContainerStateStatusEnum;
use bollard::system::EventsOptions;
use futures::StreamExt;
use std::collections::HashMap;
use std::time::Duration;

/// Label naming the data directory that owns a container (`denv.data=<path>`).
pub(crate) const DATA_LABEL: &str = "denv.data";

/// An environment found dead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvFailure {
    /// The environment id.
    pub env_id: String,
    /// Which service is not running and why, e.g.
    /// `service "box" is not running (exited with code 137)`.
    pub reason: String,
}

impl Runtime {
    /// This runtime's value of [`DATA_LABEL`].
    pub(crate) fn data_label(&self) -> String {
        self.inner.cfg.data_dir.display().to_string()
    }

    fn is_live(&self, env_id: &str) -> bool {
        self.inner
            .cfg
            .data_dir
            .join("envs")
            .join(env_id)
            .join("spec.json")
            .is_file()
    }

    /// Removes orphans of this data directory (see the module docs): containers labelled
    /// with it whose environment is not live (with the environment's network
    /// `<lc>_default`), and volumes/snapshots of environments that are not live (storage
    /// backend destroy, then `<data>/envs/<env>`). Returns the environment ids cleaned,
    /// sorted. Failures are logged and skipped.
    pub async fn reconcile(&self) -> Vec<String> {
        let mut orphans: Vec<String> = Vec::new();
        let cs = self.own_containers().await.unwrap_or_default();
        for c in &cs {
            let Some(env) = c.labels.as_ref().and_then(|l| l.get("denv.env")) else {
                continue;
            };
            if !self.is_live(env) && !orphans.contains(env) {
                orphans.push(env.clone());
            }
        }
        for env in self.inner.storage.envs() {
            // Snapshots received from another host belong to an environment that runs
            // elsewhere: kept (forks here clone them).
            let received = self
                .inner
                .storage
                .data_dir()
                .join("snaps")
                .join(&env)
                .join(crate::storage::RECEIVED_MARK)
                .is_file();
            let here = self
                .inner
                .storage
                .data_dir()
                .join("envs")
                .join(&env)
                .exists();
            if received && !here {
                continue;
            }
            if !self.is_live(&env) && !orphans.contains(&env) {
                orphans.push(env);
            }
        }
        orphans.sort();
        let mut cleaned = Vec::new();
        for env in orphans {
            let _g = self.lock_env(&env).await;
            if self.is_live(&env) {
                continue;
            }
            let mut ok = true;
            for c in &cs {
                let mine = c.labels.as_ref().and_then(|l| l.get("denv.env")) == Some(&env);
                if let (true, Some(id)) = (mine, c.id.as_ref()) {
                    if let Err(e) = self.remove_container(id).await {
                        tracing::warn!("reconcile {env}: {e}");
                        ok = false;
                    }
                }
            }
            if let Err(e) = self.remove_network(&super::network_name(&env)).await {
                tracing::warn!("reconcile {env}: {e}");
                ok = false;
            }
            let st = self.inner.storage.clone();
            let e2 = env.clone();
            let r = tokio::task::spawn_blocking(move || {
                st.destroy(&e2)?;
                crate::storage::remove_tree(&st.data_dir().join("envs").join(&e2))
            })
            .await;
            if !matches!(r, Ok(Ok(()))) {
                tracing::warn!("reconcile {env}: storage: {r:?}");
                ok = false;
            }
            if ok {
                tracing::info!("reconcile: removed orphaned environment {env}");
                cleaned.push(env);
            }
        }
        cleaned
    }

    /// Every container (running or not) labelled `denv.managed=true` and with this
    /// runtime's data directory ([`DATA_LABEL`]).
    pub(crate) async fn own_containers(&self) -> Result<Vec<bollard::models::ContainerSummary>> {
        let filters = HashMap::from([(
            "label".to_string(),
            vec![
                "denv.managed=true".to_string(),
                format!("{DATA_LABEL}={}", self.data_label()),
            ],
        )]);
        self.inner
            .docker
            .list_containers(Some(bollard::container::ListContainersOptions {
                all: true,
                filters,
                ..Default::default()
            }))
            .await
            .map_err(|e| RuntimeError::docker("list containers", e))
    }

    /// Why `env_id` is not fully running: `Ok(None)` when every service container of its
    /// saved spec is running (paused counts as running: verify freezes the agent),
    /// `Ok(Some(reason))` naming the first service that is missing, exited or dead.
    /// Error when the environment has no saved spec or the engine does not answer.
    pub async fn dead_service(&self, env_id: &str) -> Result<Option<String>> {
        let spec = self.saved_spec(env_id).await?;
        let one_shot = super::stack::one_shot_services(&spec);
        for s in &spec.services {
            if one_shot.contains(&s.name) && self.completed(env_id, &s.name).await? {
                continue;
            }
            if let Some(r) = self.service_down(env_id, &s.name).await? {
                return Ok(Some(r));
            }
        }
        Ok(None)
    }

    /// Whether the service's container exited with code 0 (a service another one waits
    /// to complete is done then, not dead).
    async fn completed(&self, env_id: &str, service: &str) -> Result<bool> {
        let Some(c) = self.inspect(&container_name(env_id, service)).await? else {
            return Ok(false);
        };
        let st = c.state.unwrap_or_default();
        Ok(st.status == Some(ContainerStateStatusEnum::EXITED) && st.exit_code == Some(0))
    }

    /// `Some(reason)` when the service's container is missing or not running.
    pub(crate) async fn service_down(&self, env_id: &str, service: &str) -> Result<Option<String>> {
        let Some(c) = self.inspect(&container_name(env_id, service)).await? else {
            return Ok(Some(format!("service {service:?} has no container")));
        };
        let st = c.state.unwrap_or_default();
        if st.running == Some(true) {
            return Ok(None);
        }
        let how = match st.status {
            Some(ContainerStateStatusEnum::CREATED) => "was never started".to_string(),
            Some(ContainerStateStatusEnum::DEAD) => "is dead".to_string(),
            _ => format!(
                "exited with code {}{}",
                st.exit_code.unwrap_or(-1),
                if st.oom_killed == Some(true) {
                    ", OOM-killed"
                } else {
                    ""
                }
            ),
        };
        Ok(Some(format!("service {service:?} is not running ({how})")))
    }

    /// The recorded failure of `env_id` (`failed.json`), if any.
    pub fn recorded_failure(&self, env_id: &str) -> Option<String> {
        let p = self
            .inner
            .cfg
            .data_dir
            .join("envs")
            .join(env_id)
            .join("failed.json");
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).ok()?).ok()?;
        v.get("reason").and_then(|r| r.as_str()).map(str::to_string)
    }

    pub(crate) fn clear_failure(&self, env_id: &str) {
        let p = self
            .inner
            .cfg
            .data_dir
            .join("envs")
            .join(env_id)
            .join("failed.json");
        let _ = std::fs::remove_file(p);
    }

    /// Checks `env_id` under its command lock; records and returns a new failure.
    pub async fn check_env(&self, env_id: &str) -> Option<EnvFailure> {
        let _g = self.lock_env(env_id).await;
        let reason = match self.dead_service(env_id).await {
            Ok(Some(r)) => r,
            Ok(None) => return None,
            // No saved spec (destroyed meanwhile, or never created here): nothing to say.
            Err(RuntimeError::Failed(_)) => return None,
            Err(e) => {
                tracing::warn!("checking {env_id}: {e}");
                return None;
            }
        };
        if self.recorded_failure(env_id).is_some() {
            return None;
        }
        let dir = self.inner.cfg.data_dir.join("envs").join(env_id);
        let body = serde_json::json!({
            "reason": reason,
            "at": chrono_now(),
        });
        if let Err(e) = std::fs::write(dir.join("failed.json"), body.to_string()) {
            tracing::warn!("recording the failure of {env_id}: {e}");
        }
        tracing::warn!("environment {env_id} failed: {reason}");
        Some(EnvFailure {
            env_id: env_id.to_string(),
            reason,
        })
    }

    /// Checks every environment with a saved spec (see [`Runtime::check_env`]).
    pub async fn check_all(&self) -> Vec<EnvFailure> {
        let mut out = Vec::new();
        let envs = std::fs::read_dir(self.inner.cfg.data_dir.join("envs"))
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().join("spec.json").is_file())
                    .filter_map(|e| e.file_name().to_str().map(str::to_string))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        for env in envs {
            if let Some(f) = self.check_env(&env).await {
                out.push(f);
            }
        }
        out
    }

    /// Follows the engine forever (see the module docs), sending each newly failed
    /// environment on `tx`. Returns when `tx` is closed.
    pub async fn watch_engine(self, tx: tokio::sync::mpsc::UnboundedSender<EnvFailure>) {
        let mut was_down = false;
        let mut reconciled = false;
        loop {
            if tx.is_closed() {
                return;
            }
            if self.inner.docker.ping().await.is_err() {
                if !was_down {
                    tracing::warn!("the Docker engine does not answer; watching for its return");
                }
                was_down = true;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            if was_down {
                tracing::info!("the Docker engine is back; checking every environment");
            }
            let mut events = self.inner.docker.events(Some(EventsOptions::<String> {
                filters: HashMap::from([
                    ("type".to_string(), vec!["container".to_string()]),
                    ("event".to_string(), vec!["die".to_string()]),
                    ("label".to_string(), vec!["denv.managed=true".to_string()]),
                ]),
                ..Default::default()
            }));
            if !reconciled {
                self.reconcile().await;
                reconciled = true;
            }
            // Subscribed first, then the sweep: a death between the two is still seen.
            for f in self.check_all().await {
                if tx.send(f).is_err() {
                    return;
                }
            }
            while let Some(ev) = events.next().await {
                let Ok(ev) = ev else { break };
                let attrs = ev.actor.and_then(|a| a.attributes).unwrap_or_default();
                let (Some(env), Some(_service)) = (
                    attrs.get("denv.env").cloned(),
                    attrs.get("denv.service").cloned(),
                ) else {
                    continue; // probes, helpers, verifiers
                };
                let (rt, tx) = (self.clone(), tx.clone());
                tokio::spawn(async move {
                    if let Some(f) = rt.check_env(&env).await {
                        let _ = tx.send(f);
                    }
                });
            }
            was_down = true;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Refuses to grade an environment whose agent service is not running (killed,
    /// OOM-killed, or stopped by an engine restart): grading a dead episode would turn
    /// an infrastructure failure into a reward. The error says `infra error`.
    pub(crate) async fn require_agent_running(&self, env_id: &str, agent: &str) -> Result<()> {
        if let Some(why) = self.service_down(env_id, agent).await? {
            return fail(format!(
                "infra error: the agent {why} in {env_id}; the episode cannot be graded"
            ));
        }
        Ok(())
    }
}

/// Now as RFC 3339 (UTC, seconds).
fn chrono_now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
