//! The idempotent command journal (spec `15-ref-protocol.md`, "Idempotency";
//! `11-ref-denvd.md`, "Execute commands").
//!
//! - Every result is written to `<data>/commands/<id>.json` (the JSON of the
//!   `CommandResult` message; temp file + fsync + rename) BEFORE it is sent.
//! - A command id already in the journal is answered from the file without running.
//! - A command id that is still running is not started again: the repeat waits for the
//!   first run and answers with its journalled result.
//! - Per environment a read/write lock ([`Access`]): `env.exec`, `env.get` and `env.put`
//!   share it, so an agent's parallel tool calls run together; every other command on
//!   the environment (`env.create`, `env.snapshot`, `env.rollback`, `env.destroy`,
//!   `verify.*`, the new environment of `env.fork`) holds it alone, so it waits for the
//!   running execs and file transfers and none start while it runs. `env.fork` also
//!   holds its source environment's lock shared (a destroy or rollback of the source
//!   waits for the clone; forks of one source run together). Different environments,
//!   and commands without an environment (`host.report`), run in parallel. `env.logs`
//!   takes no lock: it only reads what the engine keeps, and a follow that lasts hours
//!   must not hold a destroy back (the destroy ends it by removing the container).
//!
//! - Results are kept for [`RETENTION`] (7 days), then deleted ([`Journal::prune`], at
//!   start and every hour).
//!
//! What runs is behind [`Executor`], so the journal is tested without Docker.

use denv_proto::v1::{command_result, Command, CommandResult, HostErrorCode};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// How long journalled results are kept: 7 days.
pub const RETENTION: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Progress lines of one command (forwarded as `progress` frames).
pub type Progress = tokio::sync::mpsc::UnboundedSender<String>;

/// Why a command failed: the result's `code` and `error` (`ok: false`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CommandError {
    /// What kind of failure it is (the control plane picks its caller's status by it).
    pub code: HostErrorCode,
    /// The message the caller sees.
    pub message: String,
}

impl CommandError {
    /// A failure of `code` with `message`.
    pub fn new(code: HostErrorCode, message: impl Into<String>) -> Self {
        CommandError {
            code,
            message: message.into(),
        }
    }

    /// A malformed command (`INVALID`).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(HostErrorCode::Invalid, message)
    }
}

/// A runtime error keeps its kind ([`crate::runtime::RuntimeError::code`]).
impl From<crate::runtime::RuntimeError> for CommandError {
    fn from(e: crate::runtime::RuntimeError) -> Self {
        Self::new(e.code(), e.to_string())
    }
}

/// A bare message is the host's own failure (`FAILED`).
impl From<String> for CommandError {
    fn from(message: String) -> Self {
        Self::new(HostErrorCode::Failed, message)
    }
}

/// A bare message is the host's own failure (`FAILED`).
impl From<&str> for CommandError {
    fn from(message: &str) -> Self {
        Self::new(HostErrorCode::Failed, message)
    }
}

/// Runs one command. `Err` is the result's `code` and `error` (`ok: false`).
#[tonic::async_trait]
pub trait Executor: Send + Sync {
    /// The machine's capabilities (sent in `hello`).
    async fn capabilities(&self) -> denv_proto::v1::Capabilities;

    /// Executes `cmd`, sending progress lines to `progress`.
    async fn execute(
        &self,
        cmd: &Command,
        progress: &Progress,
    ) -> Result<command_result::Payload, CommandError>;

    /// The next unsolicited host event to send (`event` frames, e.g. `env.failed`).
    /// Must be cancel-safe (the session polls it in a `select!`). The default never
    /// yields one.
    async fn next_event(&self) -> denv_proto::v1::HostEvent {
        std::future::pending().await
    }

    /// The `host.report` event sent after every welcome (what this host holds, so the
    /// control plane can answer with what must go). The default sends none.
    async fn report(&self) -> Option<denv_proto::v1::HostEvent> {
        None
    }

    /// The host's figures for the next heartbeat (what it has free, what its
    /// environments hold). The default sends none.
    async fn load(&self) -> Option<denv_proto::v1::HostLoad> {
        None
    }
}

/// A journal error (the result could not be stored).
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// File system error with the path.
    #[error("journal {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A command id that cannot be a file name.
    #[error("journal: invalid command id {0:?}")]
    BadId(String),
}

/// The journal over `<data>/commands/`.
pub struct Journal {
    dir: PathBuf,
    running: Mutex<HashMap<String, watch::Receiver<bool>>>,
    env_locks: Mutex<HashMap<String, Arc<tokio::sync::RwLock<()>>>>,
}

/// How a command holds its environment's lock (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Together with other shared holders: `env.exec`, `env.get`, `env.put`,
    /// `snapshot.send` and `image.send` (they only make an offer).
    Shared,
    /// Alone: every other command that names an environment.
    Exclusive,
    /// No lock at all: `env.logs`.
    Unlocked,
}

impl Access {
    /// The access `cmd` needs to its `env_id`.
    pub fn of(cmd: &Command) -> Access {
        use denv_proto::v1::command::Payload as P;
        match cmd.payload {
            Some(
                P::EnvExec(_) | P::EnvGet(_) | P::EnvPut(_) | P::SnapshotSend(_) | P::ImageSend(_),
            ) => Access::Shared,
            Some(P::EnvLogs(_) | P::CommandCancel(_)) => Access::Unlocked,
            _ => Access::Exclusive,
        }
    }
}

/// A held environment lock.
#[allow(dead_code)] // held for its Drop
enum Held {
    Shared(tokio::sync::OwnedRwLockReadGuard<()>),
    Exclusive(tokio::sync::OwnedRwLockWriteGuard<()>),
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("dir", &self.dir).finish()
    }
}

/// Whether a command id is safe as a file name (`cmd_<ulid>` and similar).
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// How the journal answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The command ran now.
    Ran(CommandResult),
    /// Answered from the journal (it had completed before).
    Replayed(CommandResult),
    /// It was running; this is the first run's result.
    Joined(CommandResult),
}

impl Outcome {
    /// The result, however obtained.
    pub fn result(&self) -> &CommandResult {
        match self {
            Outcome::Ran(r) | Outcome::Replayed(r) | Outcome::Joined(r) => r,
        }
    }

    /// The result, owned.
    pub fn into_result(self) -> CommandResult {
        match self {
            Outcome::Ran(r) | Outcome::Replayed(r) | Outcome::Joined(r) => r,
        }
    }
}

impl Journal {
    /// Opens (creating) `<data_dir>/commands`.
    pub fn open(data_dir: &Path) -> Result<Journal, JournalError> {
        let dir = data_dir.join("commands");
        std::fs::create_dir_all(&dir).map_err(|source| JournalError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        Ok(Journal {
            dir,
            running: Mutex::new(HashMap::new()),
            env_locks: Mutex::new(HashMap::new()),
        })
    }

    /// Deletes journalled results last written more than `older_than` ago (the control
    /// plane re-sends a command only while its caller waits, minutes at most, so a week
    /// is far past any repeat). Returns how many were deleted; unreadable entries are
    /// skipped.
    pub fn prune(&self, older_than: std::time::Duration) -> usize {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let now = std::time::SystemTime::now();
        let mut n = 0;
        for e in dir.flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age > older_than);
            let ours = e.file_name().to_str().is_some_and(|n| n.ends_with(".json"));
            if old && ours && std::fs::remove_file(e.path()).is_ok() {
                n += 1;
            }
        }
        n
    }

    /// `<data>/commands/<id>.json`.
    pub fn path_of(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// The stored result of a command id, if it completed before.
    pub fn lookup(&self, id: &str) -> Option<CommandResult> {
        if !valid_id(id) {
            return None;
        }
        let b = std::fs::read(self.path_of(id)).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&b).ok()?;
        denv_proto::json::from_json(v).ok()
    }

    /// Stores a result atomically (temp file, fsync, rename).
    pub fn record(&self, res: &CommandResult) -> Result<(), JournalError> {
        if !valid_id(&res.command_id) {
            return Err(JournalError::BadId(res.command_id.clone()));
        }
        let path = self.path_of(&res.command_id);
        let body = serde_json::to_vec(&denv_proto::json::to_json(res)).unwrap_or_default();
        crate::config::write_private(&path, &body).map_err(|source| JournalError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    fn env_lock(&self, env_id: &str) -> Arc<tokio::sync::RwLock<()>> {
        self.env_locks
            .lock()
            .expect("journal env locks poisoned")
            .entry(env_id.to_string())
            .or_default()
            .clone()
    }

    async fn hold(&self, env_id: &str, access: Access) -> Option<Held> {
        let l = self.env_lock(env_id);
        match access {
            Access::Shared => Some(Held::Shared(l.read_owned().await)),
            Access::Exclusive => Some(Held::Exclusive(l.write_owned().await)),
            Access::Unlocked => None,
        }
    }

    /// Answers `cmd`: from the journal when it completed before, by waiting for the
    /// running execution when it is running, else by running it (holding the
    /// environment's lock as [`Access::of`] says) and journalling the result before returning it. An invalid command
    /// id is answered `ok: false` without running.
    pub async fn run(&self, cmd: &Command, exec: &dyn Executor, progress: &Progress) -> Outcome {
        let id = cmd.command_id.clone();
        if !valid_id(&id) {
            return Outcome::Ran(failed(
                &id,
                CommandError::invalid(format!("invalid command id {id:?}")),
            ));
        }
        if let Some(r) = self.lookup(&id) {
            return Outcome::Replayed(r);
        }
        // Register as running, or join the running execution.
        let (done_tx, joined) = {
            let mut running = self.running.lock().expect("journal running poisoned");
            match running.get(&id) {
                Some(rx) => (None, Some(rx.clone())),
                None => {
                    let (tx, rx) = watch::channel(false);
                    running.insert(id.clone(), rx);
                    (Some(tx), None)
                }
            }
        };
        if let Some(mut rx) = joined {
            let finished = rx.wait_for(|d| *d).await.is_ok();
            return Outcome::Joined(match self.lookup(&id) {
                Some(r) => r,
                None if finished => failed(&id, "command finished without a journalled result"),
                None => failed(&id, "command was interrupted"),
            });
        }
        let done_tx = done_tx.expect("registered as running");
        // A result may have landed between the lookup and the registration.
        if let Some(r) = self.lookup(&id) {
            self.finish(&id, done_tx);
            return Outcome::Replayed(r);
        }

        // The fork's source first (shared), then the addressed environment.
        let source = match &cmd.payload {
            Some(denv_proto::v1::command::Payload::EnvFork(f))
                if !f.from_env.is_empty() && f.from_env != cmd.env_id =>
            {
                self.hold(&f.from_env, Access::Shared).await
            }
            _ => None,
        };
        let guard = if cmd.env_id.is_empty() {
            None
        } else {
            self.hold(&cmd.env_id, Access::of(cmd)).await
        };
        let res = match exec.execute(cmd, progress).await {
            Ok(p) => CommandResult {
                command_id: id.clone(),
                ok: true,
                payload: Some(p),
                ..Default::default()
            },
            Err(e) => failed(&id, e),
        };
        drop(guard);
        drop(source);
        if let Err(e) = self.record(&res) {
            tracing::error!(command_id = %id, error = %e, "journal write failed");
        }
        self.finish(&id, done_tx);
        Outcome::Ran(res)
    }

    fn finish(&self, id: &str, done: watch::Sender<bool>) {
        self.running
            .lock()
            .expect("journal running poisoned")
            .remove(id);
        let _ = done.send(true);
    }
}

/// An `ok: false` result.
pub fn failed(id: &str, error: impl Into<CommandError>) -> CommandResult {
    let e = error.into();
    CommandResult {
        command_id: id.to_string(),
        ok: false,
        error: e.message,
        code: e.code.into(),
        payload: None,
    }
}

#[cfg(test)]
mod retention_tests {
    use super::*;

    #[test]
    fn results_older_than_the_retention_are_deleted() {
        let t = tempfile::tempdir().unwrap();
        let j = Journal::open(t.path()).unwrap();
        for id in ["cmd_old", "cmd_new"] {
            j.record(&failed(id, "x")).unwrap();
        }
        let week_ago =
            std::time::SystemTime::now() - RETENTION - std::time::Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(j.path_of("cmd_old"))
            .unwrap()
            .set_modified(week_ago)
            .unwrap();
        std::fs::write(t.path().join("commands/notes.txt"), "kept").unwrap();
        assert_eq!(j.prune(RETENTION), 1);
        assert!(j.lookup("cmd_old").is_none());
        assert!(j.lookup("cmd_new").is_some());
        assert!(t.path().join("commands/notes.txt").exists());
    }
}
