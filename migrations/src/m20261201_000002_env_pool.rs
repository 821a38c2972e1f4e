//! `environments.pool`: the warm pool size set on an environment by a fork or sandbox
//! request's `pool` field (`-1` = not set: the current version's `x-denv.pool` applies;
//! `docs/reference/deployments.md` "Warm pool").

use crate::util::id;
use sea_orm_migration::prelude::*;

/// Adds `environments.pool INTEGER NOT NULL DEFAULT -1`.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(id("environments"))
                .add_column(
                    ColumnDef::new(id("pool"))
                        .integer()
                        .not_null()
                        .default(-1)
                        .to_owned(),
                )
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(id("environments"))
                .drop_column(id("pool"))
                .to_owned(),
        )
        .await
    }
}
