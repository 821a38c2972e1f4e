//! Hub tables: `clouds`, `join_tokens`, `hosts`, `commands`, `host_env_state`
//! (spec pages `15-ref-protocol.md`, `17-ref-targets.md`).
//!
//! - `clouds`: a credential and configuration record per provider (`manual`,
//!   `hetzner`, `e2b`, `daytona`); `config` is a JSON object (secrets included, masked
//!   only on output).
//! - `join_tokens`: `djt_` tokens stored as SHA-256 hex (`token_hash`), one hour, single
//!   use (`used_at`, `host_id` set in the transaction that creates the host).
//! - `hosts`: sidecar (`kind = "sidecar"`) and driver (`kind = "driver:<provider>"`)
//!   hosts; `secret_hash` is the SHA-256 hex of the `dhs_` secret; `capabilities` JSON.
//! - `commands`: every command sent to a host, written before the frame; `status` is
//!   `sent | acked | done | failed`; `payload`/`result` are JSON objects.
//! - `host_env_state`: a driver host's per-environment provider state (later issue).

use crate::util::{index, string, text, text_pk};
use sea_orm_migration::prelude::*;

/// Creates the hub tables.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(Alias::new("clouds"))
                .if_not_exists()
                .col(text_pk("id"))
                .col(string("team_id"))
                .col(string("provider"))
                .col(string("name"))
                .col(text("config"))
                .col(string("created_at"))
                .to_owned(),
        )
        .await?;
        m.create_index(index("clouds", &["team_id", "name"], true))
            .await?;

        m.create_table(
            Table::create()
                .table(Alias::new("join_tokens"))
                .if_not_exists()
                .col(text_pk("token_hash"))
                .col(string("team_id"))
                .col(string("cloud_id"))
                .col(string("created_at"))
                .col(string("expires_at"))
                .col(string("used_at"))
                .col(string("host_id"))
                .to_owned(),
        )
        .await?;

        m.create_table(
            Table::create()
                .table(Alias::new("hosts"))
                .if_not_exists()
                .col(text_pk("id"))
                .col(string("team_id"))
                .col(string("cloud_id"))
                .col(string("name"))
                .col(string("kind"))
                .col(string("status"))
                .col(string("provider_ref"))
                .col(string("secret_hash"))
                .col(text("capabilities"))
                .col(string("last_seen_at"))
                .col(string("created_at"))
                .to_owned(),
        )
        .await?;
        m.create_index(index("hosts", &["team_id"], false)).await?;

        m.create_table(
            Table::create()
                .table(Alias::new("commands"))
                .if_not_exists()
                .col(text_pk("id"))
                .col(string("team_id"))
                .col(string("host_id"))
                .col(string("env_id"))
                .col(string("kind"))
                .col(text("payload"))
                .col(string("status"))
                .col(text("result"))
                .col(text("error"))
                .col(string("created_at"))
                .col(string("updated_at"))
                .to_owned(),
        )
        .await?;
        m.create_index(index("commands", &["host_id", "status"], false))
            .await?;
        m.create_index(index("commands", &["env_id"], false))
            .await?;

        m.create_table(
            Table::create()
                .table(Alias::new("host_env_state"))
                .if_not_exists()
                .col(string("host_id"))
                .col(string("env_id"))
                .col(text("state"))
                .col(string("updated_at"))
                .primary_key(
                    Index::create()
                        .col(Alias::new("host_id"))
                        .col(Alias::new("env_id")),
                )
                .to_owned(),
        )
        .await?;
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for t in [
            "host_env_state",
            "commands",
            "hosts",
            "join_tokens",
            "clouds",
        ] {
            m.drop_table(Table::drop().table(Alias::new(t)).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
