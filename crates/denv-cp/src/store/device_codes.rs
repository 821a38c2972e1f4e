//! `device_codes`: the CLI device flow (`ddc_…` device code, `XXXX-XXXX` user code,
//! 15-minute expiry). Status goes `pending` → `approved` → `handed_out`.
//!
//! The approved key's secret is not stored here; the auth service holds it in process
//! memory until the CLI picks it up (spec `18-ref-config.md`, process notes).

use crate::ids;
use sea_orm::entity::prelude::*;
#[allow(unused_imports)]
use sea_orm::{ActiveModelTrait, IntoActiveModel};

/// How long a device code is valid.
pub const DEVICE_CODE_TTL: chrono::Duration = chrono::Duration::minutes(15);

/// Waiting for a signed-in user to approve.
pub const PENDING: &str = "pending";
/// Approved: a key was minted and waits for the CLI.
pub const APPROVED: &str = "approved";
/// The key was handed out; further polls answer `410`.
pub const HANDED_OUT: &str = "handed_out";

/// A device-code row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "device_codes")]
pub struct Model {
    /// `dvc_…`
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// Hex SHA-256 of the `ddc_…` device code.
    pub hash: String,
    pub user_code: String,
    /// [`PENDING`] | [`APPROVED`] | [`HANDED_OUT`]
    pub status: String,
    /// Set on approval.
    pub team_id: String,
    /// The minted key's id, set on approval.
    pub key_id: String,
    /// The approving user's id.
    pub approved_by: String,
    pub created_at: String,
    pub expires_at: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

impl Model {
    /// Whether the code is past its 15 minutes.
    pub fn expired(&self) -> bool {
        super::parse_time(&self.expires_at).is_none_or(|t| t <= chrono::Utc::now())
    }
}

/// Start a device login. Returns the row and the `ddc_…` device code.
pub async fn create<C: ConnectionTrait>(db: &C) -> Result<(Model, String), DbErr> {
    let code = ids::new_secret("ddc");
    let now = chrono::Utc::now();
    let m = Model {
        id: ids::new_id("dvc"),
        hash: ids::hash_secret(&code),
        user_code: ids::new_user_code(),
        status: PENDING.into(),
        team_id: String::new(),
        key_id: String::new(),
        approved_by: String::new(),
        created_at: super::fmt_time(now),
        expires_at: super::fmt_time(now + DEVICE_CODE_TTL),
    };
    Entity::insert(m.clone().into_active_model())
        .exec_without_returning(db)
        .await?;
    Ok((m, code))
}

/// The row of a device code.
pub async fn find_by_device_code<C: ConnectionTrait>(
    db: &C,
    code: &str,
) -> Result<Option<Model>, DbErr> {
    let h = ids::hash_secret(code);
    let m = Entity::find()
        .filter(Column::Hash.eq(h.clone()))
        .one(db)
        .await?;
    Ok(m.filter(|m| ids::ct_eq(&m.hash, &h)))
}

/// The pending, unexpired row with this user code (case-insensitive).
pub async fn find_pending_by_user_code<C: ConnectionTrait>(
    db: &C,
    user_code: &str,
) -> Result<Option<Model>, DbErr> {
    let rows = Entity::find()
        .filter(Column::UserCode.eq(user_code.trim().to_ascii_uppercase()))
        .filter(Column::Status.eq(PENDING))
        .all(db)
        .await?;
    Ok(rows.into_iter().find(|m| !m.expired()))
}

/// Mark a pending code approved for `team_id` with the minted `key_id`. `false` when the
/// code was no longer pending.
pub async fn approve<C: ConnectionTrait>(
    db: &C,
    id: &str,
    team_id: &str,
    key_id: &str,
    user_id: &str,
) -> Result<bool, DbErr> {
    let r = Entity::update_many()
        .col_expr(Column::Status, Expr::value(APPROVED))
        .col_expr(Column::TeamId, Expr::value(team_id))
        .col_expr(Column::KeyId, Expr::value(key_id))
        .col_expr(Column::ApprovedBy, Expr::value(user_id))
        .filter(Column::Id.eq(id))
        .filter(Column::Status.eq(PENDING))
        .exec(db)
        .await?;
    Ok(r.rows_affected == 1)
}

/// Mark an approved code handed out. `false` when it was not `approved` (a second
/// hand-out).
pub async fn mark_handed_out<C: ConnectionTrait>(db: &C, id: &str) -> Result<bool, DbErr> {
    let r = Entity::update_many()
        .col_expr(Column::Status, Expr::value(HANDED_OUT))
        .filter(Column::Id.eq(id))
        .filter(Column::Status.eq(APPROVED))
        .exec(db)
        .await?;
    Ok(r.rows_affected == 1)
}
