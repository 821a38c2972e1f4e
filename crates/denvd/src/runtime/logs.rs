//! `env.logs`: a service container's output as the engine keeps it (the engine's logs
//! API, like `docker logs`; `host.proto` `EnvLogs`).

use super::{container_name, Result, Runtime, RuntimeError};
use bollard::container::{LogOutput, LogsOptions as EngineLogs};
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Notify};

/// What to read ([`Runtime::logs`]).
#[derive(Debug, Clone, Default)]
pub struct LogsOptions {
    /// Lines of backlog (0: none).
    pub tail: u32,
    /// Keep reading new lines after the backlog.
    pub follow: bool,
    /// The longest follow (zero: no limit but the others).
    pub follow_for: Duration,
    /// Each line starts with the engine's RFC 3339 time and a space.
    pub timestamps: bool,
    /// Stop after this many bytes of output (0: 8 MiB).
    pub max_bytes: u64,
}

/// How a [`Runtime::logs`] read ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogsSummary {
    /// Pieces sent (one per line the engine recorded; a line over 16 KiB is several).
    pub lines: u64,
    /// Bytes sent.
    pub bytes: u64,
    /// The output reached `max_bytes` and the rest was not read.
    pub truncated: bool,
}

/// `max_bytes` when a request leaves it 0: 8 MiB (defined in `denv_proto::contract`).
pub use denv_proto::contract::LOGS_MAX_BYTES as DEFAULT_MAX_BYTES;

impl Runtime {
    /// Sends `service`'s output to `out` as `(is_stderr, bytes)`, one engine record (a
    /// line, with its newline) each, in the engine's order: the last `tail` lines, then
    /// with `follow` new lines as they are written until the container stops, `cancel`
    /// is notified, `out` is closed, or `follow_for` passes. Stops at `max_bytes`
    /// (`truncated`). Works on a stopped or paused container. Error: `service "x" of
    /// env_… not found`, or the engine's.
    pub async fn logs(
        &self,
        env_id: &str,
        service: &str,
        opts: LogsOptions,
        out: mpsc::Sender<(bool, Vec<u8>)>,
        cancel: Arc<Notify>,
    ) -> Result<LogsSummary> {
        let cname = container_name(env_id, service);
        if self.inspect(&cname).await?.is_none() {
            return Err(RuntimeError::NotFound(format!(
                "service {service:?} of {env_id} not found"
            )));
        }
        let max = if opts.max_bytes == 0 {
            DEFAULT_MAX_BYTES
        } else {
            opts.max_bytes
        };
        let mut summary = LogsSummary::default();
        if !opts.follow && opts.tail == 0 {
            return Ok(summary);
        }
        let mut s = self.docker().logs(
            &cname,
            Some(EngineLogs::<String> {
                stdout: true,
                stderr: true,
                follow: opts.follow,
                timestamps: opts.timestamps,
                tail: opts.tail.to_string(),
                ..Default::default()
            }),
        );
        let deadline = if opts.follow && !opts.follow_for.is_zero() {
            tokio::time::Instant::now() + opts.follow_for
        } else {
            tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600)
        };
        loop {
            let item = tokio::select! {
                item = s.next() => item,
                _ = cancel.notified() => break,
                _ = out.closed() => break,
                _ = tokio::time::sleep_until(deadline) => break,
            };
            let (is_err, bytes) = match item {
                None => break,
                Some(Err(e)) => {
                    return Err(RuntimeError::docker(
                        format!("logs of service {service:?}"),
                        e,
                    ))
                }
                Some(Ok(LogOutput::StdErr { message })) => (true, message),
                Some(Ok(LogOutput::StdIn { .. })) => continue,
                Some(Ok(LogOutput::StdOut { message } | LogOutput::Console { message })) => {
                    (false, message)
                }
            };
            let room = max - summary.bytes;
            let mut bytes = bytes.to_vec();
            if bytes.len() as u64 > room {
                bytes.truncate(room as usize);
                summary.truncated = true;
            }
            if !bytes.is_empty() {
                summary.bytes += bytes.len() as u64;
                summary.lines += 1;
                if out.send((is_err, bytes)).await.is_err() {
                    break;
                }
            }
            if summary.truncated || summary.bytes >= max {
                summary.truncated = true;
                break;
            }
        }
        Ok(summary)
    }
}
