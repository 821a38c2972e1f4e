//! `join_tokens`: `djt_` tokens, single use, valid one hour (spec `17-ref-targets.md`).
//!
//! Only the SHA-256 hex of a token is stored. [`consume`] marks a token used with a
//! conditional update, so two sidecars racing with one token cannot both win; call it
//! in the transaction that inserts the host row.

use sea_orm::entity::prelude::*;
use sea_orm::sea_query::Expr;

/// A join token row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "join_tokens")]
pub struct Model {
    /// SHA-256 hex of the `djt_` token.
    #[sea_orm(primary_key, auto_increment = false)]
    pub token_hash: String,
    /// Team the joining host will belong to.
    pub team_id: String,
    /// Cloud recorded on the host (`""` when none).
    pub cloud_id: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339, `created_at` + 1 hour.
    pub expires_at: String,
    /// RFC 3339 when consumed, else `""`.
    pub used_at: String,
    /// The host created with it, else `""`.
    pub host_id: String,
}

/// No relations are navigated through the ORM.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// Lifetime of a join token, seconds.
pub const TTL_SEC: i64 = 3600;

/// Why a join token was refused. `Display` is the refusal reason the sidecar sees.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// No token with that hash.
    #[error("join: unknown join token")]
    Unknown,
    /// Consumed before.
    #[error("join: join token already used")]
    Used,
    /// Older than one hour.
    #[error("join: join token expired")]
    Expired,
    /// The store failed.
    #[error("join: {0}")]
    Db(#[from] DbErr),
}

/// Stores a new token row.
pub async fn insert<C: ConnectionTrait>(db: &C, m: Model) -> Result<Model, DbErr> {
    let am: ActiveModel = m.clone().into();
    Entity::insert(am).exec_without_returning(db).await?;
    Ok(m)
}

/// Marks the token with this hash used by `host_id` at `now` (RFC 3339) and returns
/// its row. Refuses unknown, used (`join: join token already used`) and expired
/// (`join: join token expired`) tokens. Run inside the transaction creating the host.
pub async fn consume<C: ConnectionTrait>(
    db: &C,
    token_hash: &str,
    host_id: &str,
    now: &str,
) -> Result<Model, JoinError> {
    let Some(row) = Entity::find_by_id(token_hash.to_string()).one(db).await? else {
        return Err(JoinError::Unknown);
    };
    if !row.used_at.is_empty() {
        return Err(JoinError::Used);
    }
    if expired(&row.expires_at, now) {
        return Err(JoinError::Expired);
    }
    let res = Entity::update_many()
        .col_expr(Column::UsedAt, Expr::value(now))
        .col_expr(Column::HostId, Expr::value(host_id))
        .filter(Column::TokenHash.eq(token_hash))
        .filter(Column::UsedAt.eq(""))
        .exec(db)
        .await?;
    if res.rows_affected != 1 {
        return Err(JoinError::Used);
    }
    Ok(Model {
        used_at: now.to_string(),
        host_id: host_id.to_string(),
        ..row
    })
}

/// Whether `expires_at` is at or before `now` (both RFC 3339); an unparsable expiry
/// counts as expired.
fn expired(expires_at: &str, now: &str) -> bool {
    use chrono::DateTime;
    match (
        DateTime::parse_from_rfc3339(expires_at),
        DateTime::parse_from_rfc3339(now),
    ) {
        (Ok(e), Ok(n)) => e <= n,
        _ => true,
    }
}
