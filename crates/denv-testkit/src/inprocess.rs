//! The hub and TargetService of `denv-cp` in the test's own process, over the real store.

use crate::db::TestDb;
use denv_cp::api::targets::TargetApi;
use denv_cp::config::Config;
use denv_cp::hub::{Hub, HubOptions};
use denv_cp::store;
use denv_cp::AppState;

/// A tonic server on a local port serving the hub's host stream and TargetService over a
/// migrated store with a bootstrapped team. The server stops on drop.
pub struct CpInProcess {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// The hub the server serves (send commands through it directly).
    pub hub: Hub,
    /// The store.
    pub db: sea_orm::DatabaseConnection,
    /// The bootstrapped team.
    pub team_id: String,
    /// The database (kept for the server's lifetime).
    pub test_db: TestDb,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for CpInProcess {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl CpInProcess {
    /// Starts the server over `db` with the bootstrap key `key` and the hub's `opts`.
    pub async fn start(db: TestDb, key: &str, opts: HubOptions) -> CpInProcess {
        let conn = store::connect(&db.dsn).await.unwrap();
        let config = Config {
            bootstrap_key: Some(key.into()),
            public_url: "http://cp.test:8080".into(),
            secret_key: Some([5; 32]),
            ..Config::default()
        };
        let boot = denv_cp::auth::bootstrap(&conn, &config)
            .await
            .unwrap()
            .unwrap();
        let mut state = AppState::new(conn.clone(), config);
        let hub = Hub::with_options(conn.clone(), opts);
        state.hub = hub.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let svc_hub = hub.service();
        let svc_targets = TargetApi::new(state).service();
        let server = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc_hub)
                .add_service(svc_targets)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        CpInProcess {
            url: format!("http://{addr}"),
            hub,
            db: conn,
            team_id: boot.team.id,
            test_db: db,
            server,
        }
    }
}
