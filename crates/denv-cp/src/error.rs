//! The control plane's one error type and its two mappings.
//!
//! Every service returns [`ApiError`]; `impl From<ApiError> for tonic::Status` picks the
//! gRPC code and carries the documented HTTP status in the response metadata
//! `x-denv-http-status`, which the REST gateway reads back ([`http_status_of`]) to
//! answer `{"error": "<message>"}` with exactly that status (spec `12-ref-rest-api.md`,
//! *Errors*). A `Status` without that metadata (from code outside this crate) maps by
//! its gRPC code.
//!
//! | variant | HTTP | gRPC |
//! |---|---|---|
//! | `BadRequest` | 400 | `INVALID_ARGUMENT` |
//! | `Unauthorized` | 401 | `UNAUTHENTICATED` |
//! | `Forbidden` | 403 | `PERMISSION_DENIED` |
//! | `NotFound` | 404 | `NOT_FOUND` |
//! | `Conflict` | 409 | `ALREADY_EXISTS` |
//! | `Gone` | 410 | `FAILED_PRECONDITION` |
//! | `PayloadTooLarge` | 413 | `RESOURCE_EXHAUSTED` |
//! | `Precondition` | 428 | `FAILED_PRECONDITION` |
//! | `BadGateway` | 502 | `UNAVAILABLE` |
//! | `Unavailable` | 503 | `UNIMPLEMENTED` |
//! | `HostUnavailable` | 503 | `UNAVAILABLE` |
//! | `Stopping` | 503 | `UNAVAILABLE` |
//! | `NoCapacity` | 503 | `RESOURCE_EXHAUSTED` |
//! | `Timeout` | 504 | `DEADLINE_EXCEEDED` |
//! | `Internal` | 500 | `INTERNAL` |
//!
//! A host command's error ([`HubError`], from the hub or the orchestrator's `Link`)
//! becomes an `ApiError` in one place, `impl From<HubError> for ApiError`, the message
//! being the error's text: the host not answering in time is `Timeout` (504,
//! `DEADLINE_EXCEEDED`), an unknown host `NotFound`, the store `Internal`; a failure the
//! sidecar answered maps by its `HostErrorCode`:
//!
//! | code | variant | HTTP | gRPC |
//! |---|---|---|---|
//! | `NOT_FOUND` | `NotFound` | 404 | `NOT_FOUND` |
//! | `CONFLICT` | `Conflict` | 409 | `ALREADY_EXISTS` |
//! | `TOO_LARGE` | `PayloadTooLarge` | 413 | `RESOURCE_EXHAUSTED` |
//! | `INVALID` | `BadRequest` | 400 | `INVALID_ARGUMENT` |
//! | `UNAVAILABLE` | `HostUnavailable` | 503 | `UNAVAILABLE` |
//! | `FAILED`, unspecified (a sidecar older than the code) | `BadGateway` | 502 | `UNAVAILABLE` |
//!
//! and everything else the host could not run (no host, host not connected, a result
//! that is not the command's) is `BadGateway` (502, `UNAVAILABLE`).

use crate::hub::HubError;
use denv_proto::v1::HostErrorCode;
use http::StatusCode;
use tonic::{metadata::MetadataValue, Code, Status};

/// Metadata key carrying the HTTP status of an error `Status`.
pub const HTTP_STATUS_KEY: &str = "x-denv-http-status";

/// An API error: the variant picks the status, the string is the message users see
/// (lowercase, no trailing punctuation; the device flow uses the documented codes
/// `authorization_pending`, `invalid_device_code`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// 400: bad input (refused compose file, missing field).
    #[error("{0}")]
    BadRequest(String),
    /// 401: missing or bad credential.
    #[error("{0}")]
    Unauthorized(String),
    /// 403: session without a team, or not a member.
    #[error("{0}")]
    Forbidden(String),
    /// 404: not found, or not in the caller's team.
    #[error("{0}")]
    NotFound(String),
    /// 409: duplicate name, used token, busy.
    #[error("{0}")]
    Conflict(String),
    /// 410: gone (device key already handed out).
    #[error("{0}")]
    Gone(String),
    /// 413: body too large.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// 428: device authorization pending.
    #[error("{0}")]
    Precondition(String),
    /// 502: the host or an upstream refused the command.
    #[error("{0}")]
    BadGateway(String),
    /// 503: feature not configured on this server.
    #[error("{0}")]
    Unavailable(String),
    /// 503: the host cannot serve now (its Docker engine does not answer); no
    /// `Retry-After`: the work may have begun, so clients do not send it again by
    /// themselves.
    #[error("{0}")]
    HostUnavailable(String),
    /// 503: the control plane is stopping (drain on SIGTERM); a client tries again.
    #[error("{0}")]
    Stopping(String),
    /// 503: no connected host has room for the environment now
    /// ([`crate::orchestrator::placement`]); no `Retry-After`: clients do not send it
    /// again by themselves.
    #[error("{0}")]
    NoCapacity(String),
    /// 504: did not become healthy in time, or the host did not answer a command in
    /// time.
    #[error("{0}")]
    Timeout(String),
    /// 429: over a rate limit; the second field is the `Retry-After` in whole seconds.
    #[error("{0}")]
    TooManyRequests(String, u64),
    /// 500: anything else (store errors).
    #[error("{0}")]
    Internal(String),
}

/// Metadata key carrying `Retry-After` seconds on a `429`'s (and a stopping `503`'s)
/// `Status`.
pub const RETRY_AFTER_KEY: &str = "retry-after";

/// `Retry-After` of a `503 the control plane is stopping` (seconds): by then the next
/// process (or another replica) usually serves.
pub const STOPPING_RETRY_AFTER_SEC: u64 = 2;

impl From<crate::ratelimit::Limited> for ApiError {
    fn from(l: crate::ratelimit::Limited) -> Self {
        ApiError::TooManyRequests(l.message(), l.retry_after)
    }
}

impl ApiError {
    /// The HTTP status of this error.
    pub fn http_status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Gone(_) => StatusCode::GONE,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Precondition(_) => StatusCode::PRECONDITION_REQUIRED,
            ApiError::BadGateway(_) => StatusCode::BAD_GATEWAY,
            ApiError::Unavailable(_)
            | ApiError::HostUnavailable(_)
            | ApiError::Stopping(_)
            | ApiError::NoCapacity(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::TooManyRequests(..) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The gRPC code of this error.
    pub fn grpc_code(&self) -> Code {
        match self {
            ApiError::BadRequest(_) => Code::InvalidArgument,
            ApiError::Unauthorized(_) => Code::Unauthenticated,
            ApiError::Forbidden(_) => Code::PermissionDenied,
            ApiError::NotFound(_) => Code::NotFound,
            ApiError::Conflict(_) => Code::AlreadyExists,
            ApiError::Gone(_) => Code::FailedPrecondition,
            ApiError::PayloadTooLarge(_) => Code::ResourceExhausted,
            ApiError::Precondition(_) => Code::FailedPrecondition,
            ApiError::BadGateway(_) => Code::Unavailable,
            ApiError::Unavailable(_) => Code::Unimplemented,
            ApiError::HostUnavailable(_) | ApiError::Stopping(_) => Code::Unavailable,
            ApiError::NoCapacity(_) => Code::ResourceExhausted,
            ApiError::Timeout(_) => Code::DeadlineExceeded,
            ApiError::TooManyRequests(..) => Code::ResourceExhausted,
            ApiError::Internal(_) => Code::Internal,
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        match self {
            ApiError::BadRequest(m)
            | ApiError::Unauthorized(m)
            | ApiError::Forbidden(m)
            | ApiError::NotFound(m)
            | ApiError::Conflict(m)
            | ApiError::Gone(m)
            | ApiError::PayloadTooLarge(m)
            | ApiError::Precondition(m)
            | ApiError::BadGateway(m)
            | ApiError::Unavailable(m)
            | ApiError::HostUnavailable(m)
            | ApiError::Stopping(m)
            | ApiError::NoCapacity(m)
            | ApiError::Timeout(m)
            | ApiError::TooManyRequests(m, _)
            | ApiError::Internal(m) => m,
        }
    }

    /// The same error (same status) with `<prefix>: ` before its message, e.g.
    /// `logs of service "db": timed out after 2m10s`.
    pub fn prefixed(self, prefix: impl std::fmt::Display) -> Self {
        let p = |m: String| format!("{prefix}: {m}");
        match self {
            ApiError::BadRequest(m) => ApiError::BadRequest(p(m)),
            ApiError::Unauthorized(m) => ApiError::Unauthorized(p(m)),
            ApiError::Forbidden(m) => ApiError::Forbidden(p(m)),
            ApiError::NotFound(m) => ApiError::NotFound(p(m)),
            ApiError::Conflict(m) => ApiError::Conflict(p(m)),
            ApiError::Gone(m) => ApiError::Gone(p(m)),
            ApiError::PayloadTooLarge(m) => ApiError::PayloadTooLarge(p(m)),
            ApiError::Precondition(m) => ApiError::Precondition(p(m)),
            ApiError::BadGateway(m) => ApiError::BadGateway(p(m)),
            ApiError::Unavailable(m) => ApiError::Unavailable(p(m)),
            ApiError::HostUnavailable(m) => ApiError::HostUnavailable(p(m)),
            ApiError::Stopping(m) => ApiError::Stopping(p(m)),
            ApiError::NoCapacity(m) => ApiError::NoCapacity(p(m)),
            ApiError::Timeout(m) => ApiError::Timeout(p(m)),
            ApiError::TooManyRequests(m, s) => ApiError::TooManyRequests(p(m), s),
            ApiError::Internal(m) => ApiError::Internal(p(m)),
        }
    }

    /// `404 <what> not found` (e.g. `not_found("project ops-world")`).
    pub fn not_found(what: impl std::fmt::Display) -> Self {
        ApiError::NotFound(format!("{what} not found"))
    }
}

impl From<sea_orm::DbErr> for ApiError {
    fn from(e: sea_orm::DbErr) -> Self {
        tracing::error!(error = %e, "store error");
        ApiError::Internal(format!("store: {e}"))
    }
}

impl From<HubError> for ApiError {
    /// The one mapping of a host command's error: see the module docs.
    fn from(e: HubError) -> Self {
        let msg = e.to_string();
        match e {
            HubError::UnknownHost(_) => ApiError::NotFound(msg),
            HubError::Timeout(_) => ApiError::Timeout(msg),
            HubError::Failed { code, .. } => match code {
                HostErrorCode::NotFound => ApiError::NotFound(msg),
                HostErrorCode::Conflict => ApiError::Conflict(msg),
                HostErrorCode::TooLarge => ApiError::PayloadTooLarge(msg),
                HostErrorCode::Invalid => ApiError::BadRequest(msg),
                HostErrorCode::Unavailable => ApiError::HostUnavailable(msg),
                HostErrorCode::Failed | HostErrorCode::Unspecified => ApiError::BadGateway(msg),
            },
            HubError::NoHost
            | HubError::NotConnected { .. }
            | HubError::Protocol(_)
            | HubError::UnexpectedResult(_) => ApiError::BadGateway(msg),
            HubError::Db(_) => {
                tracing::error!(error = %msg, "store error");
                ApiError::Internal(msg)
            }
        }
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Self {
        let mut s = Status::new(e.grpc_code(), e.message().to_string());
        if let Ok(v) = MetadataValue::try_from(e.http_status().as_u16().to_string()) {
            s.metadata_mut().insert(HTTP_STATUS_KEY, v);
        }
        let retry_after = match e {
            ApiError::TooManyRequests(_, secs) => Some(secs),
            ApiError::Stopping(_) => Some(STOPPING_RETRY_AFTER_SEC),
            _ => None,
        };
        if let Some(secs) = retry_after {
            if let Ok(v) = MetadataValue::try_from(secs.to_string()) {
                s.metadata_mut().insert(RETRY_AFTER_KEY, v);
            }
        }
        s
    }
}

/// The HTTP status for a gRPC `Status`: the `x-denv-http-status` metadata when present,
/// else by code.
pub fn http_status_of(s: &Status) -> StatusCode {
    if let Some(code) = s
        .metadata()
        .get(HTTP_STATUS_KEY)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u16>().ok())
        .and_then(|v| StatusCode::from_u16(v).ok())
    {
        return code;
    }
    match s.code() {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        Code::ResourceExhausted => StatusCode::PAYLOAD_TOO_LARGE,
        Code::Unavailable => StatusCode::BAD_GATEWAY,
        Code::Unimplemented => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_carries_the_http_status() {
        for (e, http) in [
            (ApiError::Precondition("authorization_pending".into()), 428),
            (ApiError::Gone("x".into()), 410),
            (ApiError::Unavailable("x".into()), 503),
            (ApiError::NotFound("x".into()), 404),
            (ApiError::NoCapacity("x".into()), 503),
        ] {
            let s: Status = e.clone().into();
            assert_eq!(s.message(), e.message());
            assert_eq!(http_status_of(&s).as_u16(), http);
        }
        // No capacity is not a refusal the clients wait out and repeat (no Retry-After).
        let s: Status = ApiError::NoCapacity("x".into()).into();
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(s.metadata().get(RETRY_AFTER_KEY).is_none());
    }

    fn failed(code: HostErrorCode, message: &str) -> HubError {
        HubError::Failed {
            code,
            message: message.into(),
        }
    }

    #[test]
    fn hub_errors_keep_their_kind() {
        let cases = [
            (
                HubError::Timeout("2m10s".into()),
                504,
                Code::DeadlineExceeded,
            ),
            (
                HubError::NotConnected {
                    host_id: "host_1".into(),
                    after: None,
                },
                502,
                Code::Unavailable,
            ),
            (
                failed(HostErrorCode::Failed, "disk full"),
                502,
                Code::Unavailable,
            ),
            (
                failed(HostErrorCode::Unspecified, "an older sidecar's error"),
                502,
                Code::Unavailable,
            ),
            (
                failed(
                    HostErrorCode::NotFound,
                    "service \"box\" of env_1 not found",
                ),
                404,
                Code::NotFound,
            ),
            (
                failed(
                    HostErrorCode::Conflict,
                    "snapshot \"s1\" of env_1 already exists",
                ),
                409,
                Code::AlreadyExists,
            ),
            (
                failed(HostErrorCode::TooLarge, "/big: archive larger than 32 MiB"),
                413,
                Code::ResourceExhausted,
            ),
            (
                failed(
                    HostErrorCode::Invalid,
                    "exec: workdir \"x\" must be an absolute path",
                ),
                400,
                Code::InvalidArgument,
            ),
            (
                failed(HostErrorCode::Unavailable, "docker: connection refused"),
                503,
                Code::Unavailable,
            ),
            (HubError::NoHost, 502, Code::Unavailable),
            (HubError::UnknownHost("host_1".into()), 404, Code::NotFound),
        ];
        for (e, http, code) in cases {
            let text = e.to_string();
            let s = Status::from(ApiError::from(e));
            assert_eq!(s.message(), text);
            assert_eq!(s.code(), code, "{text}");
            assert_eq!(http_status_of(&s).as_u16(), http, "{text}");
            // Host errors are never refusals a client sends again by itself.
            assert!(s.metadata().get(RETRY_AFTER_KEY).is_none(), "{text}");
        }
        let e = ApiError::from(HubError::Timeout("1s".into())).prefixed("logs of service \"db\"");
        assert_eq!(
            e,
            ApiError::Timeout("logs of service \"db\": timed out after 1s".into())
        );
        assert_eq!(
            HubError::NotConnected {
                host_id: "host_1".into(),
                after: Some("1s".into())
            }
            .to_string(),
            "host host_1 is not connected (timed out after 1s)"
        );
    }

    #[test]
    fn foreign_status_maps_by_code() {
        assert_eq!(
            http_status_of(&Status::not_found("x")),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            http_status_of(&Status::invalid_argument("x")),
            StatusCode::BAD_REQUEST
        );
    }
}
