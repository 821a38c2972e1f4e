//! Admission of a `hello`: a join token for a new host, the host secret for a known one.

use super::util::{ct_eq, hash_secret, new_id, new_secret, now};
use super::Hub;
use crate::store::{hosts, join_tokens};
use denv_proto::json::to_json;
use denv_proto::v1::Hello;
use sea_orm::TransactionTrait;
use tonic::Status;

/// An admitted stream.
pub(crate) struct Admitted {
    pub(crate) host_id: String,
    pub(crate) team_id: String,
    /// Set on a first join: the secret for the `welcome` frame.
    pub(crate) secret: Option<String>,
    /// The protocol version chosen for the session (see [`negotiate`]).
    pub(crate) protocol: u32,
}

/// `a` or `a to b`, for messages.
fn show_range((min, max): (u32, u32)) -> String {
    if min == max {
        min.to_string()
    } else {
        format!("{min} to {max}")
    }
}

/// The protocol version spoken with a sidecar whose `hello` says it speaks
/// `min_protocol..=protocol`, by a control plane speaking `ours` (oldest, newest): the
/// highest version in both ranges (spec `15-ref-protocol.md`, "Session"; documented in
/// `docs/reference/protocol.md`, "Protocol versions").
///
/// A `protocol` of 0 is read as 1; a `min_protocol` of 0 (a sidecar older than the
/// negotiation) means the sidecar speaks only `protocol`.
///
/// Errors (the message of the `PERMISSION_DENIED` that refuses the call, which the
/// sidecar treats as fatal): `protocol: min_protocol <min> is above protocol <max>` for
/// a malformed range, and `protocol: no version in common: the sidecar speaks <range>,
/// this control plane speaks <range>` (a range is `n` or `n to m`).
pub(crate) fn negotiate(hello: &Hello, ours: (u32, u32)) -> Result<u32, String> {
    let max = hello.protocol.max(1);
    let min = if hello.min_protocol == 0 {
        max
    } else {
        hello.min_protocol
    };
    if min > max {
        return Err(format!(
            "protocol: min_protocol {min} is above protocol {max}"
        ));
    }
    let chosen = max.min(ours.1);
    if chosen < min.max(ours.0) {
        return Err(format!(
            "protocol: no version in common: the sidecar speaks {}, this control plane speaks {}",
            show_range((min, max)),
            show_range(ours)
        ));
    }
    Ok(chosen)
}

fn store_err(e: impl std::fmt::Display) -> Status {
    // Not a refusal: the sidecar retries.
    tracing::error!(error = %e, "hub store failed during admission");
    Status::unavailable(format!("store: {e}"))
}

impl Hub {
    /// Admits a hello or refuses it with `PERMISSION_DENIED` and the reason.
    pub(crate) async fn admit(&self, hello: &Hello) -> Result<Admitted, Status> {
        let protocol =
            negotiate(hello, self.inner.opts.protocols).map_err(Status::permission_denied)?;
        let caps = hello
            .capabilities
            .as_ref()
            .map(to_json)
            .unwrap_or_else(|| serde_json::json!({}));
        let db = self.db();
        let now = now();
        if hello.host_id.is_empty() {
            if !hello.token.starts_with("djt_") {
                return Err(Status::permission_denied(
                    "join: a join token (djt_…) is required on the first connect",
                ));
            }
            let host_id = new_id("host");
            let secret = new_secret("dhs");
            let txn = db.begin().await.map_err(store_err)?;
            let tok = match join_tokens::consume(&txn, &hash_secret(&hello.token), &host_id, &now)
                .await
            {
                Ok(t) => t,
                Err(join_tokens::JoinError::Db(e)) => return Err(store_err(e)),
                Err(e) => return Err(Status::permission_denied(e.to_string())),
            };
            let name = hello
                .capabilities
                .as_ref()
                .map(|c| c.hostname.clone())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| host_id.clone());
            hosts::insert(
                &txn,
                hosts::Model {
                    id: host_id.clone(),
                    team_id: tok.team_id.clone(),
                    cloud_id: tok.cloud_id.clone(),
                    name,
                    kind: hosts::KIND_SIDECAR.into(),
                    status: hosts::STATUS_CONNECTED.into(),
                    provider_ref: String::new(),
                    secret_hash: hash_secret(&secret),
                    capabilities: caps.to_string(),
                    last_seen_at: now.clone(),
                    created_at: now,
                },
            )
            .await
            .map_err(store_err)?;
            txn.commit().await.map_err(store_err)?;
            tracing::info!(host_id = %host_id, team_id = %tok.team_id, "host joined");
            return Ok(Admitted {
                host_id,
                team_id: tok.team_id,
                secret: Some(secret),
                protocol,
            });
        }

        let Some(host) = hosts::get(db, &hello.host_id).await.map_err(store_err)? else {
            return Err(Status::permission_denied(format!(
                "unknown host {}",
                hello.host_id
            )));
        };
        if host.kind != hosts::KIND_SIDECAR
            || host.secret_hash.is_empty()
            || !ct_eq(&hash_secret(&hello.token), &host.secret_hash)
        {
            return Err(Status::permission_denied("host secret rejected"));
        }
        hosts::record_hello(db, &host.id, &caps.to_string(), &now)
            .await
            .map_err(store_err)?;
        Ok(Admitted {
            host_id: host.id,
            team_id: host.team_id,
            secret: None,
            protocol,
        })
    }
}
