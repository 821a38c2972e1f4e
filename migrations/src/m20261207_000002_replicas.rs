//! Several control-plane replicas on one PostgreSQL (`docs/explanation/replicas.md`):
//!
//! - `replicas`: one row per running replica (`rep_<ulid>`), the URL the others reach it
//!   at, `started_at` and `seen_at` (milliseconds since the epoch on the database's
//!   clock; a heartbeat every 2 s, dead after 10 s without one);
//! - `leases`: which replica runs a deployment (`deployment_id`, its `env_id`,
//!   `replica_id`, `expires_at` in database milliseconds); `active` is set while the
//!   deployment holds its environment's turn (one active lease per environment);
//! - `hosts.replica_id` (which replica holds the host's stream, `""` for none),
//!   `hosts.load` (the latest heartbeat's `HostLoad`, protobuf bytes as base64, `""`
//!   before one) and `hosts.load_at` (RFC 3339);
//! - `oauth_states`: GitHub sign-in `state` values (so the callback may reach any
//!   replica).
//!
//! Created on SQLite too (one schema for both); only PostgreSQL runs replica mode.

use crate::util::{big, boolean, id, string, text, text_pk};
use sea_orm_migration::prelude::*;

/// Creates `replicas`, `leases` and `oauth_states`, adds the hosts' replica and load
/// columns.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(id("replicas"))
                .if_not_exists()
                .col(text_pk("id"))
                .col(text("url"))
                .col(big("started_at"))
                .col(big("seen_at"))
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(id("leases"))
                .if_not_exists()
                .col(text_pk("deployment_id"))
                .col(string("env_id"))
                .col(string("replica_id"))
                .col(big("expires_at"))
                .col(boolean("active"))
                .to_owned(),
        )
        .await?;
        m.create_index(crate::util::index("leases", &["env_id"], false))
            .await?;
        m.create_table(
            Table::create()
                .table(id("oauth_states"))
                .if_not_exists()
                .col(text_pk("state"))
                .col(text("return_to"))
                .col(string("created_at"))
                .to_owned(),
        )
        .await?;
        // SQLite adds one column per statement.
        for col in [string("replica_id"), text("load"), string("load_at")] {
            m.alter_table(Table::alter().table(id("hosts")).add_column(col).to_owned())
                .await?;
        }
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for col in ["replica_id", "load", "load_at"] {
            m.alter_table(
                Table::alter()
                    .table(id("hosts"))
                    .drop_column(id(col))
                    .to_owned(),
            )
            .await?;
        }
        m.drop_table(Table::drop().table(id("oauth_states")).to_owned())
            .await?;
        m.drop_table(Table::drop().table(id("leases")).to_owned())
            .await?;
        m.drop_table(Table::drop().table(id("replicas")).to_owned())
            .await
    }
}
