//! `env.exec`, `env.put`, `env.get`.

use super::docker::text;
use super::{
    container_name, fail, ExecOptions, ExecResult, PutResult, Result, Runtime, RuntimeError,
};
use bollard::container::UploadToContainerOptions;
use std::time::Duration;

/// `env.get` limit: 32 MiB (defined in `denv_proto::contract`).
pub use denv_proto::contract::FILES_ARCHIVE_MAX_BYTES as GET_LIMIT;

impl Runtime {
    /// The container of `service`, which must exist. When `must_run`, it must be
    /// running and not paused (error `service "box" is paused`).
    async fn service_container(
        &self,
        env_id: &str,
        service: &str,
        must_run: bool,
    ) -> Result<String> {
        let cname = container_name(env_id, service);
        let Some(c) = self.inspect(&cname).await? else {
            return Err(RuntimeError::NotFound(format!(
                "service {service:?} of {env_id} not found"
            )));
        };
        if must_run {
            let st = c.state.unwrap_or_default();
            if st.paused == Some(true) {
                return fail(format!(
                    "service {service:?} of {env_id} is paused (container {cname} is paused)"
                ));
            }
            if st.running != Some(true) {
                return fail(format!("service {service:?} of {env_id} is not running"));
            }
        }
        Ok(cname)
    }

    /// `env.exec`: runs `cmd` in `service` as the service's user, without a TTY
    /// ([`Runtime::exec_with`] with no options).
    pub async fn exec(
        &self,
        env_id: &str,
        service: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<ExecResult> {
        self.exec_with(env_id, service, cmd, ExecOptions::default(), timeout)
            .await
    }

    /// `env.exec` with a user, working directory, environment and stdin (see
    /// [`ExecOptions`]; refused with its [`ExecOptions::check`] message). A non-zero exit
    /// is `Ok`. On `timeout` the process is killed and the result is `exit_code: 124`,
    /// `timed_out`, with `denvd: command timed out after <N>s` appended to stderr. Each
    /// stream keeps its first 4 MiB and says so in `stdout_truncated`/`stderr_truncated`.
    /// A paused service fails with Docker's message (`… is paused, unpause the
    /// container before exec`). What the engine refuses at start (a missing working
    /// directory, an unknown user name) comes back as the engine reports it: exit code
    /// 126 or 127 and its message on stdout, as `docker exec` shows it.
    pub async fn exec_with(
        &self,
        env_id: &str,
        service: &str,
        cmd: &[String],
        opts: ExecOptions,
        timeout: Duration,
    ) -> Result<ExecResult> {
        if cmd.is_empty() {
            return Err(RuntimeError::Invalid("exec: empty command".into()));
        }
        opts.check().map_err(RuntimeError::Invalid)?;
        let cname = self.service_container(env_id, service, false).await?;
        let r = self
            .exec_io(&cname, cmd, opts, timeout)
            .await
            .map_err(|e| match e {
                RuntimeError::Docker {
                    message,
                    status,
                    unreachable,
                    ..
                } => RuntimeError::Docker {
                    context: format!("exec in service {service:?}"),
                    message,
                    status,
                    unreachable,
                },
                other => other,
            })?;
        let mut stderr = text(&r.stderr);
        if r.timed_out {
            if !stderr.is_empty() && !stderr.ends_with('\n') {
                stderr.push('\n');
            }
            stderr.push_str(&format!(
                "denvd: command timed out after {}s",
                timeout.as_secs()
            ));
        }
        Ok(ExecResult {
            exit_code: r.exit_code,
            stdout: text(&r.stdout),
            stderr,
            stdout_truncated: r.stdout_truncated,
            stderr_truncated: r.stderr_truncated,
            timed_out: r.timed_out,
        })
    }

    /// `env.put`: creates `path` (`mkdir -p`, as the service's user, else as root) and
    /// extracts the tar archive `tar` there (Engine archive API, like `docker cp`).
    /// Refused on a paused service (`service "box" of env_x is paused …`).
    pub async fn put(
        &self,
        env_id: &str,
        service: &str,
        path: &str,
        tar: Vec<u8>,
    ) -> Result<PutResult> {
        if !path.starts_with('/') {
            return fail(format!("put: path {path:?} must be absolute"));
        }
        let cname = self.service_container(env_id, service, true).await?;
        let mk = vec![
            "mkdir".to_string(),
            "-p".to_string(),
            "--".to_string(),
            path.to_string(),
        ];
        let r = self
            .exec_raw(&cname, &mk, None, vec![], Duration::from_secs(30))
            .await?;
        if r.exit_code != 0 {
            let r2 = self
                .exec_raw(&cname, &mk, Some("0"), vec![], Duration::from_secs(30))
                .await?;
            if r2.exit_code != 0 {
                return fail(format!(
                    "put: mkdir -p {path} in service {service:?}: {}",
                    String::from_utf8_lossy(&r2.stderr).trim()
                ));
            }
        }
        self.inner
            .docker
            .upload_to_container(
                &cname,
                Some(UploadToContainerOptions {
                    path: path.to_string(),
                    ..Default::default()
                }),
                tar.into(),
            )
            .await
            .map_err(|e| RuntimeError::docker(format!("put {path} into service {service:?}"), e))?;
        Ok(PutResult {
            path: path.to_string(),
        })
    }

    /// `env.get`: a tar of `path` in `service` (archive API; works on a paused service).
    /// Errors: `<service>: <path>: no such file or directory` (`FAILED`, not
    /// `NOT_FOUND`: a path inside a service is its content, not something this host
    /// holds, and the REST API answers it `502` by its spec),
    /// `<path>: archive larger than 32 MiB` (`TOO_LARGE`).
    pub async fn get(&self, env_id: &str, service: &str, path: &str) -> Result<Vec<u8>> {
        let cname = self.service_container(env_id, service, false).await?;
        match self.download(&cname, path, GET_LIMIT).await? {
            Some(b) => Ok(b),
            None => fail(format!("{service}: {path}: no such file or directory")),
        }
    }
}
