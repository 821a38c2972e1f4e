//! `sources`: a project's GitHub source settings (one row per project).

use sea_orm::entity::prelude::*;
use sea_orm::QueryOrder;
#[allow(unused_imports)]
use sea_orm::{ActiveModelTrait, IntoActiveModel};

/// The compose path used when none is set.
pub const DEFAULT_COMPOSE_PATH: &str = "docker-compose.yaml";

/// A source row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "sources")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub project_id: String,
    pub team_id: String,
    /// `owner/repo` (`""` when the project has no GitHub source).
    pub repo: String,
    pub default_branch: String,
    pub compose_path: String,
    pub installation_id: i64,
    pub deploy_branches: bool,
    pub last_deployed_sha: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// The project's source row.
pub async fn get<C: ConnectionTrait>(db: &C, project_id: &str) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(project_id.to_string()).one(db).await
}

/// Insert or replace the row of `m.project_id`.
pub async fn upsert<C: ConnectionTrait>(db: &C, m: Model) -> Result<Model, DbErr> {
    if get(db, &m.project_id).await?.is_some() {
        m.into_active_model().reset_all().update(db).await
    } else {
        Entity::insert(m.clone().into_active_model())
            .exec_without_returning(db)
            .await?;
        Ok(m)
    }
}

/// Sources (of any team) for repo `owner/repo`.
pub async fn list_by_repo<C: ConnectionTrait>(db: &C, repo: &str) -> Result<Vec<Model>, DbErr> {
    Entity::find()
        .filter(Column::Repo.eq(repo))
        .order_by_asc(Column::ProjectId)
        .all(db)
        .await
}

/// Record the commit last deployed.
pub async fn set_last_deployed_sha<C: ConnectionTrait>(
    db: &C,
    project_id: &str,
    sha: &str,
) -> Result<(), DbErr> {
    Entity::update_many()
        .col_expr(Column::LastDeployedSha, Expr::value(sha))
        .filter(Column::ProjectId.eq(project_id))
        .exec(db)
        .await?;
    Ok(())
}
