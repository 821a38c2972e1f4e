//! `versions`: an immutable spec plus (once captured) a snapshot on the host. The entity
//! only: rows are read and written through [`crate::orchestrator::repo`].

use sea_orm::entity::prelude::*;

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
