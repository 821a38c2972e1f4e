//! `snapshot_copies`: the hosts a version's snapshot was shipped to (migration
//! `m20261207_000001_snapshot_copies`; `docs/reference/targets.md`, "Forks on any
//! host"). The host of the environment that took the snapshot holds it without a row.

use sea_orm::entity::prelude::*;
use sea_orm::{QueryOrder, QuerySelect, Set};

/// One copy of a version's snapshot on a host.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "snapshot_copies")]
pub struct Model {
    /// The version (`ver_…`) whose snapshot was shipped.
    #[sea_orm(primary_key, auto_increment = false)]
    pub version_id: String,
    /// The host (`host_…`) that holds the copy.
    #[sea_orm(primary_key, auto_increment = false)]
    pub host_id: String,
    /// The host it was shipped from.
    pub from_host_id: String,
    /// Size of the archive shipped, bytes.
    pub bytes: i64,
    /// SHA-256 of the archive, lower-case hex.
    pub sha256: String,
    /// How long the transfer took (the receiving host's `snapshot.receive`), ms: what
    /// fork placement measures throughput by.
    pub shipped_ms: i64,
    /// When it was recorded, RFC 3339.
    pub created_at: String,
}

/// No relations are navigated through the ORM.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// The copy of `version_id`'s snapshot on `host_id`, if one was recorded.
pub async fn get<C: ConnectionTrait>(
    db: &C,
    version_id: &str,
    host_id: &str,
) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id((version_id.to_string(), host_id.to_string()))
        .one(db)
        .await
}

/// Every recorded copy of `version_id`'s snapshot, oldest first.
pub async fn of_version<C: ConnectionTrait>(db: &C, version_id: &str) -> Result<Vec<Model>, DbErr> {
    Entity::find()
        .filter(Column::VersionId.eq(version_id))
        .order_by_asc(Column::CreatedAt)
        .all(db)
        .await
}

/// `(bytes, shipped_ms)` of the latest `n` copies shipped to any of `hosts`, newest
/// first (what fork placement measures throughput by).
pub async fn recent<C: ConnectionTrait>(
    db: &C,
    hosts: &[String],
    n: u64,
) -> Result<Vec<(u64, u64)>, DbErr> {
    Ok(Entity::find()
        .filter(Column::HostId.is_in(hosts.iter().cloned()))
        .order_by_desc(Column::CreatedAt)
        .limit(n)
        .all(db)
        .await?
        .into_iter()
        .map(|m| (m.bytes.max(0) as u64, m.shipped_ms.max(0) as u64))
        .collect())
}

/// Records a copy (`created_at` is set now). A copy already recorded for the same
/// (version, host) is kept as it was: `Ok(false)`.
pub async fn record<C: ConnectionTrait>(db: &C, mut m: Model) -> Result<bool, DbErr> {
    m.created_at = super::now();
    let row = ActiveModel {
        version_id: Set(m.version_id),
        host_id: Set(m.host_id),
        from_host_id: Set(m.from_host_id),
        bytes: Set(m.bytes),
        sha256: Set(m.sha256),
        shipped_ms: Set(m.shipped_ms),
        created_at: Set(m.created_at),
    };
    match Entity::insert(row).exec_without_returning(db).await {
        Ok(_) => Ok(true),
        Err(e) if super::is_unique_violation(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Forgets the copy on `host_id` (it turned out to be gone from the host).
pub async fn forget<C: ConnectionTrait>(
    db: &C,
    version_id: &str,
    host_id: &str,
) -> Result<(), DbErr> {
    Entity::delete_by_id((version_id.to_string(), host_id.to_string()))
        .exec(db)
        .await?;
    Ok(())
}
