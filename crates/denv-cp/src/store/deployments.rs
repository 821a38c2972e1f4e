//! `deployments`: one change to an environment, run as ordered phases
//! (spec `16-ref-deployments.md`).

use super::phases;
use denv_proto::v1;
use sea_orm::entity::prelude::*;
use sea_orm::QueryOrder;
#[allow(unused_imports)]
use sea_orm::{ActiveModelTrait, IntoActiveModel};

/// Status: created, not started.
pub const PENDING: &str = "pending";
/// Status: phases executing.
pub const RUNNING: &str = "running";
/// Status: every non-skipped phase ok.
pub const SUCCEEDED: &str = "succeeded";
/// Status: a phase failed and nothing was reverted.
pub const FAILED: &str = "failed";
/// Status: a deploy failed and the environment was restored.
pub const ROLLED_BACK: &str = "rolled_back";

/// Whether a deployment status is final.
pub fn is_final(status: &str) -> bool {
    matches!(status, SUCCEEDED | FAILED | ROLLED_BACK)
}

/// A deployment row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "deployments")]
pub struct Model {
    /// `dep_…`
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub project_id: String,
    pub env_id: String,
    pub team_id: String,
    /// `deploy` | `fork` | `snapshot` | `rollback` | `verify` | `destroy`
    pub kind: String,
    /// [`PENDING`] | [`RUNNING`] | [`SUCCEEDED`] | [`FAILED`] | [`ROLLED_BACK`]
    pub status: String,
    pub version_id: String,
    pub target_env_id: String,
    /// JSON object text of the request parameters.
    pub params: String,
    /// `<phase>: <reason>` on failure.
    pub error: String,
    pub created_at: String,
    pub finished_at: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

impl Model {
    /// The params as JSON (`{}` when empty).
    pub fn params_json(&self) -> serde_json::Value {
        match super::parse_json(&self.params) {
            serde_json::Value::Null => serde_json::json!({}),
            v => v,
        }
    }

    /// The wire message.
    pub fn to_proto(&self) -> v1::Deployment {
        v1::Deployment {
            id: self.id.clone(),
            project_id: self.project_id.clone(),
            env_id: self.env_id.clone(),
            kind: self.kind.clone(),
            status: self.status.clone(),
            version_id: self.version_id.clone(),
            target_env_id: self.target_env_id.clone(),
            params: Some(denv_proto::json::to_struct(&self.params_json())),
            error: self.error.clone(),
            created_at: self.created_at.clone(),
            finished_at: self.finished_at.clone(),
        }
    }
}

/// Create a `pending` deployment of `kind` on `env_id` with `params` (a JSON object).
pub async fn create<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    project_id: &str,
    env_id: &str,
    kind: &str,
    params: &serde_json::Value,
) -> Result<Model, DbErr> {
    let m = Model {
        id: crate::ids::new_id("dep"),
        project_id: project_id.to_string(),
        env_id: env_id.to_string(),
        team_id: team_id.to_string(),
        kind: kind.to_string(),
        status: PENDING.to_string(),
        version_id: String::new(),
        target_env_id: String::new(),
        params: super::json_text(params),
        error: String::new(),
        created_at: super::now(),
        finished_at: String::new(),
    };
    Entity::insert(m.clone().into_active_model())
        .exec_without_returning(db)
        .await?;
    Ok(m)
}

/// The team's deployment with this id.
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

/// The deployment with this id, whatever its team (internal use).
pub async fn get_any<C: ConnectionTrait>(db: &C, id: &str) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(id.to_string()).one(db).await
}

/// The environment's deployments, newest first.
pub async fn list_by_env<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    env_id: &str,
) -> Result<Vec<Model>, DbErr> {
    Entity::find()
        .filter(Column::TeamId.eq(team_id))
        .filter(Column::EnvId.eq(env_id))
        .order_by_desc(Column::Id)
        .all(db)
        .await
}

/// Every deployment still `pending` or `running` (restart recovery), oldest first.
pub async fn list_unfinished<C: ConnectionTrait>(db: &C) -> Result<Vec<Model>, DbErr> {
    Entity::find()
        .filter(Column::Status.is_in([PENDING, RUNNING]))
        .order_by_asc(Column::Id)
        .all(db)
        .await
}

/// Set the status.
pub async fn set_status<C: ConnectionTrait>(db: &C, id: &str, status: &str) -> Result<(), DbErr> {
    Entity::update_many()
        .col_expr(Column::Status, Expr::value(status))
        .filter(Column::Id.eq(id))
        .exec(db)
        .await?;
    Ok(())
}

/// Set the version this deployment produced or targets.
pub async fn set_version<C: ConnectionTrait>(
    db: &C,
    id: &str,
    version_id: &str,
) -> Result<(), DbErr> {
    Entity::update_many()
        .col_expr(Column::VersionId, Expr::value(version_id))
        .filter(Column::Id.eq(id))
        .exec(db)
        .await?;
    Ok(())
}

/// Set the environment this deployment creates (fork, verify).
pub async fn set_target_env<C: ConnectionTrait>(
    db: &C,
    id: &str,
    env_id: &str,
) -> Result<(), DbErr> {
    Entity::update_many()
        .col_expr(Column::TargetEnvId, Expr::value(env_id))
        .filter(Column::Id.eq(id))
        .exec(db)
        .await?;
    Ok(())
}

/// Finish the deployment: final `status`, `error` (`""` on success), `FinishedAt` now.
pub async fn finish<C: ConnectionTrait>(
    db: &C,
    id: &str,
    status: &str,
    error: &str,
) -> Result<(), DbErr> {
    Entity::update_many()
        .col_expr(Column::Status, Expr::value(status))
        .col_expr(Column::Error, Expr::value(error))
        .col_expr(Column::FinishedAt, Expr::value(super::now()))
        .filter(Column::Id.eq(id))
        .exec(db)
        .await?;
    Ok(())
}

/// Write every column of `m` (row identified by `m.id`).
pub async fn update<C: ConnectionTrait>(db: &C, m: Model) -> Result<Model, DbErr> {
    m.into_active_model().reset_all().update(db).await
}

/// `{deployment, phases}`: the answer of every call that starts or reads a deployment.
pub async fn response<C: ConnectionTrait>(
    db: &C,
    dep: &Model,
) -> Result<v1::DeploymentResponse, DbErr> {
    let phases = phases::list(db, &dep.id).await?;
    Ok(v1::DeploymentResponse {
        deployment: Some(dep.to_proto()),
        phases: phases.iter().map(phases::Model::to_proto).collect(),
    })
}
