//! `snapshot_copies`: where copies of a version's snapshot live besides the host of the
//! environment that took it (`docs/reference/targets.md`, "Forks on any host"). One row
//! per (version, host) that received the snapshot with `snapshot.receive`: the host it
//! came from, the archive's size (bytes) and SHA-256 (lower-case hex), how long the
//! shipment took (ms, send and receive together) and when it was recorded (RFC 3339).
//! Rows are not removed when the version goes (copies are not garbage collected yet).

use crate::util::{big, id, string};
use sea_orm_migration::prelude::*;

/// Creates `snapshot_copies`.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(id("snapshot_copies"))
                .if_not_exists()
                .col(string("version_id"))
                .col(string("host_id"))
                .col(string("from_host_id"))
                .col(big("bytes"))
                .col(string("sha256"))
                .col(big("shipped_ms"))
                .col(string("created_at"))
                .primary_key(Index::create().col(id("version_id")).col(id("host_id")))
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(id("snapshot_copies")).to_owned())
            .await
    }
}
