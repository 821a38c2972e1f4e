//! Typed host commands over the hub: one function per command kind the orchestrator
//! sends, each returning the kind's result message or a [`HubError`] that keeps its
//! kind (no host, host not connected, timed out, the sidecar's own error, …). Its text
//! is what a phase records (`host … is not connected`, `timed out after …`); an API
//! call turns it into its status with `ApiError::from` (the one mapping, in
//! [`crate::error`]).
//!
//! This is the orchestrator's host edge: the commands and their results are the host
//! protocol's wire messages (`v1::EnvCreate`, `v1::EnvFork`, `v1::ExecOutput`, ...), so
//! they appear here and where a runner builds a command's payload or reads its result;
//! the rows the orchestrator keeps are [`crate::domain`]'s.

use crate::hub::{Hub, HubError};
use denv_proto::v1::{self, command::Payload as Cmd, command_result::Payload as Res};
use std::time::Duration;

/// Where a command goes: the team, the host, and the environment addressed.
#[derive(Debug, Clone)]
pub struct Addr {
    pub team_id: String,
    pub host_id: String,
    pub env_id: String,
}

impl Addr {
    /// An address from its parts.
    pub fn new(team_id: &str, host_id: &str, env_id: &str) -> Self {
        Addr {
            team_id: team_id.to_string(),
            host_id: host_id.to_string(),
            env_id: env_id.to_string(),
        }
    }
}

/// The hub, seen as typed commands.
#[derive(Clone)]
pub struct Link {
    hub: Hub,
}

macro_rules! command {
    ($(#[$doc:meta])* $name:ident, $payload:ty, $variant:ident, $result:ty) => {
        $(#[$doc])*
        pub async fn $name(
            &self,
            to: &Addr,
            payload: $payload,
            timeout: Duration,
        ) -> Result<$result, HubError> {
            match self.send(to, Cmd::$variant(payload), timeout).await? {
                Res::$variant(r) => Ok(r),
                _ => Err(HubError::UnexpectedResult(stringify!($name))),
            }
        }
    };
}

impl Link {
    /// Wraps the hub.
    pub fn new(hub: Hub) -> Self {
        Link { hub }
    }

    /// The hub itself.
    pub fn hub(&self) -> &Hub {
        &self.hub
    }

    /// Whether the host has a live stream now.
    pub fn is_connected(&self, host_id: &str) -> bool {
        !host_id.is_empty() && self.hub.is_connected(host_id)
    }

    /// [`Link::is_connected`], asking the store for a host held by another replica
    /// ([`Hub::is_connected_now`]): for decisions a stale answer would make for good.
    pub async fn is_connected_now(&self, host_id: &str) -> bool {
        !host_id.is_empty() && self.hub.is_connected_now(host_id).await
    }

    /// `Ok` when the host has a live stream now, else [`HubError::NoHost`] or
    /// [`HubError::NotConnected`] without a wait (`host … is not connected`). Used before
    /// commands that should fail at once rather than wait in the hub for a reconnect.
    pub fn require(&self, host_id: &str) -> Result<(), HubError> {
        if host_id.is_empty() {
            Err(HubError::NoHost)
        } else if self.hub.is_connected(host_id) {
            Ok(())
        } else {
            Err(HubError::NotConnected {
                host_id: host_id.to_string(),
                after: None,
            })
        }
    }

    /// The team's first connected host (sidecars first), if any (whether any host of the
    /// team is connected; new environments are placed by [`super::placement`]).
    pub fn first_connected_host(&self, team_id: &str) -> Option<String> {
        self.hub.first_connected_host(team_id)
    }

    async fn send(&self, to: &Addr, payload: Cmd, timeout: Duration) -> Result<Res, HubError> {
        if to.host_id.is_empty() {
            return Err(HubError::NoHost);
        }
        self.hub
            .send(&to.team_id, &to.host_id, &to.env_id, payload, timeout)
            .await
    }

    /// `env.exec` with `stream` set: output frames go to `output` as they arrive, then
    /// the result (exit code and flags) is returned.
    pub async fn exec_stream(
        &self,
        to: &Addr,
        mut payload: v1::EnvExec,
        timeout: Duration,
        output: crate::hub::OutputSender,
    ) -> Result<v1::ExecOutput, HubError> {
        if to.host_id.is_empty() {
            return Err(HubError::NoHost);
        }
        payload.stream = true;
        match self
            .hub
            .send_with_output(
                &to.team_id,
                &to.host_id,
                &to.env_id,
                Cmd::EnvExec(payload),
                timeout,
                output,
            )
            .await?
        {
            Res::EnvExec(r) => Ok(r),
            _ => Err(HubError::UnexpectedResult("exec_stream")),
        }
    }

    /// `env.logs` of one service: each Progress frame (one log line) goes to `output`
    /// as it arrives, then the result (`{lines, bytes, truncated}`) is returned. When the
    /// caller stops waiting first, the host is told to stop ([`Hub::send_cancellable`]).
    pub async fn logs(
        &self,
        to: &Addr,
        payload: v1::EnvLogs,
        timeout: Duration,
        output: crate::hub::OutputSender,
    ) -> Result<v1::LogsResult, HubError> {
        if to.host_id.is_empty() {
            return Err(HubError::NoHost);
        }
        match self
            .hub
            .send_cancellable(
                &to.team_id,
                &to.host_id,
                &to.env_id,
                Cmd::EnvLogs(payload),
                timeout,
                output,
            )
            .await?
        {
            Res::EnvLogs(r) => Ok(r),
            _ => Err(HubError::UnexpectedResult("logs")),
        }
    }

    command!(
        /// `env.create` → `{endpoints, started_in_ms, digests, storage, egress, egress_probe}`.
        create, v1::EnvCreate, EnvCreate, v1::EnvCreateResult
    );
    command!(
        /// `env.snapshot` → `{snapshot, datasets, frozen_for_ms, consistent}`.
        snapshot, v1::EnvSnapshot, EnvSnapshot, v1::SnapshotResult
    );
    command!(
        /// `env.fork`, addressed to the NEW environment → `{forked_in_ms, endpoints, egress,
        /// egress_probe}`.
        fork, v1::EnvFork, EnvFork, v1::ForkResult
    );
    command!(
        /// `env.rollback` → `{snapshot, endpoints}`.
        rollback, v1::EnvRollback, EnvRollback, v1::RollbackResult
    );
    command!(
        /// `env.exec` → `{exit_code, stdout, stderr}` (a non-zero exit is still `Ok`).
        exec, v1::EnvExec, EnvExec, v1::ExecOutput
    );
    command!(
        /// `env.put` → `{path}`.
        put, v1::EnvPut, EnvPut, v1::PutResult
    );
    command!(
        /// `env.get` → `{tar}`.
        get, v1::EnvGet, EnvGet, v1::GetResult
    );
    command!(
        /// `verify.collect` → `{files, bytes, missing, refused}`.
        collect, v1::VerifyCollect, VerifyCollect, v1::CollectResult
    );
    command!(
        /// `verify.run`, addressed to the grader's fork → `{reward, exit_code, …}`.
        run_verifier, v1::VerifyRun, VerifyRun, v1::RunResult
    );
    /// `image.build` → `{tag, image_id, cached, took_ms, log_tail}`, with the command id
    /// (its progress lines, the build's output, are events on `cmd:<id>`; `""` when the
    /// command was never recorded).
    pub async fn build(
        &self,
        to: &Addr,
        payload: v1::ImageBuild,
        timeout: Duration,
    ) -> (String, Result<v1::BuildResult, HubError>) {
        if to.host_id.is_empty() {
            return (String::new(), Err(HubError::NoHost));
        }
        match self
            .hub
            .send_with_id(
                &to.team_id,
                &to.host_id,
                &to.env_id,
                Cmd::ImageBuild(payload),
                timeout,
            )
            .await
        {
            Err(e) => (String::new(), Err(e)),
            Ok((id, r)) => match r {
                Ok(Res::ImageBuild(r)) => (id, Ok(r)),
                Ok(_) => (id, Err(HubError::UnexpectedResult("build"))),
                Err(e) => (id, Err(e)),
            },
        }
    }
    command!(
        /// `snapshot.send`, addressed to the environment that took the snapshot on a
        /// host holding it: an offer on its data port → `{url}`.
        send_snapshot, v1::SnapshotSend, SnapshotSend, v1::SnapshotSendResult
    );
    command!(
        /// `snapshot.receive`, addressed to the same environment id on the destination
        /// host → `{bytes, sha256, took_ms, cached}`.
        receive_snapshot, v1::SnapshotReceive, SnapshotReceive, v1::SnapshotReceiveResult
    );
    command!(
        /// `image.send` to a host holding the images: an offer on its data port →
        /// `{url}`.
        send_images, v1::ImageSend, ImageSend, v1::ImageSendResult
    );
    command!(
        /// `image.receive` to the host that needs the images → `{loaded, bytes,
        /// took_ms}`.
        receive_images, v1::ImageReceive, ImageReceive, v1::ImageReceiveResult
    );
    command!(
        /// `env.destroy` → `{destroyed}`.
        destroy, v1::EnvDestroy, EnvDestroy, v1::DestroyResult
    );
}
