//! `denv.v1.GithubService`: installations, repositories, and the webhook
//! (spec `12-ref-rest-api.md` *GitHub*, `18-ref-config.md` *GitHub App*).
//!
//! Without `DENV_GITHUB_APP_ID` and `DENV_GITHUB_APP_PRIVATE_KEY` the app is off:
//! `ListInstallations` answers `configured: false`, the other calls and the webhook
//! answer `503`. With the app on, the webhook is verified with `X-Hub-Signature-256`
//! (HMAC-SHA256 of the raw body with `DENV_GITHUB_WEBHOOK_SECRET`, compared in constant
//! time; `401` on mismatch, refused when the secret is unset) and handles `ping` and
//! `installation` events. Push events are acknowledged per project with an `error`
//! because this build has no GitHub App token client to fetch the compose file.

use crate::auth::authenticate;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{installations, projects, sources, webhook_deliveries};
use denv_proto::v1::{
    github_service_server::{GithubService, GithubServiceServer},
    LinkInstallationRequest, LinkInstallationResponse, ListInstallationsRequest,
    ListInstallationsResponse, ListReposRequest, ListReposResponse, WebhookProject, WebhookRequest,
    WebhookResponse,
};
use sha2::{Digest, Sha256};
use tonic::{Request, Response, Status};

/// Largest webhook body accepted (2 MiB).
pub const MAX_WEBHOOK_BYTES: usize = 2 << 20;

/// The GitHub service.
#[derive(Clone)]
pub struct GithubApi {
    state: AppState,
}

type R<T> = Result<Response<T>, Status>;

impl GithubApi {
    /// The service over the shared state.
    pub fn new(state: AppState) -> Self {
        GithubApi { state }
    }

    /// The tonic server.
    pub fn server(state: AppState) -> GithubServiceServer<GithubApi> {
        GithubServiceServer::new(Self::new(state))
    }

    fn require_app(&self) -> Result<(), ApiError> {
        if self.state.config.github_app_configured() {
            Ok(())
        } else {
            Err(ApiError::Unavailable("github app is not configured".into()))
        }
    }
}

/// Whether `signature` (`sha256=<hex>`, the `X-Hub-Signature-256` header) is the
/// HMAC-SHA256 of `body` with `secret` (checked in constant time by the `hmac` crate).
pub fn signature_ok(secret: &str, body: &[u8], signature: &str) -> bool {
    use hmac::{Hmac, Mac};
    let Some(sig) = signature
        .trim()
        .strip_prefix("sha256=")
        .and_then(|h| hex::decode(h).ok())
    else {
        return false;
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret.as_bytes()) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&sig).is_ok()
}

#[tonic::async_trait]
impl GithubService for GithubApi {
    async fn list_installations(
        &self,
        req: Request<ListInstallationsRequest>,
    ) -> R<ListInstallationsResponse> {
        let caller = authenticate(&self.state, req.metadata()).await?;
        let rows = installations::list_for_team(&self.state.db, &caller.team_id)
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(ListInstallationsResponse {
            installations: rows.iter().map(Into::into).collect(),
            configured: self.state.config.github_app_configured(),
        }))
    }

    async fn link_installation(
        &self,
        req: Request<LinkInstallationRequest>,
    ) -> R<LinkInstallationResponse> {
        let caller = authenticate(&self.state, req.metadata()).await?;
        self.require_app()?;
        let id = req.into_inner().id;
        let db = &self.state.db;
        let inst = installations::get(db, id)
            .await
            .map_err(ApiError::from)?
            .ok_or_else(|| ApiError::not_found(format!("installation {id}")))?;
        if !inst.team_id.is_empty() && inst.team_id != caller.team_id {
            return Err(
                ApiError::Conflict(format!("installation {id} is linked to another team")).into(),
            );
        }
        installations::link(db, id, &caller.team_id)
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(LinkInstallationResponse {
            installation: Some(
                (&installations::Model {
                    team_id: caller.team_id,
                    ..inst
                })
                    .into(),
            ),
        }))
    }

    async fn list_repos(&self, req: Request<ListReposRequest>) -> R<ListReposResponse> {
        let caller = authenticate(&self.state, req.metadata()).await?;
        self.require_app()?;
        let id = req.into_inner().installation;
        let linked = installations::get(&self.state.db, id)
            .await
            .map_err(ApiError::from)?
            .is_some_and(|i| i.team_id == caller.team_id);
        if !linked {
            return Err(ApiError::not_found(format!("installation {id}")).into());
        }
        Err(ApiError::Unavailable(
            "listing repositories needs the github app client, which this build lacks".into(),
        )
        .into())
    }

    async fn webhook(&self, req: Request<WebhookRequest>) -> R<WebhookResponse> {
        self.require_app()?;
        let r = req.into_inner();
        if r.body.len() > MAX_WEBHOOK_BYTES {
            return Err(ApiError::PayloadTooLarge("webhook body over 2 MiB".into()).into());
        }
        let Some(secret) = self.state.config.github_webhook_secret.as_deref() else {
            return Err(ApiError::Unauthorized("webhook secret is not configured".into()).into());
        };
        if !signature_ok(secret, &r.body, &r.signature) {
            return Err(ApiError::Unauthorized("signature mismatch".into()).into());
        }
        let delivery = r.delivery.trim();
        if delivery.is_empty() || delivery.len() > 200 {
            return Err(ApiError::BadRequest(
                "X-GitHub-Delivery is required (at most 200 characters)".into(),
            )
            .into());
        }
        // Parsed before it is recorded: a body that is refused is not "seen".
        let body: serde_json::Value = serde_json::from_slice(&r.body)
            .map_err(|e| ApiError::BadRequest(format!("invalid json body: {e}")))?;
        let digest = hex::encode(Sha256::digest(&r.body));
        if !webhook_deliveries::record_first(&self.state.db, delivery, &digest)
            .await
            .map_err(ApiError::from)?
        {
            tracing::warn!(delivery, "webhook replay ignored");
            return Ok(Response::new(WebhookResponse {
                ok: true,
                duplicate: true,
                ..Default::default()
            }));
        }
        match self.handle_event(&r.event, &body).await {
            Ok(out) => Ok(Response::new(out)),
            Err(e) => {
                // Not processed: GitHub's redelivery of it must not be taken for a replay.
                if let Err(fe) = webhook_deliveries::forget(&self.state.db, delivery, &digest).await
                {
                    tracing::error!(delivery, error = %fe, "forgetting a failed delivery failed");
                }
                Err(e.into())
            }
        }
    }
}

impl GithubApi {
    /// Processes one verified, first-seen webhook event.
    async fn handle_event(
        &self,
        event: &str,
        body: &serde_json::Value,
    ) -> Result<WebhookResponse, ApiError> {
        let db = &self.state.db;
        let mut out = WebhookResponse {
            ok: true,
            ..Default::default()
        };
        match event {
            "installation" => {
                let id = body["installation"]["id"].as_i64().unwrap_or(0);
                let login = body["installation"]["account"]["login"]
                    .as_str()
                    .unwrap_or_default();
                match body["action"].as_str().unwrap_or_default() {
                    "created" | "unsuspend" | "new_permissions_accepted" if id != 0 => {
                        installations::upsert_seen(db, id, login)
                            .await
                            .map_err(ApiError::from)?;
                    }
                    "deleted" if id != 0 => {
                        installations::delete(db, id)
                            .await
                            .map_err(ApiError::from)?;
                    }
                    _ => {}
                }
            }
            "push" => {
                let repo = body["repository"]["full_name"].as_str().unwrap_or_default();
                out.sha = body["after"].as_str().unwrap_or_default().to_string();
                out.branch = body["ref"]
                    .as_str()
                    .unwrap_or_default()
                    .trim_start_matches("refs/heads/")
                    .to_string();
                for s in sources::list_by_repo(db, repo)
                    .await
                    .map_err(ApiError::from)?
                {
                    let name = projects::get_any(db, &s.project_id)
                        .await
                        .map_err(ApiError::from)?
                        .map(|p| p.name)
                        .unwrap_or_else(|| s.project_id.clone());
                    out.projects.push(WebhookProject {
                        project: name,
                        error: "push deploys need the github app client, which this build lacks"
                            .into(),
                        ..Default::default()
                    });
                }
            }
            _ => {}
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_hmac_sha256_of_the_body() {
        // RFC 4231 test case 2.
        let sig = "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        assert!(signature_ok("Jefe", b"what do ya want for nothing?", sig));
        assert!(signature_ok(
            "Jefe",
            b"what do ya want for nothing?",
            &sig.to_ascii_uppercase().replace("SHA256=", "sha256=")
        ));
        assert!(!signature_ok("Jefe", b"what do ya want for nothing!", sig));
        assert!(!signature_ok("jefe", b"what do ya want for nothing?", sig));
        assert!(!signature_ok(
            "Jefe",
            b"what do ya want for nothing?",
            &sig[..20]
        ));
        assert!(!signature_ok("s", b"{}", "sha1=00"));
        assert!(!signature_ok("s", b"{}", "sha256=zz"));
    }
}
