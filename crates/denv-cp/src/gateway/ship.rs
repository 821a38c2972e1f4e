//! `PUT /v1/ship/{id}` and `GET /v1/ship/{id}`: the two legs of a snapshot shipment
//! between hosts ([`crate::orchestrator::ship`]). Authenticated by the shipment's
//! one-time bearer token of each direction, not by an API key. Answers: `200`
//! `{bytes, sha256}` for a completed upload; the archive (`application/x-tar`, with its
//! `Content-Length`) for a download; `401` wrong token, `404` no such shipment, `409`
//! token used or shipment not ready, `413` upload larger than allowed.

use super::Gateway;
use crate::orchestrator::ship::Refused;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

fn auth(h: &HeaderMap) -> Option<&str> {
    h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
}

fn refusal(r: Refused) -> Response {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(serde_json::json!({"error": r.message}))).into_response()
}

/// `PUT /v1/ship/{id}`: the source host's upload.
pub async fn upload(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let shipping = gw.state.orchestrator.shipping();
    match shipping.upload(&id, auth(&headers), body).await {
        Ok((bytes, sha256)) => {
            axum::Json(serde_json::json!({"bytes": bytes, "sha256": sha256})).into_response()
        }
        Err(r) => refusal(r),
    }
}

/// `GET /v1/ship/{id}`: the destination host's download.
pub async fn download(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let shipping = gw.state.orchestrator.shipping();
    match shipping.download(&id, auth(&headers)).await {
        Ok((file, len)) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "application/x-tar".to_string()),
                (header::CONTENT_LENGTH, len.to_string()),
            ],
            Body::from_stream(tokio_util::io::ReaderStream::with_capacity(file, 256 << 10)),
        )
            .into_response(),
        Err(r) => refusal(r),
    }
}
