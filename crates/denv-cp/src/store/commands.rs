//! `commands`: every command sent to a host (spec `15-ref-protocol.md`, command
//! lifecycle). A row is written with status `sent` BEFORE its frame goes on the stream;
//! `ack` moves it to `acked`, the `result` to `done` (ok) or `failed` (with `error`), a
//! caller's timeout to `failed` (`timed out after …`). `message` is the protobuf
//! encoding of the whole `Command` frame and `result` that of its `CommandResult` (NULL
//! until one arrives): what is read back is the typed message, never rebuilt from a
//! kind string. Bulk bytes (tar archives in and out, exec stdin) are never stored: they
//! are emptied in the stored message and counted in `left_out` / `result_left_out`
//! (see `hub::util::stored_command`). Finished rows are deleted after 7 days
//! ([`prune_finished`]).

use sea_orm::entity::prelude::*;
use sea_orm::sea_query::Expr;
use sea_orm::QueryOrder;

/// A command row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "commands")]
pub struct Model {
    /// `cmd_<ulid>`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// Team of the host.
    pub team_id: String,
    /// Addressed host.
    pub host_id: String,
    /// Addressed environment (`""` for `host.report`).
    pub env_id: String,
    /// `sent` | `acked` | `done` | `failed`.
    pub status: String,
    /// The `Command` frame, protobuf-encoded, its bulk bytes emptied.
    pub message: Vec<u8>,
    /// Bytes of bulk fields emptied in `message` (`0`: it is whole and can be sent
    /// again from the row).
    pub left_out: i64,
    /// The `CommandResult`, protobuf-encoded, bulk bytes emptied; `None` until a result
    /// arrives (and for a failure the hub recorded itself, such as a timeout).
    pub result: Option<Vec<u8>>,
    /// Bytes of bulk fields emptied in `result`.
    pub result_left_out: i64,
    /// The sidecar's error or the hub's (`timed out after 15m0s`), else `""`.
    pub error: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339, last status change.
    pub updated_at: String,
}

/// No relations are navigated through the ORM.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// Written before the frame is sent.
pub const SENT: &str = "sent";
/// The sidecar has the frame.
pub const ACKED: &str = "acked";
/// Result `ok: true`.
pub const DONE: &str = "done";
/// Result `ok: false`, or timed out.
pub const FAILED: &str = "failed";

/// Deletes finished rows (`done`, `failed`) last changed before `cutoff` (RFC 3339).
/// Returns how many were deleted.
pub async fn prune_finished<C: ConnectionTrait>(db: &C, cutoff: &str) -> Result<u64, DbErr> {
    Ok(Entity::delete_many()
        .filter(Column::Status.is_in([DONE, FAILED]))
        .filter(Column::UpdatedAt.lt(cutoff))
        .exec(db)
        .await?
        .rows_affected)
}

/// Inserts a command row.
pub async fn insert<C: ConnectionTrait>(db: &C, m: Model) -> Result<Model, DbErr> {
    let am: ActiveModel = m.clone().into();
    Entity::insert(am).exec_without_returning(db).await?;
    Ok(m)
}

/// A command by id.
pub async fn get<C: ConnectionTrait>(db: &C, id: &str) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(id.to_string()).one(db).await
}

/// Commands of a host with no result yet (`sent` or `acked`), oldest first: what is
/// sent again when the host reconnects.
pub async fn open_for_host<C: ConnectionTrait>(db: &C, host_id: &str) -> Result<Vec<Model>, DbErr> {
    Entity::find()
        .filter(Column::HostId.eq(host_id))
        .filter(Column::Status.is_in([SENT, ACKED]))
        .order_by_asc(Column::CreatedAt)
        .order_by_asc(Column::Id)
        .all(db)
        .await
}

/// `sent` → `acked` (no change in any other status).
pub async fn mark_acked<C: ConnectionTrait>(db: &C, id: &str, now: &str) -> Result<(), DbErr> {
    Entity::update_many()
        .col_expr(Column::Status, Expr::value(ACKED))
        .col_expr(Column::UpdatedAt, Expr::value(now))
        .filter(Column::Id.eq(id))
        .filter(Column::Status.eq(SENT))
        .exec(db)
        .await
        .map(|_| ())
}

/// Stores a result. An open row becomes `done` or `failed`; a row already closed (a
/// caller timed out) keeps its status and error but gets the late result. `result` is
/// the encoded `CommandResult` and `left_out` the bulk bytes emptied in it. Returns
/// whether the row was open.
pub async fn record_result<C: ConnectionTrait>(
    db: &C,
    id: &str,
    ok: bool,
    (result, left_out): (Vec<u8>, i64),
    error: &str,
    now: &str,
) -> Result<bool, DbErr> {
    let res = Entity::update_many()
        .col_expr(Column::Status, Expr::value(if ok { DONE } else { FAILED }))
        .col_expr(Column::Result, Expr::value(result.clone()))
        .col_expr(Column::ResultLeftOut, Expr::value(left_out))
        .col_expr(Column::Error, Expr::value(error))
        .col_expr(Column::UpdatedAt, Expr::value(now))
        .filter(Column::Id.eq(id))
        .filter(Column::Status.is_in([SENT, ACKED]))
        .exec(db)
        .await?;
    if res.rows_affected == 1 {
        return Ok(true);
    }
    Entity::update_many()
        .col_expr(Column::Result, Expr::value(result))
        .col_expr(Column::ResultLeftOut, Expr::value(left_out))
        .col_expr(Column::UpdatedAt, Expr::value(now))
        .filter(Column::Id.eq(id))
        .exec(db)
        .await?;
    Ok(false)
}

/// Marks an open row `failed` with `error` (a caller's timeout). Returns whether the
/// row was still open.
pub async fn fail_open<C: ConnectionTrait>(
    db: &C,
    id: &str,
    error: &str,
    now: &str,
) -> Result<bool, DbErr> {
    let res = Entity::update_many()
        .col_expr(Column::Status, Expr::value(FAILED))
        .col_expr(Column::Error, Expr::value(error))
        .col_expr(Column::UpdatedAt, Expr::value(now))
        .filter(Column::Id.eq(id))
        .filter(Column::Status.is_in([SENT, ACKED]))
        .exec(db)
        .await?;
    Ok(res.rows_affected == 1)
}
