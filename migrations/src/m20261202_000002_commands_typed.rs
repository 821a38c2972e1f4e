//! `commands` holds each host command as its encoded protocol message (spec
//! `15-ref-protocol.md`, command lifecycle) instead of a `kind` string and the JSON of
//! the payload (which were rebuilt into a frame by naming the oneof field after the
//! kind).
//!
//! New columns: `message` (the protobuf encoding of the whole `Command`, bulk bytes left
//! out), `left_out` (how many bulk bytes were left out of `message`, `0` when it is
//! whole), `result` (the protobuf encoding of the `CommandResult` once one arrived, else
//! NULL) and `result_left_out`. `kind`, `payload` and the JSON `result` are gone.
//!
//! Existing rows are converted: a row's JSON is read back into its message exactly as
//! the hub read it before (`{command_id, kind, env_id, <kind as field>: payload}`), so
//! an open command is sent again after the upgrade and a finished one still answers a
//! resumed deployment. A row that cannot be read is kept as `failed` with
//! `stored command unreadable after upgrade: <why>` (an open one) or with its result
//! dropped (a finished one). Not reversible: `down` refuses.

use crate::util::{big, id, index, string, text, text_pk};
use denv_proto::v1::{Command, CommandResult};
use prost::Message;
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{
    ConnectionTrait, DatabaseBackend, QueryResult, Statement, TryGetable, Value as DbValue,
};
use serde_json::{json, Value};

/// Makes `commands` again with the typed columns.
#[derive(DeriveMigrationName)]
pub struct Migration;

/// The oneof field of a kind (`env.create` → `env_create`).
fn field_of(kind: &str) -> String {
    kind.replace('.', "_")
}

fn parse(text: &str) -> Result<Value, String> {
    if text.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_str(text).map_err(|e| e.to_string())
}

/// The bytes a stored JSON payload says it left out (`not_stored: {field: n}`).
fn left_out(j: &Value) -> i64 {
    j.get("not_stored")
        .and_then(Value::as_object)
        .map(|m| m.values().filter_map(Value::as_i64).sum())
        .unwrap_or(0)
}

/// The message of an old row, and the bytes its payload left out.
fn old_command(
    id: &str,
    kind: &str,
    env_id: &str,
    payload: &str,
) -> Result<(Vec<u8>, i64), String> {
    let payload = parse(payload)?;
    let gone = left_out(&payload);
    let mut j = json!({"command_id": id, "kind": kind, "env_id": env_id});
    j[field_of(kind)] = payload;
    let cmd: Command = serde_json::from_value(j).map_err(|e| e.to_string())?;
    if cmd.payload.is_none() {
        return Err(format!("unknown kind {kind}"));
    }
    Ok((cmd.encode_to_vec(), gone))
}

/// The result message of an old finished row, and the bytes it left out.
fn old_result(
    id: &str,
    kind: &str,
    ok: bool,
    error: &str,
    result: &str,
) -> Result<(Vec<u8>, i64), String> {
    let body = parse(result)?;
    let gone = left_out(&body);
    let mut j = json!({"command_id": id, "ok": ok, "error": error});
    if ok {
        j[field_of(kind)] = body;
    }
    let res: CommandResult = serde_json::from_value(j).map_err(|e| e.to_string())?;
    Ok((res.encode_to_vec(), gone))
}

/// One old row as the values of the new one, in the column order of the insert.
fn convert(row: &QueryResult) -> Result<Vec<DbValue>, DbErr> {
    let id: String = get(row, "id")?;
    let kind: String = get(row, "kind")?;
    let env_id: String = get(row, "env_id")?;
    let mut status: String = get(row, "status")?;
    let mut error: String = get(row, "error")?;
    let open = status == "sent" || status == "acked";
    let (message, left) = match old_command(&id, &kind, &env_id, &get::<String>(row, "payload")?) {
        Ok(m) => m,
        Err(why) => {
            if open {
                status = "failed".into();
                error = format!("stored command unreadable after upgrade: {why}");
            }
            (Vec::new(), 0)
        }
    };
    let (result, result_left) = if open {
        (None, 0)
    } else {
        // A failure's outcome is its error; a success's is its result message.
        let text: String = get(row, "result")?;
        let done = status == "done";
        match old_result(&id, &kind, done, &error, &text) {
            Ok((r, n)) if done || !text.is_empty() => (Some(r), n),
            _ => (None, 0),
        }
    };
    Ok(vec![
        id.into(),
        get::<String>(row, "team_id")?.into(),
        get::<String>(row, "host_id")?.into(),
        env_id.into(),
        status.into(),
        message.into(),
        left.into(),
        result.into(),
        result_left.into(),
        error.into(),
        get::<String>(row, "created_at")?.into(),
        get::<String>(row, "updated_at")?.into(),
    ])
}

fn get<T: TryGetable>(row: &QueryResult, col: &str) -> Result<T, DbErr> {
    row.try_get("", col)
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        let db = m.get_connection();
        let backend = db.get_database_backend();
        // The rows, converted, are held while the table is made again (finished rows
        // are pruned after 7 days, so this is at most a week of commands).
        let mut rows = Vec::new();
        for row in db
            .query_all(Statement::from_string(
                backend,
                "SELECT id, team_id, host_id, env_id, kind, payload, status, result, error, \
                 created_at, updated_at FROM commands",
            ))
            .await?
        {
            rows.push(convert(&row)?);
        }

        m.drop_table(Table::drop().table(id("commands")).to_owned())
            .await?;
        m.create_table(
            Table::create()
                .table(id("commands"))
                .col(text_pk("id"))
                .col(string("team_id"))
                .col(string("host_id"))
                .col(string("env_id"))
                .col(string("status"))
                .col(ColumnDef::new(id("message")).blob().not_null())
                .col(big("left_out"))
                .col(ColumnDef::new(id("result")).blob().null())
                .col(big("result_left_out"))
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
        m.create_index(index("commands", &["status", "updated_at"], false))
            .await?;

        let insert = match backend {
            DatabaseBackend::Postgres => {
                "INSERT INTO commands (id, team_id, host_id, env_id, status, message, left_out, \
                 result, result_left_out, error, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
            }
            _ => {
                "INSERT INTO commands (id, team_id, host_id, env_id, status, message, left_out, \
                 result, result_left_out, error, created_at, updated_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            }
        };
        for values in rows {
            db.execute(Statement::from_sql_and_values(backend, insert, values))
                .await?;
        }
        Ok(())
    }

    async fn down(&self, _m: &SchemaManager) -> Result<(), DbErr> {
        Err(DbErr::Migration(
            "m20261202_000002_commands_typed cannot be undone: the JSON columns it replaced are gone".into(),
        ))
    }
}
