//! `denv.v1.AuthService`: dev-login, GitHub sign-in, the CLI device flow, `me`, teams
//! and API keys (spec `12-ref-rest-api.md` *Auth, teams, and keys*, `10-ref-cli.md`
//! *login*).
//!
//! Device flow: `DeviceCode` stores a `ddc_…` code (hash only) with a `XXXX-XXXX` user
//! code for 15 minutes; `DeviceApprove` (a user session, member of `team_id`) mints an
//! API key named `name` (default `cli`) and holds its secret in process memory;
//! `DeviceToken` answers `428 authorization_pending` until then (`428 slow_down` for a
//! poll sooner than the interval, which then grows by 5 s, RFC 8628 §3.5), `400
//! invalid_device_code` for an unknown code, `400 expired_token` after 15 minutes, the
//! key exactly once, and `410` afterwards.

use super::convert;
use crate::auth::{authenticate, Caller};
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{api_keys, device_codes, memberships, oauth_states, sessions, teams, users};
use denv_proto::v1::{
    auth_service_server::{AuthService, AuthServiceServer},
    CreateKeyRequest, CreateKeyResponse, CreateTeamRequest, CreateTeamResponse, DevLoginRequest,
    DevLoginResponse, DeviceApproveRequest, DeviceApproveResponse, DeviceCodeRequest,
    DeviceCodeResponse, DeviceTokenRequest, DeviceTokenResponse, GithubCallbackRequest,
    GithubStartRequest, ListKeysRequest, ListKeysResponse, ListTeamsRequest, ListTeamsResponse,
    MeRequest, MeResponse, RedirectResponse, RevokeKeyRequest, RevokeKeyResponse,
};
use sea_orm::TransactionTrait;
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

/// How long an approved device key waits in memory for the CLI.
const DEVICE_KEY_TTL: Duration = Duration::from_secs(15 * 60);
/// How long a GitHub sign-in `state` is valid.
const OAUTH_STATE_TTL: Duration = Duration::from_secs(10 * 60);
/// Seconds between CLI polls.
const POLL_INTERVAL: i32 = 5;

/// The auth service.
#[derive(Clone)]
pub struct AuthApi {
    state: AppState,
}

type R<T> = Result<Response<T>, Status>;

impl AuthApi {
    /// The service over the shared state.
    pub fn new(state: AppState) -> Self {
        AuthApi { state }
    }

    /// The tonic server.
    pub fn server(state: AppState) -> AuthServiceServer<AuthApi> {
        AuthServiceServer::new(Self::new(state))
    }

    async fn caller<T>(&self, req: &Request<T>) -> Result<Caller, ApiError> {
        authenticate(&self.state, req.metadata()).await
    }

    /// Create a user's personal team (named after `login`) when they have none.
    async fn ensure_personal_team(&self, user: &users::Model) -> Result<(), ApiError> {
        if memberships::teams_of_user(&self.state.db, &user.id)
            .await?
            .is_empty()
        {
            let txn = self.state.db.begin().await?;
            let name = if user.login.is_empty() {
                user.email.clone()
            } else {
                user.login.clone()
            };
            let team = teams::create(&txn, &name).await?;
            memberships::add(&txn, &team.id, &user.id, "owner").await?;
            txn.commit().await?;
        }
        Ok(())
    }

    fn github_web_base(&self) -> String {
        let api = &self.state.config.github_api_url;
        if api == "https://api.github.com" {
            "https://github.com".into()
        } else {
            api.trim_end_matches("/api/v3").to_string()
        }
    }

    /// Where a sign-in may return to, parsed and normalised (see [`return_target`]); the
    /// base for relative forms is the console URL, else the public URL.
    fn allowed_return(&self, ret: &str) -> Result<url::Url, String> {
        let cfg = &self.state.config;
        let base = if cfg.console_base().is_empty() {
            cfg.public_url.as_str()
        } else {
            cfg.console_base()
        };
        return_target(ret, base)
    }

    /// RFC 8628 §3.5 for a poll of a pending code: `authorization_pending`, or
    /// `slow_down` when it came sooner than the interval, which then grows by 5 s for
    /// this code from now on.
    fn pending_poll(&self, code_id: &str) -> &'static str {
        let mut m = self
            .state
            .device_polls
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        m.retain(|_, (_, at)| at.elapsed() < DEVICE_KEY_TTL);
        let now = Instant::now();
        let Some((interval, last)) = m.get_mut(code_id) else {
            m.insert(code_id.to_string(), (POLL_INTERVAL as u64, now));
            return "authorization_pending";
        };
        let early = now.duration_since(*last) < Duration::from_secs(*interval);
        *last = now;
        if early {
            *interval += 5;
            "slow_down"
        } else {
            "authorization_pending"
        }
    }

    async fn github_user(&self, code: &str) -> Result<(i64, String, String, String), ApiError> {
        let cfg = &self.state.config;
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(15))
            .user_agent("denv-cp")
            .build()
            .map_err(|e| ApiError::Internal(format!("http client: {e}")))?;
        let tok: serde_json::Value = client
            .post(format!(
                "{}/login/oauth/access_token",
                self.github_web_base()
            ))
            .header("accept", "application/json")
            .form(&[
                (
                    "client_id",
                    cfg.github_client_id.clone().unwrap_or_default(),
                ),
                (
                    "client_secret",
                    cfg.github_client_secret.clone().unwrap_or_default(),
                ),
                ("code", code.to_string()),
                (
                    "redirect_uri",
                    format!("{}/auth/github/callback", cfg.public_url),
                ),
            ])
            .send()
            .await
            .map_err(|e| ApiError::BadGateway(format!("github: {e}")))?
            .json()
            .await
            .map_err(|e| ApiError::BadGateway(format!("github: {e}")))?;
        let Some(access) = tok["access_token"].as_str() else {
            return Err(ApiError::BadRequest(format!(
                "github refused the code: {}",
                tok["error"].as_str().unwrap_or("no access token")
            )));
        };
        let get = |path: &str| {
            client
                .get(format!("{}{path}", cfg.github_api_url))
                .bearer_auth(access)
                .header("accept", "application/vnd.github+json")
                .send()
        };
        let u: serde_json::Value = get("/user")
            .await
            .map_err(|e| ApiError::BadGateway(format!("github: {e}")))?
            .json()
            .await
            .map_err(|e| ApiError::BadGateway(format!("github: {e}")))?;
        let id = u["id"]
            .as_i64()
            .ok_or_else(|| ApiError::BadGateway("github: user without id".into()))?;
        let login = u["login"].as_str().unwrap_or_default().to_string();
        let name = u["name"].as_str().unwrap_or_default().to_string();
        let mut email = u["email"].as_str().unwrap_or_default().to_string();
        if email.is_empty() {
            if let Ok(r) = get("/user/emails").await {
                if let Ok(list) = r.json::<Vec<serde_json::Value>>().await {
                    email = list
                        .iter()
                        .find(|e| e["primary"].as_bool() == Some(true))
                        .and_then(|e| e["email"].as_str())
                        .unwrap_or_default()
                        .to_string();
                }
            }
        }
        Ok((id, login, name, email))
    }
}

/// Sign-in states created before this are expired (10 minutes ago).
fn oauth_cutoff() -> String {
    let t = chrono::Utc::now() - chrono::Duration::from_std(OAUTH_STATE_TTL).unwrap_or_default();
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[tonic::async_trait]
impl AuthService for AuthApi {
    async fn dev_login(&self, req: Request<DevLoginRequest>) -> R<DevLoginResponse> {
        if !self.state.config.dev_login {
            return Err(ApiError::NotFound("not found".into()).into());
        }
        let r = req.into_inner();
        let email = r.email.trim();
        if email.is_empty() || !email.contains('@') {
            return Err(ApiError::BadRequest("email is required".into()).into());
        }
        let (user, _) = users::upsert_by_email(&self.state.db, email, r.name.trim())
            .await
            .map_err(ApiError::from)?;
        self.ensure_personal_team(&user).await?;
        let (_, token) = sessions::create(&self.state.db, &user.id)
            .await
            .map_err(ApiError::from)?;
        tracing::info!(user = %user.id, "dev login");
        Ok(Response::new(DevLoginResponse { token }))
    }

    async fn github_start(&self, req: Request<GithubStartRequest>) -> R<RedirectResponse> {
        let cfg = &self.state.config;
        if !cfg.github_oauth_configured() {
            return Err(ApiError::Unavailable("github sign-in is not configured".into()).into());
        }
        let mut ret = req.into_inner().r#return;
        if ret.is_empty() {
            ret = "/app/".into();
        }
        let ret = self
            .allowed_return(&ret)
            .map_err(|why| {
                ApiError::BadRequest(format!(
                    "return must be the console origin or a loopback url, not {ret:?}: {why}"
                ))
            })?
            .to_string();
        let st = crate::ids::new_secret("dos");
        oauth_states::insert(&self.state.db, &st, &ret, &oauth_cutoff())
            .await
            .map_err(ApiError::from)?;
        let location = format!(
            "{}/login/oauth/authorize?client_id={}&redirect_uri={}&scope={}&state={}",
            self.github_web_base(),
            enc(cfg.github_client_id.as_deref().unwrap_or_default()),
            enc(&format!("{}/auth/github/callback", cfg.public_url)),
            enc("read:user user:email"),
            enc(&st),
        );
        Ok(Response::new(RedirectResponse { location }))
    }

    async fn github_callback(&self, req: Request<GithubCallbackRequest>) -> R<RedirectResponse> {
        if !self.state.config.github_oauth_configured() {
            return Err(ApiError::Unavailable("github sign-in is not configured".into()).into());
        }
        let r = req.into_inner();
        let ret = oauth_states::take(&self.state.db, &r.state, &oauth_cutoff())
            .await
            .map_err(ApiError::from)?;
        let Some(ret) = ret else {
            return Err(ApiError::BadRequest("unknown or expired state".into()).into());
        };
        let (gh_id, login, name, email) = self.github_user(&r.code).await?;
        let (user, _) = users::upsert_github(&self.state.db, gh_id, &login, &name, &email)
            .await
            .map_err(ApiError::from)?;
        self.ensure_personal_team(&user).await?;
        let (_, token) = sessions::create(&self.state.db, &user.id)
            .await
            .map_err(ApiError::from)?;
        // `ret` was serialised by the URL parser and has no fragment.
        Ok(Response::new(RedirectResponse {
            location: format!("{ret}#token={token}"),
        }))
    }

    async fn device_code(&self, _req: Request<DeviceCodeRequest>) -> R<DeviceCodeResponse> {
        let (row, code) = device_codes::create(&self.state.db)
            .await
            .map_err(ApiError::from)?;
        let uri = format!("{}/app/device/", self.state.config.console_base());
        Ok(Response::new(DeviceCodeResponse {
            device_code: code,
            verification_uri_complete: format!("{uri}?code={}", row.user_code),
            user_code: row.user_code,
            verification_uri: uri,
            expires_in: device_codes::DEVICE_CODE_TTL.num_seconds() as i32,
            interval: POLL_INTERVAL,
        }))
    }

    async fn device_approve(&self, req: Request<DeviceApproveRequest>) -> R<DeviceApproveResponse> {
        let caller = self.caller(&req).await?;
        let user_id = caller.require_user()?.to_string();
        let r = req.into_inner();
        let team_id = if r.team_id.trim().is_empty() {
            caller.team_id.clone()
        } else {
            r.team_id.trim().to_string()
        };
        let db = &self.state.db;
        if memberships::role(db, &team_id, &user_id)
            .await
            .map_err(ApiError::from)?
            .is_none()
        {
            return Err(ApiError::Forbidden(format!("not a member of team {team_id}")).into());
        }
        if r.user_code.trim().is_empty() {
            return Err(ApiError::BadRequest("user_code is required".into()).into());
        }
        // User codes are short: every attempt counts, so they cannot be guessed.
        self.state
            .limits
            .check_approval(&user_id)
            .map_err(ApiError::from)?;
        let row = device_codes::find_pending_by_user_code(db, &r.user_code)
            .await
            .map_err(ApiError::from)?
            .ok_or_else(|| ApiError::NotFound("unknown or expired user code".into()))?;
        let name = if r.name.trim().is_empty() {
            "cli"
        } else {
            r.name.trim()
        };
        let txn = db.begin().await.map_err(ApiError::from)?;
        // The key's secret is made when the CLI picks it up (`device_token`), on
        // whichever replica it asks: until then this one is never known.
        let (key, _unknown) = api_keys::create(&txn, &team_id, name, &user_id)
            .await
            .map_err(ApiError::from)?;
        if !device_codes::approve(&txn, &row.id, &team_id, &key.id, &user_id)
            .await
            .map_err(ApiError::from)?
        {
            return Err(ApiError::Conflict("device code already approved".into()).into());
        }
        txn.commit().await.map_err(ApiError::from)?;
        tracing::info!(team = %team_id, key = %key.id, "device login approved");
        Ok(Response::new(DeviceApproveResponse {
            approved: true,
            key_id: key.id,
            team_id,
        }))
    }

    async fn device_token(&self, req: Request<DeviceTokenRequest>) -> R<DeviceTokenResponse> {
        let code = req.into_inner().device_code;
        let db = &self.state.db;
        let row = if code.trim().is_empty() {
            None
        } else {
            device_codes::find_by_device_code(db, code.trim())
                .await
                .map_err(ApiError::from)?
        };
        let Some(row) = row else {
            return Err(ApiError::BadRequest("invalid_device_code".into()).into());
        };
        if row.status == device_codes::HANDED_OUT {
            return Err(ApiError::Gone("device code already used".into()).into());
        }
        if row.expired() {
            return Err(ApiError::BadRequest("expired_token".into()).into());
        }
        if row.status == device_codes::PENDING {
            return Err(ApiError::Precondition(self.pending_poll(&row.id).into()).into());
        }
        // Handed out once: a new secret for the approved key, in the transaction that
        // marks the code handed out (nothing is kept in memory, so any replica answers).
        let secret = crate::ids::new_secret("dak");
        let txn = db.begin().await.map_err(ApiError::from)?;
        let handed = device_codes::mark_handed_out(&txn, &row.id)
            .await
            .map_err(ApiError::from)?;
        if !handed
            || !api_keys::set_secret(&txn, &row.key_id, &secret)
                .await
                .map_err(ApiError::from)?
        {
            return Err(ApiError::Gone("device code already used".into()).into());
        }
        txn.commit().await.map_err(ApiError::from)?;
        let team = teams::get(db, &row.team_id)
            .await
            .map_err(ApiError::from)?
            .map(|t| convert::team(&t, ""));
        Ok(Response::new(DeviceTokenResponse {
            api_key: secret,
            team,
        }))
    }

    async fn me(&self, req: Request<MeRequest>) -> R<MeResponse> {
        let caller = self.caller(&req).await?;
        let db = &self.state.db;
        let team = teams::get(db, &caller.team_id)
            .await
            .map_err(ApiError::from)?
            .ok_or_else(|| ApiError::not_found(format!("team {}", caller.team_id)))?;
        if let (true, Some(uid)) = (caller.is_session, &caller.user_id) {
            let mine = memberships::teams_of_user(db, uid)
                .await
                .map_err(ApiError::from)?;
            let role = mine
                .iter()
                .find(|(t, _)| t.id == team.id)
                .map(|(_, r)| r.clone())
                .unwrap_or_default();
            let user = users::get(db, uid).await.map_err(ApiError::from)?;
            return Ok(Response::new(MeResponse {
                team: Some(convert::team(&team, &role)),
                teams: mine.iter().map(|(t, r)| convert::team(t, r)).collect(),
                user: user.as_ref().map(Into::into),
            }));
        }
        Ok(Response::new(MeResponse {
            team: Some(convert::team(&team, "key")),
            teams: vec![convert::team(&team, "key")],
            user: None,
        }))
    }

    async fn list_teams(&self, req: Request<ListTeamsRequest>) -> R<ListTeamsResponse> {
        let caller = self.caller(&req).await?;
        let uid = caller.require_user()?;
        let mine = memberships::teams_of_user(&self.state.db, uid)
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(ListTeamsResponse {
            teams: mine.iter().map(|(t, r)| convert::team(t, r)).collect(),
        }))
    }

    async fn create_team(&self, req: Request<CreateTeamRequest>) -> R<CreateTeamResponse> {
        let caller = self.caller(&req).await?;
        let uid = caller.require_user()?.to_string();
        let name = req.into_inner().name.trim().to_string();
        if name.is_empty() {
            return Err(ApiError::BadRequest("name is required".into()).into());
        }
        let txn = self.state.db.begin().await.map_err(ApiError::from)?;
        let team = teams::create(&txn, &name).await.map_err(ApiError::from)?;
        memberships::add(&txn, &team.id, &uid, "owner")
            .await
            .map_err(ApiError::from)?;
        txn.commit().await.map_err(ApiError::from)?;
        Ok(Response::new(CreateTeamResponse {
            team: Some(convert::team(&team, "owner")),
        }))
    }

    async fn list_keys(&self, req: Request<ListKeysRequest>) -> R<ListKeysResponse> {
        let caller = self.caller(&req).await?;
        let keys = api_keys::list(&self.state.db, &caller.team_id)
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(ListKeysResponse {
            keys: keys.iter().map(Into::into).collect(),
        }))
    }

    async fn create_key(&self, req: Request<CreateKeyRequest>) -> R<CreateKeyResponse> {
        let caller = self.caller(&req).await?;
        let name = req.into_inner().name.trim().to_string();
        let name = if name.is_empty() {
            "key".to_string()
        } else {
            name
        };
        let (key, secret) =
            api_keys::create(&self.state.db, &caller.team_id, &name, &caller.actor())
                .await
                .map_err(ApiError::from)?;
        tracing::info!(team = %caller.team_id, key = %key.id, "api key created");
        Ok(Response::new(CreateKeyResponse {
            key: Some((&key).into()),
            api_key: secret,
        }))
    }

    async fn revoke_key(&self, req: Request<RevokeKeyRequest>) -> R<RevokeKeyResponse> {
        let caller = self.caller(&req).await?;
        let id = req.into_inner().id;
        if !api_keys::revoke(&self.state.db, &caller.team_id, &id)
            .await
            .map_err(ApiError::from)?
        {
            return Err(ApiError::not_found(format!("key {id}")).into());
        }
        tracing::info!(team = %caller.team_id, key = %id, "api key revoked");
        Ok(Response::new(RevokeKeyResponse { revoked: true }))
    }
}

/// Percent-encode a query value.
pub(crate) fn enc(s: &str) -> String {
    crate::config::pct(s)
}

/// Where a browser may be sent with a session token after sign-in: `ret` parsed the way
/// a browser parses it (WHATWG URL rules, relative forms resolved against `base`, so
/// `//host`, `/\host`, tabs and newlines mean what they mean to a browser), then allowed
/// only when it has no user info and is either on `base`'s origin (scheme, host and
/// port) or an `http`/`https` URL whose host is `localhost` or a loopback address. The
/// fragment is dropped (the token goes there). The error says what was wrong.
pub fn return_target(ret: &str, base: &str) -> Result<url::Url, String> {
    let base = url::Url::parse(base).map_err(|e| format!("server url {base:?}: {e}"))?;
    let mut u = base.join(ret).map_err(|e| e.to_string())?;
    if !u.username().is_empty() || u.password().is_some() {
        return Err("user info is not allowed".into());
    }
    let loopback = matches!(u.scheme(), "http" | "https")
        && match u.host() {
            Some(url::Host::Domain(d)) => d == "localhost",
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        };
    if u.origin() != base.origin() && !loopback {
        return Err(match u.host_str() {
            Some(h) => format!("host {h} is neither the console nor loopback"),
            None => "not an http(s) url".into(),
        });
    }
    u.set_fragment(None);
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::return_target;

    #[test]
    fn return_urls_are_checked_as_a_browser_reads_them() {
        let base = "https://console.example";
        let ok = |r: &str| return_target(r, base).map(|u| u.to_string());
        for (r, want) in [
            ("/app/", "https://console.example/app/"),
            (
                "https://console.example/app/x?y=1#old",
                "https://console.example/app/x?y=1",
            ),
            ("HTTPS://CONSOLE.EXAMPLE:443/a", "https://console.example/a"),
            ("http://localhost:3100/app/", "http://localhost:3100/app/"),
            ("http://127.0.0.1/", "http://127.0.0.1/"),
            ("http://127.1:9/", "http://127.0.0.1:9/"),
            ("http://0x7f.0.0.1/", "http://127.0.0.1/"),
            ("http://[::1]:8/", "http://[::1]:8/"),
            ("http://local\thost:1/", "http://localhost:1/"),
        ] {
            assert_eq!(ok(r).as_deref(), Ok(want), "{r}");
        }
        for r in [
            "https://evil.example/",
            "//evil.example/",
            "/\\evil.example/",
            "\\\\evil.example",
            "https://console.example@evil.example/",
            "http://localhost:3100@evil.example/",
            "https://user:pw@console.example/",
            "http://127.0.0.1.evil.example/",
            "http://localhost.evil.example/",
            "https://console.example.evil.example/",
            "http://console.example/",
            "https://console.example:8443/",
            "javascript:alert(1)",
            "data:text/html,x",
            "file:///etc/passwd",
            "ftp://127.0.0.1/",
            "https://evil.example\\@console.example/",
            " //evil.example",
            "/\t/evil.example",
        ] {
            assert!(ok(r).is_err(), "{r:?} was allowed as {:?}", ok(r));
        }
    }
}
