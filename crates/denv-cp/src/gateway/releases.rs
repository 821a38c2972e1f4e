//! `GET /denvd`, `/denvd-linux-amd64`, `/denvd-linux-arm64`: the sidecar binary from
//! `DENV_RELEASES_DIR` (default `bin`), files named `denvd-linux-<arch>`. `/denvd` is
//! amd64 unless `?arch=arm64`. `404` when that build is not present.

use super::{error_response, Gateway};
use crate::error::ApiError;
use axum::extract::{Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::path::PathBuf;

async fn serve(gw: &Gateway, arch: &str) -> Response {
    let arch = match arch {
        "arm64" | "aarch64" => "arm64",
        "" | "amd64" | "x86_64" => "amd64",
        other => {
            return error_response(
                &ApiError::BadRequest(format!("unknown arch {other:?}: want amd64 or arm64"))
                    .into(),
            )
        }
    };
    let name = format!("denvd-linux-{arch}");
    let path = PathBuf::from(&gw.state.config.releases_dir).join(&name);
    match tokio::fs::read(&path).await {
        Ok(bytes) => (
            StatusCode::OK,
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                ),
                (
                    header::CONTENT_DISPOSITION,
                    HeaderValue::from_str(&format!("attachment; filename=\"{name}\""))
                        .unwrap_or_else(|_| HeaderValue::from_static("attachment")),
                ),
            ],
            bytes,
        )
            .into_response(),
        Err(_) => error_response(
            &ApiError::NotFound(format!(
                "denvd for linux/{arch} is not present on this server"
            ))
            .into(),
        ),
    }
}

/// `GET /denvd[?arch=arm64]`.
pub async fn denvd(
    State(gw): State<Gateway>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    serve(&gw, q.get("arch").map(String::as_str).unwrap_or("")).await
}

/// `GET /denvd-linux-amd64`.
pub async fn denvd_amd64(State(gw): State<Gateway>) -> Response {
    serve(&gw, "amd64").await
}

/// `GET /denvd-linux-arm64`.
pub async fn denvd_arm64(State(gw): State<Gateway>) -> Response {
    serve(&gw, "arm64").await
}
