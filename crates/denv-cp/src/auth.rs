//! Who is calling: credentials → [`Caller`], plus the bootstrap team and key.
//!
//! - `authorization: Bearer dak_…`: a team API key. Looked up by its SHA-256 hash
//!   (compared in constant time); revoked keys are refused at once (`401`);
//!   `LastUsedAt` is refreshed (at most every 10 s per key).
//! - `authorization: Bearer dst_…`: a user session (30 days). `x-denv-team: team_…`
//!   selects the team; the user must be a member (`403`). Without the header the user's
//!   first team is used (`403` when the user has none).
//! - Anything else is `401`.
//!
//! Services call [`authenticate`] with the request's metadata (the REST gateway copies
//! the HTTP headers into it), then scope every lookup to `caller.team_id`: another
//! team's object is `404`.

use crate::config::Config;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{self, api_keys, memberships, sessions, teams};
use sea_orm::DatabaseConnection;
use tonic::metadata::MetadataMap;

/// How often `LastUsedAt` is written for a busy key.
const TOUCH_EVERY: chrono::Duration = chrono::Duration::seconds(10);

/// The authenticated caller of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The team every object of this request is scoped to.
    pub team_id: String,
    /// The signed-in user (sessions only).
    pub user_id: Option<String>,
    /// The API key used (keys only).
    pub key_id: Option<String>,
    /// Whether the credential is a user session (`dst_…`).
    pub is_session: bool,
}

impl Caller {
    /// The user id, or `403` for API keys (routes marked *user* in the REST reference).
    pub fn require_user(&self) -> Result<&str, ApiError> {
        match (&self.user_id, self.is_session) {
            (Some(u), true) => Ok(u),
            _ => Err(ApiError::Forbidden("this call needs a user session".into())),
        }
    }

    /// Who created something: the user id, else `key:<key id>`.
    pub fn actor(&self) -> String {
        match (&self.user_id, &self.key_id) {
            (Some(u), _) => u.clone(),
            (None, Some(k)) => format!("key:{k}"),
            _ => String::new(),
        }
    }
}

/// The bearer token of the request (`None` when absent or not `Bearer`).
pub fn bearer(md: &MetadataMap) -> Option<String> {
    let v = md.get("authorization")?.to_str().ok()?.trim();
    let (scheme, token) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty()).then(|| token.to_string())
}

/// Authenticate a request's metadata (`authorization`, `x-denv-team`).
pub async fn authenticate(state: &AppState, md: &MetadataMap) -> Result<Caller, ApiError> {
    authenticate_db(&state.db, md).await
}

/// [`authenticate`] against a store directly.
pub async fn authenticate_db(
    db: &DatabaseConnection,
    md: &MetadataMap,
) -> Result<Caller, ApiError> {
    let Some(token) = bearer(md) else {
        return Err(ApiError::Unauthorized(
            "missing credential: send authorization: bearer dak_… or dst_…".into(),
        ));
    };
    if token.starts_with("dak_") {
        let key = api_keys::find_by_secret(db, &token)
            .await?
            .ok_or_else(|| ApiError::Unauthorized("invalid api key".into()))?;
        if !key.revoked_at.is_empty() {
            return Err(ApiError::Unauthorized("api key revoked".into()));
        }
        let stale = store::parse_time(&key.last_used_at)
            .is_none_or(|t| chrono::Utc::now() - t > TOUCH_EVERY);
        if stale {
            api_keys::touch(db, &key.id).await?;
        }
        return Ok(Caller {
            team_id: key.team_id,
            user_id: None,
            key_id: Some(key.id),
            is_session: false,
        });
    }
    if token.starts_with("dst_") {
        let s = sessions::find_valid(db, &token)
            .await?
            .ok_or_else(|| ApiError::Unauthorized("invalid or expired session".into()))?;
        let wanted = md
            .get("x-denv-team")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty());
        let team_id = match wanted {
            Some(t) => {
                if memberships::role(db, t, &s.user_id).await?.is_none() {
                    return Err(ApiError::Forbidden(format!("not a member of team {t}")));
                }
                t.to_string()
            }
            None => memberships::teams_of_user(db, &s.user_id)
                .await?
                .into_iter()
                .next()
                .map(|(t, _)| t.id)
                .ok_or_else(|| ApiError::Forbidden("session has no team".into()))?,
        };
        return Ok(Caller {
            team_id,
            user_id: Some(s.user_id),
            key_id: None,
            is_session: true,
        });
    }
    Err(ApiError::Unauthorized("unknown credential".into()))
}

/// What [`bootstrap`] did on an empty database.
#[derive(Debug, Clone)]
pub struct Bootstrapped {
    /// The first team.
    pub team: teams::Model,
    /// The key installed for it.
    pub key: api_keys::Model,
    /// The generated secret when `DENV_BOOTSTRAP_KEY` was unset (printed once).
    pub generated_secret: Option<String>,
}

/// On a database without teams: create team `DENV_TEAM` and install
/// `DENV_BOOTSTRAP_KEY` (or a random `dak_…`) as its key named `bootstrap`.
/// Returns `None` when teams already exist (nothing is consulted or printed then).
pub async fn bootstrap(
    db: &DatabaseConnection,
    config: &Config,
) -> Result<Option<Bootstrapped>, ApiError> {
    use sea_orm::TransactionTrait;
    if teams::count(db).await? > 0 {
        return Ok(None);
    }
    if let Some(k) = &config.bootstrap_key {
        // The quickstart's own example is `dak_local`: a short key is the operator's choice.
        if !k.starts_with("dak_") || k.len() < 5 {
            return Err(ApiError::BadRequest(
                "DENV_BOOTSTRAP_KEY must start with dak_ and have at least one more character"
                    .into(),
            ));
        }
    }
    let txn = db.begin().await?;
    let team = teams::create(&txn, &config.team_name).await?;
    let (secret, generated) = match &config.bootstrap_key {
        Some(k) => (k.clone(), None),
        None => {
            let s = crate::ids::new_secret("dak");
            (s.clone(), Some(s))
        }
    };
    let key = api_keys::insert_with_secret(&txn, &team.id, "bootstrap", "", &secret).await?;
    txn.commit().await?;
    Ok(Some(Bootstrapped {
        team,
        key,
        generated_secret: generated,
    }))
}
