//! `oauth_states`: GitHub sign-in `state` values between `/auth/github/start` and the
//! callback (10 minutes, used once). In the store so the callback may reach any replica.

use sea_orm::entity::prelude::*;
use sea_orm::Set;

/// A sign-in in progress.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "oauth_states")]
pub struct Model {
    /// The `state` value (`dos_…`).
    #[sea_orm(primary_key, auto_increment = false)]
    pub state: String,
    /// Where the callback sends the browser.
    pub return_to: String,
    /// RFC 3339.
    pub created_at: String,
}

/// No relations are navigated through the ORM.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// Records `state` (and removes the ones created before `cutoff`).
pub async fn insert<C: ConnectionTrait>(
    db: &C,
    state: &str,
    return_to: &str,
    cutoff: &str,
) -> Result<(), DbErr> {
    Entity::delete_many()
        .filter(Column::CreatedAt.lt(cutoff))
        .exec(db)
        .await?;
    Entity::insert(ActiveModel {
        state: Set(state.to_string()),
        return_to: Set(return_to.to_string()),
        created_at: Set(super::now()),
    })
    .exec_without_returning(db)
    .await
    .map(|_| ())
}

/// Takes `state` once: its return URL when it exists and was created at or after
/// `cutoff`; it is removed either way. Of two callbacks with one state, one gets it.
pub async fn take<C: ConnectionTrait>(
    db: &C,
    state: &str,
    cutoff: &str,
) -> Result<Option<String>, DbErr> {
    let Some(row) = Entity::find_by_id(state.to_string()).one(db).await? else {
        return Ok(None);
    };
    let gone = Entity::delete_many()
        .filter(Column::State.eq(state))
        .exec(db)
        .await?;
    Ok((gone.rows_affected == 1 && row.created_at.as_str() >= cutoff).then_some(row.return_to))
}
