//! What each connected host has room for, as placement reads it
//! ([`crate::orchestrator::placement`]): the `load` of its latest heartbeat (`HostLoad`
//! of `host.proto`), and the claims of the environments this control plane placed on it
//! whose deploys are still running (their caps, not yet in any report: a group of new
//! environments then spreads over hosts instead of piling on the one that reported the
//! most room). Kept in memory: a host's figures go with its stream (forgotten when it
//! becomes unreachable, sent again right after its next welcome). In replica mode the
//! hosts other replicas hold report through the store (`hosts.load`, read with each
//! replica beat, [`crate::replica`]); claims stay per replica (a deploy placed by
//! another replica counts once that host's next report does).

use super::Hub;
use denv_proto::v1::HostLoad;
use std::collections::HashMap;

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

impl Loads {
    fn sum(&self, host_id: &str) -> Claimed {
        let mut sum = Claimed::default();
        for c in self
            .claims
            .get(host_id)
            .into_iter()
            .flat_map(|m| m.values())
        {
            sum.add(c);
        }
        sum
    }

    fn insert(&mut self, host_id: &str, what: Claimed) -> u64 {
        self.next_claim += 1;
        let id = self.next_claim;
        self.claims
            .entry(host_id.to_string())
            .or_default()
            .insert(id, what);
        id
    }
}

/// One host's figures as placement reads them: its latest report and its claims.
pub type Figures = (Option<HostLoad>, Claimed);

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
        let local = self.loads().reports.get(host_id).copied();
        local.or_else(|| self.remote_load(host_id))
    }

    /// Replica mode: the load another replica recorded for a host it holds.
    fn remote_load(&self, host_id: &str) -> Option<HostLoad> {
        self.replica()?.remote(host_id)?.load
    }

    /// What the open claims on the host add up to.
    pub fn claimed(&self, host_id: &str) -> Claimed {
        self.loads().sum(host_id)
    }

    /// Counts `what` against the host until the returned [`Claim`] is dropped.
    pub fn claim(&self, host_id: &str, what: Claimed) -> Claim {
        let id = self.loads().insert(host_id, what);
        Claim {
            hub: self.clone(),
            host_id: host_id.to_string(),
            id,
        }
    }

    /// Hands `pick` the [`Figures`] of each of `host_ids` as they are now and records the
    /// claim it answers (an index into `host_ids`, what to count), all under one lock:
    /// placements made at the same moment each see the claims of the others.
    pub fn claim_by<T>(
        &self,
        host_ids: &[String],
        pick: impl FnOnce(&[Figures]) -> (T, Option<(usize, Claimed)>),
    ) -> (T, Option<Claim>) {
        let remote: Vec<Option<HostLoad>> = host_ids.iter().map(|h| self.remote_load(h)).collect();
        let mut l = self.loads();
        let figures: Vec<Figures> = host_ids
            .iter()
            .zip(remote)
            .map(|(h, r)| (l.reports.get(h).copied().or(r), l.sum(h)))
            .collect();
        let (out, chosen) = pick(&figures);
        let claim = chosen.and_then(|(i, what)| {
            let host_id = host_ids.get(i)?;
            let id = l.insert(host_id, what);
            Some(Claim {
                hub: self.clone(),
                host_id: host_id.clone(),
                id,
            })
        });
        drop(l);
        (out, claim)
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
        hub.record_load("host_a", l);
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

        // claim_by sees the figures and records the claim picked, in one step.
        hub.record_load("host_b", HostLoad::default());
        let ids = vec!["host_a".to_string(), "host_b".to_string()];
        let held = hub.claim("host_a", one);
        let (seen, claim) = hub.claim_by(&ids, |f| (f.to_vec(), Some((1, one))));
        assert_eq!(
            seen,
            vec![(None, one), (Some(HostLoad::default()), Claimed::default())]
        );
        assert_eq!(hub.claimed("host_b"), one);
        drop(claim);
        assert_eq!(hub.claimed("host_b"), Claimed::default());
        let (_, none) = hub.claim_by(&ids, |_| ((), None));
        assert!(none.is_none());
        drop(held);
    }
}
