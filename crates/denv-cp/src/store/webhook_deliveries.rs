//! `webhook_deliveries`: GitHub webhook deliveries already processed (see the migration
//! `m20261202_000001_webhook_deliveries` for why both the delivery id and the body
//! digest are keys).

use sea_orm::entity::prelude::*;
use sea_orm::TransactionTrait;

/// A processed-delivery row.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_deliveries")]
pub struct Model {
    /// `delivery:<X-GitHub-Delivery>` or `body:<sha256 hex of the raw body>`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub key: String,
    /// RFC 3339.
    pub received_at: String,
}

/// No relations are navigated through the ORM.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// Records a delivery by its id and its body digest, atomically. `Ok(false)` when
/// either was recorded before (a replay, or two copies racing: exactly one gets `true`).
pub async fn record_first<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    delivery: &str,
    body_sha256: &str,
) -> Result<bool, DbErr> {
    let now = super::now();
    let txn = db.begin().await?;
    for key in [
        format!("delivery:{delivery}"),
        format!("body:{body_sha256}"),
    ] {
        let row = ActiveModel {
            key: sea_orm::Set(key),
            received_at: sea_orm::Set(now.clone()),
        };
        match Entity::insert(row).exec_without_returning(&txn).await {
            Ok(_) => {}
            Err(e) if super::is_unique_violation(&e) => {
                txn.rollback().await?;
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
    }
    txn.commit().await?;
    Ok(true)
}

/// Removes a delivery's two keys (its processing failed, so a redelivery must run).
pub async fn forget<C: ConnectionTrait>(
    db: &C,
    delivery: &str,
    body_sha256: &str,
) -> Result<(), DbErr> {
    Entity::delete_many()
        .filter(Column::Key.is_in([
            format!("delivery:{delivery}"),
            format!("body:{body_sha256}"),
        ]))
        .exec(db)
        .await?;
    Ok(())
}
