//! `api_keys`: team API keys `dak_…`, stored as SHA-256 hashes.

use crate::ids;
use sea_orm::entity::prelude::*;
use sea_orm::QueryOrder;
#[allow(unused_imports)]
use sea_orm::{ActiveModelTrait, IntoActiveModel};

/// An API key row. The key material is never stored, only `hash`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "api_keys")]
pub struct Model {
    /// `key_…`
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub team_id: String,
    pub name: String,
    /// Hex SHA-256 of the `dak_…` secret.
    pub hash: String,
    /// User id of the creator (`""` for the bootstrap key).
    pub created_by: String,
    pub created_at: String,
    pub last_used_at: String,
    /// `""` while the key is valid.
    pub revoked_at: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// Mint a new key for `team_id`. Returns the row and the `dak_…` secret (shown once).
pub async fn create<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    name: &str,
    created_by: &str,
) -> Result<(Model, String), DbErr> {
    let secret = ids::new_secret("dak");
    let m = insert_with_secret(db, team_id, name, created_by, &secret).await?;
    Ok((m, secret))
}

/// Replaces the secret of a live key (a device-flow key at its hand-out); `false` when
/// there is no such live key.
pub async fn set_secret<C: ConnectionTrait>(db: &C, id: &str, secret: &str) -> Result<bool, DbErr> {
    let r = Entity::update_many()
        .col_expr(
            Column::Hash,
            sea_orm::sea_query::Expr::value(ids::hash_secret(secret)),
        )
        .filter(Column::Id.eq(id))
        .filter(Column::RevokedAt.eq(""))
        .exec(db)
        .await?;
    Ok(r.rows_affected == 1)
}

/// Install a given secret as a key of `team_id` (the bootstrap key).
pub async fn insert_with_secret<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    name: &str,
    created_by: &str,
    secret: &str,
) -> Result<Model, DbErr> {
    let m = Model {
        id: ids::new_id("key"),
        team_id: team_id.to_string(),
        name: name.to_string(),
        hash: ids::hash_secret(secret),
        created_by: created_by.to_string(),
        created_at: super::now(),
        last_used_at: String::new(),
        revoked_at: String::new(),
    };
    Entity::insert(m.clone().into_active_model())
        .exec_without_returning(db)
        .await?;
    Ok(m)
}

/// The key whose secret is `secret` (revoked keys included; the caller checks
/// `revoked_at`). The stored hash is compared in constant time.
pub async fn find_by_secret<C: ConnectionTrait>(
    db: &C,
    secret: &str,
) -> Result<Option<Model>, DbErr> {
    let h = ids::hash_secret(secret);
    let m = Entity::find()
        .filter(Column::Hash.eq(h.clone()))
        .one(db)
        .await?;
    Ok(m.filter(|m| ids::ct_eq(&m.hash, &h)))
}

/// Record a use of the key now.
pub async fn touch<C: ConnectionTrait>(db: &C, id: &str) -> Result<(), DbErr> {
    Entity::update_many()
        .col_expr(Column::LastUsedAt, Expr::value(super::now()))
        .filter(Column::Id.eq(id))
        .exec(db)
        .await?;
    Ok(())
}

/// The team's keys, oldest first (revoked ones included).
pub async fn list<C: ConnectionTrait>(db: &C, team_id: &str) -> Result<Vec<Model>, DbErr> {
    Entity::find()
        .filter(Column::TeamId.eq(team_id))
        .order_by_asc(Column::Id)
        .all(db)
        .await
}

/// The team's key with this id.
pub async fn get<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    id: &str,
) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(id.to_string())
        .filter(Column::TeamId.eq(team_id))
        .one(db)
        .await
}

/// Revoke the team's key `id`. `false` when no such key exists in that team; revoking
/// an already revoked key keeps its first `revoked_at` and answers `true`.
pub async fn revoke<C: ConnectionTrait>(db: &C, team_id: &str, id: &str) -> Result<bool, DbErr> {
    let Some(k) = get(db, team_id, id).await? else {
        return Ok(false);
    };
    if k.revoked_at.is_empty() {
        Entity::update_many()
            .col_expr(Column::RevokedAt, Expr::value(super::now()))
            .filter(Column::Id.eq(id))
            .exec(db)
            .await?;
    }
    Ok(true)
}
