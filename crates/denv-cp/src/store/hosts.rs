//! `hosts`: sidecar and driver hosts (spec pages `15-ref-protocol.md`, `17-ref-targets.md`).
//!
//! `status` is `connected | unreachable` as last recorded; whether a stream is open
//! *now* is the hub's answer ([`crate::hub::Hub::is_connected`]). `secret_hash` is the
//! SHA-256 hex of the `dhs_` secret; `capabilities` the JSON of the sidecar's report.

use sea_orm::entity::prelude::*;
use sea_orm::{QueryOrder, Set};

/// A host row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "hosts")]
pub struct Model {
    /// `host_<ulid>`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// Owning team.
    pub team_id: String,
    /// The cloud it joined through (`""` for a manual join without a cloud).
    pub cloud_id: String,
    /// The sidecar's hostname at first join, or the provider name for a driver host.
    pub name: String,
    /// `sidecar` or `driver:<provider>`.
    pub kind: String,
    /// `connected` | `unreachable`.
    pub status: String,
    /// Provider's machine id (provisioned machines), else `""`.
    pub provider_ref: String,
    /// SHA-256 hex of the host secret (`""` for driver hosts).
    pub secret_hash: String,
    /// JSON object: the last capability report.
    pub capabilities: String,
    /// RFC 3339, last hello or heartbeat.
    pub last_seen_at: String,
    /// RFC 3339.
    pub created_at: String,
}

/// No relations are navigated through the ORM.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// Kind of a sidecar host.
pub const KIND_SIDECAR: &str = "sidecar";
/// Status written on hello and heartbeats.
pub const STATUS_CONNECTED: &str = "connected";
/// Status written when the stream drops or the grace window passes.
pub const STATUS_UNREACHABLE: &str = "unreachable";

/// A host by id (any team).
pub async fn get<C: ConnectionTrait>(db: &C, id: &str) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(id.to_string()).one(db).await
}

/// A host by id within a team (another team's host is `None`).
pub async fn get_in_team<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    id: &str,
) -> Result<Option<Model>, DbErr> {
    Ok(get(db, id).await?.filter(|h| h.team_id == team_id))
}

/// The team's hosts, oldest first.
pub async fn list<C: ConnectionTrait>(db: &C, team_id: &str) -> Result<Vec<Model>, DbErr> {
    Entity::find()
        .filter(Column::TeamId.eq(team_id))
        .order_by_asc(Column::CreatedAt)
        .order_by_asc(Column::Id)
        .all(db)
        .await
}

/// Inserts a host row.
pub async fn insert<C: ConnectionTrait>(db: &C, m: Model) -> Result<Model, DbErr> {
    let am: ActiveModel = m.clone().into();
    Entity::insert(am).exec_without_returning(db).await?;
    Ok(m)
}

/// On hello: status `connected`, the new capabilities, `last_seen_at = now`.
pub async fn record_hello<C: ConnectionTrait>(
    db: &C,
    id: &str,
    capabilities: &str,
    now: &str,
) -> Result<(), DbErr> {
    Entity::update(ActiveModel {
        id: Set(id.to_string()),
        status: Set(STATUS_CONNECTED.into()),
        capabilities: Set(capabilities.to_string()),
        last_seen_at: Set(now.to_string()),
        ..Default::default()
    })
    .exec(db)
    .await
    .map(|_| ())
}

/// On a heartbeat: status `connected`, `last_seen_at = now`.
pub async fn record_seen<C: ConnectionTrait>(db: &C, id: &str, now: &str) -> Result<(), DbErr> {
    Entity::update(ActiveModel {
        id: Set(id.to_string()),
        status: Set(STATUS_CONNECTED.into()),
        last_seen_at: Set(now.to_string()),
        ..Default::default()
    })
    .exec(db)
    .await
    .map(|_| ())
}

/// Sets the status (`unreachable` on a drop or after the grace window).
pub async fn set_status<C: ConnectionTrait>(db: &C, id: &str, status: &str) -> Result<(), DbErr> {
    Entity::update(ActiveModel {
        id: Set(id.to_string()),
        status: Set(status.to_string()),
        ..Default::default()
    })
    .exec(db)
    .await
    .map(|_| ())
}
