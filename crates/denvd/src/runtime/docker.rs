//! Thin helpers over bollard: images, containers, networks, exec, archives, health.

use super::netpolicy::{EnvNet, BRIDGE_OPTION, EGRESS_LABEL, OWNER_LABEL};
use super::{fail, project, ExecOptions, Result, Runtime, RuntimeError};
use bollard::container::{
    DownloadFromContainerOptions, InspectContainerOptions, KillContainerOptions,
    ListContainersOptions, LogOutput, LogsOptions, RemoveContainerOptions,
};
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::image::CreateImageOptions;
use bollard::models::{
    ContainerInspectResponse, ContainerStateStatusEnum, ContainerSummary, HealthStatusEnum,
};
use bollard::network::{CreateNetworkOptions, InspectNetworkOptions, ListNetworksOptions};
use denv_compose::Egress;
use futures::StreamExt;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Output of one exec.
pub(crate) struct RawExec {
    pub exit_code: i64,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub timed_out: bool,
    /// More than [`EXEC_OUTPUT_LIMIT`] bytes were written to stdout (the rest is dropped).
    pub stdout_truncated: bool,
    /// The same for stderr.
    pub stderr_truncated: bool,
}

/// Keep at most this much of each exec stream: 4 MiB (defined in `denv_proto::contract`).
pub(crate) use denv_proto::contract::EXEC_OUTPUT_MAX_BYTES as EXEC_OUTPUT_LIMIT;

impl Runtime {
    /// Makes sure `image` is present locally (never pulls one that is); tries a pull only
    /// when missing. Returns what it resolved to ([`ImageRef`]).
    pub(crate) async fn ensure_image(&self, image: &str) -> Result<ImageRef> {
        let d = &self.inner.docker;
        match d.inspect_image(image).await {
            Ok(i) => return Ok(image_ref(&i)),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            Err(e) => return Err(RuntimeError::docker(format!("inspect image {image}"), e)),
        }
        // Images built here are never pulled: `denv-build/<key>` on a registry would be
        // whatever someone pushed under that name.
        if image.starts_with(&format!("{}/", denv_compose::BUILD_REPO)) {
            return Err(RuntimeError::NotFound(format!(
                "image {image:?} was built on this host and is gone from it; deploy again to \
                 build it"
            )));
        }
        let mut s = d.create_image(
            Some(CreateImageOptions {
                from_image: image,
                ..Default::default()
            }),
            None,
            None,
        );
        while let Some(item) = s.next().await {
            if let Err(e) = item {
                let e = RuntimeError::docker("pull", e);
                return fail(format!(
                    "image {image:?} is not present locally and could not be pulled: {e}"
                ));
            }
        }
        match d.inspect_image(image).await {
            Ok(i) => Ok(image_ref(&i)),
            Err(e) => fail(format!(
                "image {image:?} is not present locally and could not be pulled: {}",
                RuntimeError::docker("inspect", e)
            )),
        }
    }

    /// The image a version pinned for service `service` (`image` as written, `id` the
    /// local image id), which must still be on this host: it is never pulled or
    /// resolved by tag again. Errors: `image "<image>" of service "<service>" (pinned by
    /// the version as <id>) is no longer on this host; …`.
    pub(crate) async fn pinned_image(
        &self,
        service: &str,
        image: &str,
        id: &str,
    ) -> Result<ImageRef> {
        if !super::ship::is_image_id(id) {
            return Err(RuntimeError::Invalid(format!(
                "service {service:?}: pinned image id {id:?} is not sha256:<64 hex digits>"
            )));
        }
        match self.inner.docker.inspect_image(id).await {
            Ok(i) if i.id.as_deref() == Some(id) => Ok(image_ref(&i)),
            Ok(_)
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Err(RuntimeError::NotFound(format!(
                "image {image:?} of service {service:?} (pinned by the version as {id}) is no \
                 longer on this host; denv does not run another image under the same tag: \
                 load or build that image again, or deploy a new version"
            ))),
            Err(e) => Err(RuntimeError::docker(format!("inspect image {id}"), e)),
        }
    }

    /// Containers labelled `denv.managed=true` (and `denv.env=<env>` when given), all states.
    pub(crate) async fn managed_containers(
        &self,
        env: Option<&str>,
    ) -> Result<Vec<ContainerSummary>> {
        let mut labels = vec!["denv.managed=true".to_string()];
        if let Some(e) = env {
            labels.push(format!("denv.env={e}"));
        }
        let mut filters = HashMap::new();
        filters.insert("label".to_string(), labels);
        self.inner
            .docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters,
                ..Default::default()
            }))
            .await
            .map_err(|e| RuntimeError::docker("list containers", e))
    }

    /// Inspects a container; `None` when it does not exist.
    pub(crate) async fn inspect(&self, name: &str) -> Result<Option<ContainerInspectResponse>> {
        match self
            .inner
            .docker
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
        {
            Ok(c) => Ok(Some(c)),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(None),
            Err(e) => Err(RuntimeError::docker(format!("inspect container {name}"), e)),
        }
    }

    /// Removes a container (unpausing it first; killing it if running). Missing is fine.
    pub(crate) async fn remove_container(&self, name: &str) -> Result<()> {
        let d = &self.inner.docker;
        if let Some(c) = self.inspect(name).await? {
            if c.state.as_ref().and_then(|s| s.paused).unwrap_or(false) {
                let _ = d.unpause_container(name).await;
            }
        }
        match d
            .remove_container(
                name,
                Some(RemoveContainerOptions {
                    force: true,
                    v: true,
                    ..Default::default()
                }),
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(e) => Err(RuntimeError::docker(format!("remove container {name}"), e)),
        }
    }

    /// Kills a container (SIGKILL), ignoring "not running".
    pub(crate) async fn kill(&self, name: &str) {
        let _ = self
            .inner
            .docker
            .kill_container(name, Some(KillContainerOptions { signal: "SIGKILL" }))
            .await;
    }

    /// Creates the environment's network `<lc>_default`: a normal bridge whose interface
    /// is [`super::bridge_name`], labelled `denv.egress=<deny|allow>` and
    /// `denv.owner=<owner tag>`. An existing network is kept when it has that bridge,
    /// those labels and no `internal` flag, and recreated
    /// otherwise. When Docker's address pools are exhausted, allocates a free /24 in
    /// `10.213.0.0/16` itself. Returns the network as a policy (bridge, gateway).
    pub(crate) async fn ensure_network(&self, env_id: &str, egress: Egress) -> Result<EnvNet> {
        let name = super::network_name(env_id);
        let bridge = super::bridge_name(env_id);
        let d = &self.inner.docker;
        match d
            .inspect_network(&name, None::<InspectNetworkOptions<String>>)
            .await
        {
            Ok(n) => {
                let same = n.internal != Some(true)
                    && n.labels
                        .as_ref()
                        .and_then(|l| l.get(EGRESS_LABEL))
                        .map(String::as_str)
                        == Some(egress.as_str())
                    && EnvNet::of(&n).is_some_and(|e| {
                        e.bridge == bridge
                            && e.gateway.is_some()
                            && e.owner.as_deref() == Some(self.inner.owner.as_str())
                    });
                if same {
                    return EnvNet::of(&n).ok_or_else(|| {
                        RuntimeError::Failed(format!("network {name} has no labels"))
                    });
                }
                d.remove_network(&name)
                    .await
                    .map_err(|e| RuntimeError::docker(format!("remove network {name}"), e))?;
            }
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            Err(e) => return Err(RuntimeError::docker(format!("inspect network {name}"), e)),
        }
        let labels = HashMap::from([
            ("denv.managed".to_string(), "true".to_string()),
            ("denv.env".to_string(), env_id.to_string()),
            (EGRESS_LABEL.to_string(), egress.as_str().to_string()),
            (OWNER_LABEL.to_string(), self.inner.owner.clone()),
            ("com.docker.compose.project".to_string(), project(env_id)),
        ]);
        let options = HashMap::from([(BRIDGE_OPTION.to_string(), bridge.clone())]);
        let opts = CreateNetworkOptions {
            name: name.clone(),
            check_duplicate: true,
            driver: "bridge".to_string(),
            labels: labels.clone(),
            options: options.clone(),
            ..Default::default()
        };
        if let Err(e) = d.create_network(opts).await {
            let msg = e.to_string();
            if !(msg.contains("address pool") || msg.contains("non-overlapping")) {
                return Err(RuntimeError::docker(format!("create network {name}"), e));
            }
            let subnet = self.free_subnet().await?;
            let opts = CreateNetworkOptions {
                name: name.clone(),
                check_duplicate: true,
                driver: "bridge".to_string(),
                labels,
                options,
                ipam: bollard::models::Ipam {
                    config: Some(vec![bollard::models::IpamConfig {
                        subnet: Some(subnet),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                ..Default::default()
            };
            d.create_network(opts)
                .await
                .map_err(|e| RuntimeError::docker(format!("create network {name}"), e))?;
        }
        let n = d
            .inspect_network(&name, None::<InspectNetworkOptions<String>>)
            .await
            .map_err(|e| RuntimeError::docker(format!("inspect network {name}"), e))?;
        match EnvNet::of(&n) {
            Some(e) if e.gateway.is_some() => Ok(e),
            _ => fail(format!("network {name} has no IPv4 gateway")),
        }
    }

    /// The network of an environment as a policy; `None` when it does not exist.
    pub(crate) async fn env_network(&self, env_id: &str) -> Result<Option<EnvNet>> {
        let name = super::network_name(env_id);
        match self
            .inner
            .docker
            .inspect_network(&name, None::<InspectNetworkOptions<String>>)
            .await
        {
            Ok(n) => Ok(EnvNet::of(&n)),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(None),
            Err(e) => Err(RuntimeError::docker(format!("inspect network {name}"), e)),
        }
    }

    /// The DNS servers for a container on an environment's network: the gateway under
    /// `deny` (only denvd's refuser answers there; Docker's embedded DNS then forwards
    /// from the container's namespace, where the policy applies, never from the host's),
    /// `None` (Docker's default) under `allow` or when the network is unknown.
    pub(crate) async fn env_dns(&self, env_id: &str) -> Result<Option<Vec<String>>> {
        Ok(self.env_network(env_id).await?.and_then(|n| match n {
            EnvNet {
                egress: Egress::Deny,
                gateway: Some(gw),
                ..
            } => Some(vec![gw.to_string()]),
            _ => None,
        }))
    }

    /// A /24 in 10.213.0.0/16 that no Docker network uses.
    async fn free_subnet(&self) -> Result<String> {
        let nets = self
            .inner
            .docker
            .list_networks(None::<ListNetworksOptions<String>>)
            .await
            .map_err(|e| RuntimeError::docker("list networks", e))?;
        let used: Vec<String> = nets
            .iter()
            .filter_map(|n| n.ipam.as_ref().and_then(|i| i.config.clone()))
            .flatten()
            .filter_map(|c| c.subnet)
            .collect();
        for i in 0..=255u32 {
            let s = format!("10.213.{i}.0/24");
            if !used.iter().any(|u| u.starts_with(&format!("10.213.{i}."))) {
                return Ok(s);
            }
        }
        fail("no free subnet left in 10.213.0.0/16 for a new network")
    }

    /// Removes a network; missing is fine.
    pub(crate) async fn remove_network(&self, name: &str) -> Result<()> {
        match self.inner.docker.remove_network(name).await {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(e) => Err(RuntimeError::docker(format!("remove network {name}"), e)),
        }
    }

    /// Runs `cmd` in a running container and collects its output (each stream capped at
    /// [`EXEC_OUTPUT_LIMIT`]). On timeout the process is killed (SIGKILL to its host pid)
    /// and `timed_out` is set with exit code 124.
    pub(crate) async fn exec_raw(
        &self,
        container: &str,
        cmd: &[String],
        user: Option<&str>,
        env: Vec<String>,
        timeout: Duration,
    ) -> Result<RawExec> {
        let io = ExecOptions {
            user: user.map(str::to_string),
            env,
            ..Default::default()
        };
        self.exec_io(container, cmd, io, timeout).await
    }

    /// [`Runtime::exec_raw`] with every engine exec option: `io.user` and `io.workdir`
    /// are the engine's exec `User` and `WorkingDir` (passed as given; the caller
    /// validates them), `io.env` is `KEY=VALUE` entries, and `io.stdin` is written to the
    /// process's standard input, which is then closed (without it, stdin is not
    /// attached and reads end of file). The stdin write runs beside the output reader, so
    /// a command that never reads its input still ends at its timeout.
    pub(crate) async fn exec_io(
        &self,
        container: &str,
        cmd: &[String],
        io: ExecOptions,
        timeout: Duration,
    ) -> Result<RawExec> {
        let d = &self.inner.docker;
        let exec = d
            .create_exec(
                container,
                CreateExecOptions {
                    cmd: Some(cmd.to_vec()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    attach_stdin: Some(io.stdin.is_some()),
                    user: io.user.clone(),
                    working_dir: io.workdir.clone(),
                    env: if io.env.is_empty() {
                        None
                    } else {
                        Some(io.env.clone())
                    },
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| RuntimeError::docker("exec", e))?;
        let started = d
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| RuntimeError::docker("exec", e))?;
        let mut out = RawExec {
            exit_code: 0,
            stdout: Vec::new(),
            stderr: Vec::new(),
            timed_out: false,
            stdout_truncated: false,
            stderr_truncated: false,
        };
        if let StartExecResults::Attached { mut output, input } = started {
            // The writer ends on its own (all written, or the process closed its stdin);
            // it is aborted below when the command is done or killed.
            let writer = io.stdin.clone().map(|data| {
                let mut input = input;
                tokio::spawn(async move {
                    use tokio::io::AsyncWriteExt;
                    let _ = input.write_all(&data).await;
                    let _ = input.shutdown().await;
                })
            });
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                match tokio::time::timeout_at(deadline, output.next()).await {
                    Err(_) => {
                        out.timed_out = true;
                        break;
                    }
                    Ok(None) => break,
                    Ok(Some(Err(e))) => {
                        if let Some(w) = &writer {
                            w.abort();
                        }
                        return Err(RuntimeError::docker("exec output", e));
                    }
                    Ok(Some(Ok(chunk))) => match (chunk, &io.output) {
                        (LogOutput::StdIn { .. }, _) => {}
                        (LogOutput::StdErr { message }, Some(tx)) => {
                            let _ = tx.send((true, message.to_vec())).await;
                        }
                        (
                            LogOutput::StdOut { message } | LogOutput::Console { message },
                            Some(tx),
                        ) => {
                            let _ = tx.send((false, message.to_vec())).await;
                        }
                        (LogOutput::StdErr { message }, None) => {
                            out.stderr_truncated |= push_capped(&mut out.stderr, &message)
                        }
                        (LogOutput::StdOut { message } | LogOutput::Console { message }, None) => {
                            out.stdout_truncated |= push_capped(&mut out.stdout, &message)
                        }
                    },
                }
            }
            if let Some(w) = writer {
                w.abort();
            }
        }
        if out.timed_out {
            if let Ok(i) = d.inspect_exec(&exec.id).await {
                if let Some(pid) = i.pid.filter(|p| *p > 0) {
                    let _ = tokio::process::Command::new("kill")
                        .args(["-KILL", &pid.to_string()])
                        .status()
                        .await;
                }
            }
            out.exit_code = 124;
            return Ok(out);
        }
        // The stream can end a moment before the Engine records the exit code.
        for _ in 0..50 {
            let i = d
                .inspect_exec(&exec.id)
                .await
                .map_err(|e| RuntimeError::docker("inspect exec", e))?;
            if i.running != Some(true) {
                out.exit_code = i.exit_code.unwrap_or(-1);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(out)
    }

    /// Downloads `path` from a container as a tar (archive API). `Ok(None)` when the path
    /// does not exist; an error when the archive exceeds `limit` bytes (the message
    /// contains `larger than`).
    pub(crate) async fn download(
        &self,
        container: &str,
        path: &str,
        limit: usize,
    ) -> Result<Option<Vec<u8>>> {
        let mut s = self.inner.docker.download_from_container(
            container,
            Some(DownloadFromContainerOptions {
                path: path.to_string(),
            }),
        );
        let mut buf = Vec::new();
        while let Some(chunk) = s.next().await {
            match chunk {
                Ok(b) => {
                    if buf.len() + b.len() > limit {
                        return Err(RuntimeError::TooLarge(format!(
                            "{path}: archive larger than {} MiB",
                            limit >> 20
                        )));
                    }
                    buf.extend_from_slice(&b);
                }
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => return Ok(None),
                Err(e) => return Err(RuntimeError::docker(format!("read {path}"), e)),
            }
        }
        Ok(Some(buf))
    }

    /// The last `lines` lines of a container's output (stdout and stderr interleaved).
    pub(crate) async fn logs_tail(&self, container: &str, lines: usize) -> String {
        let mut s = self.inner.docker.logs(
            container,
            Some(LogsOptions::<String> {
                stdout: true,
                stderr: true,
                tail: lines.to_string(),
                ..Default::default()
            }),
        );
        let mut out = Vec::new();
        while let Some(Ok(c)) = s.next().await {
            out.extend_from_slice(&c.into_bytes());
        }
        String::from_utf8_lossy(&out).trim().to_string()
    }

    /// Stdout and stderr of a finished container, each capped.
    pub(crate) async fn logs_split(&self, container: &str) -> (Vec<u8>, Vec<u8>) {
        let mut s = self.inner.docker.logs(
            container,
            Some(LogsOptions::<String> {
                stdout: true,
                stderr: true,
                tail: "all".to_string(),
                ..Default::default()
            }),
        );
        let (mut o, mut e) = (Vec::new(), Vec::new());
        while let Some(Ok(c)) = s.next().await {
            match c {
                LogOutput::StdErr { message } => {
                    push_capped(&mut e, &message);
                }
                other => {
                    push_capped(&mut o, &other.into_bytes());
                }
            }
        }
        (o, e)
    }

    /// The error a start reports for a service whose container exited or died:
    /// `service "db" exited with code 7: <its last 20 log lines>`, with ` (OOM-killed)`
    /// after the code when the kernel killed it for memory.
    pub(crate) async fn exit_error(
        &self,
        service: &str,
        container: &str,
        st: &bollard::models::ContainerState,
    ) -> RuntimeError {
        let logs = self.logs_tail(container, 20).await;
        let oom = if st.oom_killed == Some(true) {
            " (OOM-killed)"
        } else {
            ""
        };
        RuntimeError::Failed(format!(
            "service {service:?} exited with code {}{oom}: {logs}",
            st.exit_code.unwrap_or(-1)
        ))
    }

    /// Waits until a service's container is ready, without waiting for Docker's
    /// healthcheck schedule: when the container has a healthcheck (from the spec or the
    /// image), denvd runs its test itself (`docker exec` of the `CMD` argv, or
    /// `/bin/sh -c <script>` for `CMD-SHELL`, as the container's user, each run bounded
    /// by the check's `timeout`, default 30 s; at most [`super::ready_check_slots`] runs
    /// at once on the host, the others waiting their turn for up to [`READY_SLOT_WAIT`])
    /// at once and then every
    /// [`READY_POLL`] (every [`READY_POLL_SLOW`] after [`READY_FAST_FOR`]) until one
    /// exits 0 and every run since has for `settle` (zero: the first pass); without a healthcheck the container only has to be running. Docker's
    /// own status is not awaited (after an unpause Docker reports `unhealthy` until its
    /// next interval), but with `fail_fast` a Docker `unhealthy` verdict (its own
    /// `retries` exhausted) fails at once, as does an exited container (with its last
    /// log lines). Errors: `service "db" exited with code 1: <logs>`, `service "db" is
    /// unhealthy: exit 1: <output>`, `service "db" did not become healthy within 60s:
    /// exit 1: <output>`, `service "db" is paused`, `service "db": container … is gone`.
    pub(crate) async fn wait_ready(
        &self,
        service: &str,
        container: &str,
        timeout: Duration,
        fail_fast: bool,
        settle: Duration,
    ) -> Result<()> {
        let t0 = Instant::now();
        // When the check first passed in the current run of passes (see `settle`).
        let mut passing_since: Option<Instant> = None;
        let deadline = t0 + timeout;
        let mut c = self.inspect(container).await?;
        let hc = c
            .as_ref()
            .and_then(|c| c.config.as_ref())
            .and_then(|c| c.healthcheck.clone());
        let test = hc.as_ref().and_then(|h| health_argv(h.test.as_deref()));
        let check_timeout = hc
            .as_ref()
            .and_then(|h| h.timeout)
            .filter(|t| *t > 0)
            .map(|t| Duration::from_nanos(t as u64))
            .unwrap_or(Duration::from_secs(30));
        let mut last = "no health check has run yet".to_string();
        loop {
            let Some(ci) = c.take() else {
                return fail(format!(
                    "service {service:?}: container {container} is gone"
                ));
            };
            let st = ci.state.clone().unwrap_or_default();
            match st.status {
                Some(ContainerStateStatusEnum::EXITED) | Some(ContainerStateStatusEnum::DEAD) => {
                    return Err(self.exit_error(service, container, &st).await);
                }
                Some(ContainerStateStatusEnum::PAUSED) => {
                    return fail(format!("service {service:?} is paused"));
                }
                _ => {}
            }
            let docker_health = st.health.as_ref().and_then(|h| h.status);
            if fail_fast && docker_health == Some(HealthStatusEnum::UNHEALTHY) {
                return fail(format!("service {service:?} is unhealthy: {last}"));
            }
            match &test {
                None if st.running == Some(true) => return Ok(()),
                None => {}
                Some(argv) if st.running == Some(true) => {
                    // One of the host's check slots, or none after [`READY_SLOT_WAIT`]
                    // (a hung check elsewhere delays this one, never stops it). The
                    // check's budget starts after the wait.
                    let _slot =
                        tokio::time::timeout(READY_SLOT_WAIT, self.inner.ready_checks.acquire())
                            .await
                            .ok()
                            .and_then(|r| r.ok());
                    let left = deadline.saturating_duration_since(Instant::now());
                    let budget = check_timeout.min(left).max(Duration::from_millis(100));
                    match self.exec_raw(container, argv, None, vec![], budget).await {
                        Ok(r) if r.exit_code == 0 && !r.timed_out => {
                            let since = *passing_since.get_or_insert_with(Instant::now);
                            if since.elapsed() >= settle {
                                return Ok(());
                            }
                            last = "health check passing, not yet for long enough".into();
                        }
                        Ok(r) if r.timed_out => {
                            passing_since = None;
                            last = format!("health check timed out after {}ms", budget.as_millis());
                        }
                        Ok(r) => {
                            passing_since = None;
                            let mut out = r.stdout;
                            out.extend_from_slice(&r.stderr);
                            last = format!(
                                "exit {}: {}",
                                r.exit_code,
                                tail(String::from_utf8_lossy(&out).trim(), 300)
                            );
                        }
                        Err(e) => {
                            passing_since = None;
                            last = e.to_string();
                        }
                    }
                }
                Some(_) => {}
            }
            if Instant::now() >= deadline {
                return fail(format!(
                    "service {service:?} did not become healthy within {}s: {last}",
                    timeout.as_secs()
                ));
            }
            let pause = if t0.elapsed() < READY_FAST_FOR {
                READY_POLL
            } else {
                READY_POLL_SLOW
            };
            tokio::time::sleep(pause).await;
            c = self.inspect(container).await?;
        }
    }
}

/// Longest wait of a readiness check for one of the host's check slots before it runs
/// without one.
pub const READY_SLOT_WAIT: Duration = Duration::from_secs(2);

/// Pause between two readiness checks of one service during the first
/// [`READY_FAST_FOR`] of a wait.
pub const READY_POLL: Duration = Duration::from_millis(50);
/// Pause between two readiness checks after [`READY_FAST_FOR`] (a slow service is not
/// exec'd into twenty times a second for minutes).
pub const READY_POLL_SLOW: Duration = Duration::from_millis(250);
/// How long readiness is checked every [`READY_POLL`].
pub const READY_FAST_FOR: Duration = Duration::from_secs(5);

/// The argv denvd runs for a Docker healthcheck `test`: `["CMD", a, b…]` → `[a, b…]`,
/// `["CMD-SHELL", s]` → `["/bin/sh", "-c", s]` (as Docker does); `None` for `NONE`,
/// an empty or unknown form (no check).
pub fn health_argv(test: Option<&[String]>) -> Option<Vec<String>> {
    let (first, rest) = test?.split_first()?;
    match first.as_str() {
        "CMD" if !rest.is_empty() => Some(rest.to_vec()),
        "CMD-SHELL" if !rest.is_empty() => Some(vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            rest.join(" "),
        ]),
        _ => None,
    }
}

/// What an image reference resolved to on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ImageRef {
    /// The repo digest (`name@sha256:…`) when the image has one, else the image id: what
    /// the evidence reports.
    pub digest: String,
    /// The local image id (`sha256:…`): what containers are created from, and what a
    /// version pins.
    pub id: String,
}

fn image_ref(i: &bollard::models::ImageInspect) -> ImageRef {
    let id = i.id.clone().unwrap_or_default();
    let digest = i
        .repo_digests
        .as_ref()
        .and_then(|d| d.first().cloned())
        .unwrap_or_else(|| id.clone());
    ImageRef { digest, id }
}

/// Appends `chunk` to `buf` up to [`EXEC_OUTPUT_LIMIT`] bytes; returns whether some of it
/// was dropped.
pub(crate) fn push_capped(buf: &mut Vec<u8>, chunk: &[u8]) -> bool {
    let room = EXEC_OUTPUT_LIMIT.saturating_sub(buf.len());
    buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
    chunk.len() > room
}

/// Lossy UTF-8 (a cut is reported by the `*_truncated` flags, never in the text).
pub(crate) fn text(buf: &[u8]) -> String {
    String::from_utf8_lossy(buf).into_owned()
}

/// The last `max` bytes of `s` (on a char boundary).
pub(crate) fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}
