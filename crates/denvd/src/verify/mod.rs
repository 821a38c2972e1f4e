//! Verify: `verify.collect` and `verify.run` (spec `13-ref-compose.md` "Verifier
//! contract", `19-ref-protections.md` §2-3, `21-snapshot-and-verify-explained.md`).
//!
//! **Collect.** The agent service's container is paused first (and left paused). Each
//! collect path is read through the Engine's archive API as a tar (the same stream
//! `docker cp` uses; symlinks are archived as symlinks, never followed) and checked
//! entry by entry ([`check::check_archive`]) before anything is written.
//!
//! Sockets: Docker's archiver skips sockets silently (`pkg/archive`: "skipping … since it
//! is a socket"), so a socket never reaches the tar. To still refuse them, and to catch
//! hard links whose other name lies outside the collected tree (the tar only marks the
//! second name of an inode it saw twice), the collected path is also walked on the host
//! with `lstat`, without following symlinks, through the paused container's file system
//! as Docker mounted it: its bind mounts (the dataset directories) and the overlay's
//! `MergedDir`. Parent symlinks are resolved inside the container's root. Findings:
//! `<path>: socket`, `<path>: hard link` (a regular file with more than one link).
//! When the container's file system is not visible on the host (a graph driver without
//! `MergedDir`, a tmpfs mount), that walk is skipped for the affected paths and
//! sockets there are simply absent from the copy.
//!
//! Accepted content is written to `<data>/verify/<id>/submission/<abs path>`: owned by
//! the sidecar's user (root), `submission/` itself mode 0700, file and directory modes
//! from the archive with set-id bits dropped. On any refusal the copy is removed (it is
//! never written). Missing paths go to `missing`.
//!
//! **Run.** On the grader's fork: an image verifier runs as its own container (uid 0, the
//! fork's network, `/submission` read-only, `/logs/verifier` writable, env `SUBMISSION`,
//! `DENV_VERIFY_ID`); a service verifier gets the copy at `/submission` inside that
//! service and runs via exec as uid 0. The reward is `reward.txt` as a float, else the
//! last whitespace token of stdout as a float, else an error.

pub mod check;

use crate::runtime::{container_name, network_name, say, Progress, Result, Runtime, RuntimeError};
use crate::storage::validate_name;
use bollard::container::{Config, CreateContainerOptions, WaitContainerOptions};
use bollard::models::{ContainerInspectResponse, HostConfig, MountPointTypeEnum};
use check::{check_archive, normalize, rel_of, Budget, Item, MAX_FILES};
use denv_compose::Verifier;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `verify.collect` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
/// Archive bytes read per submission before giving up: the content limit plus room for
/// 20000 headers.
const DOWNLOAD_LIMIT: usize = (check::MAX_BYTES as usize) + (MAX_FILES as usize) * 1536 + (1 << 20);

impl Runtime {
    fn verify_dir(&self, verify_id: &str) -> PathBuf {
        self.data_dir().join("verify").join(verify_id)
    }

    /// `<data>/verify/<id>/submission`.
    pub fn submission_dir(&self, verify_id: &str) -> PathBuf {
        self.verify_dir(verify_id).join("submission")
    }

    /// `verify.collect`: freeze the agent service, copy and check every collect path,
    /// write the accepted copy. The agent service stays paused. See the module docs.
    /// Errors (not refusals): the agent service does not exist, Docker failures.
    pub async fn verify_collect(
        &self,
        env_id: &str,
        verify_id: &str,
        agent_service: &str,
        collect: &[String],
        progress: &Progress,
    ) -> Result<CollectResult> {
        let _g = self.lock_env(env_id).await;
        validate_name("verify id", verify_id)?;
        let cname = container_name(env_id, agent_service);
        let Some(c) = self.inspect(&cname).await? else {
            return Err(RuntimeError::Failed(format!(
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
        // Re-inspect: mounts and MergedDir as they are now.
        let c = self.inspect(&cname).await?.unwrap_or(c);
        let view = HostView::of(&c);

        say(progress, "checking the copy");
        let mut budget = Budget::default();
        let mut items: Vec<Item> = Vec::new();
        let mut missing = Vec::new();
        let mut refused = Vec::new();
        for raw in collect {
            let Some(path) = normalize(raw) else {
                refused.push(format!("{}: collect path must be absolute", rel_of(raw)));
                continue;
            };
            let tar = match self.download(&cname, &path, DOWNLOAD_LIMIT).await {
                Ok(Some(t)) => t,
                Ok(None) => {
                    missing.push(raw.clone());
                    continue;
                }
                Err(RuntimeError::Failed(m)) if m.contains("larger than") => {
                    refused.push(format!("{}: submission larger than 256 MiB", rel_of(&path)));
                    continue;
                }
                Err(e) => return Err(e),
            };
            match check_archive(&path, &tar, &mut budget) {
                Err(r) => refused.push(r),
                Ok(got) => {
                    if let Some(v) = &view {
                        let p = path.clone();
                        let v = v.clone();
                        let finding = tokio::task::spawn_blocking(move || v.walk_for_specials(&p))
                            .await
                            .map_err(|e| RuntimeError::Failed(format!("verify walk: {e}")))?;
                        if let Some(r) = finding {
                            refused.push(r);
                            continue;
                        }
                    }
                    items.extend(got);
                }
            }
        }
        let dir = self.verify_dir(verify_id);
        let sub = dir.join("submission");
        crate::storage::remove_tree(&sub)?;
        if !refused.is_empty() {
            say(progress, format!("refused: {}", refused.join("; ")));
            return Ok(CollectResult {
                files: 0,
                bytes: 0,
                missing,
                refused,
            });
        }
        let (files, bytes) = tokio::task::spawn_blocking(move || write_copy(&dir, &items))
            .await
            .map_err(|e| RuntimeError::Failed(format!("verify write: {e}")))??;
        say(
            progress,
            format!("collected {files} file(s), {bytes} bytes"),
        );
        Ok(CollectResult {
            files,
            bytes,
            missing,
            refused,
        })
    }

    /// `verify.run` on the grader's fork `grader_env_id`. `refused` short-circuits to
    /// `{reward: 0, source: "refused"}` without running anything. Errors:
    /// `verifier timed out after <N>s`, `verifier wrote no reward (exit <N>)`,
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
        crate::storage::remove_tree(&logs)?;
        std::fs::create_dir_all(&logs)
            .map_err(|e| RuntimeError::io(format!("create {}", logs.display()), e))?;
        let timeout = Duration::from_secs(if verifier.timeout_sec == 0 {
            denv_compose::DEFAULT_VERIFIER_TIMEOUT_SEC
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
                self.run_image_verifier(grader_env_id, image, verifier, env, &sub, &logs, timeout)
                    .await?
            }
            (None, Some(service)) => {
                say(progress, format!("grading inside service {service}"));
                self.run_service_verifier(
                    grader_env_id,
                    service,
                    verifier,
                    env,
                    &sub,
                    &logs,
                    timeout,
                )
                .await?
            }
            (None, None) => {
                return Err(RuntimeError::Failed(
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
        image: &str,
        verifier: &Verifier,
        env: Vec<String>,
        sub: &Path,
        logs: &Path,
        timeout: Duration,
    ) -> Result<(i64, String, String, Option<String>)> {
        self.ensure_image(image).await?;
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
                image: Some(image.to_string()),
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
        let r = self.wait_verifier(&name, timeout).await;
        let out = match r {
            Ok(code) => {
                let (o, e) = self.logs_split(&name).await;
                Ok((
                    code,
                    String::from_utf8_lossy(&o).into_owned(),
                    String::from_utf8_lossy(&e).into_owned(),
                ))
            }
            Err(e) => Err(e),
        };
        let _ = self.remove_container(&name).await;
        let (code, o, e) = out?;
        let reward = std::fs::read_to_string(logs.join("reward.txt")).ok();
        Ok((code, o, e, reward))
    }

    async fn wait_verifier(&self, name: &str, timeout: Duration) -> Result<i64> {
        let d = self.docker();
        d.start_container::<String>(name, None)
            .await
            .map_err(|e| RuntimeError::docker("start verifier", e))?;
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
                let c = self.inspect(name).await?;
                Ok(c.and_then(|c| c.state)
                    .and_then(|s| s.exit_code)
                    .unwrap_or(-1))
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_service_verifier(
        &self,
        grader_env_id: &str,
        service: &str,
        verifier: &Verifier,
        env: Vec<String>,
        sub: &Path,
        logs: &Path,
        timeout: Duration,
    ) -> Result<(i64, String, String, Option<String>)> {
        let cname = container_name(grader_env_id, service);
        if self.inspect(&cname).await?.is_none() {
            return Err(RuntimeError::Failed(format!(
                "verifier service {service:?} of {grader_env_id} not found"
            )));
        }
        let sub2 = sub.to_path_buf();
        let tar = tokio::task::spawn_blocking(move || tar_submission(&sub2))
            .await
            .map_err(|e| RuntimeError::Failed(format!("verify tar: {e}")))?
            .map_err(|e| RuntimeError::io(format!("tar {}", sub.display()), e))?;
        let root = Some("0");
        let prep = [
            "sh",
            "-c",
            "rm -rf /submission && mkdir -p /logs/verifier && rm -f /logs/verifier/reward.txt",
        ]
        .map(String::from)
        .to_vec();
        let r = self
            .exec_raw(&cname, &prep, root, vec![], Duration::from_secs(60))
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
        let r = self
            .exec_raw(&cname, &verifier.command, root, env, timeout)
            .await?;
        if r.timed_out {
            return Err(RuntimeError::Failed(format!(
                "verifier timed out after {}s",
                timeout.as_secs()
            )));
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

/// A tar of the copy with names under `submission/`, owned by root, for the service
/// verifier.
fn tar_submission(sub: &Path) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.mode(tar::HeaderMode::Deterministic);
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_mode(0o700);
    h.set_uid(0);
    h.set_gid(0);
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
            h.set_uid(0);
            h.set_gid(0);
            h.set_mode(m.permissions().mode() & 0o777);
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

/// Writes the accepted items to `<dir>/submission` (via a sibling temp dir + rename).
/// Returns (regular files, bytes).
fn write_copy(dir: &Path, items: &[Item]) -> Result<(u64, u64)> {
    let io = |p: &Path, e: std::io::Error| RuntimeError::io(format!("write {}", p.display()), e);
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| io(dir, e))?;
    let tmp = dir.join(format!(".submission.partial-{:08x}", rand::random::<u32>()));
    std::fs::create_dir(&tmp).map_err(|e| io(&tmp, e))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| io(&tmp, e))?;
    let r = (|| -> Result<(u64, u64)> {
        let (mut files, mut bytes) = (0u64, 0u64);
        let mut dir_modes: Vec<(PathBuf, u32)> = Vec::new();
        for it in items {
            let p = tmp.join(it.rel());
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
            }
            match it {
                Item::Dir { mode, .. } => {
                    match std::fs::create_dir(&p) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(io(&p, e)),
                    }
                    dir_modes.push((p, *mode));
                }
                Item::File { mode, data, .. } => {
                    std::fs::write(&p, data).map_err(|e| io(&p, e))?;
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode))
                        .map_err(|e| io(&p, e))?;
                    files += 1;
                    bytes += data.len() as u64;
                }
            }
        }
        // Modes last (a read-only directory must not stop its own content from landing).
        for (p, m) in dir_modes.iter().rev() {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(*m))
                .map_err(|e| io(p, e))?;
        }
        Ok((files, bytes))
    })();
    match r {
        Ok(v) => {
            let sub = dir.join("submission");
            std::fs::rename(&tmp, &sub).map_err(|e| io(&sub, e))?;
            Ok(v)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// The paused container's file system as seen from the host.
#[derive(Debug, Clone)]
struct HostView {
    /// (container destination, host source), longest destination first.
    mounts: Vec<(String, PathBuf)>,
    /// Destinations that are not visible on the host (tmpfs, …).
    hidden: Vec<String>,
    merged: PathBuf,
}

fn under(path: &str, prefix: &str) -> Option<String> {
    if prefix == "/" {
        return Some(path.trim_start_matches('/').to_string());
    }
    if path == prefix {
        return Some(String::new());
    }
    path.strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('/'))
        .map(str::to_string)
}

impl HostView {
    fn of(c: &ContainerInspectResponse) -> Option<HostView> {
        let merged = c
            .graph_driver
            .as_ref()
            .and_then(|g| g.data.get("MergedDir").cloned())
            .map(PathBuf::from)
            .filter(|p| p.is_dir())?;
        let mut mounts = Vec::new();
        let mut hidden = Vec::new();
        for m in c.mounts.clone().unwrap_or_default() {
            let Some(dest) = m.destination else { continue };
            match (m.typ, m.source) {
                (Some(MountPointTypeEnum::BIND) | Some(MountPointTypeEnum::VOLUME), Some(src))
                    if !src.is_empty() =>
                {
                    mounts.push((dest, PathBuf::from(src)))
                }
                _ => hidden.push(dest),
            }
        }
        mounts.sort_by_key(|(d, _)| std::cmp::Reverse(d.len()));
        Some(HostView {
            mounts,
            hidden,
            merged,
        })
    }

    /// Host path of a symlink-free container path; `None` when not visible.
    fn map(&self, cpath: &str) -> Option<PathBuf> {
        for (dest, src) in &self.mounts {
            if let Some(rest) = under(cpath, dest) {
                if self
                    .hidden
                    .iter()
                    .any(|h| h.len() > dest.len() && under(cpath, h).is_some())
                {
                    return None;
                }
                return Some(if rest.is_empty() {
                    src.clone()
                } else {
                    src.join(rest)
                });
            }
        }
        if self.hidden.iter().any(|h| under(cpath, h).is_some()) {
            return None;
        }
        Some(self.merged.join(cpath.trim_start_matches('/')))
    }

    /// Resolves symlinks in the parent components of `cpath` inside the container's
    /// root (as the archive API does); the last component is left alone.
    fn resolve_parents(&self, cpath: &str) -> Option<String> {
        let mut todo: Vec<String> = cpath
            .split('/')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        let last = todo.pop()?;
        todo.reverse();
        let mut done: Vec<String> = Vec::new();
        let mut hops = 0;
        while let Some(c) = todo.pop() {
            match c.as_str() {
                "." => continue,
                ".." => {
                    done.pop();
                    continue;
                }
                _ => {}
            }
            let cand = format!("/{}", [done.clone(), vec![c.clone()]].concat().join("/"));
            let host = self.map(&cand)?;
            match std::fs::symlink_metadata(&host) {
                Ok(m) if m.file_type().is_symlink() => {
                    hops += 1;
                    if hops > 40 {
                        return None;
                    }
                    let target = std::fs::read_link(&host).ok()?;
                    let t = target.to_string_lossy().into_owned();
                    if t.starts_with('/') {
                        done.clear();
                    }
                    let mut parts: Vec<String> = t
                        .split('/')
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect();
                    parts.reverse();
                    todo.extend(parts);
                }
                _ => done.push(c),
            }
        }
        done.push(last);
        Some(format!("/{}", done.join("/")))
    }

    /// Walks `cpath` with lstat; the first socket or multiply-linked regular file is
    /// returned as a refusal (reported under the requested path).
    fn walk_for_specials(&self, cpath: &str) -> Option<String> {
        let real = self.resolve_parents(cpath)?;
        let mut stack = vec![(real, rel_of(cpath), 0usize)];
        let mut seen = 0u64;
        while let Some((c, shown, depth)) = stack.pop() {
            seen += 1;
            if seen > MAX_FILES + 1 || depth > check::MAX_DEPTH + 2 {
                return None; // the archive check already enforces the limits
            }
            let Some(h) = self.map(&c) else { continue };
            let Ok(m) = std::fs::symlink_metadata(&h) else {
                continue;
            };
            let ft = m.file_type();
            if ft.is_socket() {
                return Some(format!("{shown}: socket"));
            }
            if ft.is_file() && m.nlink() > 1 {
                return Some(format!("{shown}: hard link"));
            }
            if ft.is_dir() {
                if let Ok(rd) = std::fs::read_dir(&h) {
                    for e in rd.flatten() {
                        let n = e.file_name().to_string_lossy().into_owned();
                        stack.push((format!("{c}/{n}"), format!("{shown}/{n}"), depth + 1));
                    }
                }
            }
        }
        None
    }
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

    #[test]
    fn host_view_maps_mounts_and_resolves_parent_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let merged = t.path().join("merged");
        let vol = t.path().join("vol");
        std::fs::create_dir_all(merged.join("home")).unwrap();
        std::fs::create_dir_all(merged.join("data")).unwrap();
        std::fs::create_dir_all(&vol).unwrap();
        std::os::unix::fs::symlink("/data", merged.join("home/link")).unwrap();
        std::fs::write(merged.join("data/f"), "x").unwrap();
        let v = HostView {
            mounts: vec![("/home/agent".into(), vol.clone())],
            hidden: vec!["/tmp".into()],
            merged: merged.clone(),
        };
        assert_eq!(v.map("/home/agent/x"), Some(vol.join("x")));
        assert_eq!(v.map("/home/agent"), Some(vol.clone()));
        assert_eq!(v.map("/home/agentx"), Some(merged.join("home/agentx")));
        assert_eq!(v.map("/tmp/x"), None);
        assert_eq!(
            v.resolve_parents("/home/link/f").as_deref(),
            Some("/data/f")
        );
        std::fs::hard_link(merged.join("data/f"), merged.join("data/g")).unwrap();
        assert_eq!(
            v.walk_for_specials("/home/link").as_deref(),
            None,
            "the last component is not followed"
        );
        let r = v.walk_for_specials("/data").unwrap();
        assert!(r == "data/f: hard link" || r == "data/g: hard link", "{r}");
        let l = std::os::unix::net::UnixListener::bind(vol.join("s.sock")).unwrap();
        assert_eq!(
            v.walk_for_specials("/home/agent").as_deref(),
            Some("home/agent/s.sock: socket")
        );
        drop(l);
    }
}
