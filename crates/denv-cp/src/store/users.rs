//! `users`: people who sign in (GitHub, or dev-login by email).

use sea_orm::entity::prelude::*;
#[allow(unused_imports)]
use sea_orm::{ActiveModelTrait, IntoActiveModel};

/// A user row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "users")]
pub struct Model {
    /// `usr_…`
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// GitHub user id (0 for dev-login users).
    pub github_id: i64,
    pub login: String,
    pub name: String,
    pub email: String,
    pub created_at: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// The user with this id.
pub async fn get<C: ConnectionTrait>(db: &C, id: &str) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(id.to_string()).one(db).await
}

/// The dev-login user with this email, created if new (login = the email's local part).
/// Returns the user and whether it was created. A non-empty `name` updates the name.
pub async fn upsert_by_email<C: ConnectionTrait>(
    db: &C,
    email: &str,
    name: &str,
) -> Result<(Model, bool), DbErr> {
    if let Some(mut u) = Entity::find()
        .filter(Column::Email.eq(email))
        .filter(Column::GithubId.eq(0))
        .one(db)
        .await?
    {
        if !name.is_empty() && u.name != name {
            Entity::update_many()
                .col_expr(Column::Name, Expr::value(name))
                .filter(Column::Id.eq(u.id.clone()))
                .exec(db)
                .await?;
            u.name = name.to_string();
        }
        return Ok((u, false));
    }
    let login = email.split('@').next().unwrap_or(email).to_string();
    let m = Model {
        id: crate::ids::new_id("usr"),
        github_id: 0,
        login,
        name: name.to_string(),
        email: email.to_string(),
        created_at: super::now(),
    };
    Entity::insert(m.clone().into_active_model())
        .exec_without_returning(db)
        .await?;
    Ok((m, true))
}

/// The GitHub user with this id, created or updated. Returns the user and whether it
/// was created.
pub async fn upsert_github<C: ConnectionTrait>(
    db: &C,
    github_id: i64,
    login: &str,
    name: &str,
    email: &str,
) -> Result<(Model, bool), DbErr> {
    if let Some(u) = Entity::find()
        .filter(Column::GithubId.eq(github_id))
        .one(db)
        .await?
    {
        Entity::update_many()
            .col_expr(Column::Login, Expr::value(login))
            .col_expr(Column::Name, Expr::value(name))
            .col_expr(Column::Email, Expr::value(email))
            .filter(Column::Id.eq(u.id.clone()))
            .exec(db)
            .await?;
        let u = Model {
            login: login.into(),
            name: name.into(),
            email: email.into(),
            ..u
        };
        return Ok((u, false));
    }
    let m = Model {
        id: crate::ids::new_id("usr"),
        github_id,
        login: login.to_string(),
        name: name.to_string(),
        email: email.to_string(),
        created_at: super::now(),
    };
    Entity::insert(m.clone().into_active_model())
        .exec_without_returning(db)
        .await?;
    Ok((m, true))
}
