//! `teams`: every object belongs to one.

use sea_orm::entity::prelude::*;
#[allow(unused_imports)]
use sea_orm::{ActiveModelTrait, IntoActiveModel};
use sea_orm::{PaginatorTrait, QueryOrder};

/// A team row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "teams")]
pub struct Model {
    /// `team_…`
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub name: String,
    pub created_at: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// Create a team named `name`.
pub async fn create<C: ConnectionTrait>(db: &C, name: &str) -> Result<Model, DbErr> {
    let m = Model {
        id: crate::ids::new_id("team"),
        name: name.to_string(),
        created_at: super::now(),
    };
    Entity::insert(m.clone().into_active_model())
        .exec_without_returning(db)
        .await?;
    Ok(m)
}

/// The team with this id.
pub async fn get<C: ConnectionTrait>(db: &C, id: &str) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(id.to_string()).one(db).await
}

/// How many teams exist (bootstrap runs only at zero).
pub async fn count<C: ConnectionTrait>(db: &C) -> Result<u64, DbErr> {
    Entity::find().count(db).await
}

/// Every team, oldest first.
pub async fn list_all<C: ConnectionTrait>(db: &C) -> Result<Vec<Model>, DbErr> {
    Entity::find().order_by_asc(Column::Id).all(db).await
}
