//! `deployments`: one change to an environment, run as ordered phases
//! (spec `16-ref-deployments.md`). The entity only: rows are read and written through
//! [`crate::orchestrator::repo`].

use sea_orm::entity::prelude::*;

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
    /// A [`Kind`](crate::domain::Kind) string.
    pub kind: String,
    /// A [`DeploymentStatus`](crate::domain::DeploymentStatus) string.
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
