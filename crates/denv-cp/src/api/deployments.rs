//! `DeploymentService` (spec pages `12-ref-rest-api.md`, `16-ref-deployments.md`):
//!
//! - `GetDeployment` (`GET /v1/deployments/{id}`): `{deployment, phases}` with phases in
//!   order; another team's deployment is `404`.
//! - `WatchDeployment` (server streaming; `denv deployment watch`; over REST
//!   `GET /v1/deployments/{id}/events`, see `gateway::follow`): sends the current
//!   state at once, then the whole state again on every change (phase started, phase
//!   ended, status), and ends after a final status (`succeeded`, `failed`,
//!   `rolled_back`). Changes come from the runner's `tokio::sync::watch` channel, not
//!   from polling; a deployment with no runner in this process (already final) is
//!   answered from the store.

use crate::domain::DeploymentState;
use crate::error::ApiError;
use crate::orchestrator::{repo, Orchestrator};
use crate::state::AppState;
use denv_proto::v1::{
    self, deployment_service_server::DeploymentService,
    deployment_service_server::DeploymentServiceServer,
};
use futures::Stream;
use std::pin::Pin;
use std::time::Duration;
use tonic::{Request, Response, Status};

/// The gRPC implementation of `denv.v1.DeploymentService`.
#[derive(Clone)]
pub struct DeploymentApi {
    state: AppState,
}

impl DeploymentApi {
    /// The service over the shared state.
    pub fn new(state: AppState) -> Self {
        DeploymentApi { state }
    }

    /// The tonic server.
    pub fn server(state: AppState) -> DeploymentServiceServer<DeploymentApi> {
        DeploymentServiceServer::new(Self::new(state))
            .max_decoding_message_size(denv_proto::contract::API_MESSAGE_MAX_BYTES)
            .max_encoding_message_size(denv_proto::contract::API_MESSAGE_MAX_BYTES)
    }

    fn orch(&self) -> &Orchestrator {
        &self.state.orchestrator
    }
}

fn is_final(s: &DeploymentState) -> bool {
    s.deployment.status.is_final()
}

/// The stream of `WatchDeployment`.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<v1::DeploymentResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DeploymentService for DeploymentApi {
    async fn get_deployment(
        &self,
        req: Request<v1::GetDeploymentRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        let caller = crate::auth::authenticate(&self.state, req.metadata()).await?;
        let id = &req.get_ref().id;
        let out = repo::deployment(self.orch().db(), &caller.team_id, id)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("deployment {id} not found")))?;
        Ok(Response::new(out.into()))
    }

    type WatchDeploymentStream = WatchStream;

    async fn watch_deployment(
        &self,
        req: Request<v1::GetDeploymentRequest>,
    ) -> Result<Response<Self::WatchDeploymentStream>, Status> {
        let caller = crate::auth::authenticate(&self.state, req.metadata()).await?;
        let id = req.into_inner().id;
        let orch = self.orch().clone();
        // Subscribe before reading the store so no change falls between the two.
        let rx = orch.subscribe(&id);
        let first = repo::deployment(orch.db(), &caller.team_id, &id)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("deployment {id} not found")))?;
        let team = caller.team_id.clone();
        let stream = async_stream::stream! {
            let mut last = first.clone();
            yield Ok(first.into());
            if !is_final(&last) {
                if let Some(mut rx) = rx {
                    while rx.changed().await.is_ok() {
                        let cur = rx.borrow_and_update().clone();
                        if cur != last {
                            last = cur.clone();
                            yield Ok(cur.into());
                        }
                        if is_final(&last) {
                            break;
                        }
                    }
                }
                // No runner here (or it ended without us seeing the end): the store.
                while !is_final(&last) {
                    match repo::deployment(orch.db(), &team, &id).await {
                        Ok(Some(cur)) => {
                            if cur != last {
                                last = cur.clone();
                                yield Ok(cur.into());
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            yield Err(Status::from(e));
                            break;
                        }
                    }
                    if !is_final(&last) {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        };
        Ok(Response::new(Box::pin(stream)))
    }
}
