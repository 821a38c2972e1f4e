//! The host's data port (`denvd --data-addr`; `docs/reference/denvd.md`, "Data port"):
//! where another host fetches what this host offers, so that a version's data travels
//! host to host and never through the control plane.
//!
//! The control plane decides what moves where: it mints a random token, sends this host
//! an offer (`snapshot.send` or `image.send`) carrying only the token's SHA-256, and
//! sends the token itself to the receiving host (`snapshot.receive`, `image.receive`).
//! The routes:
//!
//! | route | what it streams |
//! |---|---|
//! | `GET /v1/ship/{offer}` | the snapshot's archive and its trailer ([`crate::storage::ship`]) |
//! | `GET /v1/images/{offer}?ids=<id>,…` | `docker save` of those of the offered image ids |
//!
//! Each takes `Authorization: Bearer <token>`. An offer is used once: the first request
//! with the right token takes it; a wrong token is `401` (compared as SHA-256 in
//! constant time), an unknown, used or expired offer `404`, an offer asked on the other
//! route `404` (not spent), ids outside the offer `403`, an offered image no longer in
//! the engine `404` naming it. Offers expire [`OFFER_TTL`] after they are made. Nothing else is served.

use crate::runtime::{Runtime, RuntimeError};
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an offer waits for its one fetch: 15 minutes.
pub const OFFER_TTL: Duration = Duration::from_secs(15 * 60);

/// What an offer hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Goods {
    /// Volumes `vols` of snapshot `snap` of environment `env`.
    Snapshot {
        /// Environment id.
        env: String,
        /// Snapshot name.
        snap: String,
        /// Volume names.
        vols: Vec<String>,
    },
    /// Images by exact id (`sha256:<64 hex>`).
    Images(Vec<String>),
}

#[derive(Debug)]
struct Offer {
    token_sha256: String,
    goods: Goods,
    expires: Instant,
}

/// The data port: the offers of this host and the URL other hosts reach it at.
#[derive(Clone, Debug)]
pub struct DataPort {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    url: String,
    rt: Runtime,
    offers: Mutex<HashMap<String, Offer>>,
}

/// A refusal of a data route: status and message (the body is `{"error": message}`).
type Refusal = (StatusCode, String);

impl DataPort {
    /// The data port of `rt`, reached by other hosts at `url` (`http://host:port`, no
    /// trailing slash).
    pub fn new(rt: Runtime, url: &str) -> Self {
        DataPort {
            inner: Arc::new(Inner {
                url: url.trim_end_matches('/').to_string(),
                rt,
                offers: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The URL other hosts reach this port at.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// Offers `goods` to whoever presents the token whose SHA-256 (lower-case hex) is
    /// `token_sha256`; returns the URL to fetch (`<url>/v1/ship/<id>` or
    /// `<url>/v1/images/<id>`). Expired offers are dropped here. Error: the digest is
    /// not 64 hex digits.
    pub fn offer(&self, goods: Goods, token_sha256: &str) -> Result<String, RuntimeError> {
        let t = token_sha256.to_ascii_lowercase();
        if t.len() != 64 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(RuntimeError::Invalid(
                "offer: the token digest is not a SHA-256 in hex".into(),
            ));
        }
        let id = format!("off_{}", hex::encode(rand::random::<[u8; 16]>()));
        let route = match goods {
            Goods::Snapshot { .. } => "ship",
            Goods::Images(_) => "images",
        };
        let now = Instant::now();
        let mut offers = self.inner.offers.lock().expect("offers");
        offers.retain(|_, o| o.expires > now);
        offers.insert(
            id.clone(),
            Offer {
                token_sha256: t,
                goods,
                expires: now + OFFER_TTL,
            },
        );
        Ok(format!("{}/v1/{route}/{id}", self.inner.url))
    }

    /// Takes offer `id` for the bearer token in `headers`: once, before it expires, and
    /// only on its own route (`images`: an image offer; else a snapshot offer), so a
    /// token presented on the wrong route does not spend the offer.
    fn take(&self, id: &str, headers: &HeaderMap, images: bool) -> Result<Goods, Refusal> {
        let token = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        let presented = hex::encode(Sha256::digest(token.as_bytes()));
        let mut offers = self.inner.offers.lock().expect("offers");
        let Some(o) = offers.get(id) else {
            return Err((StatusCode::NOT_FOUND, format!("no offer {id}")));
        };
        if o.expires <= Instant::now() {
            offers.remove(id);
            return Err((StatusCode::NOT_FOUND, format!("offer {id} expired")));
        }
        use subtle::ConstantTimeEq;
        if !bool::from(presented.as_bytes().ct_eq(o.token_sha256.as_bytes())) {
            return Err((StatusCode::UNAUTHORIZED, "invalid token".into()));
        }
        if matches!(o.goods, Goods::Images(_)) != images {
            let what = if images { "images" } else { "a snapshot" };
            return Err((StatusCode::NOT_FOUND, format!("offer {id} is not {what}")));
        }
        Ok(offers.remove(id).expect("present").goods)
    }

    /// The routes, for [`DataPort::serve`] or a test's own server.
    pub fn router(&self) -> axum::Router {
        axum::Router::new()
            .route("/v1/ship/:id", axum::routing::get(get_snapshot))
            .route("/v1/images/:id", axum::routing::get(get_images))
            .with_state(self.clone())
    }

    /// Serves the routes on `listener` until the process ends; expired offers are
    /// dropped every minute (an offer nobody fetched holds no more than its entry).
    pub async fn serve(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        let inner = std::sync::Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(60));
            loop {
                every.tick().await;
                let Some(inner) = inner.upgrade() else { return };
                let now = Instant::now();
                inner
                    .offers
                    .lock()
                    .expect("offers")
                    .retain(|_, o| o.expires > now);
            }
        });
        axum::serve(listener, self.router()).await
    }
}

fn refuse((status, msg): Refusal) -> Response {
    (status, axum::Json(serde_json::json!({ "error": msg }))).into_response()
}

async fn get_snapshot(
    State(port): State<DataPort>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let goods = match port.take(&id, &headers, false) {
        Ok(g) => g,
        Err(r) => return refuse(r),
    };
    let Goods::Snapshot { env, snap, vols } = goods else {
        unreachable!("take checked the offer's kind")
    };
    match port.inner.rt.snapshot_stream(&env, &snap, &vols) {
        Ok(rx) => {
            let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
            ([("content-type", "application/x-tar")], body).into_response()
        }
        Err(e) => refuse((StatusCode::NOT_FOUND, e.to_string())),
    }
}

#[derive(serde::Deserialize)]
struct IdsQuery {
    #[serde(default)]
    ids: String,
}

async fn get_images(
    State(port): State<DataPort>,
    Path(id): Path<String>,
    Query(q): Query<IdsQuery>,
    headers: HeaderMap,
) -> Response {
    let goods = match port.take(&id, &headers, true) {
        Ok(g) => g,
        Err(r) => return refuse(r),
    };
    let Goods::Images(offered) = goods else {
        unreachable!("take checked the offer's kind")
    };
    let asked: Vec<String> = if q.ids.is_empty() {
        offered.clone()
    } else {
        q.ids.split(',').map(str::to_string).collect()
    };
    if let Some(other) = asked.iter().find(|a| !offered.contains(a)) {
        return refuse((
            StatusCode::FORBIDDEN,
            format!("image {other} is not part of offer {id}"),
        ));
    }
    // Gone since the offer (removed from the engine): said before the stream starts.
    match port.inner.rt.missing_images(&asked).await {
        Ok(m) if m.is_empty() => {}
        Ok(m) => {
            return refuse((
                StatusCode::NOT_FOUND,
                format!("images {} are not on this host", m.join(", ")),
            ))
        }
        Err(e) => return refuse((StatusCode::BAD_REQUEST, e.to_string())),
    }
    let stream = port.inner.rt.images_stream(&asked);
    let body = Body::from_stream(futures::StreamExt::map(stream, |r| {
        r.map_err(|e| std::io::Error::other(format!("docker save: {e}")))
    }));
    ([("content-type", "application/x-tar")], body).into_response()
}
