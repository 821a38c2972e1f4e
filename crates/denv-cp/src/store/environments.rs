//! `environments`: a running stack on one host. The entity only: rows are read and
//! written through [`crate::orchestrator::repo`].

use sea_orm::entity::prelude::*;

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
    /// An [`EnvStatus`](crate::domain::EnvStatus) string.
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
