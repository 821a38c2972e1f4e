//! What each connected host has room for, as placement reads it
//! ([`crate::orchestrator::placement`]): the `load` of its latest heartbeat (`HostLoad`
//! of `host.proto`), and the claims of the environments this control plane placed on it
//! whose deploys are still running (their caps, not yet in any report: a group of new
//! environments then spreads over hosts instead of piling on the one that reported the
//! most room). Kept in memory: a host's figures go with its stream (forgotten when it
//! becomes unreachable, sent again right after its next welcome).

use super::Hub;
use denv_proto::v1::HostLoad;
use std::collections::HashMap;
use std::sync::Arc;

/// What claims on one host add up to ([`Hub::claimed`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Claimed {
    /// Environments.
    pub environments: u32,
    /// CPU caps summed.
    pub cpus: f64,
    /// Memory caps summed, MiB.
    pub memory_mb: u64,
    /// Disk quotas summed, MiB.
    pub disk_mb: u64,
}

impl Claimed {
    fn add(&mut self, o: &Claimed) {
        self.environments += o.environments;
        self.cpus += o.cpus;
        self.memory_mb += o.memory_mb;
        self.disk_mb += o.disk_mb;
    }
}

/// The hub's table: latest report and open claims per host.
#[derive(Default)]
pub(crate) struct Loads {
    reports: HashMap<String, HostLoad>,
    claims: HashMap<String, HashMap<u64, Claimed>>,
    next_claim: u64,
}

/// One environment's caps counted against a host until this is dropped (its deploy
/// ended: by then the host's own reports count what the environment uses).
pub struct Claim {
    hub: Hub,
    host_id: String,
    id: u64,
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim")
            .field("host_id", &self.host_id)
            .field("id", &self.id)
            .finish()
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut l = self.hub.loads();
        if let Some(m) = l.claims.get_mut(&self.host_id) {
            m.remove(&self.id);
            if m.is_empty() {
                l.claims.remove(&self.host_id);
            }
        }
    }
}

impl Hub {
    fn loads(&self) -> std::sync::MutexGuard<'_, Loads> {
        self.inner.loads.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `load` as the host's latest report.
    pub(crate) fn record_load(&self, host_id: &str, load: HostLoad) {
        self.loads().reports.insert(host_id.to_string(), load);
    }

    /// Forgets the host's report (its stream ended).
    pub(crate) fn forget_load(&self, host_id: &str) {
        self.loads().reports.remove(host_id);
    }

    /// The host's latest report; `None` before its first heartbeat with one (or from a
    /// `denvd` older than the report).
    pub fn load(&self, host_id: &str) -> Option<HostLoad> {
        self.loads().reports.get(host_id).cloned()
    }

    /// What the open claims on the host add up to.
    pub fn claimed(&self, host_id: &str) -> Claimed {
        let mut sum = Claimed::default();
        if let Some(m) = self.loads().claims.get(host_id) {
            for c in m.values() {
                sum.add(c);
            }
        }
        sum
    }

    /// Counts `what` against the host until the returned [`Claim`] is dropped.
    pub fn claim(&self, host_id: &str, what: Claimed) -> Claim {
        let id = {
            let mut l = self.loads();
            l.next_claim += 1;
            let id = l.next_claim;
            l.claims
                .entry(host_id.to_string())
                .or_default()
                .insert(id, what);
            id
        };
        Claim {
            hub: Hub {
                inner: Arc::clone(&self.inner),
            },
            host_id: host_id.to_string(),
            id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reports_are_kept_and_claims_count_until_dropped() {
        let db = sea_orm::Database::connect("sqlite::memory:").await.unwrap();
        let hub = Hub::new(db);
        assert_eq!(hub.load("host_a"), None);
        let l = HostLoad {
            memory_free_mb: 1000,
            ..Default::default()
        };
        hub.record_load("host_a", l.clone());
        assert_eq!(hub.load("host_a"), Some(l));
        hub.forget_load("host_a");
        assert_eq!(hub.load("host_a"), None);

        let one = Claimed {
            environments: 1,
            cpus: 2.0,
            memory_mb: 4096,
            disk_mb: 10240,
        };
        let a = hub.claim("host_a", one);
        let b = hub.claim("host_a", one);
        let c = hub.claim("host_b", one);
        assert_eq!(
            hub.claimed("host_a"),
            Claimed {
                environments: 2,
                cpus: 4.0,
                memory_mb: 8192,
                disk_mb: 20480
            }
        );
        drop(a);
        assert_eq!(hub.claimed("host_a"), one);
        drop(b);
        assert_eq!(hub.claimed("host_a"), Claimed::default());
        assert_eq!(hub.claimed("host_b"), one);
        drop(c);
        assert!(hub.loads().claims.is_empty());
    }
}
