//! The one listen port: gRPC (h2c, or h2 over TLS), gRPC-web, the REST gateway, the
//! sidecar host stream and the `/denvd*` release files, behind one trace layer, plus
//! start-up (store, migrations, bootstrap, recovery) and graceful shutdown. With
//! `-tls-cert`/`-tls-key` the port speaks TLS only ([`crate::tls`]); without, plain
//! HTTP/1.1 and h2c.
//!
//! Routing: requests whose `content-type` starts with `application/grpc` (gRPC and
//! gRPC-web) go to the tonic services (every one with 64 MiB messages both ways, since
//! files travel as bytes); everything else to the REST router; unknown REST paths are
//! `404 {"error": "not found"}`.

use crate::api::{
    auth::AuthApi, deployments::DeploymentApi, envs::EnvironmentApi, events::EventApi,
    github::GithubApi, health::HealthApi, projects::ProjectApi, sandboxes::SandboxApi,
    targets::TargetApi,
};
use crate::config::{normalize_args, Config, Flags};
use crate::state::AppState;
use anyhow::Context;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::Router;
use clap::Parser;
use std::time::Duration;
use tower::ServiceExt;
use tracing::{info, warn};

/// Largest gRPC message either way: 64 MiB (defined in `denv_proto::contract`).
pub use denv_proto::contract::API_MESSAGE_MAX_BYTES as MAX_MESSAGE_BYTES;
/// How long shutdown waits for in-flight requests.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The tonic services (public API + host stream) as an axum router, gRPC-web enabled.
pub fn grpc_router(state: &AppState) -> Router {
    macro_rules! sized {
        ($svc:expr) => {
            tonic_web::enable(
                $svc.max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
        };
    }
    let routes = tonic::service::Routes::new(sized!(HealthApi::server()))
        .add_service(sized!(AuthApi::server(state.clone())))
        .add_service(sized!(ProjectApi::server(state.clone())))
        .add_service(sized!(EnvironmentApi::server(state.clone())))
        .add_service(sized!(DeploymentApi::server(state.clone())))
        .add_service(sized!(SandboxApi::server(state.clone())))
        .add_service(sized!(TargetApi::new(state.clone()).service()))
        .add_service(sized!(GithubApi::server(state.clone())))
        .add_service(sized!(EventApi::server(state.clone())))
        .add_service(sized!(state.hub.service()));
    // Replica mode only: replicas relay host commands to each other.
    match state.hub.relay_service() {
        Some(relay) => routes.add_service(relay),
        None => routes,
    }
    .into_axum_router()
}

fn is_grpc(req: &Request) -> bool {
    req.headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/grpc"))
}

/// Counts the request against [`crate::ratelimit`]'s limits; over one, answers `429`
/// with `Retry-After` (REST) or `RESOURCE_EXHAUSTED` with `retry-after` metadata (gRPC).
async fn rate_limit(
    axum::extract::State(state): axum::extract::State<AppState>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let credential = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let anon_write = crate::ratelimit::is_anon_write(req.method(), req.uri().path());
    match state.limits.check_request(peer, credential, anon_write) {
        Ok(()) => next.run(req).await,
        Err(l) => {
            let status: tonic::Status = crate::error::ApiError::from(l).into();
            if is_grpc(&req) {
                status.into_http().map(axum::body::Body::new)
            } else {
                crate::gateway::error_response(&status)
            }
        }
    }
}

/// The whole application: REST gateway + gRPC + rate limits + CORS + tracing.
pub fn app(state: AppState) -> Router {
    let grpc = grpc_router(&state);
    let rest = crate::gateway::router(state.clone()).fallback(|| async {
        crate::gateway::error_response(&crate::error::ApiError::NotFound("not found".into()).into())
    });
    // gRPC and REST paths never collide; dispatch on the content type so a gRPC call is
    // never answered by a REST route (or a REST 404) and vice versa.
    let grpc_first = move |req: Request| {
        let grpc = grpc.clone();
        let rest = rest.clone();
        async move {
            let r: Response = if is_grpc(&req) {
                match grpc.oneshot(req).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                }
            } else {
                match rest.oneshot(req).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                }
            };
            r.into_response()
        }
    };
    Router::new()
        .fallback(grpc_first)
        .layer(axum::middleware::from_fn_with_state(state.clone(), rate_limit))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::gateway::cors_middleware,
        ))
        .layer(
            tower_http::trace::TraceLayer::new_for_http()
                // The path only: query strings may carry OAuth codes and states.
                .make_span_with(|req: &http::Request<axum::body::Body>| {
                    tracing::debug_span!("request", method = %req.method(), path = %req.uri().path())
                })
                .on_response(
                    tower_http::trace::DefaultOnResponse::new().level(tracing::Level::DEBUG),
                ),
        )
}

/// Open the store, bootstrap an empty database, recover deployments: the state to serve.
pub async fn prepare(config: Config) -> anyhow::Result<AppState> {
    info!(db = %config.db_redacted(), "opening store");
    let db = crate::store::open(&config.db)
        .await
        .with_context(|| format!("open store {}", config.db_redacted()))?;
    // Replicas starting together on an empty database migrate and bootstrap in turn.
    let startup = crate::store::startup_lock(&db)
        .await
        .with_context(|| format!("lock store {}", config.db_redacted()))?;
    crate::store::migrate(&db)
        .await
        .with_context(|| format!("migrate store {}", config.db_redacted()))?;
    if let Some(b) = crate::auth::bootstrap(&db, &config)
        .await
        .map_err(|e| anyhow::anyhow!("bootstrap: {e}"))?
    {
        info!(team = %b.team.id, name = %b.team.name, key = %b.key.id, "bootstrap team created");
        if let Some(secret) = &b.generated_secret {
            // Printed once, to stderr, never logged.
            eprintln!(
                "denv-cp: bootstrap API key for team {} ({}): {secret}",
                b.team.name, b.team.id
            );
        }
    }
    if let Some(tx) = startup {
        tx.commit().await.context("unlock store")?;
    }
    if config.github_app_configured() && config.github_webhook_secret.is_none() {
        warn!("github app configured without DENV_GITHUB_WEBHOOK_SECRET: webhooks are refused");
    }
    let replica = config.replica.clone();
    let lease_ttl = config.lease_ttl;
    let state = AppState::new(db, config);
    if let Some(r) = replica {
        let trust = denv_client::transport::Trust::load(r.ca_file.as_deref())
            .context("-replica-ca-file (DENV_REPLICA_CA_FILE)")?;
        let rep = std::sync::Arc::new(crate::replica::Replica::new(
            state.db.clone(),
            &r.url,
            &r.secret,
            trust,
            lease_ttl,
        ));
        rep.register()
            .await
            .context("register this replica in the store")?;
        rep.refresh_remote()
            .await
            .context("read the other replicas' hosts")?;
        info!(replica = %rep.id, url = %rep.url, lease_ttl = ?lease_ttl, "replica mode");
        state.hub.set_replica(rep.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(crate::replica::HEARTBEAT).await;
                if let Err(e) = rep.beat().await {
                    warn!(error = %e, "replica heartbeat failed");
                }
            }
        });
    }
    match state.orchestrator.recover().await {
        Ok(0) => {}
        Ok(n) => info!(deployments = n, "recovered unfinished deployments"),
        Err(e) => warn!(error = %e, "deployment recovery failed"),
    }
    state.orchestrator.spawn_lifecycle();
    state.orchestrator.spawn_takeover();
    Ok(state)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Serve `state` on its configured address (over TLS with `tls`, from
/// [`crate::tls::load`] of the configured files) until SIGINT/SIGTERM; then drain the
/// orchestrator (new deployments refused, running ones given `DENV_DRAIN` seconds to end
/// while the host streams are still served, then cancelled), close the host streams and
/// wait up to 10 s for the other in-flight requests.
pub async fn serve(state: AppState, tls: Option<crate::tls::ServerTls>) -> anyhow::Result<()> {
    let addr = state.config.addr;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listen on {addr}"))?;
    let local = listener.local_addr()?;
    info!(addr = %local, public_url = %state.config.public_url, tls = tls.is_some(), "denv-cp listening");
    let (orchestrator, hub) = (state.orchestrator.clone(), state.hub.clone());
    let drain_sec = state.config.drain_sec;
    let app = app(state);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let stopped = async {
        let _ = rx.await;
    };
    let server = tokio::spawn(async move {
        match tls {
            Some(tls) => crate::tls::serve(listener, tls, app, stopped).await,
            None => {
                axum::serve(
                    listener,
                    app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
                )
                .with_graceful_shutdown(stopped)
                .await
            }
        }
    });
    shutdown_signal().await;
    // Drain first, while the host streams are still served: deployments that end within
    // the drain end here; the rest stay `running` and the next start resumes them.
    let drain = Duration::from_secs(drain_sec.into());
    info!(within = ?drain, "stopping: new deployments are refused; draining running ones");
    let left = orchestrator.drain(drain).await;
    if left > 0 {
        warn!(
            deployments = left,
            "still running after the drain; the next start resumes them"
        );
    }
    if let Some(rep) = hub.replica() {
        // The other replicas take the rest over at their next look, not after the TTL.
        let released = orchestrator.release_leases().await;
        info!(leases = released, "leases released");
        if let Err(e) = rep.leave().await {
            warn!(error = %e, "removing this replica's row failed");
        }
    }
    // Host streams never end on their own; closed now, they do not hold the grace.
    hub.close_streams();
    info!("shutting down: waiting up to 10s for in-flight requests");
    let _ = tx.send(());
    match tokio::time::timeout(SHUTDOWN_GRACE, server).await {
        Ok(Ok(Ok(()))) => info!("stopped"),
        Ok(Ok(Err(e))) => return Err(e).context("serve"),
        Ok(Err(e)) => return Err(anyhow::anyhow!("server task: {e}")),
        Err(_) => warn!("in-flight requests still open after 10s; exiting"),
    }
    Ok(())
}

/// The binary's entry point: parse flags and environment, log, serve.
pub fn main_entry() -> anyhow::Result<()> {
    let flags = match Flags::try_parse_from(normalize_args(std::env::args())) {
        Ok(f) => f,
        Err(e) => e.exit(),
    };
    let config = match Config::resolve(flags, |k| std::env::var(k).ok().filter(|v| !v.is_empty())) {
        Ok(c) => c,
        Err(msg) => {
            eprintln!("denv-cp: {msg}");
            std::process::exit(2);
        }
    };
    // The certificate and key are read before anything else starts: a bad file is a
    // configuration error like a bad flag.
    let tls = match config.tls.as_ref().map(crate::tls::load).transpose() {
        Ok(t) => t,
        Err(msg) => {
            eprintln!("denv-cp: {msg}");
            std::process::exit(2);
        }
    };
    let default = if config.verbose { "debug" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("DENV_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "{default},sqlx=warn,sea_orm=warn,sea_orm_migration=warn,h2=info,hyper=info,hyper_util=info,tonic=info"
        ))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(async move {
        let state = prepare(config).await?;
        serve(state, tls).await
    })
}
