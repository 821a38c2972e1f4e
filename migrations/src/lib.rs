//! sea-orm migrations for the denv control-plane store.
//!
//! The control plane applies every migration at start (`Migrator::up(db, None)`), on
//! SQLite and on Postgres alike. Column conventions: ids are prefixed ULID strings,
//! timestamps are RFC 3339 UTC strings (`""` when unset), JSON documents are text,
//! optional strings are `""` rather than `NULL`.
//!
//! Add a migration by adding a file `mYYYYMMDD_HHMMSS_name.rs` and one line to
//! [`Migrator::migrations`].

pub use sea_orm_migration::prelude::*;

mod m20261129_000001_core;
mod m20261129_000002_hosts;
mod m20261201_000001_env_ttl;
mod m20261201_000002_env_pool;
mod m20261202_000001_webhook_deliveries;
mod m20261202_000002_commands_typed;
mod m20261207_000001_snapshot_copies;
mod m20261207_000002_replicas;

/// The migration list, in order.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261129_000001_core::Migration),
            Box::new(m20261129_000002_hosts::Migration),
            Box::new(m20261201_000001_env_ttl::Migration),
            Box::new(m20261201_000002_env_pool::Migration),
            Box::new(m20261202_000001_webhook_deliveries::Migration),
            Box::new(m20261202_000002_commands_typed::Migration),
            Box::new(m20261207_000001_snapshot_copies::Migration),
            Box::new(m20261207_000002_replicas::Migration),
        ]
    }
}

/// Schema-building helpers shared by the migration files.
pub mod util {
    use sea_orm_migration::prelude::*;

    /// An identifier from a string (table or column name).
    pub fn id(name: &'static str) -> Alias {
        Alias::new(name)
    }

    /// `name TEXT NOT NULL DEFAULT ''` (ids, names, timestamps, JSON documents).
    pub fn text(name: &'static str) -> ColumnDef {
        ColumnDef::new(Alias::new(name))
            .text()
            .not_null()
            .default("")
            .to_owned()
    }

    /// `name TEXT NOT NULL PRIMARY KEY`.
    pub fn text_pk(name: &'static str) -> ColumnDef {
        ColumnDef::new(Alias::new(name))
            .string()
            .not_null()
            .primary_key()
            .to_owned()
    }

    /// `name VARCHAR NOT NULL DEFAULT ''` (indexable strings: ids, names, hashes).
    pub fn string(name: &'static str) -> ColumnDef {
        ColumnDef::new(Alias::new(name))
            .string()
            .not_null()
            .default("")
            .to_owned()
    }

    /// `name BIGINT NOT NULL DEFAULT 0`.
    pub fn big(name: &'static str) -> ColumnDef {
        ColumnDef::new(Alias::new(name))
            .big_integer()
            .not_null()
            .default(0)
            .to_owned()
    }

    /// `name INTEGER NOT NULL DEFAULT 0`.
    pub fn int(name: &'static str) -> ColumnDef {
        ColumnDef::new(Alias::new(name))
            .integer()
            .not_null()
            .default(0)
            .to_owned()
    }

    /// `name BOOLEAN NOT NULL DEFAULT false`.
    pub fn boolean(name: &'static str) -> ColumnDef {
        ColumnDef::new(Alias::new(name))
            .boolean()
            .not_null()
            .default(false)
            .to_owned()
    }

    /// A (possibly unique) index `idx_<table>_<cols>` on `table(cols…)`.
    pub fn index(table: &'static str, cols: &[&'static str], unique: bool) -> IndexCreateStatement {
        let mut i = Index::create();
        i.name(format!("idx_{}_{}", table, cols.join("_")))
            .table(Alias::new(table))
            .if_not_exists();
        for c in cols {
            i.col(Alias::new(*c));
        }
        if unique {
            i.unique();
        }
        i.to_owned()
    }
}
