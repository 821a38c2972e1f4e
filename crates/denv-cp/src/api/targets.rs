//! `TargetService`: clouds, join tokens, hosts and targets (spec pages
//! `12-ref-rest-api.md` "Targets, clouds, and hosts", `17-ref-targets.md`,
//! `02-connect-a-target.md`).
//!
//! | rpc | REST | answer |
//! |---|---|---|
//! | `ListClouds` | `GET /v1/clouds` | `{clouds}`; `token` and any config key containing `secret` or `key` shown as `•••` |
//! | `CreateCloud` | `POST /v1/clouds` | `201 {cloud}`; `400` unknown provider / missing `token`; `409` duplicate name |
//! | `CreateJoinToken` | `POST /v1/join-tokens` | `201 {token: "djt_…", expires_in_sec: 3600, command}` |
//! | `ListHosts` | `GET /v1/hosts` | `{hosts}` with `connected` (an open stream now) |
//! | `ListTargets` | `GET /v1/targets` | `{targets}`, sidecars first, `kind: "sidecar"` or `driver:<provider>` |
//! | `ConnectTarget` | `POST /v1/targets/connect` | `503 driver hosts are not available yet` (drivers come later) |
//!
//! Provider tokens cannot be checked against the live providers from here, so a cloud's
//! config is validated for shape only (`token` present and a non-empty string).

use crate::error::ApiError;
use crate::ids::new_secret;
use crate::state::AppState;
use crate::store::{clouds, hosts, join_tokens};
use denv_proto::json::{from_struct, to_struct};
use denv_proto::v1::{
    target_service_server::{TargetService, TargetServiceServer},
    Cloud, ConnectTargetRequest, ConnectTargetResponse, CreateCloudRequest, CreateCloudResponse,
    CreateJoinTokenRequest, CreateJoinTokenResponse, Host, ListCloudsRequest, ListCloudsResponse,
    ListHostsRequest, ListHostsResponse, ListTargetsRequest, ListTargetsResponse, Target,
};
use serde_json::{json, Map, Value};
use tonic::{Request, Response, Status};

/// Providers a cloud may name.
pub const PROVIDERS: [&str; 4] = ["manual", "hetzner", "e2b", "daytona"];

/// What secrets look like in `GET /v1/clouds`.
pub const MASK: &str = "•••";

/// The `TargetService` implementation.
#[derive(Clone)]
pub struct TargetApi {
    state: AppState,
}

impl TargetApi {
    /// Over the shared state.
    pub fn new(state: AppState) -> Self {
        TargetApi { state }
    }

    /// The tonic service to mount (64 MiB messages both ways).
    pub fn service(self) -> TargetServiceServer<TargetApi> {
        TargetServiceServer::new(self)
            .max_decoding_message_size(crate::hub::MAX_FRAME_BYTES)
            .max_encoding_message_size(crate::hub::MAX_FRAME_BYTES)
    }

    async fn team(&self, md: &tonic::metadata::MetadataMap) -> Result<String, ApiError> {
        Ok(crate::auth::authenticate(&self.state, md).await?.team_id)
    }
}

fn db_err(e: sea_orm::DbErr) -> ApiError {
    ApiError::Internal(format!("store: {e}"))
}

/// Validates a cloud's provider and config (shape only) and fills defaults. Errors are
/// the `400` messages: `unknown provider "x" (one of manual, hetzner, e2b, daytona)`,
/// `hetzner: config.token is required`.
pub fn validate_cloud(provider: &str, config: &Value) -> Result<Value, String> {
    let mut cfg: Map<String, Value> = match config {
        Value::Object(m) => m.clone(),
        Value::Null => Map::new(),
        _ => return Err("config must be an object".into()),
    };
    let need_token = |cfg: &Map<String, Value>| -> Result<(), String> {
        match cfg.get("token") {
            Some(Value::String(t)) if !t.trim().is_empty() => Ok(()),
            Some(Value::String(_)) | None | Some(Value::Null) => {
                Err(format!("{provider}: config.token is required"))
            }
            Some(_) => Err(format!("{provider}: config.token must be a string")),
        }
    };
    match provider {
        "manual" => {}
        "hetzner" => {
            need_token(&cfg)?;
            for (k, d) in [
                ("server_type", "cpx31"),
                ("location", "nbg1"),
                ("image", "ubuntu-24.04"),
            ] {
                match cfg.get(k) {
                    Some(Value::String(s)) if !s.is_empty() => {}
                    None | Some(Value::Null) | Some(Value::String(_)) => {
                        cfg.insert(k.into(), Value::String(d.into()));
                    }
                    Some(_) => return Err(format!("hetzner: config.{k} must be a string")),
                }
            }
        }
        "e2b" | "daytona" => need_token(&cfg)?,
        other => {
            return Err(format!(
                "unknown provider {other:?} (one of {})",
                PROVIDERS.join(", ")
            ))
        }
    }
    Ok(Value::Object(cfg))
}

/// A config with the value of `token` and of every key containing `secret` or `key`,
/// at any depth, replaced by `•••`.
pub fn mask_config(config: &Value) -> Value {
    crate::sealed::mask_secrets(config, MASK)
}

/// The paste-able install line of a join token: download `denvd` from this control
/// plane's release route, make it executable, join in the foreground.
pub fn join_command(public_url: &str, token: &str) -> String {
    let url = public_url.trim_end_matches('/');
    format!(
        "curl -fsSL {url}/denvd -o /usr/local/bin/denvd && chmod +x /usr/local/bin/denvd && denvd join --server {url} --token {token}"
    )
}

/// The static capability row of a hosted provider (`17-ref-targets.md`, capability table).
pub fn provider_table(provider: &str) -> Option<Value> {
    let row = match provider {
        "e2b" => {
            json!({"provider": "e2b", "multi_service": "no", "snapshot": "pause (sandbox persisted)", "fork": "—", "fork_time": "n/a", "egress_deny": "provider network config", "caps": "provider tier", "gpu": "no", "verify": "no", "notes": "one sandbox per environment; pause/resume keeps state, no branch"})
        }
        "daytona" => {
            json!({"provider": "daytona", "multi_service": "no", "snapshot": "snapshot to image", "fork": "new sandbox from snapshot", "fork_time": "tens of seconds", "egress_deny": "limited", "caps": "provider tier", "gpu": "partial", "verify": "no", "notes": "—"})
        }
        "modal" => {
            json!({"provider": "modal", "multi_service": "no", "snapshot": "filesystem + memory snapshot", "fork": "restore from snapshot", "fork_time": "seconds", "egress_deny": "block_network", "caps": "per sandbox", "gpu": "yes", "verify": "no", "notes": "driver not shipped: Modal's sandbox API is Python-only"})
        }
        "prime" => {
            json!({"provider": "prime", "multi_service": "no", "snapshot": "snapshot", "fork": "new sandbox from snapshot", "fork_time": "seconds", "egress_deny": "yes", "caps": "per sandbox", "gpu": "yes", "verify": "no", "notes": "driver not shipped"})
        }
        _ => return None,
    };
    Some(row)
}

fn cloud_msg(c: &clouds::Model) -> Cloud {
    let cfg: Value = serde_json::from_str(&c.config).unwrap_or_else(|_| json!({}));
    Cloud {
        id: c.id.clone(),
        team_id: c.team_id.clone(),
        provider: c.provider.clone(),
        name: c.name.clone(),
        config: Some(to_struct(&mask_config(&cfg))),
        created_at: c.created_at.clone(),
    }
}

/// Live view of a host row: `connected` from the hub (driver hosts always), and a
/// stored `connected` status without a stream shown as `unreachable`.
fn host_view(state: &AppState, h: &hosts::Model) -> (bool, String, Value) {
    let driver = h.kind.starts_with("driver:");
    let connected = driver || state.hub.is_connected(&h.id);
    let status = if connected {
        hosts::STATUS_CONNECTED.to_string()
    } else if h.status == hosts::STATUS_CONNECTED || h.status.is_empty() {
        hosts::STATUS_UNREACHABLE.to_string()
    } else {
        h.status.clone()
    };
    let caps: Value = serde_json::from_str(&h.capabilities).unwrap_or_else(|_| json!({}));
    (connected, status, caps)
}

/// A host row as the API's `Host`.
pub fn host_msg(state: &AppState, h: &hosts::Model) -> Host {
    let (connected, status, caps) = host_view(state, h);
    Host {
        id: h.id.clone(),
        team_id: h.team_id.clone(),
        cloud_id: h.cloud_id.clone(),
        name: h.name.clone(),
        status,
        provider_ref: h.provider_ref.clone(),
        last_seen_at: h.last_seen_at.clone(),
        created_at: h.created_at.clone(),
        capabilities: Some(to_struct(&caps)),
        connected,
    }
}

fn target_msg(state: &AppState, h: &hosts::Model) -> Target {
    let (connected, status, caps) = host_view(state, h);
    let provider = h.kind.strip_prefix("driver:").unwrap_or("").to_string();
    Target {
        id: h.id.clone(),
        team_id: h.team_id.clone(),
        cloud_id: h.cloud_id.clone(),
        name: h.name.clone(),
        status,
        provider_ref: h.provider_ref.clone(),
        last_seen_at: h.last_seen_at.clone(),
        created_at: h.created_at.clone(),
        kind: if h.kind.is_empty() {
            hosts::KIND_SIDECAR.into()
        } else {
            h.kind.clone()
        },
        table: provider_table(&provider).map(|t| to_struct(&t)),
        provider,
        connected,
        capabilities: Some(to_struct(&caps)),
    }
}

#[tonic::async_trait]
impl TargetService for TargetApi {
    async fn list_clouds(
        &self,
        request: Request<ListCloudsRequest>,
    ) -> Result<Response<ListCloudsResponse>, Status> {
        let team = self.team(request.metadata()).await?;
        let rows = clouds::list(&self.state.db, &team).await.map_err(db_err)?;
        Ok(Response::new(ListCloudsResponse {
            clouds: rows.iter().map(cloud_msg).collect(),
        }))
    }

    async fn create_cloud(
        &self,
        request: Request<CreateCloudRequest>,
    ) -> Result<Response<CreateCloudResponse>, Status> {
        let team = self.team(request.metadata()).await?;
        let req = request.into_inner();
        let provider = req.provider.trim().to_lowercase();
        if provider.is_empty() {
            return Err(ApiError::BadRequest(format!(
                "provider is required (one of {})",
                PROVIDERS.join(", ")
            ))
            .into());
        }
        let cfg = req.config.as_ref().map(from_struct).unwrap_or(Value::Null);
        let cfg = validate_cloud(&provider, &cfg).map_err(ApiError::BadRequest)?;
        let name = if req.name.trim().is_empty() {
            provider.clone()
        } else {
            req.name.trim().to_string()
        };
        let db = &self.state.db;
        if clouds::by_name(db, &team, &name)
            .await
            .map_err(db_err)?
            .is_some()
        {
            return Err(ApiError::Conflict(format!("cloud {name:?} already exists")).into());
        }
        let id = crate::ids::new_id("cloud");
        let cfg = crate::sealed::seal_secrets(&cfg, &id, self.state.config.secret_key.as_ref())
            .map_err(|field| {
                ApiError::Unavailable(format!(
                    "config.{field} is a credential and this control plane has no \
                     DENV_SECRET_KEY to encrypt it with (32 bytes: `openssl rand -hex 32`)"
                ))
            })?;
        let row = clouds::insert(
            db,
            clouds::Model {
                id,
                team_id: team,
                provider,
                name,
                config: cfg.to_string(),
                created_at: crate::store::now(),
            },
        )
        .await
        .map_err(db_err)?;
        Ok(Response::new(CreateCloudResponse {
            cloud: Some(cloud_msg(&row)),
        }))
    }

    async fn create_join_token(
        &self,
        request: Request<CreateJoinTokenRequest>,
    ) -> Result<Response<CreateJoinTokenResponse>, Status> {
        let team = self.team(request.metadata()).await?;
        let req = request.into_inner();
        let db = &self.state.db;
        let cloud_id = req.cloud_id.trim().to_string();
        if !cloud_id.is_empty()
            && clouds::get_in_team(db, &team, &cloud_id)
                .await
                .map_err(db_err)?
                .is_none()
        {
            return Err(ApiError::NotFound(format!("cloud {cloud_id} not found")).into());
        }
        let token = new_secret("djt");
        let created = chrono::Utc::now();
        let expires = created + chrono::Duration::seconds(join_tokens::TTL_SEC);
        join_tokens::insert(
            db,
            join_tokens::Model {
                token_hash: crate::ids::hash_secret(&token),
                team_id: team,
                cloud_id,
                created_at: crate::store::fmt_time(created),
                expires_at: crate::store::fmt_time(expires),
                used_at: String::new(),
                host_id: String::new(),
            },
        )
        .await
        .map_err(db_err)?;
        let command = join_command(&self.state.config.public_url, &token);
        Ok(Response::new(CreateJoinTokenResponse {
            token,
            expires_in_sec: join_tokens::TTL_SEC as i32,
            command,
        }))
    }

    async fn list_hosts(
        &self,
        request: Request<ListHostsRequest>,
    ) -> Result<Response<ListHostsResponse>, Status> {
        let team = self.team(request.metadata()).await?;
        let rows = hosts::list(&self.state.db, &team).await.map_err(db_err)?;
        Ok(Response::new(ListHostsResponse {
            hosts: rows.iter().map(|h| host_msg(&self.state, h)).collect(),
        }))
    }

    async fn list_targets(
        &self,
        request: Request<ListTargetsRequest>,
    ) -> Result<Response<ListTargetsResponse>, Status> {
        let team = self.team(request.metadata()).await?;
        let rows = hosts::list(&self.state.db, &team).await.map_err(db_err)?;
        let (mut sidecars, drivers): (Vec<_>, Vec<_>) = rows
            .iter()
            .map(|h| target_msg(&self.state, h))
            .partition(|t| t.kind == hosts::KIND_SIDECAR);
        sidecars.extend(drivers);
        Ok(Response::new(ListTargetsResponse { targets: sidecars }))
    }

    async fn connect_target(
        &self,
        request: Request<ConnectTargetRequest>,
    ) -> Result<Response<ConnectTargetResponse>, Status> {
        let _team = self.team(request.metadata()).await?;
        let req = request.into_inner();
        let provider = req.provider.trim().to_lowercase();
        if provider != "e2b" && provider != "daytona" {
            return Err(ApiError::BadRequest(format!(
                "unknown hosted provider {provider:?} (one of e2b, daytona)"
            ))
            .into());
        }
        let mut cfg = req.config.as_ref().map(from_struct).unwrap_or(json!({}));
        if !req.token.is_empty() {
            if let Value::Object(m) = &mut cfg {
                m.insert("token".into(), Value::String(req.token.clone()));
            }
        }
        validate_cloud(&provider, &cfg).map_err(ApiError::BadRequest)?;
        Err(ApiError::Unavailable("driver hosts are not available yet".into()).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hetzner_needs_a_token_and_gets_defaults() {
        let err = validate_cloud("hetzner", &json!({})).unwrap_err();
        assert_eq!(err, "hetzner: config.token is required");
        let cfg = validate_cloud("hetzner", &json!({"token": "t", "location": "fsn1"})).unwrap();
        assert_eq!(cfg["server_type"], "cpx31");
        assert_eq!(cfg["location"], "fsn1");
        assert_eq!(cfg["image"], "ubuntu-24.04");
    }

    #[test]
    fn providers_are_checked() {
        assert!(validate_cloud("aws", &json!({}))
            .unwrap_err()
            .starts_with("unknown provider \"aws\""));
        assert!(validate_cloud("manual", &Value::Null).is_ok());
        assert_eq!(
            validate_cloud("e2b", &json!({"token": ""})).unwrap_err(),
            "e2b: config.token is required"
        );
        assert!(validate_cloud("daytona", &json!({"token": "dtn_1"})).is_ok());
    }

    #[test]
    fn secrets_are_masked() {
        let m = mask_config(
            &json!({"token": "t", "api_key": "k", "client_secret": "s", "location": "nbg1"}),
        );
        assert_eq!(m["token"], MASK);
        assert_eq!(m["api_key"], MASK);
        assert_eq!(m["client_secret"], MASK);
        assert_eq!(m["location"], "nbg1");
    }

    #[test]
    fn join_command_uses_the_release_route() {
        assert_eq!(
            join_command("http://cp:8080/", "djt_x"),
            "curl -fsSL http://cp:8080/denvd -o /usr/local/bin/denvd && chmod +x /usr/local/bin/denvd && denvd join --server http://cp:8080 --token djt_x"
        );
    }
}
