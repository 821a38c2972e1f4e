//! Deployment leases across replicas (replica mode, [`crate::replica`]).
//!
//! - A deployment started on a replica gets its lease (`leases` row: deployment,
//!   environment, replica, `expires_at`) before its rows are written; its runner renews
//!   it every third of `DENV_LEASE_TTL` (15 s) and stops at once when a renewal fails
//!   or finds the lease gone to another replica (`keep`). The lease is deleted when
//!   the runner ends, and all of a replica's leases after a SIGTERM's drain.
//! - Every replica looks for unfinished deployments without a live lease every third of
//!   the TTL ([`crate::orchestrator::Orchestrator::spawn_takeover`]) and takes each
//!   with [`take`] (one statement: of two replicas, one wins), then resumes it as a
//!   restart does (same command ids, [`crate::hub::replay`]).
//! - One deployment of an environment runs at a time across replicas: before it runs,
//!   a deployment's lease must become the environment's active one ([`take_turn`]);
//!   within a replica the environment lock keeps arrival order, across replicas the
//!   order between waiting deployments is whichever looks first.

pub use crate::replica::leases::{release, release_all, take, take_turn};
use crate::replica::{leases, Replica};
use std::sync::Mutex;

/// Renews the leases listed in `held` every third of the TTL; returns (why) as soon as
/// one is not this replica's any more or the store cannot renew it.
pub(crate) async fn keep(rep: &Replica, held: &Mutex<Vec<String>>) -> String {
    let every = rep.lease_ttl / 3;
    loop {
        tokio::time::sleep(every).await;
        let ids = held.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for id in ids {
            match leases::renew(rep, &id).await {
                Ok(true) => {}
                Ok(false) => {
                    // Released by the runner between the copy and the renewal?
                    let still = held.lock().unwrap_or_else(|e| e.into_inner()).contains(&id);
                    if still {
                        return format!("the lease of {id} is another replica's");
                    }
                }
                Err(e) => return format!("renewing the lease of {id}: {e}"),
            }
        }
    }
}
