//! `events`: an append-only log per subject (`env:<id>`, `dep:<id>`, `host:<id>`,
//! `cmd:<id>`), read newest first.

use sea_orm::entity::prelude::*;
#[allow(unused_imports)]
use sea_orm::{ActiveModelTrait, IntoActiveModel};
use sea_orm::{QueryOrder, QuerySelect};

/// An event row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "events")]
pub struct Model {
    /// `evt_…` (sorts in append order)
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub team_id: String,
    pub subject: String,
    /// e.g. `deployment.started`
    pub kind: String,
    /// JSON text of the body.
    pub body: String,
    pub at: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

impl Model {
    /// The body as JSON.
    pub fn body_json(&self) -> serde_json::Value {
        super::parse_json(&self.body)
    }
}

/// Append an event for `team_id` on `subject`.
pub async fn append<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    subject: &str,
    kind: &str,
    body: serde_json::Value,
) -> Result<Model, DbErr> {
    let m = Model {
        id: crate::ids::new_id("evt"),
        team_id: team_id.to_string(),
        subject: subject.to_string(),
        kind: kind.to_string(),
        body: super::json_text(&body),
        at: super::now(),
    };
    Entity::insert(m.clone().into_active_model())
        .exec_without_returning(db)
        .await?;
    Ok(m)
}

/// The team's events, newest first, at most `limit`; only `subject` when non-empty.
pub async fn list<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    subject: &str,
    limit: u64,
) -> Result<Vec<Model>, DbErr> {
    let mut q = Entity::find().filter(Column::TeamId.eq(team_id));
    if !subject.is_empty() {
        q = q.filter(Column::Subject.eq(subject));
    }
    q.order_by_desc(Column::Id).limit(limit).all(db).await
}
