//! `GET /v1/envs/{env}/logs`: an environment's container logs over plain HTTP (our
//! manual's `docs/reference/rest-api.md`, "Logs"; the REST face of
//! `EnvironmentService.Logs`, see [`crate::api::logs`]).
//!
//! Query: `service` (default every service), `tail` (lines of backlog per service:
//! default 100, at most 10000, `-1` none), `follow` and `timestamps` (`true`/`false`).
//! The answer is JSON lines (`application/x-ndjson`, chunked): one
//! `{service, stream, line, timestamp, truncated}` object per log line, in the order the
//! lines arrived; while following, an empty line every 15 s when nothing was written
//! (readers skip empty lines). Without `follow` the body ends after the backlog.
//!
//! Errors before the first line are ordinary JSON errors with their status (`400` for a
//! bad `tail` or an unknown service, naming the services; `404`; `409` for a destroyed
//! environment or one with nothing deployed; `502` when the host is away). An error
//! after the stream started is a last `{"error": msg}` line.

use super::{error_response, query_bool, query_str, Call, Gateway};
use crate::error::ApiError;
use axum::extract::State;
use axum::response::Response;
use denv_proto::v1::{environment_service_server::EnvironmentService, LogsRequest};

/// The request of a call (`400` naming a bad `tail`, `follow` or `timestamps`).
fn request_of(call: &Call) -> Result<LogsRequest, ApiError> {
    let tail = match call.query.get("tail").map(|t| t.trim()) {
        None | Some("") => 0,
        Some(t) => t.parse::<i32>().map_err(|_| {
            ApiError::BadRequest(format!("invalid tail {t:?}: use a number of lines"))
        })?,
    };
    Ok(LogsRequest {
        env: call.params.get("env").cloned().unwrap_or_default(),
        service: query_str(call, "service"),
        tail,
        follow: query_bool(call, "follow")?,
        timestamps: query_bool(call, "timestamps")?,
    })
}

/// The handler (see the module documentation).
pub async fn logs(State(gw): State<Gateway>, call: Call) -> Response {
    let res = async {
        let req = request_of(&call)?;
        gw.envs.logs(call.request(req)).await
    }
    .await;
    let entries = match res {
        Ok(r) => r.into_inner(),
        Err(s) => return error_response(&s),
    };
    super::message_lines(entries)
}
