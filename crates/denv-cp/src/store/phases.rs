//! `phases`: the ordered steps of a deployment, each with evidence. The entity only:
//! rows are read and written through [`crate::orchestrator::repo`].

use sea_orm::entity::prelude::*;

/// A phase row (primary key `(deployment_id, seq)`).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "phases")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub deployment_id: String,
    /// 1, 2, ... in run order.
    #[sea_orm(primary_key, auto_increment = false)]
    pub seq: i32,
    /// A [`PhaseName`](crate::domain::PhaseName) string.
    pub name: String,
    /// A [`PhaseStatus`](crate::domain::PhaseStatus) string.
    pub status: String,
    /// JSON text of the evidence (`""` = null).
    pub evidence: String,
    pub error: String,
    pub started_at: String,
    pub finished_at: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
