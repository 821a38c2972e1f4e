//! Several `denv-cp` replicas on one PostgreSQL (`docs/explanation/replicas.md`).
//!
//! Replica mode is on with `-replica-url`/`DENV_REPLICA_URL` and `DENV_REPLICA_SECRET`
//! (PostgreSQL only). Each process then:
//!
//! - registers itself in `replicas` (`rep_<ulid>`, its URL) and beats every
//!   [`HEARTBEAT`] (2 s); a replica not seen for [`DEAD_AFTER`] (10 s) is dead;
//! - records on each host row which replica holds its stream (`hosts.replica_id`,
//!   written at hello, cleared when the stream ends if still its own) and the host's
//!   latest load (`hosts.load`), and keeps a copy of the hosts other live replicas hold
//!   ([`Replica::remote`], refreshed with every beat) so the hub's synchronous answers
//!   (`is_connected`, `connected_hosts`, `load`) cover every replica's hosts;
//! - sends a command for a host another replica holds through that replica
//!   ([`crate::hub`]'s relay, `proto/denv/v1/relay.proto`);
//! - runs each of its deployments under a lease ([`leases`]) and takes over the
//!   deployments whose lease expired ([`crate::orchestrator::Orchestrator::spawn_takeover`]).
//!
//! Times in `replicas` and `leases` are milliseconds on the database's clock, so the
//! replicas' clocks need not agree.

use denv_proto::v1::HostLoad;
use prost::Message;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Statement, Value};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// How often a replica records that it is alive (and refreshes [`Replica::remote`]).
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// A replica not seen for this long is dead: its host streams count as gone.
pub const DEAD_AFTER: Duration = Duration::from_secs(10);

/// The database's clock, milliseconds since the epoch (PostgreSQL).
pub(crate) const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// A host whose stream another live replica holds.
#[derive(Debug, Clone)]
pub struct Remote {
    /// The holding replica.
    pub replica_id: String,
    /// Where it is reached.
    pub url: String,
    /// The host's team.
    pub team_id: String,
    /// The host's latest load, as the holder recorded it.
    pub load: Option<HostLoad>,
}

/// This process as one replica: its identity, the shared secret, and what it knows of
/// the hosts the others hold.
pub struct Replica {
    /// `rep_<ulid>`, new at each start.
    pub id: String,
    /// The URL the other replicas reach this one at.
    pub url: String,
    secret: String,
    /// What an `https://` replica URL's certificate must chain to.
    trust: denv_client::transport::Trust,
    /// `DENV_LEASE_TTL`.
    pub lease_ttl: Duration,
    db: DatabaseConnection,
    remote: Mutex<HashMap<String, Remote>>,
    /// Set by [`Replica::leave`]: no more beats.
    left: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("id", &self.id)
            .field("url", &self.url)
            .field("lease_ttl", &self.lease_ttl)
            .finish()
    }
}

fn stmt(db: &DatabaseConnection, sql: &str, values: Vec<Value>) -> Statement {
    Statement::from_sql_and_values(db.get_database_backend(), sql, values)
}

/// A stored load: the `HostLoad` protobuf as base64 (`""`: none).
pub(crate) fn encode_load(l: &HostLoad) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(l.encode_to_vec())
}

fn decode_load(s: &str) -> Option<HostLoad> {
    use base64::Engine;
    if s.is_empty() {
        return None;
    }
    let b = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
    HostLoad::decode(b.as_slice()).ok()
}

impl Replica {
    /// A new replica identity over the store (not registered yet: [`Replica::register`]).
    /// `trust`: what the other replicas' `https://` certificates must chain to
    /// (`-replica-ca-file`; the default roots otherwise).
    pub fn new(
        db: DatabaseConnection,
        url: &str,
        secret: &str,
        trust: denv_client::transport::Trust,
        lease_ttl: Duration,
    ) -> Replica {
        Replica {
            id: crate::ids::new_id("rep"),
            url: url.to_string(),
            secret: secret.to_string(),
            trust,
            lease_ttl,
            db,
            remote: Mutex::new(HashMap::new()),
            left: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether `token` is the shared secret (constant time).
    pub fn secret_matches(&self, token: &str) -> bool {
        crate::ids::ct_eq(token, &self.secret)
    }

    /// A channel to another replica's `url`: h2c for `http://`, TLS checked against
    /// this replica's trust for `https://`. Errors name the URL.
    pub(crate) fn endpoint(&self, url: &str) -> Result<tonic::transport::Endpoint, String> {
        self.trust.endpoint(url).map_err(|e| e.to_string())
    }

    /// The shared secret (the bearer of this replica's relay calls).
    pub(crate) fn secret(&self) -> &str {
        &self.secret
    }

    pub(crate) fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    /// Inserts this replica's row.
    pub async fn register(&self) -> Result<(), DbErr> {
        let sql = format!(
            "INSERT INTO replicas (id, url, started_at, seen_at) VALUES ($1, $2, {NOW_MS}, {NOW_MS})"
        );
        self.db
            .execute(stmt(
                &self.db,
                &sql,
                vec![self.id.clone().into(), self.url.clone().into()],
            ))
            .await
            .map(|_| ())
    }

    /// Records that this replica is alive (its row is put back if it was removed), then
    /// refreshes the hosts the other live replicas hold.
    pub async fn beat(&self) -> Result<(), DbErr> {
        if self.left.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        let sql = format!("UPDATE replicas SET seen_at = {NOW_MS} WHERE id = $1");
        let r = self
            .db
            .execute(stmt(&self.db, &sql, vec![self.id.clone().into()]))
            .await?;
        if r.rows_affected() == 0 {
            self.register().await?;
        }
        // Leases a runner could not delete (the store failed at its end) and rows of
        // replicas gone for an hour: nobody needs them.
        for table in ["leases WHERE expires_at", "replicas WHERE seen_at"] {
            let sql = format!("DELETE FROM {table} < {NOW_MS} - 3600000");
            self.db.execute_unprepared(&sql).await?;
        }
        self.refresh_remote().await
    }

    /// Removes this replica's row and forgets its host streams (a SIGTERM's end).
    pub async fn leave(&self) -> Result<(), DbErr> {
        self.left.store(true, std::sync::atomic::Ordering::SeqCst);
        self.db
            .execute(stmt(
                &self.db,
                "UPDATE hosts SET replica_id = '' WHERE replica_id = $1",
                vec![self.id.clone().into()],
            ))
            .await?;
        self.db
            .execute(stmt(
                &self.db,
                "DELETE FROM replicas WHERE id = $1",
                vec![self.id.clone().into()],
            ))
            .await
            .map(|_| ())
    }

    fn remote_sql(one: bool) -> String {
        format!(
            "SELECT h.id, h.team_id, h.replica_id, r.url, h.load FROM hosts h \
             JOIN replicas r ON r.id = h.replica_id \
             WHERE h.replica_id <> $1 AND r.seen_at > {NOW_MS} - {dead}{one}",
            dead = DEAD_AFTER.as_millis(),
            one = if one { " AND h.id = $2" } else { "" }
        )
    }

    fn remote_of(row: &sea_orm::QueryResult) -> Result<(String, Remote), DbErr> {
        let host: String = row.try_get("", "id")?;
        let load: String = row.try_get("", "load")?;
        Ok((
            host,
            Remote {
                team_id: row.try_get("", "team_id")?,
                replica_id: row.try_get("", "replica_id")?,
                url: row.try_get("", "url")?,
                load: decode_load(&load),
            },
        ))
    }

    /// Reloads [`Replica::remote`] from the store.
    pub async fn refresh_remote(&self) -> Result<(), DbErr> {
        let rows = self
            .db
            .query_all(stmt(
                &self.db,
                &Self::remote_sql(false),
                vec![self.id.clone().into()],
            ))
            .await?;
        let mut m = HashMap::new();
        for row in &rows {
            let (h, r) = Self::remote_of(row)?;
            m.insert(h, r);
        }
        *self.remote.lock().unwrap_or_else(|e| e.into_inner()) = m;
        Ok(())
    }

    /// The live replica holding `host_id`'s stream now, read from the store (not this
    /// one); also updates the copy [`Replica::remote`] keeps.
    pub async fn holder(&self, host_id: &str) -> Result<Option<Remote>, DbErr> {
        let row = self
            .db
            .query_one(stmt(
                &self.db,
                &Self::remote_sql(true),
                vec![self.id.clone().into(), host_id.into()],
            ))
            .await?;
        let found = row.as_ref().map(Self::remote_of).transpose()?;
        let mut m = self.remote.lock().unwrap_or_else(|e| e.into_inner());
        match &found {
            Some((h, r)) => {
                m.insert(h.clone(), r.clone());
            }
            None => {
                m.remove(host_id);
            }
        }
        Ok(found.map(|(_, r)| r))
    }

    /// The copy of the hosts other live replicas hold, as of the last beat.
    pub fn remote(&self, host_id: &str) -> Option<Remote> {
        self.remote
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(host_id)
            .cloned()
    }

    /// The team's hosts other live replicas hold (as of the last beat).
    pub fn remote_hosts(&self, team_id: &str) -> Vec<String> {
        self.remote
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, r)| r.team_id == team_id)
            .map(|(h, _)| h.clone())
            .collect()
    }

    /// Hello: this replica holds the host's stream now.
    pub async fn hold_host(&self, host_id: &str) -> Result<(), DbErr> {
        self.remote
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(host_id);
        self.db
            .execute(stmt(
                &self.db,
                "UPDATE hosts SET replica_id = $2 WHERE id = $1",
                vec![host_id.into(), self.id.clone().into()],
            ))
            .await
            .map(|_| ())
    }

    /// The host's stream here ended: the host is unreachable unless it is held by
    /// another replica by now. Returns whether it was still this replica's.
    pub async fn release_host(&self, host_id: &str) -> Result<bool, DbErr> {
        let r = self
            .db
            .execute(stmt(
                &self.db,
                "UPDATE hosts SET replica_id = '', load = '', status = 'unreachable' \
                 WHERE id = $1 AND replica_id = $2",
                vec![host_id.into(), self.id.clone().into()],
            ))
            .await?;
        Ok(r.rows_affected() > 0)
    }

    /// A heartbeat's load, for the other replicas' placement.
    pub async fn record_load(&self, host_id: &str, load: &HostLoad) -> Result<(), DbErr> {
        self.db
            .execute(stmt(
                &self.db,
                "UPDATE hosts SET load = $2, load_at = $3 WHERE id = $1",
                vec![
                    host_id.into(),
                    encode_load(load).into(),
                    crate::store::now().into(),
                ],
            ))
            .await
            .map(|_| ())
    }
}

/// Deployment leases: which replica runs a deployment. See the module docs of
/// [`crate::orchestrator`] ("Replicas").
pub mod leases {
    use super::{stmt, Replica, NOW_MS};
    use sea_orm::{ConnectionTrait, DbErr, TransactionTrait};

    fn ttl_ms(r: &Replica) -> i64 {
        r.lease_ttl.as_millis() as i64
    }

    /// Takes the lease of `deployment_id` (of environment `env_id`) for this replica if
    /// nobody holds it or its holder let it expire: one statement, so of two replicas
    /// trying at once exactly one wins. A live lease, this replica's own included, is
    /// not taken. Returns whether it was taken.
    pub async fn take(r: &Replica, deployment_id: &str, env_id: &str) -> Result<bool, DbErr> {
        let sql = format!(
            "INSERT INTO leases (deployment_id, env_id, replica_id, expires_at, active) \
             VALUES ($1, $2, $3, {NOW_MS} + $4, false) \
             ON CONFLICT (deployment_id) DO UPDATE SET replica_id = EXCLUDED.replica_id, \
             env_id = EXCLUDED.env_id, expires_at = EXCLUDED.expires_at, active = false \
             WHERE leases.expires_at < {NOW_MS}"
        );
        let res = r
            .db()
            .execute(stmt(
                r.db(),
                &sql,
                vec![
                    deployment_id.into(),
                    env_id.into(),
                    r.id.clone().into(),
                    ttl_ms(r).into(),
                ],
            ))
            .await?;
        Ok(res.rows_affected() == 1)
    }

    /// Extends this replica's lease of `deployment_id` by the TTL; `false` when it is
    /// not this replica's any more (taken over, or removed).
    pub async fn renew(r: &Replica, deployment_id: &str) -> Result<bool, DbErr> {
        let sql = format!(
            "UPDATE leases SET expires_at = {NOW_MS} + $3 WHERE deployment_id = $1 AND replica_id = $2"
        );
        let res = r
            .db()
            .execute(stmt(
                r.db(),
                &sql,
                vec![deployment_id.into(), r.id.clone().into(), ttl_ms(r).into()],
            ))
            .await?;
        Ok(res.rows_affected() == 1)
    }

    /// The environment's turn across replicas: marks this replica's lease of
    /// `deployment_id` active when no other deployment of `env_id` holds a live active
    /// lease (under an advisory lock on the environment, so two replicas never both get
    /// it). Returns whether the turn is this deployment's.
    pub async fn take_turn(r: &Replica, deployment_id: &str, env_id: &str) -> Result<bool, DbErr> {
        let tx = r.db().begin().await?;
        tx.execute(stmt(
            r.db(),
            "SELECT pg_advisory_xact_lock(hashtext($1))",
            vec![format!("denv-env:{env_id}").into()],
        ))
        .await?;
        let sql = format!(
            "UPDATE leases SET active = true WHERE deployment_id = $1 AND replica_id = $2 \
             AND NOT EXISTS (SELECT 1 FROM leases o WHERE o.env_id = $3 \
             AND o.deployment_id <> $1 AND o.active AND o.expires_at >= {NOW_MS})"
        );
        let res = tx
            .execute(stmt(
                r.db(),
                &sql,
                vec![deployment_id.into(), r.id.clone().into(), env_id.into()],
            ))
            .await?;
        tx.commit().await?;
        Ok(res.rows_affected() == 1)
    }

    /// Lets go of this replica's lease of `deployment_id` (its runner ended).
    pub async fn release(r: &Replica, deployment_id: &str) -> Result<(), DbErr> {
        r.db()
            .execute(stmt(
                r.db(),
                "DELETE FROM leases WHERE deployment_id = $1 AND replica_id = $2",
                vec![deployment_id.into(), r.id.clone().into()],
            ))
            .await
            .map(|_| ())
    }

    /// Lets go of every lease of this replica (after a SIGTERM's drain): the others
    /// take the deployments over at their next look instead of after the TTL.
    pub async fn release_all(r: &Replica) -> Result<u64, DbErr> {
        r.db()
            .execute(stmt(
                r.db(),
                "DELETE FROM leases WHERE replica_id = $1",
                vec![r.id.clone().into()],
            ))
            .await
            .map(|x| x.rows_affected())
    }
}
