//! `memberships`: which users belong to which teams, with a role.

use super::teams;
use sea_orm::entity::prelude::*;
use sea_orm::QueryOrder;
#[allow(unused_imports)]
use sea_orm::{ActiveModelTrait, IntoActiveModel};

/// A membership row (primary key `(team_id, user_id)`).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "memberships")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub team_id: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub user_id: String,
    /// `owner` | `member`
    pub role: String,
    pub created_at: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// Add `user_id` to `team_id` with `role`.
pub async fn add<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    user_id: &str,
    role: &str,
) -> Result<Model, DbErr> {
    let m = Model {
        team_id: team_id.to_string(),
        user_id: user_id.to_string(),
        role: role.to_string(),
        created_at: super::now(),
    };
    Entity::insert(m.clone().into_active_model())
        .exec_without_returning(db)
        .await?;
    Ok(m)
}

/// The user's role in the team, `None` when not a member.
pub async fn role<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    user_id: &str,
) -> Result<Option<String>, DbErr> {
    Ok(
        Entity::find_by_id((team_id.to_string(), user_id.to_string()))
            .one(db)
            .await?
            .map(|m| m.role),
    )
}

/// The user's teams with their role, in the order they were joined (the first is the
/// default team of a session without `X-Denv-Team`).
pub async fn teams_of_user<C: ConnectionTrait>(
    db: &C,
    user_id: &str,
) -> Result<Vec<(teams::Model, String)>, DbErr> {
    let ms = Entity::find()
        .filter(Column::UserId.eq(user_id))
        .order_by_asc(Column::CreatedAt)
        .order_by_asc(Column::TeamId)
        .all(db)
        .await?;
    let mut out = Vec::with_capacity(ms.len());
    for m in ms {
        if let Some(t) = teams::get(db, &m.team_id).await? {
            out.push((t, m.role));
        }
    }
    Ok(out)
}
