//! `environments.expires_at`: when an environment's TTL destroys it (RFC 3339 UTC, `""`
//! = no TTL; spec pages `12-ref-rest-api.md`, `16-ref-deployments.md`).

use crate::util::{id, string};
use sea_orm_migration::prelude::*;

/// Adds `environments.expires_at`.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(id("environments"))
                .add_column(string("expires_at"))
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(id("environments"))
                .drop_column(id("expires_at"))
                .to_owned(),
        )
        .await
    }
}
