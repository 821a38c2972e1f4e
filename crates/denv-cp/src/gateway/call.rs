//! The gateway's request extractor and response helpers.

use crate::error::{http_status_of, ApiError};
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::HashMap;
use tonic::metadata::MetadataMap;
use tonic::Status;

/// Largest request body (tar uploads included): 32 MiB (defined in `denv_proto::contract`).
pub use denv_proto::contract::REST_BODY_MAX_BYTES as MAX_BODY_BYTES;

/// One REST call: path parameters, query parameters, headers and the raw body.
#[derive(Debug, Clone)]
pub struct Call {
    /// Path parameters by name (`project`, `env`, `id`, `target`).
    pub params: HashMap<String, String>,
    /// Query parameters.
    pub query: HashMap<String, String>,
    /// The HTTP headers (become the gRPC metadata).
    pub headers: HeaderMap,
    /// The body, at most [`MAX_BODY_BYTES`].
    pub body: Bytes,
}

#[axum::async_trait]
impl<S: Send + Sync> FromRequest<S> for Call {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = req.into_parts();
        let params = Path::<HashMap<String, String>>::from_request_parts(&mut parts, state)
            .await
            .map(|Path(p)| p)
            .unwrap_or_default();
        let query = Query::<HashMap<String, String>>::from_request_parts(&mut parts, state)
            .await
            .map(|Query(q)| q)
            .map_err(|e| {
                error_response(&ApiError::BadRequest(format!("invalid query: {e}")).into())
            })?;
        let body = axum::body::to_bytes(body, MAX_BODY_BYTES)
            .await
            .map_err(|_| {
                error_response(
                    &ApiError::PayloadTooLarge(format!(
                        "body too large: at most {} MiB",
                        MAX_BODY_BYTES >> 20
                    ))
                    .into(),
                )
            })?;
        Ok(Call {
            params,
            query,
            headers: parts.headers,
            body,
        })
    }
}

impl Call {
    /// The body object (`{}` when empty) merged with path and query parameters.
    pub fn merged(&self) -> Result<Value, ApiError> {
        let mut obj = if self.body.iter().all(u8::is_ascii_whitespace) {
            Map::new()
        } else {
            match serde_json::from_slice::<Value>(&self.body) {
                Ok(Value::Object(m)) => m,
                Ok(_) => {
                    return Err(ApiError::BadRequest(
                        "request body must be a json object".into(),
                    ))
                }
                Err(e) => return Err(ApiError::BadRequest(format!("invalid json body: {e}"))),
            }
        };
        self.merge_params(&mut obj);
        Ok(Value::Object(obj))
    }

    fn merge_params(&self, obj: &mut Map<String, Value>) {
        for (k, v) in &self.query {
            if !obj.contains_key(k) || obj[k].is_null() {
                obj.insert(k.clone(), Value::String(v.clone()));
            }
        }
        for (k, v) in &self.params {
            obj.insert(k.clone(), Value::String(v.clone()));
        }
    }

    /// The request message from [`Call::merged`] (`400` on a shape error).
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        denv_proto::json::from_json(self.merged()?)
            .map_err(|e| ApiError::BadRequest(format!("invalid request: {e}")))
    }

    /// The request message from path and query parameters only (raw-body routes).
    pub fn decode_without_body<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        let mut obj = Map::new();
        self.merge_params(&mut obj);
        denv_proto::json::from_json(Value::Object(obj))
            .map_err(|e| ApiError::BadRequest(format!("invalid request: {e}")))
    }

    /// A `tonic::Request` carrying `msg` with the HTTP headers as metadata.
    pub fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        *r.metadata_mut() = MetadataMap::from_headers(self.headers.clone());
        r
    }
}

/// `{"error": message}` with the status's HTTP status.
pub fn error_response(s: &Status) -> Response {
    let code = http_status_of(s);
    if code.is_server_error() {
        tracing::warn!(
            status = code.as_u16(),
            error = s.message(),
            "request failed"
        );
    }
    let mut r = (code, Json(serde_json::json!({ "error": s.message() }))).into_response();
    if let Some(v) = s.metadata().get(crate::error::RETRY_AFTER_KEY) {
        if let Ok(v) = axum::http::HeaderValue::from_bytes(v.as_bytes()) {
            r.headers_mut().insert(axum::http::header::RETRY_AFTER, v);
        }
    }
    r
}

/// The response message as JSON with `status`, or the error.
pub fn reply<T: Serialize>(
    status: StatusCode,
    res: Result<tonic::Response<T>, Status>,
) -> Response {
    match res {
        Ok(r) => (status, Json(denv_proto::json::to_json(r.get_ref()))).into_response(),
        Err(s) => error_response(&s),
    }
}
