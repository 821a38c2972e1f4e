//! Shared state of the control plane: cheap to clone (every field is a handle).

use crate::config::Config;
use crate::hub::Hub;
use crate::orchestrator::Orchestrator;
use sea_orm::DatabaseConnection;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Everything a service needs: the store, the configuration, the hub and the
/// orchestrator, plus the in-memory device-flow and OAuth state (per process: with
/// several replicas, per replica; `docs/explained/replicas.md`, "What stays per
/// replica").
#[derive(Clone)]
pub struct AppState {
    /// The store (SQLite or Postgres), migrated.
    pub db: DatabaseConnection,
    /// The resolved configuration.
    pub config: Arc<Config>,
    /// Host streams and the command path.
    pub hub: Hub,
    /// Deployments and their runners.
    pub orchestrator: Orchestrator,
    /// Device-flow polling: device-code row id → (the interval the CLI must keep, in
    /// seconds, last poll). RFC 8628 `slow_down` adds 5 s each time it is broken.
    pub device_polls: Arc<Mutex<HashMap<String, (u64, Instant)>>>,
    /// Request and approval rate limits.
    pub limits: Arc<crate::ratelimit::RateLimits>,
}

impl AppState {
    /// State over a migrated store: builds the hub and the orchestrator.
    pub fn new(db: DatabaseConnection, config: Config) -> AppState {
        let hub = Hub::new(db.clone());
        let orchestrator = Orchestrator::new(db.clone(), hub.clone()).with_resume_wait(
            std::time::Duration::from_secs(config.resume_wait_sec.into()),
        );
        let limits = Arc::new(crate::ratelimit::RateLimits::new(&config));
        AppState {
            db,
            config: Arc::new(config),
            hub,
            orchestrator,
            device_polls: Arc::new(Mutex::new(HashMap::new())),
            limits,
        }
    }
}
