//! `GET /v1/deployments/{id}/events`: follow a deployment over plain HTTP (our manual's
//! `docs/reference/rest-api.md`, "Following a deployment"; the REST face of
//! `DeploymentService.WatchDeployment`).
//!
//! The answer is a stream of the deployment's whole state, `{deployment, phases}` (the
//! body of `GET /v1/deployments/{id}`): once at once, then again on every change (a
//! phase started or ended, the status changed), and the stream ends after the state
//! whose status is final (`succeeded`, `failed`, `rolled_back`). A deployment that is
//! already final is answered with that one state and the stream ends. The subscription
//! to the runner's changes is taken before the store is read, so nothing that happens
//! between the first state and the live ones is missed; states that follow each other
//! faster than the client reads may be merged, but every state carries every phase, so
//! no phase's outcome is lost.
//!
//! Two encodings, chosen by the request:
//! - default: server-sent events (`text/event-stream`). Each state is
//!   `event: deployment`, `id: <n>` (1, 2, …) and `data: <json>`; a comment line
//!   (`:`) is sent every 15 s while nothing changes.
//! - `Accept: application/x-ndjson` or `?format=jsonl`: JSON lines
//!   (`application/x-ndjson`), one state per line; an empty line is sent every 15 s
//!   while nothing changes (readers skip empty lines).
//!
//! Errors before the stream starts are ordinary JSON errors with their status (`401`,
//! `404 deployment <id> not found`, `400` for an unknown `format`). An error after it
//! started (the store failing) is one last item, `event: error` with `{"error": msg}` or
//! a `{"error": msg}` line, and then the stream ends.

use super::{error_response, Call, Gateway};
use crate::error::ApiError;
use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use denv_proto::v1::{deployment_service_server::DeploymentService, GetDeploymentRequest};
use futures::StreamExt;
use std::convert::Infallible;
use std::time::Duration;

/// How often an idle stream sends a keep-alive (SSE comment or empty JSON line).
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The two encodings of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `text/event-stream`.
    Sse,
    /// `application/x-ndjson`.
    JsonLines,
}

/// The encoding a call asks for: `?format=sse|jsonl|ndjson` wins, then an `Accept`
/// header naming `application/x-ndjson` (or `application/jsonl`), else SSE. An unknown
/// `format` is a `400` naming it.
pub fn encoding_of(call: &Call) -> Result<Encoding, ApiError> {
    if let Some(f) = call.query.get("format") {
        return match f.as_str() {
            "sse" => Ok(Encoding::Sse),
            "jsonl" | "ndjson" => Ok(Encoding::JsonLines),
            other => Err(ApiError::BadRequest(format!(
                "unknown format {other:?}: use sse or jsonl"
            ))),
        };
    }
    let accept = call
        .headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    if accept.contains("application/x-ndjson") || accept.contains("application/jsonl") {
        Ok(Encoding::JsonLines)
    } else {
        Ok(Encoding::Sse)
    }
}

/// The handler of `GET /v1/deployments/{id}/events` (see the module documentation).
pub async fn follow_deployment(State(gw): State<Gateway>, call: Call) -> Response {
    let enc = match encoding_of(&call) {
        Ok(e) => e,
        Err(e) => return error_response(&e.into()),
    };
    let res = async {
        let req: GetDeploymentRequest = call.decode_without_body()?;
        gw.deployments.watch_deployment(call.request(req)).await
    }
    .await;
    let states = match res {
        Ok(r) => r.into_inner(),
        Err(s) => return error_response(&s),
    };
    // Each item: Ok(state json) or Err(message); the stream stops after an error.
    let items = states
        .map(|r| match r {
            Ok(state) => Ok(denv_proto::json::to_json(&state)),
            Err(s) => Err(s.message().to_string()),
        })
        .scan(false, |failed, item| {
            if *failed {
                return futures::future::ready(None);
            }
            *failed = item.is_err();
            futures::future::ready(Some(item))
        });
    match enc {
        Encoding::Sse => {
            let mut n = 0u64;
            let events = items.map(move |item| {
                let ev = match item {
                    Ok(v) => {
                        n += 1;
                        Event::default()
                            .event("deployment")
                            .id(n.to_string())
                            .data(v.to_string())
                    }
                    Err(msg) => Event::default()
                        .event("error")
                        .data(serde_json::json!({ "error": msg }).to_string()),
                };
                Ok::<_, Infallible>(ev)
            });
            let mut resp = Sse::new(events)
                .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
                .into_response();
            // Proxies that buffer (nginx) pass the events on at once.
            resp.headers_mut()
                .insert("x-accel-buffering", HeaderValue::from_static("no"));
            resp
        }
        Encoding::JsonLines => {
            let lines = async_stream::stream! {
                let mut items = std::pin::pin!(items);
                let mut tick = tokio::time::interval(KEEP_ALIVE);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick.tick().await;
                loop {
                    tokio::select! {
                        item = items.next() => {
                            tick.reset();
                            match item {
                                Some(Ok(v)) => yield Ok::<_, Infallible>(format!("{v}\n")),
                                Some(Err(msg)) => {
                                    yield Ok(format!("{}\n", serde_json::json!({ "error": msg })));
                                }
                                None => break,
                            }
                        }
                        _ = tick.tick() => yield Ok("\n".to_string()),
                    }
                }
            };
            super::json_lines(lines)
        }
    }
}
