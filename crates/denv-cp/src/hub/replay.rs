//! Command ids a deployment runner can run again (spec `15-ref-protocol.md`,
//! "Idempotency"; `docs/reference/deployments.md`, "Restarts").
//!
//! Inside [`scope`], every command [`super::Hub`] sends gets the id
//! `cmd_<deployment id>_<n>`, `n` counting from 1 in the order the runner sends them,
//! instead of a fresh ULID. A runner resumed after a control-plane restart sends the
//! same commands in the same order, so each gets the id it had before and
//! [`super::Hub::send`] answers it from what is known of that id:
//!
//! - a row with a result (`done`/`failed`): that result, and nothing goes to the host;
//! - a row without one (`sent`/`acked`): the command goes to the host again under the
//!   same id; the sidecar's journal answers a command it already ran from its record and
//!   joins one that is still running, so nothing runs twice;
//! - no row: sent as any command.
//!
//! A row under the id that names another host, environment or kind means the runner
//! took another path than before: [`super::HubError::Protocol`] (`resumed deployment
//! diverged: …`), never a second command under one id.
//!
//! Commands sent from tasks the runner spawns are outside the scope and get fresh ids
//! (the runner sends its commands one after another, so the order is its own).

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};

struct Keys {
    deployment_id: String,
    next: AtomicU32,
}

tokio::task_local! {
    static KEYS: Keys;
}

/// Runs `fut` with commands keyed by `deployment_id` (see the module docs).
pub async fn scope<F: Future>(deployment_id: &str, fut: F) -> F::Output {
    let keys = Keys {
        deployment_id: deployment_id.to_string(),
        next: AtomicU32::new(1),
    };
    KEYS.scope(keys, fut).await
}

/// The next keyed command id, when the caller runs inside [`scope`].
pub(crate) fn next_id() -> Option<String> {
    KEYS.try_with(|k| {
        let n = k.next.fetch_add(1, Ordering::Relaxed);
        format!("cmd_{}_{n}", k.deployment_id)
    })
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ids_count_per_scope_and_are_absent_outside() {
        assert_eq!(next_id(), None);
        let ids = scope("dep_01ABC", async { [next_id(), next_id(), next_id()] }).await;
        assert_eq!(
            ids,
            [
                Some("cmd_dep_01ABC_1".to_string()),
                Some("cmd_dep_01ABC_2".to_string()),
                Some("cmd_dep_01ABC_3".to_string())
            ]
        );
        // A second run of the same deployment counts from 1 again.
        let again = scope("dep_01ABC", async { next_id() }).await;
        assert_eq!(again.as_deref(), Some("cmd_dep_01ABC_1"));
        // A spawned task is outside the scope.
        let spawned = scope("dep_01ABC", async {
            tokio::spawn(async { next_id() }).await.unwrap()
        })
        .await;
        assert_eq!(spawned, None);
    }
}
