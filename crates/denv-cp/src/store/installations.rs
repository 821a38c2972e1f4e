//! `installations`: GitHub App installations the app has reported, and the team each
//! is linked to (`""` until linked).

use sea_orm::entity::prelude::*;
use sea_orm::QueryOrder;
#[allow(unused_imports)]
use sea_orm::{ActiveModelTrait, IntoActiveModel};

/// An installation row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "installations")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub installation_id: i64,
    /// `""` until linked with `POST /v1/github/installations/{id}/link`.
    pub team_id: String,
    pub account_login: String,
    pub created_at: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// The installation with this id.
pub async fn get<C: ConnectionTrait>(db: &C, id: i64) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(id).one(db).await
}

/// Installations linked to the team.
pub async fn list_for_team<C: ConnectionTrait>(db: &C, team_id: &str) -> Result<Vec<Model>, DbErr> {
    Entity::find()
        .filter(Column::TeamId.eq(team_id))
        .order_by_asc(Column::InstallationId)
        .all(db)
        .await
}

/// Record an installation the app reported (kept linked if it already was).
pub async fn upsert_seen<C: ConnectionTrait>(
    db: &C,
    id: i64,
    account_login: &str,
) -> Result<Model, DbErr> {
    if let Some(m) = get(db, id).await? {
        Entity::update_many()
            .col_expr(Column::AccountLogin, Expr::value(account_login))
            .filter(Column::InstallationId.eq(id))
            .exec(db)
            .await?;
        return Ok(Model {
            account_login: account_login.into(),
            ..m
        });
    }
    let m = Model {
        installation_id: id,
        team_id: String::new(),
        account_login: account_login.to_string(),
        created_at: super::now(),
    };
    Entity::insert(m.clone().into_active_model())
        .exec_without_returning(db)
        .await?;
    Ok(m)
}

/// Link the installation to `team_id`.
pub async fn link<C: ConnectionTrait>(db: &C, id: i64, team_id: &str) -> Result<(), DbErr> {
    Entity::update_many()
        .col_expr(Column::TeamId, Expr::value(team_id))
        .filter(Column::InstallationId.eq(id))
        .exec(db)
        .await?;
    Ok(())
}

/// Forget an installation (app uninstalled).
pub async fn delete<C: ConnectionTrait>(db: &C, id: i64) -> Result<(), DbErr> {
    Entity::delete_by_id(id).exec(db).await?;
    Ok(())
}
