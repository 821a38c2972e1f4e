//! `projects`: a repository with a kind, owned by a team.

use sea_orm::entity::prelude::*;
#[allow(unused_imports)]
use sea_orm::{ActiveModelTrait, IntoActiveModel};
use sea_orm::{Condition, QueryOrder};

/// A project row; `(team_id, name)` is unique.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "projects")]
pub struct Model {
    /// `prj_…`
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub team_id: String,
    pub name: String,
    /// `rl-environment` | `agent` | `service` | `website` | `inference`
    pub kind: String,
    /// e.g. `github:owner/repo` (`""` when none)
    pub source: String,
    pub created_at: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// Create a project. A duplicate name in the team is a unique violation
/// ([`super::is_unique_violation`]).
pub async fn create<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    name: &str,
    kind: &str,
    source: &str,
) -> Result<Model, DbErr> {
    let m = Model {
        id: crate::ids::new_id("prj"),
        team_id: team_id.to_string(),
        name: name.to_string(),
        kind: kind.to_string(),
        source: source.to_string(),
        created_at: super::now(),
    };
    Entity::insert(m.clone().into_active_model())
        .exec_without_returning(db)
        .await?;
    Ok(m)
}

/// The team's project whose id or name is `id_or_name`.
pub async fn find<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    id_or_name: &str,
) -> Result<Option<Model>, DbErr> {
    Entity::find()
        .filter(Column::TeamId.eq(team_id))
        .filter(
            Condition::any()
                .add(Column::Id.eq(id_or_name))
                .add(Column::Name.eq(id_or_name)),
        )
        .one(db)
        .await
}

/// The project with this id, whatever its team (internal use).
pub async fn get_any<C: ConnectionTrait>(db: &C, id: &str) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(id.to_string()).one(db).await
}

/// The team's projects, oldest first.
pub async fn list<C: ConnectionTrait>(db: &C, team_id: &str) -> Result<Vec<Model>, DbErr> {
    Entity::find()
        .filter(Column::TeamId.eq(team_id))
        .order_by_asc(Column::Id)
        .all(db)
        .await
}

/// Projects (of any team) whose source is `source` (`github:owner/repo`).
pub async fn list_by_source<C: ConnectionTrait>(db: &C, source: &str) -> Result<Vec<Model>, DbErr> {
    Entity::find()
        .filter(Column::Source.eq(source))
        .order_by_asc(Column::Id)
        .all(db)
        .await
}

/// Deletes project `id` and what only it refers to: its source, environments,
/// versions, deployments and their phases. Run in the transaction that checked it
/// has no live environment. Returns whether the project row existed.
pub async fn delete_with_history<C: ConnectionTrait>(db: &C, id: &str) -> Result<bool, DbErr> {
    use super::{deployments, environments, phases, sources, versions};
    let deps: Vec<String> = deployments::Entity::find()
        .filter(deployments::Column::ProjectId.eq(id))
        .all(db)
        .await?
        .into_iter()
        .map(|d| d.id)
        .collect();
    for chunk in deps.chunks(500) {
        phases::Entity::delete_many()
            .filter(phases::Column::DeploymentId.is_in(chunk.to_vec()))
            .exec(db)
            .await?;
    }
    deployments::Entity::delete_many()
        .filter(deployments::Column::ProjectId.eq(id))
        .exec(db)
        .await?;
    versions::Entity::delete_many()
        .filter(versions::Column::ProjectId.eq(id))
        .exec(db)
        .await?;
    environments::Entity::delete_many()
        .filter(environments::Column::ProjectId.eq(id))
        .exec(db)
        .await?;
    sources::Entity::delete_many()
        .filter(sources::Column::ProjectId.eq(id))
        .exec(db)
        .await?;
    let r = Entity::delete_by_id(id.to_string()).exec(db).await?;
    Ok(r.rows_affected > 0)
}
