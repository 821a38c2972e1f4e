//! Verify: `verify.collect` and `verify.run` (spec `13-ref-compose.md` "Verifier
//! contract", `19-ref-protections.md` §2-3, `21-snapshot-and-verify-explained.md`).
//!
//! **Collect.** The agent service's container is paused first (and left paused). Each
//! collect path is then read straight from the frozen container's mount namespace
//! (`/proc/<pid>/root`), one name at a time, never following a symlink, with the
//! agent's own file-system credentials, checked, and copied in constant memory: see
//! [`collect`]. A refusal is decided before anything is written; on a refusal no copy
//! is kept. Missing paths go to `missing`.
//!
//! Accepted content is at `<data>/verify/<id>/submission/<abs path>` (`<data>/verify/<id>`
//! is root's, mode 0700; every entry of the copy is owned by 65534:65534, read-only).
//!
//! **Run.** On the grader's fork: an image verifier runs as its own container (uid 0, the
//! fork's network, `/submission` read-only, `/logs/verifier` writable, env `SUBMISSION`,
//! `DENV_VERIFY_ID`); a service verifier gets the copy at `/submission` inside that
//! service and runs via exec as uid 0. The reward is `reward.txt` as a float, else the
//! last whitespace token of stdout as a float, else an error.

pub mod check;
pub mod collect;

use crate::runtime::{container_name, network_name, say, Progress, Result, Runtime, RuntimeError};
use crate::storage::validate_name;
use bollard::container::{Config, CreateContainerOptions, WaitContainerOptions};
use bollard::models::HostConfig;
use check::{normalize, rel_of};
use denv_compose::Verifier;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `verify.collect` result.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectResult {
    /// Regular files copied (0 when refused).
    pub files: u64,
    /// Bytes of regular files copied (0 when refused).
    pub bytes: u64,
    /// Collect paths that do not exist in the agent service (as given).
    pub missing: Vec<String>,
    /// Refusals `<path>: <reason>`, paths relative to `/` (`home/agent/answer.txt: symlink`).
    pub refused: Vec<String>,
}

/// `verify.run` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// The reward (`0` when refused).
    pub reward: Option<f64>,
    /// The verifier's exit code (0 when it did not run).
    pub exit_code: i64,
    /// Last 8 KiB of the verifier's stdout.
    pub stdout: String,
    /// Last 8 KiB of the verifier's stderr.
    pub stderr: String,
    /// `reward.txt`, `stdout` or `refused`.
    pub source: String,
    /// Verifier wall time, ms.
    pub ran_for: u64,
}

const OUTPUT_TAIL: usize = 8 << 10;

impl Runtime {
    fn verify_dir(&self, verify_id: &str) -> PathBuf {
        self.data_dir().join("verify").join(verify_id)
    }

    /// `<data>/verify/<id>/submission`.
    pub fn submission_dir(&self, verify_id: &str) -> PathBuf {
        self.verify_dir(verify_id).join("submission")
    }

    /// `verify.collect`: freeze the agent service, check every collect path, write the
    /// accepted copy ([`collect`]). The agent service stays paused, unless something
    /// was refused and `resume_if_refused` is set (a refused `verify --resume` takes no
    /// snapshot, so the unpause happens here). Errors (not refusals, all infra errors):
    /// the agent service does not exist or is not running, Docker failures, the copy
    /// cannot be written.
    pub async fn verify_collect(
        &self,
        env_id: &str,
        verify_id: &str,
        agent_service: &str,
        collect: &[String],
        resume_if_refused: bool,
        progress: &Progress,
    ) -> Result<CollectResult> {
        let _g = self.lock_env(env_id).await;
        validate_name("verify id", verify_id)?;
        let cname = container_name(env_id, agent_service);
        let Some(c) = self.inspect(&cname).await? else {
            return Err(RuntimeError::NotFound(format!(
                "agent service {agent_service:?} of {env_id} not found"
            )));
        };
        self.require_agent_running(env_id, agent_service).await?;
        say(progress, format!("freezing agent service {agent_service}"));
        let st = c.state.clone().unwrap_or_default();
        if st.running == Some(true) && st.paused != Some(true) {
            self.docker().pause_container(&cname).await.map_err(|e| {
                RuntimeError::docker(format!("pause agent service {agent_service:?}"), e)
            })?;
        }
        // Re-inspect: the pid of the frozen container.
        let c = self.inspect(&cname).await?.unwrap_or(c);
        let pid = c.state.as_ref().and_then(|s| s.pid).unwrap_or(0);
        if pid <= 0 {
            return Err(RuntimeError::Failed(format!(
                "infra error: the agent service {agent_service:?} of {env_id} has no process to read from"
            )));
        }

        say(progress, "checking the copy");
        let mut paths = Vec::new();
        let mut refused = Vec::new();
        for raw in collect {
            match normalize(raw) {
                Some(p) => paths.push(p),
                None => refused.push(format!("{}: collect path must be absolute", rel_of(raw))),
            }
        }
        let proc_root = format!("/proc/{pid}/root");
        let root = nix::fcntl::open(
            proc_root.as_str(),
            nix::fcntl::OFlag::O_PATH
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| RuntimeError::io(format!("open {proc_root}"), e.into()))?;
        let creds = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| collect::Creds::from_status(&s));
        let dir = self.verify_dir(verify_id);
        crate::storage::remove_tree(&dir.join("submission"))?;
        let got = if refused.is_empty() {
            let dir2 = dir.clone();
            tokio::task::spawn_blocking(move || collect::collect(root, creds, paths, &dir2))
                .await
                .map_err(|e| RuntimeError::Failed(format!("verify collect: {e}")))?
                .map_err(|e| RuntimeError::io(format!("collect into {}", dir.display()), e))?
        } else {
            CollectResult::default()
        };
        let mut got = got;
        refused.append(&mut got.refused);
        if !refused.is_empty() {
            say(progress, format!("refused: {}", refused.join("; ")));
            if resume_if_refused {
                self.docker().unpause_container(&cname).await.map_err(|e| {
                    RuntimeError::docker(format!("unpause agent service {agent_service:?}"), e)
                })?;
                say(progress, format!("resumed agent service {agent_service}"));
            }
            return Ok(CollectResult {
                files: 0,
                bytes: 0,
                missing: got.missing,
                refused,
            });
        }
        say(
            progress,
            format!("collected {} file(s), {} bytes", got.files, got.bytes),
        );
        Ok(got)
    }

    /// `verify.run` on the grader's fork `grader_env_id`. `refused` short-circuits to
    /// `{reward: 0, source: "refused"}` without running anything. Errors (the control
    /// plane records them as `reward: null`, `source: error`):
    /// `verifier timed out after <N>s`, `verifier wrote no reward (exit <N>)`,
    /// `infra error: the verifier was killed by the OOM killer; …`,
    /// `infra error: the verifier was killed (SIGKILL); …` (exit 137),
    /// `verify <id>: no collected copy at <path>`, Docker's messages.
    pub async fn verify_run(
        &self,
        grader_env_id: &str,
        verify_id: &str,
        verifier: &Verifier,
        refused: bool,
        progress: &Progress,
    ) -> Result<RunResult> {
        if refused {
            say(progress, "submission refused; grader not run");
            return Ok(RunResult {
                reward: Some(0.0),
                exit_code: 0,
                stdout: String::new(),
                stderr: String::new(),
                source: "refused".into(),
                ran_for: 0,
            });
        }
        let _g = self.lock_env(grader_env_id).await;
        validate_name("verify id", verify_id)?;
        let sub = self.submission_dir(verify_id);
        if !sub.is_dir() {
            return Err(RuntimeError::Failed(format!(
                "verify {verify_id}: no collected copy at {}",
                sub.display()
            )));
        }
        let logs = self.verify_dir(verify_id).join("logs");
        let timeout = Duration::from_secs(if verifier.timeout_sec == 0 {
            denv_proto::contract::VERIFIER_TIMEOUT_SEC
        } else {
            verifier.timeout_sec
        });
        let env = vec![
            "SUBMISSION=/submission".to_string(),
            format!("DENV_VERIFY_ID={verify_id}"),
        ];
        let t0 = Instant::now();
        let (exit_code, stdout, stderr, reward_txt) = match (&verifier.image, &verifier.service) {
            (Some(image), _) => {
                say(progress, format!("grading in {image}"));
                self.run_image_verifier(
                    grader_env_id,
                    verify_id,
                    image,
                    verifier,
                    env,
                    &sub,
                    &logs,
                    timeout,
                    progress,
                )
                .await?
            }
            (None, Some(service)) => {
                say(progress, format!("grading inside service {service}"));
                self.run_service_verifier(
                    grader_env_id,
                    verify_id,
                    service,
                    verifier,
                    env,
                    &sub,
                    &logs,
                    timeout,
                    progress,
                )
                .await?
            }
            (None, None) => {
                return Err(RuntimeError::Invalid(
                    "compose: x-denv.verifier needs exactly one of image or service".into(),
                ))
            }
        };
        let ran_for = t0.elapsed().as_millis() as u64;
        let (reward, source) = match parse_reward(reward_txt.as_deref(), &stdout) {
            Some(r) => r,
            None => {
                return Err(RuntimeError::Failed(format!(
                    "verifier wrote no reward (exit {exit_code})"
                )))
            }
        };
        say(progress, format!("reward {reward} from {source}"));
        Ok(RunResult {
            reward: Some(reward),
            exit_code,
            stdout: crate::runtime::docker_tail(&stdout, OUTPUT_TAIL),
            stderr: crate::runtime::docker_tail(&stderr, OUTPUT_TAIL),
            source: source.into(),
            ran_for,
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_image_verifier(
        &self,
        grader_env_id: &str,
        verify_id: &str,
        image: &str,
        verifier: &Verifier,
        env: Vec<String>,
        sub: &Path,
        logs: &Path,
        timeout: Duration,
        progress: &Progress,
    ) -> Result<(i64, String, String, Option<String>)> {
        // Exactly once: a grader of this verify that an earlier denvd started (and
        // died while waiting for) is adopted, its result used; no second one starts.
        let earlier = self.verifiers_of(verify_id).await?;
        if let Some((first, rest)) = earlier.split_first() {
            for n in rest {
                self.kill(n).await;
                let _ = self.remove_container(n).await;
            }
            say(
                progress,
                format!("adopting the grader {first} started before a restart"),
            );
            return self.finish_verifier(first, logs, timeout, false).await;
        }
        crate::storage::remove_tree(logs)?;
        std::fs::create_dir_all(logs)
            .map_err(|e| RuntimeError::io(format!("create {}", logs.display()), e))?;
        // The version's pinned grader, exactly (or the tag, before a deploy pinned it).
        let run_image = if verifier.image_id.is_empty() {
            self.ensure_image(image).await?.id
        } else {
            self.pinned_image("x-denv.verifier", image, &verifier.image_id)
                .await?
                .id
        };
        // Under deny the grader resolves like the services: through denvd's refuser.
        let dns = self.env_dns(grader_env_id).await?;
        let name = format!(
            "{}-verifier-{:08x}",
            grader_env_id.to_lowercase(),
            rand::random::<u32>()
        );
        let d = self.docker();
        d.create_container(
            Some(CreateContainerOptions {
                name: name.clone(),
                platform: None,
            }),
            Config {
                image: Some(run_image.clone()),
                cmd: if verifier.command.is_empty() {
                    None
                } else {
                    Some(verifier.command.clone())
                },
                user: Some("0".into()),
                env: Some(env),
                labels: Some(HashMap::from([
                    ("denv.managed".to_string(), "true".to_string()),
                    ("denv.env".to_string(), grader_env_id.to_string()),
                    ("denv.verifier".to_string(), "true".to_string()),
                    ("denv.verify".to_string(), verify_id.to_string()),
                ])),
                host_config: Some({
                    let mut hc = HostConfig {
                        binds: Some(vec![
                            format!("{}:/submission:ro", sub.display()),
                            format!("{}:/logs/verifier:rw", logs.display()),
                        ]),
                        network_mode: Some(network_name(grader_env_id)),
                        dns,
                        memory: Some((denv_compose::DEFAULT_MEMORY_MB as i64) << 20),
                        memory_swap: Some((denv_compose::DEFAULT_MEMORY_MB as i64) << 20),
                        pids_limit: Some(denv_compose::DEFAULT_PIDS),
                        nano_cpus: Some(
                            (crate::runtime::max_cpus(self.inner.host_cpus)
                                .min(denv_compose::DEFAULT_CPUS)
                                * 1e9) as i64,
                        ),
                        ..Default::default()
                    };
                    // The grader runs as uid 0 over a copy owned by the agent's uid: it
                    // keeps the service set (DAC_OVERRIDE to read it), nothing more.
                    crate::runtime::harden(&mut hc, crate::runtime::Privilege::Service(&[]));
                    hc
                }),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| RuntimeError::docker(format!("create verifier from {image}"), e))?;
        self.finish_verifier(&name, logs, timeout, true).await
    }

    /// SIGKILLs every process of container `cname` whose environment holds
    /// `DENV_VERIFY_ID=<verify_id>` (read from the host's `/proc`); returns how many.
    async fn kill_verify_processes(&self, cname: &str, verify_id: &str) -> Result<usize> {
        let top = match self
            .docker()
            .top_processes(
                cname,
                Some(bollard::container::TopOptions { ps_args: "-eo pid" }),
            )
            .await
        {
            Ok(t) => t,
            Err(e) => {
                return Err(RuntimeError::docker(
                    "list the verifier service's processes",
                    e,
                ))
            }
        };
        let marker = format!("DENV_VERIFY_ID={verify_id}");
        let mut killed = 0;
        for row in top.processes.unwrap_or_default() {
            let Some(pid) = row.first().and_then(|p| p.trim().parse::<i32>().ok()) else {
                continue;
            };
            let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
                continue;
            };
            if environ.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                killed += 1;
            }
        }
        Ok(killed)
    }

    /// Names of the verifier containers labelled `denv.verify=<verify_id>` (any state).
    async fn verifiers_of(&self, verify_id: &str) -> Result<Vec<String>> {
        let list = self
            .docker()
            .list_containers(Some(bollard::container::ListContainersOptions::<String> {
                all: true,
                filters: HashMap::from([(
                    "label".to_string(),
                    vec![format!("denv.verify={verify_id}")],
                )]),
                ..Default::default()
            }))
            .await
            .map_err(|e| RuntimeError::docker("list verifier containers", e))?;
        let mut names: Vec<String> = list
            .into_iter()
            .filter_map(|c| c.names.and_then(|n| n.into_iter().next()))
            .map(|n| n.trim_start_matches('/').to_string())
            .collect();
        names.sort();
        Ok(names)
    }

    /// Starts (when `start`) and waits for the verifier container `name`, reads its
    /// output and reward, removes it.
    async fn finish_verifier(
        &self,
        name: &str,
        logs: &Path,
        timeout: Duration,
        start: bool,
    ) -> Result<(i64, String, String, Option<String>)> {
        let r = self.wait_verifier(name, timeout, start).await;
        let out = match r {
            Ok(code) => {
                let (o, e) = self.logs_split(name).await;
                Ok((
                    code,
                    String::from_utf8_lossy(&o).into_owned(),
                    String::from_utf8_lossy(&e).into_owned(),
                ))
            }
            Err(e) => Err(e),
        };
        let _ = self.remove_container(name).await;
        let (code, o, e) = out?;
        let reward = std::fs::read_to_string(logs.join("reward.txt")).ok();
        Ok((code, o, e, reward))
    }

    async fn wait_verifier(&self, name: &str, timeout: Duration, start: bool) -> Result<i64> {
        let d = self.docker();
        if start {
            d.start_container::<String>(name, None)
                .await
                .map_err(|e| RuntimeError::docker("start verifier", e))?;
        }
        let mut w = d.wait_container(
            name,
            Some(WaitContainerOptions {
                condition: "not-running",
            }),
        );
        match tokio::time::timeout(timeout, w.next()).await {
            Err(_) => {
                self.kill(name).await;
                Err(RuntimeError::Failed(format!(
                    "verifier timed out after {}s",
                    timeout.as_secs()
                )))
            }
            Ok(_) => {
                let st = self
                    .inspect(name)
                    .await?
                    .and_then(|c| c.state)
                    .unwrap_or_default();
                let code = st.exit_code.unwrap_or(-1);
                if st.oom_killed == Some(true) {
                    return Err(RuntimeError::Failed(
                        "infra error: the verifier was killed by the OOM killer; the episode was not graded".into(),
                    ));
                }
                if code == 137 {
                    return Err(RuntimeError::Failed(
                        "infra error: the verifier was killed (SIGKILL); the episode was not graded".into(),
                    ));
                }
                Ok(code)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_service_verifier(
        &self,
        grader_env_id: &str,
        verify_id: &str,
        service: &str,
        verifier: &Verifier,
        env: Vec<String>,
        sub: &Path,
        logs: &Path,
        timeout: Duration,
        progress: &Progress,
    ) -> Result<(i64, String, String, Option<String>)> {
        let cname = container_name(grader_env_id, service);
        if self.inspect(&cname).await?.is_none() {
            return Err(RuntimeError::NotFound(format!(
                "verifier service {service:?} of {grader_env_id} not found"
            )));
        }
        // Exactly once: a grader of this verify that an earlier denvd started in this
        // service (its processes carry `DENV_VERIFY_ID=<id>`) is killed first.
        let killed = self.kill_verify_processes(&cname, verify_id).await?;
        if killed > 0 {
            say(
                progress,
                format!("killed {killed} process(es) of a grader started before a restart"),
            );
        }
        crate::storage::remove_tree(logs)?;
        std::fs::create_dir_all(logs)
            .map_err(|e| RuntimeError::io(format!("create {}", logs.display()), e))?;
        let sub2 = sub.to_path_buf();
        let tar = tokio::task::spawn_blocking(move || tar_submission(&sub2))
            .await
            .map_err(|e| RuntimeError::Failed(format!("verify tar: {e}")))?
            .map_err(|e| RuntimeError::io(format!("tar {}", sub.display()), e))?;
        // `/logs/verifier` and `/submission` must not be on a volume (the agent may have
        // written it); `/` of a fork's container is the image, fresh.
        let c = self.inspect(&cname).await?.unwrap_or_default();
        let c_env = c
            .config
            .as_ref()
            .and_then(|c| c.env.clone())
            .unwrap_or_default();
        let mounts: Vec<String> = c
            .mounts
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| m.destination)
            .collect();
        for reserved in ["/logs/verifier", "/submission"] {
            if let Some(m) = mounts
                .iter()
                .find(|m| covers(m, reserved) || covers(reserved, m))
            {
                return Err(RuntimeError::Failed(format!(
                    "verifier service {service:?} has a volume at {m}, which overlaps {reserved}; \
                     the grader's {reserved} must not be on a volume the agent could write"
                )));
            }
        }
        let home = if mounts.iter().any(|m| covers(m, "/root")) {
            "/nonexistent"
        } else {
            "/root"
        };
        // An exec starts with the service's environment (a
        // planted `LD_PRELOAD` would load into it as root): every variable of the container is
        // emptied for it, `PATH` set to the standard one.
        let mut blank: Vec<String> = c_env
            .iter()
            .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
            .filter(|k| *k != "PATH")
            .map(|k| format!("{k}="))
            .collect();
        blank.push(clean_env(home)[0].clone());
        // An earlier run's copy is read-only and owned by 65534; a service may have no
        // capabilities (the agent's), so its root cannot remove it: its owner opens it
        // up first.
        let unlock = [
            "sh",
            "-c",
            "[ ! -d /submission ] || chmod -R a+w /submission",
        ]
        .map(String::from)
        .to_vec();
        let owner = format!("{}:{}", collect::COPY_UID, collect::COPY_GID);
        self.exec_raw(
            &cname,
            &unlock,
            Some(owner.as_str()),
            blank.clone(),
            Duration::from_secs(60),
        )
        .await?;
        let root = Some("0");
        let prep = [
            "sh",
            "-c",
            "rm -rf /submission /logs/verifier && mkdir -p /logs/verifier && chmod 0755 /logs/verifier",
        ]
        .map(String::from)
        .to_vec();
        let r = self
            .exec_raw(&cname, &prep, root, blank.clone(), Duration::from_secs(60))
            .await?;
        if r.exit_code != 0 {
            return Err(RuntimeError::Failed(format!(
                "prepare service {service:?} for the verifier: {}",
                String::from_utf8_lossy(&r.stderr).trim()
            )));
        }
        self.docker()
            .upload_to_container(
                &cname,
                Some(bollard::container::UploadToContainerOptions {
                    path: "/".to_string(),
                    ..Default::default()
                }),
                tar.into(),
            )
            .await
            .map_err(|e| {
                RuntimeError::docker(format!("put /submission into service {service:?}"), e)
            })?;
        // A clean environment: not the service's (`HOME`, `PATH`, `PYTHON*`, `LD_*`,
        // `GIT_*`, `ENV`, `BASH_ENV` are all gone), the working directory `/`.
        let mut cmd: Vec<String> = ["sh", "-c", "cd / && exec env -i \"$@\"", "sh"]
            .map(String::from)
            .to_vec();
        cmd.extend(clean_env(home));
        cmd.extend(env);
        cmd.extend(verifier.command.iter().cloned());
        let r = self.exec_raw(&cname, &cmd, root, blank, timeout).await?;
        if r.timed_out {
            return Err(RuntimeError::Failed(format!(
                "verifier timed out after {}s",
                timeout.as_secs()
            )));
        }
        if r.exit_code == 137 {
            return Err(RuntimeError::Failed(
                "infra error: the verifier was killed (SIGKILL); the episode was not graded".into(),
            ));
        }
        let reward = match self
            .download(&cname, "/logs/verifier/reward.txt", 1 << 20)
            .await
        {
            Ok(Some(t)) => first_file(&t),
            _ => None,
        };
        if let Some(rw) = &reward {
            let _ = std::fs::write(logs.join("reward.txt"), rw);
        }
        Ok((
            r.exit_code,
            String::from_utf8_lossy(&r.stdout).into_owned(),
            String::from_utf8_lossy(&r.stderr).into_owned(),
            reward,
        ))
    }
}

/// Whether the container path `outer` is `inner` or one of its parents.
fn covers(outer: &str, inner: &str) -> bool {
    let o = outer.trim_end_matches('/');
    o.is_empty() || inner == o || inner.starts_with(&format!("{o}/"))
}

/// The whole environment of a service verifier's command (besides `SUBMISSION` and
/// `DENV_VERIFY_ID`): a standard `PATH`, `HOME`, and Python's user site, bytecode
/// writing and implicit path entries off.
pub fn clean_env(home: &str) -> Vec<String> {
    vec![
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        format!("HOME={home}"),
        "LANG=C.UTF-8".into(),
        "PYTHONNOUSERSITE=1".into(),
        "PYTHONDONTWRITEBYTECODE=1".into(),
    ]
}

/// `reward.txt` as a float, else the last whitespace token of stdout as a float.
pub fn parse_reward(reward_txt: Option<&str>, stdout: &str) -> Option<(f64, &'static str)> {
    if let Some(r) = reward_txt.and_then(|t| t.trim().parse::<f64>().ok()) {
        if r.is_finite() {
            return Some((r, "reward.txt"));
        }
    }
    stdout
        .split_whitespace()
        .last()
        .and_then(|t| t.parse::<f64>().ok())
        .filter(|r| r.is_finite())
        .map(|r| (r, "stdout"))
}

fn first_file(tar: &[u8]) -> Option<String> {
    let mut ar = tar::Archive::new(tar);
    for e in ar.entries().ok()? {
        let mut e = e.ok()?;
        if e.header().entry_type() == tar::EntryType::Regular {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut e, &mut s).ok()?;
            return Some(s);
        }
    }
    None
}

/// A tar of the copy with names under `submission/`, for the service verifier: owned
/// by [`collect::COPY_UID`], modes as in the copy (read-only).
fn tar_submission(sub: &Path) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.mode(tar::HeaderMode::Deterministic);
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_mode(0o555);
    h.set_uid(collect::COPY_UID.into());
    h.set_gid(collect::COPY_GID.into());
    h.set_size(0);
    b.append_data(&mut h, "submission/", std::io::empty())?;
    fn walk(b: &mut tar::Builder<Vec<u8>>, root: &Path, rel: &Path) -> std::io::Result<()> {
        let mut names: Vec<_> = std::fs::read_dir(root.join(rel))?
            .flatten()
            .map(|e| e.file_name())
            .collect();
        names.sort();
        for n in names {
            let r = rel.join(&n);
            let p = root.join(&r);
            let m = std::fs::symlink_metadata(&p)?;
            let mut h = tar::Header::new_gnu();
            h.set_uid(collect::COPY_UID.into());
            h.set_gid(collect::COPY_GID.into());
            h.set_mode(m.permissions().mode() & 0o555);
            let name = Path::new("submission").join(&r);
            if m.is_dir() {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                b.append_data(&mut h, &name, std::io::empty())?;
                walk(b, root, &r)?;
            } else if m.is_file() {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(m.len());
                b.append_data(&mut h, &name, std::fs::File::open(&p)?)?;
            }
        }
        Ok(())
    }
    walk(&mut b, sub, Path::new(""))?;
    b.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reward_sources() {
        assert_eq!(parse_reward(Some("1\n"), "x"), Some((1.0, "reward.txt")));
        assert_eq!(
            parse_reward(Some("nope"), "score 0.5\n"),
            Some((0.5, "stdout"))
        );
        assert_eq!(parse_reward(None, "score: 0.25"), Some((0.25, "stdout")));
        assert_eq!(parse_reward(None, "done"), None);
        assert_eq!(parse_reward(None, ""), None);
    }
}
