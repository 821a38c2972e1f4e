//! `clouds`: provider credentials and configuration (spec `17-ref-targets.md`).
//! `config` is the JSON object as validated (defaults filled in), with every credential
//! field sealed under `DENV_SECRET_KEY` ([`crate::sealed`]); answers mask them.

use sea_orm::entity::prelude::*;
use sea_orm::QueryOrder;

/// A cloud row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "clouds")]
pub struct Model {
    /// `cloud_<ulid>`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// Owning team.
    pub team_id: String,
    /// `manual` | `hetzner` | `e2b` | `daytona`.
    pub provider: String,
    /// Unique per team.
    pub name: String,
    /// JSON object.
    pub config: String,
    /// RFC 3339.
    pub created_at: String,
}

/// No relations are navigated through the ORM.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// Inserts a cloud row.
pub async fn insert<C: ConnectionTrait>(db: &C, m: Model) -> Result<Model, DbErr> {
    let am: ActiveModel = m.clone().into();
    Entity::insert(am).exec_without_returning(db).await?;
    Ok(m)
}

/// The team's clouds, oldest first.
pub async fn list<C: ConnectionTrait>(db: &C, team_id: &str) -> Result<Vec<Model>, DbErr> {
    Entity::find()
        .filter(Column::TeamId.eq(team_id))
        .order_by_asc(Column::CreatedAt)
        .order_by_asc(Column::Id)
        .all(db)
        .await
}

/// A cloud of the team by id.
pub async fn get_in_team<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    id: &str,
) -> Result<Option<Model>, DbErr> {
    Ok(Entity::find_by_id(id.to_string())
        .one(db)
        .await?
        .filter(|c| c.team_id == team_id))
}

/// A cloud of the team by name.
pub async fn by_name<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    name: &str,
) -> Result<Option<Model>, DbErr> {
    Entity::find()
        .filter(Column::TeamId.eq(team_id))
        .filter(Column::Name.eq(name))
        .one(db)
        .await
}
