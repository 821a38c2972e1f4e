//! `EnvironmentService.Logs` (`GET /v1/envs/{env}/logs`; our manual's
//! `docs/reference/rest-api.md`, "Logs"): the container logs of an environment's
//! services, one [`v1::LogEntry`] per line.
//!
//! One `env.logs` host command per service runs on the environment's host; every line
//! it sends up is attributed to that command's service here, by the command it came
//! with and never by what the line says, so a service (an agent) cannot write lines
//! that pass for another service's. Lines are split at `\n` per service and stream
//! (a piece without a newline waits for the rest; more than [`MAX_LINE`] bytes are sent
//! as a line of their own).
//!
//! Bounds: `tail` lines of backlog per service (default [`DEFAULT_TAIL`], at most
//! [`MAX_TAIL`]), at most [`MAX_BYTES`] of output per service per call (then an entry
//! with `truncated` for that service), and a follow ends after [`FOLLOW_SEC`]. A follow
//! whose caller leaves is cancelled on the host ([`crate::hub::Hub::send_cancellable`]).

use crate::error::ApiError;
use crate::orchestrator::link::Addr;
use crate::orchestrator::Orchestrator;
use denv_proto::v1;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::Status;

/// Backlog lines per service when `tail` is 0.
pub const DEFAULT_TAIL: u32 = 100;
/// The largest `tail`.
pub const MAX_TAIL: i32 = 10_000;
/// Output per service per call before it is cut: 8 MiB (defined in `denv_proto::contract`).
pub use denv_proto::contract::LOGS_MAX_BYTES as MAX_BYTES;
/// The longest follow: 24 h.
pub const FOLLOW_SEC: u32 = 24 * 3600;
/// A line longer than this (bytes) is passed on in pieces of this size.
pub const MAX_LINE: usize = 64 << 10;
/// How long a call without `follow` may take.
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// The `LogEntry` stream.
pub type LogStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<v1::LogEntry, Status>> + Send>>;

/// The backlog length of a request's `tail`: 0 → [`DEFAULT_TAIL`], -1 → none, 1..=
/// [`MAX_TAIL`] as given; anything else is `BadRequest`.
pub fn tail_of(tail: i32) -> Result<u32, ApiError> {
    match tail {
        0 => Ok(DEFAULT_TAIL),
        -1 => Ok(0),
        1..=MAX_TAIL => Ok(tail as u32),
        t => Err(ApiError::BadRequest(format!(
            "invalid tail {t}: use 1..{MAX_TAIL} lines, 0 for the default {DEFAULT_TAIL}, or -1 for none"
        ))),
    }
}

/// Validates `r` and starts the host commands; the stream ends after every service's
/// command ended (a failure is a last error item naming the service, with the host error's status).
pub async fn start(
    orch: &Orchestrator,
    team_id: &str,
    env: &crate::domain::Environment,
    r: v1::LogsRequest,
) -> Result<LogStream, ApiError> {
    let tail = tail_of(r.tail)?;
    let (to, services) = orch.prepare_logs(team_id, env, r.service.trim()).await?;
    if !r.follow && tail == 0 {
        return Ok(Box::pin(futures::stream::empty::<
            Result<v1::LogEntry, Status>,
        >()));
    }
    let (tx, rx) = mpsc::channel::<Result<v1::LogEntry, Status>>(256);
    let link = orch.link().clone();
    tokio::spawn(run(link, to, services, r.follow, r.timestamps, tail, tx));
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

/// One service's pending partial lines, by stream.
#[derive(Default)]
struct Partial {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Splits `bytes` into complete lines (appended to `buf` first); what follows the last
/// newline stays in `buf` (cut into [`MAX_LINE`] pieces when it grows past that).
pub fn split_lines(buf: &mut Vec<u8>, bytes: &[u8]) -> Vec<Vec<u8>> {
    buf.extend_from_slice(bytes);
    let mut out = Vec::new();
    while let Some(i) = buf.iter().position(|&b| b == b'\n') {
        let mut line: Vec<u8> = buf.drain(..=i).collect();
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        out.push(line);
    }
    while buf.len() > MAX_LINE {
        out.push(buf.drain(..MAX_LINE).collect());
    }
    out
}

/// The entry of one line: with `timestamps`, the engine's RFC 3339 time before the
/// first space becomes `timestamp` (a line whose first word is not one is kept whole).
pub fn entry(service: &str, stream: &str, line: &[u8], timestamps: bool) -> v1::LogEntry {
    let text = String::from_utf8_lossy(line);
    let (timestamp, line) = match (timestamps, text.split_once(' ')) {
        (true, Some((ts, rest))) if chrono::DateTime::parse_from_rfc3339(ts).is_ok() => {
            (ts.to_string(), rest.to_string())
        }
        _ => (String::new(), text.into_owned()),
    };
    v1::LogEntry {
        service: service.to_string(),
        stream: stream.to_string(),
        line,
        timestamp,
        truncated: false,
    }
}

/// What a service's task hands the merger, in the order it happened.
enum Item {
    /// Output bytes of service `.0`.
    Out(usize, v1::Progress),
    /// Service `.0`'s command ended.
    Done(usize, Result<v1::LogsResult, crate::hub::HubError>),
}

async fn run(
    link: crate::orchestrator::link::Link,
    to: Addr,
    services: Vec<String>,
    follow: bool,
    timestamps: bool,
    tail: u32,
    tx: mpsc::Sender<Result<v1::LogEntry, Status>>,
) {
    // Every command's output goes to one channel, tagged with the index of its service
    // (the tag is ours: the host's frames are routed by command id).
    let (itx, mut irx) = mpsc::unbounded_channel::<Item>();
    let timeout = if follow {
        Duration::from_secs(u64::from(FOLLOW_SEC)) + Duration::from_secs(60)
    } else {
        READ_TIMEOUT
    };
    // Dropping `tasks` (the caller left) drops the commands' waiters, which cancels
    // them on the host.
    let mut tasks = tokio::task::JoinSet::new();
    for (i, service) in services.iter().enumerate() {
        let payload = v1::EnvLogs {
            service: service.clone(),
            tail,
            follow,
            follow_sec: FOLLOW_SEC,
            timestamps,
            max_bytes: MAX_BYTES,
        };
        let link = link.clone();
        let to = to.clone();
        let itx = itx.clone();
        tasks.spawn(async move {
            let (otx, mut orx) = mpsc::unbounded_channel::<v1::Progress>();
            let call = link.logs(&to, payload, timeout, otx);
            tokio::pin!(call);
            loop {
                tokio::select! {
                    Some(p) = orx.recv() => {
                        if itx.send(Item::Out(i, p)).is_err() {
                            return;
                        }
                    }
                    r = &mut call => {
                        // Output frames are routed before the result resolves.
                        while let Ok(p) = orx.try_recv() {
                            let _ = itx.send(Item::Out(i, p));
                        }
                        let _ = itx.send(Item::Done(i, r));
                        return;
                    }
                }
            }
        });
    }
    drop(itx);
    let mut partial: HashMap<usize, Partial> = HashMap::new();
    let mut open = services.len();
    let mut out: Vec<Result<v1::LogEntry, Status>> = Vec::new();
    loop {
        let item = tokio::select! {
            _ = tx.closed() => return,
            item = irx.recv() => match item {
                Some(item) => item,
                None => return,
            },
        };
        let mut last = false;
        match item {
            Item::Out(i, p) => {
                let part = partial.entry(i).or_default();
                for (stream, bytes, buf) in [
                    ("stdout", &p.stdout, &mut part.stdout),
                    ("stderr", &p.stderr, &mut part.stderr),
                ] {
                    for line in split_lines(buf, bytes) {
                        out.push(Ok(entry(&services[i], stream, &line, timestamps)));
                    }
                }
            }
            Item::Done(i, r) => {
                if let Some(part) = partial.remove(&i) {
                    for (stream, rest) in [("stdout", part.stdout), ("stderr", part.stderr)] {
                        if !rest.is_empty() {
                            out.push(Ok(entry(&services[i], stream, &rest, timestamps)));
                        }
                    }
                }
                match r {
                    Ok(res) if res.truncated => out.push(Ok(v1::LogEntry {
                        service: services[i].clone(),
                        truncated: true,
                        ..Default::default()
                    })),
                    Ok(_) => {}
                    Err(e) => {
                        let e = ApiError::from(e)
                            .prefixed(format_args!("logs of service {:?}", services[i]));
                        out.push(Err(Status::from(e)));
                        last = true;
                    }
                }
                open -= 1;
                last |= open == 0;
            }
        }
        for e in out.drain(..) {
            if tx.send(e).await.is_err() {
                return;
            }
        }
        if last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_at_newlines_and_partials_wait() {
        let mut buf = Vec::new();
        assert_eq!(split_lines(&mut buf, b"a\nb"), vec![b"a".to_vec()]);
        assert_eq!(buf, b"b");
        assert_eq!(
            split_lines(&mut buf, b"c\r\n\nd\n"),
            vec![b"bc".to_vec(), b"".to_vec(), b"d".to_vec()]
        );
        assert!(buf.is_empty());
        let long = vec![b'x'; MAX_LINE * 2 + 5];
        let out = split_lines(&mut buf, &long);
        assert_eq!(out.len(), 2);
        assert_eq!(buf.len(), 5);
    }

    #[test]
    fn timestamps_are_taken_only_from_the_first_word() {
        let e = entry(
            "web",
            "stdout",
            b"2026-12-01T10:00:00.123456789Z hello world",
            true,
        );
        assert_eq!(e.timestamp, "2026-12-01T10:00:00.123456789Z");
        assert_eq!(e.line, "hello world");
        let e = entry("web", "stdout", b"not-a-time hello", true);
        assert_eq!(e.timestamp, "");
        assert_eq!(e.line, "not-a-time hello");
        let e = entry("web", "stderr", b"2026-12-01T10:00:00Z x", false);
        assert_eq!(e.timestamp, "");
        assert_eq!(e.line, "2026-12-01T10:00:00Z x");
        assert_eq!(e.stream, "stderr");
        let e = entry("web", "stdout", b"\xff\xfeok", false);
        assert_eq!(e.line, "\u{fffd}\u{fffd}ok");
    }

    #[test]
    fn tail_bounds() {
        assert_eq!(tail_of(0).unwrap(), DEFAULT_TAIL);
        assert_eq!(tail_of(-1).unwrap(), 0);
        assert_eq!(tail_of(7).unwrap(), 7);
        assert_eq!(tail_of(MAX_TAIL).unwrap(), MAX_TAIL as u32);
        assert!(tail_of(MAX_TAIL + 1).is_err());
        assert!(tail_of(-2).is_err());
    }
}
