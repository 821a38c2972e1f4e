//! `sessions`: user sessions `dst_…` (30 days), stored as SHA-256 hashes.

use crate::ids;
use sea_orm::entity::prelude::*;
#[allow(unused_imports)]
use sea_orm::{ActiveModelTrait, IntoActiveModel};

/// How long a session is valid.
pub const SESSION_TTL: chrono::Duration = chrono::Duration::days(30);

/// A session row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "sessions")]
pub struct Model {
    /// `ses_…`
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// Hex SHA-256 of the `dst_…` secret.
    pub hash: String,
    pub user_id: String,
    pub created_at: String,
    pub expires_at: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// Start a 30-day session for `user_id`. Returns the row and the `dst_…` secret.
pub async fn create<C: ConnectionTrait>(db: &C, user_id: &str) -> Result<(Model, String), DbErr> {
    let secret = ids::new_secret("dst");
    let now = chrono::Utc::now();
    let m = Model {
        id: ids::new_id("ses"),
        hash: ids::hash_secret(&secret),
        user_id: user_id.to_string(),
        created_at: super::fmt_time(now),
        expires_at: super::fmt_time(now + SESSION_TTL),
    };
    Entity::insert(m.clone().into_active_model())
        .exec_without_returning(db)
        .await?;
    Ok((m, secret))
}

/// The unexpired session whose secret is `secret`.
pub async fn find_valid<C: ConnectionTrait>(db: &C, secret: &str) -> Result<Option<Model>, DbErr> {
    let h = ids::hash_secret(secret);
    let m = Entity::find()
        .filter(Column::Hash.eq(h.clone()))
        .one(db)
        .await?;
    Ok(m.filter(|m| {
        ids::ct_eq(&m.hash, &h)
            && super::parse_time(&m.expires_at).is_some_and(|t| t > chrono::Utc::now())
    }))
}
