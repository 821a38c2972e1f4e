//! `denv.v1.HealthService` (`GET /health`).

use denv_proto::v1::{
    health_service_server::{HealthService, HealthServiceServer},
    HealthRequest, HealthResponse,
};
use tonic::{Request, Response, Status};

/// The health service: always `{"status": "ok"}` while the process serves.
#[derive(Debug, Clone, Default)]
pub struct HealthApi;

impl HealthApi {
    /// The tonic server.
    pub fn server() -> HealthServiceServer<HealthApi> {
        HealthServiceServer::new(HealthApi)
    }
}

#[tonic::async_trait]
impl HealthService for HealthApi {
    async fn health(
        &self,
        _req: Request<HealthRequest>,
    ) -> Result<Response<HealthResponse>, Status> {
        Ok(Response::new(HealthResponse {
            status: "ok".into(),
        }))
    }
}
