//! `phases`: the ordered steps of a deployment, each with evidence.

use denv_proto::v1;
use sea_orm::entity::prelude::*;
use sea_orm::QueryOrder;
#[allow(unused_imports)]
use sea_orm::{ActiveModelTrait, IntoActiveModel};

/// Status: not started.
pub const PENDING: &str = "pending";
/// Status: executing.
pub const RUNNING: &str = "running";
/// Status: done.
pub const OK: &str = "ok";
/// Status: failed.
pub const FAILED: &str = "failed";
/// Status: not needed this time, or after a failure.
pub const SKIPPED: &str = "skipped";

/// A phase row (primary key `(deployment_id, seq)`).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "phases")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub deployment_id: String,
    /// 1, 2, ... in run order.
    #[sea_orm(primary_key, auto_increment = false)]
    pub seq: i32,
    pub name: String,
    /// [`PENDING`] | [`RUNNING`] | [`OK`] | [`FAILED`] | [`SKIPPED`]
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

impl Model {
    /// The evidence as JSON (`null` when unset).
    pub fn evidence_json(&self) -> serde_json::Value {
        super::parse_json(&self.evidence)
    }

    /// The wire message.
    pub fn to_proto(&self) -> v1::Phase {
        v1::Phase {
            deployment_id: self.deployment_id.clone(),
            seq: self.seq,
            name: self.name.clone(),
            status: self.status.clone(),
            evidence: Some(denv_proto::json::to_value(&self.evidence_json())),
            error: self.error.clone(),
            started_at: self.started_at.clone(),
            finished_at: self.finished_at.clone(),
        }
    }
}

/// Create the deployment's phases `names` (seq 1..), all `pending`.
pub async fn create_all<C: ConnectionTrait>(
    db: &C,
    deployment_id: &str,
    names: &[&str],
) -> Result<Vec<Model>, DbErr> {
    let rows: Vec<Model> = names
        .iter()
        .enumerate()
        .map(|(i, n)| Model {
            deployment_id: deployment_id.to_string(),
            seq: i as i32 + 1,
            name: (*n).to_owned(),
            status: PENDING.into(),
            evidence: String::new(),
            error: String::new(),
            started_at: String::new(),
            finished_at: String::new(),
        })
        .collect();
    if !rows.is_empty() {
        Entity::insert_many(rows.iter().cloned().map(IntoActiveModel::into_active_model))
            .exec_without_returning(db)
            .await?;
    }
    Ok(rows)
}

/// The deployment's phases by seq.
pub async fn list<C: ConnectionTrait>(db: &C, deployment_id: &str) -> Result<Vec<Model>, DbErr> {
    Entity::find()
        .filter(Column::DeploymentId.eq(deployment_id))
        .order_by_asc(Column::Seq)
        .all(db)
        .await
}

/// Mark phase `seq` running, `StartedAt` now.
pub async fn start<C: ConnectionTrait>(db: &C, deployment_id: &str, seq: i32) -> Result<(), DbErr> {
    Entity::update_many()
        .col_expr(Column::Status, Expr::value(RUNNING))
        .col_expr(Column::StartedAt, Expr::value(super::now()))
        .filter(Column::DeploymentId.eq(deployment_id))
        .filter(Column::Seq.eq(seq))
        .exec(db)
        .await?;
    Ok(())
}

/// Finish phase `seq` with `status` (`ok`, `failed`, `skipped`), its evidence and error
/// (`""` when none), `FinishedAt` now.
pub async fn finish<C: ConnectionTrait>(
    db: &C,
    deployment_id: &str,
    seq: i32,
    status: &str,
    evidence: &serde_json::Value,
    error: &str,
) -> Result<(), DbErr> {
    Entity::update_many()
        .col_expr(Column::Status, Expr::value(status))
        .col_expr(Column::Evidence, Expr::value(super::json_text(evidence)))
        .col_expr(Column::Error, Expr::value(error))
        .col_expr(Column::FinishedAt, Expr::value(super::now()))
        .filter(Column::DeploymentId.eq(deployment_id))
        .filter(Column::Seq.eq(seq))
        .exec(db)
        .await?;
    Ok(())
}

/// Write every column of `m` (row identified by `(deployment_id, seq)`).
pub async fn update<C: ConnectionTrait>(db: &C, m: Model) -> Result<Model, DbErr> {
    m.into_active_model().reset_all().update(db).await
}
