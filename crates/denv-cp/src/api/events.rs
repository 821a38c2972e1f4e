//! `denv.v1.EventService` (`GET /v1/events?subject=`).

use crate::state::AppState;
use crate::store::events;
use denv_proto::v1::{
    event_service_server::{EventService, EventServiceServer},
    ListEventsRequest, ListEventsResponse,
};
use tonic::{Request, Response, Status};

/// Most events one call returns.
pub const MAX_EVENTS: u64 = 200;

/// The event service: the caller's team's events, newest first.
#[derive(Clone)]
pub struct EventApi {
    state: AppState,
}

impl EventApi {
    /// The service over the shared state.
    pub fn new(state: AppState) -> Self {
        EventApi { state }
    }

    /// The tonic server.
    pub fn server(state: AppState) -> EventServiceServer<EventApi> {
        EventServiceServer::new(Self::new(state))
    }
}

#[tonic::async_trait]
impl EventService for EventApi {
    /// Up to 200 events of the caller's team, newest first; only `subject`
    /// (`env:<id>`, `dep:<id>`, `host:<id>`, `cmd:<id>`) when given.
    async fn list_events(
        &self,
        req: Request<ListEventsRequest>,
    ) -> Result<Response<ListEventsResponse>, Status> {
        let caller = crate::auth::authenticate(&self.state, req.metadata()).await?;
        let rows = events::list(
            &self.state.db,
            &caller.team_id,
            req.get_ref().subject.trim(),
            MAX_EVENTS,
        )
        .await
        .map_err(crate::ApiError::from)?;
        Ok(Response::new(ListEventsResponse {
            events: rows.iter().map(Into::into).collect(),
        }))
    }
}
