//! `environments`: a running stack on one host.

use denv_proto::v1;
use sea_orm::entity::prelude::*;
use sea_orm::QueryOrder;
#[allow(unused_imports)]
use sea_orm::{ActiveModelTrait, IntoActiveModel};
use std::collections::HashMap;

/// Status: created, nothing deployed yet.
pub const PENDING: &str = "pending";
/// Status: a deployment is changing it.
pub const DEPLOYING: &str = "deploying";
/// Status: running and healthy.
pub const HEALTHY: &str = "healthy";
/// Status: the last deployment failed and nothing was reverted.
pub const FAILED: &str = "failed";
/// Status: a destroy deployment runs.
pub const DESTROYING: &str = "destroying";
/// Status: torn down.
pub const DESTROYED: &str = "destroyed";

/// An environment row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "environments")]
pub struct Model {
    /// `env_…`
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub project_id: String,
    pub team_id: String,
    pub name: String,
    /// `alpha` | `fork` | `verify` | `sandbox` | ...
    pub stage: String,
    /// `""` until placed.
    pub host_id: String,
    pub parent_version_id: String,
    pub current_version_id: String,
    /// [`PENDING`] | [`DEPLOYING`] | [`HEALTHY`] | [`FAILED`] | [`DESTROYING`] | [`DESTROYED`]
    pub status: String,
    /// JSON object service → `"127.0.0.1:port"` (`""` = none).
    pub endpoints: String,
    pub created_at: String,
    /// RFC 3339: when the environment's TTL destroys it; `""` = no TTL.
    pub expires_at: String,
    /// Warm pool size set by a request's `pool` field; `-1` = not set (the current
    /// version's `x-denv.pool` applies).
    pub pool: i32,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

impl Model {
    /// The endpoints map (service → `host:port`).
    pub fn endpoints_map(&self) -> HashMap<String, String> {
        serde_json::from_str(&self.endpoints).unwrap_or_default()
    }

    /// The wire message.
    pub fn to_proto(&self) -> v1::Environment {
        v1::Environment {
            id: self.id.clone(),
            project_id: self.project_id.clone(),
            name: self.name.clone(),
            stage: self.stage.clone(),
            host_id: self.host_id.clone(),
            parent_version_id: self.parent_version_id.clone(),
            current_version_id: self.current_version_id.clone(),
            status: self.status.clone(),
            created_at: self.created_at.clone(),
            endpoints: self.endpoints_map(),
            expires_at: self.expires_at.clone(),
        }
    }
}

/// Create an environment with status `pending`, no host, no current version.
pub async fn create<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    project_id: &str,
    name: &str,
    stage: &str,
    parent_version_id: &str,
) -> Result<Model, DbErr> {
    let m = Model {
        id: crate::ids::new_id("env"),
        project_id: project_id.to_string(),
        team_id: team_id.to_string(),
        name: name.to_string(),
        stage: stage.to_string(),
        host_id: String::new(),
        parent_version_id: parent_version_id.to_string(),
        current_version_id: String::new(),
        status: PENDING.to_string(),
        endpoints: "{}".to_string(),
        created_at: super::now(),
        expires_at: String::new(),
        pool: -1,
    };
    Entity::insert(m.clone().into_active_model())
        .exec_without_returning(db)
        .await?;
    Ok(m)
}

/// The team's environment with this id.
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

/// The environment with this id, whatever its team (orchestrator, hub).
pub async fn get_any<C: ConnectionTrait>(db: &C, id: &str) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(id.to_string()).one(db).await
}

/// The project's newest environment named `name` that is not destroyed.
pub async fn find_by_name<C: ConnectionTrait>(
    db: &C,
    project_id: &str,
    name: &str,
) -> Result<Option<Model>, DbErr> {
    Entity::find()
        .filter(Column::ProjectId.eq(project_id))
        .filter(Column::Name.eq(name))
        .filter(Column::Status.ne(DESTROYED))
        .order_by_desc(Column::Id)
        .one(db)
        .await
}

/// The project's environments, oldest first (destroyed ones included).
pub async fn list_by_project<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    project_id: &str,
) -> Result<Vec<Model>, DbErr> {
    Entity::find()
        .filter(Column::TeamId.eq(team_id))
        .filter(Column::ProjectId.eq(project_id))
        .order_by_asc(Column::Id)
        .all(db)
        .await
}

/// Every status an environment can have, in lifecycle order.
pub const STATUSES: [&str; 6] = [PENDING, DEPLOYING, HEALTHY, FAILED, DESTROYING, DESTROYED];

/// The team's environments across projects, oldest first: only `project_id` when set,
/// only `status` when set, else (unless `all`) every status but [`DESTROYED`].
pub async fn list_by_team<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    project_id: Option<&str>,
    status: Option<&str>,
    all: bool,
) -> Result<Vec<Model>, DbErr> {
    let mut q = Entity::find().filter(Column::TeamId.eq(team_id));
    if let Some(p) = project_id {
        q = q.filter(Column::ProjectId.eq(p));
    }
    match status {
        Some(s) => q = q.filter(Column::Status.eq(s)),
        None if !all => q = q.filter(Column::Status.ne(DESTROYED)),
        None => {}
    }
    q.order_by_asc(Column::Id).all(db).await
}

/// Environments placed on `host_id`, oldest first.
pub async fn list_by_host<C: ConnectionTrait>(db: &C, host_id: &str) -> Result<Vec<Model>, DbErr> {
    Entity::find()
        .filter(Column::HostId.eq(host_id))
        .order_by_asc(Column::Id)
        .all(db)
        .await
}

/// Environments whose TTL has passed (`expires_at` set and `<= now`, RFC 3339 in the
/// store's format) that are not `destroying` or `destroyed`, oldest first.
pub async fn list_expired<C: ConnectionTrait>(db: &C, now: &str) -> Result<Vec<Model>, DbErr> {
    Entity::find()
        .filter(Column::ExpiresAt.ne(""))
        .filter(Column::ExpiresAt.lte(now))
        .filter(Column::Status.is_not_in([DESTROYING, DESTROYED]))
        .order_by_asc(Column::Id)
        .all(db)
        .await
}

async fn set_col<C: ConnectionTrait>(
    db: &C,
    id: &str,
    col: Column,
    v: String,
) -> Result<(), DbErr> {
    Entity::update_many()
        .col_expr(col, Expr::value(v))
        .filter(Column::Id.eq(id))
        .exec(db)
        .await?;
    Ok(())
}

/// Set the status.
pub async fn set_status<C: ConnectionTrait>(db: &C, id: &str, status: &str) -> Result<(), DbErr> {
    set_col(db, id, Column::Status, status.into()).await
}

/// Set the host.
pub async fn set_host<C: ConnectionTrait>(db: &C, id: &str, host_id: &str) -> Result<(), DbErr> {
    set_col(db, id, Column::HostId, host_id.into()).await
}

/// Set the current version.
pub async fn set_current_version<C: ConnectionTrait>(
    db: &C,
    id: &str,
    version_id: &str,
) -> Result<(), DbErr> {
    set_col(db, id, Column::CurrentVersionId, version_id.into()).await
}

/// Replace the endpoints map.
pub async fn set_endpoints<C: ConnectionTrait>(
    db: &C,
    id: &str,
    endpoints: &HashMap<String, String>,
) -> Result<(), DbErr> {
    let text = serde_json::to_string(endpoints).unwrap_or_else(|_| "{}".into());
    set_col(db, id, Column::Endpoints, text).await
}

/// Write every column of `m` (row identified by `m.id`).
pub async fn update<C: ConnectionTrait>(db: &C, m: Model) -> Result<Model, DbErr> {
    m.into_active_model().reset_all().update(db).await
}
