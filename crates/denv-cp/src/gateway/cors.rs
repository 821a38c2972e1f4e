//! CORS for the console (spec `18-ref-config.md` *CORS*).
//!
//! Only when `DENV_CONSOLE_URL` is set, and only on `/v1/*` and `/auth/*`: an `Origin`
//! equal to the console URL or on `http://localhost:*` / `http://127.0.0.1:*` is echoed
//! in `Access-Control-Allow-Origin` with the allowed headers, methods and a 600 s max
//! age; `OPTIONS` on those paths answers `204`.

use crate::state::AppState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Whether `origin` may call the API given the console URL.
pub fn origin_allowed(console: &str, origin: &str) -> bool {
    if origin == console {
        return true;
    }
    for prefix in ["http://localhost", "http://127.0.0.1"] {
        if let Some(rest) = origin.strip_prefix(prefix) {
            if rest.is_empty() {
                return true;
            }
            if let Some(port) = rest.strip_prefix(':') {
                return !port.is_empty() && port.chars().all(|c| c.is_ascii_digit());
            }
        }
    }
    false
}

/// The CORS middleware (a no-op without `DENV_CONSOLE_URL`).
pub async fn cors_middleware(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(console) = state.config.console_url.clone() else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    if !(path.starts_with("/v1/") || path.starts_with("/auth/")) {
        return next.run(req).await;
    }
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .filter(|o| origin_allowed(&console, o))
        .and_then(|o| HeaderValue::from_str(o).ok());
    let mut resp = if req.method() == Method::OPTIONS {
        StatusCode::NO_CONTENT.into_response()
    } else {
        next.run(req).await
    };
    if let Some(origin) = origin {
        let h = resp.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("Authorization, Content-Type, X-Denv-Team"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, PUT, DELETE, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
        h.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        let c = "https://denv.example";
        assert!(origin_allowed(c, c));
        assert!(origin_allowed(c, "http://localhost:3100"));
        assert!(origin_allowed(c, "http://127.0.0.1:5173"));
        assert!(!origin_allowed(c, "http://localhost.evil:3100"));
        assert!(!origin_allowed(c, "https://evil.example"));
        assert!(!origin_allowed(c, "http://127.0.0.1:80x"));
    }
}
