//! `versions`: an immutable spec plus (once captured) a snapshot on the host.

use denv_proto::v1;
use sea_orm::entity::prelude::*;
#[allow(unused_imports)]
use sea_orm::{ActiveModelTrait, IntoActiveModel};
use sea_orm::{QueryOrder, QuerySelect};

/// A version row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "versions")]
pub struct Model {
    /// `ver_…`
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub project_id: String,
    pub env_id: String,
    pub team_id: String,
    /// 1, 2, ... per environment.
    pub number: i32,
    /// The parsed compose spec as JSON text (`denv_compose::Spec`).
    pub spec: String,
    /// Snapshot name on the host (`""` until captured).
    pub snapshot: String,
    pub healthy: bool,
    pub created_at: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

impl Model {
    /// The spec as JSON (`null` when empty).
    pub fn spec_json(&self) -> serde_json::Value {
        super::parse_json(&self.spec)
    }

    /// The spec as the compose crate's type.
    pub fn spec_typed(&self) -> Result<denv_compose::Spec, serde_json::Error> {
        serde_json::from_str(&self.spec)
    }

    /// The wire message.
    pub fn to_proto(&self) -> v1::Version {
        v1::Version {
            id: self.id.clone(),
            project_id: self.project_id.clone(),
            env_id: self.env_id.clone(),
            number: self.number,
            spec: Some(denv_proto::json::to_struct(&self.spec_json())),
            snapshot: self.snapshot.clone(),
            healthy: self.healthy,
            created_at: self.created_at.clone(),
        }
    }
}

/// Create the next version of `env_id` (number = highest so far + 1), not healthy,
/// without a snapshot.
pub async fn create<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    project_id: &str,
    env_id: &str,
    spec: &serde_json::Value,
) -> Result<Model, DbErr> {
    let last: Option<i32> = Entity::find()
        .select_only()
        .column_as(Column::Number.max(), "n")
        .filter(Column::EnvId.eq(env_id))
        .into_tuple::<Option<i32>>()
        .one(db)
        .await?
        .flatten();
    let m = Model {
        id: crate::ids::new_id("ver"),
        project_id: project_id.to_string(),
        env_id: env_id.to_string(),
        team_id: team_id.to_string(),
        number: last.unwrap_or(0) + 1,
        spec: super::json_text(spec),
        snapshot: String::new(),
        healthy: false,
        created_at: super::now(),
    };
    Entity::insert(m.clone().into_active_model())
        .exec_without_returning(db)
        .await?;
    Ok(m)
}

/// The team's version with this id.
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

/// The version with this id, whatever its team (internal use).
pub async fn get_any<C: ConnectionTrait>(db: &C, id: &str) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(id.to_string()).one(db).await
}

/// The environment's versions by number, oldest first.
pub async fn list_by_env<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    env_id: &str,
) -> Result<Vec<Model>, DbErr> {
    Entity::find()
        .filter(Column::TeamId.eq(team_id))
        .filter(Column::EnvId.eq(env_id))
        .order_by_asc(Column::Number)
        .all(db)
        .await
}

/// Record the snapshot name.
pub async fn set_snapshot<C: ConnectionTrait>(
    db: &C,
    id: &str,
    snapshot: &str,
) -> Result<(), DbErr> {
    Entity::update_many()
        .col_expr(Column::Snapshot, Expr::value(snapshot))
        .filter(Column::Id.eq(id))
        .exec(db)
        .await?;
    Ok(())
}

/// Mark the version healthy (or not).
pub async fn set_healthy<C: ConnectionTrait>(db: &C, id: &str, healthy: bool) -> Result<(), DbErr> {
    Entity::update_many()
        .col_expr(Column::Healthy, Expr::value(healthy))
        .filter(Column::Id.eq(id))
        .exec(db)
        .await?;
    Ok(())
}

/// Write every column of `m` (row identified by `m.id`).
pub async fn update<C: ConnectionTrait>(db: &C, m: Model) -> Result<Model, DbErr> {
    m.into_active_model().reset_all().update(db).await
}
