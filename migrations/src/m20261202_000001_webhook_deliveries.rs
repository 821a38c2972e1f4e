//! `webhook_deliveries`: the GitHub webhook deliveries already processed, so a replay is
//! answered without being processed again (spec `12-ref-rest-api.md` *GitHub*). One row
//! per delivery id (`delivery:<X-GitHub-Delivery>`) and one per body digest
//! (`body:<sha256 hex>`): GitHub signs only the body, so a replay can carry any delivery
//! id. Rows are kept: a body has no signed time that would let an old one expire.

use crate::util::{id, string, text_pk};
use sea_orm_migration::prelude::*;

/// Creates `webhook_deliveries`.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(id("webhook_deliveries"))
                .if_not_exists()
                .col(text_pk("key"))
                .col(string("received_at"))
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(id("webhook_deliveries")).to_owned())
            .await
    }
}
