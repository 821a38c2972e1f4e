//! The orchestrator's view of the store: environments, versions, deployments and phases
//! as the domain rows of [`crate::domain`] (a version's compose spec parsed once, when
//! the row is read, and stored as its JSON object; a deployment's params and a phase's
//! evidence stored as JSON text, whole numbers as integers), events and projects, read
//! and written through the sea-orm entities of [`crate::store`]. Nothing here knows the
//! wire messages: [`crate::api::convert`] makes them.
//!
//! The one repository of those four tables: production and `tests/store.rs` (on SQLite
//! and PostgreSQL) use these functions; [`crate::store`] holds only their entities.
//! Status columns are written as the strings of [`crate::domain`]'s enums, and every
//! save checks the move: [`save_env`], [`set_env_status`], [`save_deployment`] and
//! [`save_phase`] answer `Internal` (naming the row and both states, nothing written)
//! when the stored status may not become the new one. The check is part of the write
//! (`UPDATE … WHERE status IN (<every status that may become the new one>)`), so a
//! concurrent writer's move cannot land between the check and the write.
//!
//! Everything here is team-scoped where a caller can name the object: a row of another
//! team reads as `None` (the API answers `404`, never `403`).

use crate::domain::{
    illegal_transition, read_status, Deployment, DeploymentState, DeploymentStatus, EnvRow,
    EnvStatus, Environment, Kind, Phase, PhaseStatus, UnknownValue, Version,
};
use crate::error::ApiError;
use crate::store::{deployments, environments, events, phases, projects, versions};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection,
    EntityTrait, IntoActiveModel, PaginatorTrait, QueryFilter, QueryOrder, TransactionTrait,
};
use serde_json::Value;

pub(crate) fn db_err(e: sea_orm::DbErr) -> ApiError {
    ApiError::Internal(format!("store: {e}"))
}

/// The deployment statuses of a deployment not yet final.
const OPEN: [&str; 2] = [
    DeploymentStatus::Pending.as_str(),
    DeploymentStatus::Running.as_str(),
];

/// A status string of a row as its enum (`Internal` naming the row when unknown).
fn parse_status<T: std::str::FromStr<Err = UnknownValue>>(
    what: &str,
    id: &str,
    s: &str,
) -> Result<T, ApiError> {
    s.parse()
        .map_err(|e: UnknownValue| ApiError::Internal(format!("{what} {id}: {e}")))
}

/// `Ok` when a row whose stored status is `from` may be saved with `to`: the same
/// status, or a move its `can_become` allows; else `Internal` naming both states.
fn check_move<T>(
    what: &str,
    id: &str,
    from: T,
    to: T,
    can: fn(T, T) -> bool,
) -> Result<(), ApiError>
where
    T: Copy + PartialEq + std::fmt::Display,
{
    if from == to || can(from, to) {
        Ok(())
    } else {
        Err(ApiError::Internal(illegal_transition(what, id, from, to)))
    }
}

/// The stored strings of every status a row may hold to be saved with `to`: `to` itself
/// and each one whose `can_become` allows the move. A write filters on these, so the
/// check and the write are one statement: a concurrent writer's move cannot slip
/// between them.
fn may_become<T>(
    all: &[T],
    to: T,
    can: fn(T, T) -> bool,
    as_str: fn(T) -> &'static str,
) -> Vec<&'static str>
where
    T: Copy + PartialEq,
{
    all.iter()
        .copied()
        .filter(|from| *from == to || can(*from, to))
        .map(as_str)
        .collect()
}

/// After a guarded write changed no row: `Ok(true)` when the row is missing (nothing to
/// write, as before), `Err(Internal)` naming both states when its status may not
/// become `to`, `Ok(false)` when it may now (another writer moved it in between: the
/// caller writes again).
fn after_refused_write<T>(
    what: &str,
    id: &str,
    stored: Option<String>,
    to: T,
    can: fn(T, T) -> bool,
) -> Result<bool, ApiError>
where
    T: Copy + PartialEq + std::fmt::Display + std::str::FromStr<Err = UnknownValue>,
{
    let Some(status) = stored else {
        return Ok(true);
    };
    let from: T = parse_status(what, id, &status)?;
    check_move(what, id, from, to, can).map(|()| false)
}

/// How many times a guarded write is tried when other writers keep moving the row.
const GUARDED_TRIES: usize = 3;

fn raced(what: &str, id: &str) -> ApiError {
    ApiError::Internal(format!(
        "{what} {id}: its status kept changing under this write ({GUARDED_TRIES} tries)"
    ))
}

/// The current time as RFC 3339 UTC (milliseconds).
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn json_text(v: &Value) -> String {
    if v.is_null() {
        String::new()
    } else {
        v.to_string()
    }
}

fn parse_json(s: &str) -> Value {
    if s.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(s).unwrap_or(Value::Null)
    }
}

/// JSON that went through `google.protobuf.Struct`/`Value` has every number as a
/// double; integral ones (within ±2^53) become integers again, so stored documents
/// read back into typed structs (`u64` fields of a spec) and print as `3`, not `3.0`.
pub fn normalize_numbers(v: Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 => {
                Value::from(f as i64)
            }
            _ => Value::Number(n),
        },
        Value::Array(a) => Value::Array(a.into_iter().map(normalize_numbers).collect()),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, v)| (k, normalize_numbers(v)))
                .collect(),
        ),
        other => other,
    }
}

// ---------------------------------------------------------------- conversions

/// An environment row as the domain row; a status no [`EnvStatus`] knows (a row
/// written by something else than this code) reads as `failed` (logged), and
/// [`save_env`] refuses to save over it.
pub fn env_of(m: &environments::Model) -> Environment {
    let endpoints = serde_json::from_str(&m.endpoints).unwrap_or_default();
    Environment {
        id: m.id.clone(),
        project_id: m.project_id.clone(),
        name: m.name.clone(),
        stage: m.stage.clone(),
        host_id: m.host_id.clone(),
        parent_version_id: m.parent_version_id.clone(),
        current_version_id: m.current_version_id.clone(),
        status: m.status(),
        created_at: m.created_at.clone(),
        endpoints,
        expires_at: m.expires_at.clone(),
    }
}

fn env_model(team_id: &str, e: &Environment) -> environments::Model {
    environments::Model {
        id: e.id.clone(),
        project_id: e.project_id.clone(),
        team_id: team_id.to_string(),
        name: e.name.clone(),
        stage: e.stage.clone(),
        host_id: e.host_id.clone(),
        parent_version_id: e.parent_version_id.clone(),
        current_version_id: e.current_version_id.clone(),
        status: e.status.as_str().to_string(),
        endpoints: serde_json::to_string(&e.endpoints).unwrap_or_else(|_| "{}".into()),
        created_at: e.created_at.clone(),
        expires_at: e.expires_at.clone(),
        pool: -1,
    }
}

/// A version row as the domain row, its spec parsed (`Internal` naming the version
/// when the stored spec does not read as a [`denv_compose::Spec`]).
fn version_row(m: &versions::Model) -> Result<Version, ApiError> {
    let spec = serde_json::from_value(normalize_numbers(parse_json(&m.spec)))
        .map_err(|e| ApiError::Internal(format!("version {} has an unreadable spec: {e}", m.id)))?;
    Ok(Version {
        id: m.id.clone(),
        project_id: m.project_id.clone(),
        env_id: m.env_id.clone(),
        number: m.number,
        spec,
        snapshot: m.snapshot.clone(),
        healthy: m.healthy,
        created_at: m.created_at.clone(),
    })
}

/// A version as its store model; the spec is stored as its JSON object.
fn version_model(team_id: &str, v: &Version) -> versions::Model {
    versions::Model {
        id: v.id.clone(),
        project_id: v.project_id.clone(),
        env_id: v.env_id.clone(),
        team_id: team_id.to_string(),
        number: v.number,
        spec: serde_json::to_value(&v.spec)
            .map(|j| normalize_numbers(j).to_string())
            .unwrap_or_default(),
        snapshot: v.snapshot.clone(),
        healthy: v.healthy,
        created_at: v.created_at.clone(),
    }
}

/// A deployment row as the domain row: `Internal` naming the deployment when its kind is
/// one this code does not know; a status no [`DeploymentStatus`] knows reads as
/// `failed` (logged), and [`save_deployment`] refuses to save over it. Params that are
/// not a JSON object read as `{}`.
fn deployment_row(m: &deployments::Model) -> Result<Deployment, ApiError> {
    let params = match normalize_numbers(parse_json(&m.params)) {
        p @ Value::Object(_) => p,
        _ => Value::Object(Default::default()),
    };
    Ok(Deployment {
        id: m.id.clone(),
        project_id: m.project_id.clone(),
        env_id: m.env_id.clone(),
        kind: parse_status("deployment", &m.id, &m.kind)?,
        status: read_status(&m.status, &m.id, DeploymentStatus::Failed),
        version_id: m.version_id.clone(),
        target_env_id: m.target_env_id.clone(),
        params,
        error: m.error.clone(),
        created_at: m.created_at.clone(),
        finished_at: m.finished_at.clone(),
    })
}

/// A deployment as its store model; params are stored as their JSON object (`{}`
/// when not an object).
fn deployment_model(team_id: &str, d: &Deployment) -> deployments::Model {
    let params = if d.params.is_object() {
        normalize_numbers(d.params.clone()).to_string()
    } else {
        "{}".to_string()
    };
    deployments::Model {
        id: d.id.clone(),
        project_id: d.project_id.clone(),
        env_id: d.env_id.clone(),
        team_id: team_id.to_string(),
        kind: d.kind.as_str().to_string(),
        status: d.status.as_str().to_string(),
        version_id: d.version_id.clone(),
        target_env_id: d.target_env_id.clone(),
        params,
        error: d.error.clone(),
        created_at: d.created_at.clone(),
        finished_at: d.finished_at.clone(),
    }
}

/// A phase row as the domain row (evidence the stored JSON value, `null` if none):
/// `Internal` naming the phase when its name is one this code does not know; a status
/// no [`PhaseStatus`] knows reads as `failed` (logged), and [`save_phase`] refuses to
/// save over it.
fn phase_row(m: &phases::Model) -> Result<Phase, ApiError> {
    let id = format!("{}/{}", m.deployment_id, m.name);
    Ok(Phase {
        deployment_id: m.deployment_id.clone(),
        seq: m.seq,
        name: parse_status("phase", &id, &m.name)?,
        status: read_status(&m.status, &id, PhaseStatus::Failed),
        evidence: normalize_numbers(parse_json(&m.evidence)),
        error: m.error.clone(),
        started_at: m.started_at.clone(),
        finished_at: m.finished_at.clone(),
    })
}

/// A phase as its store model; the evidence is stored as its JSON text (`""` for
/// `null`).
fn phase_model(p: &Phase) -> phases::Model {
    phases::Model {
        deployment_id: p.deployment_id.clone(),
        seq: p.seq,
        name: p.name.as_str().to_string(),
        status: p.status.as_str().to_string(),
        evidence: json_text(&normalize_numbers(p.evidence.clone())),
        error: p.error.clone(),
        started_at: p.started_at.clone(),
        finished_at: p.finished_at.clone(),
    }
}

// ---------------------------------------------------------------- environments

/// An environment of the team by id.
pub async fn env(
    db: &DatabaseConnection,
    team_id: &str,
    id: &str,
) -> Result<Option<Environment>, ApiError> {
    let m = environments::Entity::find_by_id(id.to_string())
        .one(db)
        .await
        .map_err(db_err)?;
    Ok(m.filter(|m| m.team_id == team_id).map(|m| env_of(&m)))
}

/// An environment by project and name.
pub async fn env_by_name(
    db: &DatabaseConnection,
    team_id: &str,
    project_id: &str,
    name: &str,
) -> Result<Option<Environment>, ApiError> {
    let m = environments::Entity::find()
        .filter(environments::Column::TeamId.eq(team_id))
        .filter(environments::Column::ProjectId.eq(project_id))
        .filter(environments::Column::Name.eq(name))
        .order_by_desc(environments::Column::CreatedAt)
        .one(db)
        .await
        .map_err(db_err)?;
    Ok(m.map(|m| env_of(&m)))
}

/// The gate forks ([`super::runner::promote`]'s stage `gate`) of `version_id` that are
/// not destroyed.
pub async fn live_gate_forks(
    db: &DatabaseConnection,
    team_id: &str,
    version_id: &str,
) -> Result<Vec<Environment>, ApiError> {
    let ms = environments::Entity::find()
        .filter(environments::Column::TeamId.eq(team_id))
        .filter(environments::Column::Stage.eq("gate"))
        .filter(environments::Column::ParentVersionId.eq(version_id))
        .filter(environments::Column::Status.ne(EnvStatus::Destroyed.as_str()))
        .all(db)
        .await
        .map_err(db_err)?;
    Ok(ms.iter().map(env_of).collect())
}

/// Writes every column of an environment (but its TTL and pool size). `Internal` (naming
/// both states, nothing written) when the stored status may not become the new one
/// ([`EnvStatus::can_become`]).
pub async fn save_env(
    db: &impl ConnectionTrait,
    team_id: &str,
    e: &Environment,
) -> Result<(), ApiError> {
    let from = may_become(
        EnvStatus::ALL,
        e.status,
        EnvStatus::can_become,
        EnvStatus::as_str,
    );
    for _ in 0..GUARDED_TRIES {
        let mut am = env_model(team_id, e).into_active_model().reset_all();
        // The TTL changes only through `set_expiry`: a runner's stale copy must not undo it.
        am.expires_at = sea_orm::ActiveValue::NotSet;
        // The pool size changes only through `set_pool`.
        am.pool = sea_orm::ActiveValue::NotSet;
        match environments::Entity::update(am)
            .filter(environments::Column::Status.is_in(from.clone()))
            .exec(db)
            .await
        {
            Ok(_) => return Ok(()),
            Err(sea_orm::DbErr::RecordNotUpdated) => {
                if after_refused_write(
                    "environment",
                    &e.id,
                    env_status(db, &e.id).await?,
                    e.status,
                    EnvStatus::can_become,
                )? {
                    return Ok(());
                }
            }
            Err(err) => return Err(db_err(err)),
        }
    }
    Err(raced("environment", &e.id))
}

/// The stored status of environment `id` (`None`: no such row).
async fn env_status(db: &impl ConnectionTrait, id: &str) -> Result<Option<String>, ApiError> {
    Ok(environments::Entity::find_by_id(id.to_string())
        .one(db)
        .await
        .map_err(db_err)?
        .map(|m| m.status))
}

/// Sets an environment's status alone; `Internal` (nothing written) when the stored
/// status may not become `to` ([`EnvStatus::can_become`]).
pub async fn set_env_status(
    db: &impl ConnectionTrait,
    env_id: &str,
    to: EnvStatus,
) -> Result<(), ApiError> {
    let from = may_become(EnvStatus::ALL, to, EnvStatus::can_become, EnvStatus::as_str);
    for _ in 0..GUARDED_TRIES {
        let res = environments::Entity::update_many()
            .col_expr(environments::Column::Status, Expr::value(to.as_str()))
            .filter(environments::Column::Id.eq(env_id))
            .filter(environments::Column::Status.is_in(from.clone()))
            .exec(db)
            .await
            .map_err(db_err)?;
        if res.rows_affected > 0
            || after_refused_write(
                "environment",
                env_id,
                env_status(db, env_id).await?,
                to,
                EnvStatus::can_become,
            )?
        {
            return Ok(());
        }
    }
    Err(raced("environment", env_id))
}

/// Sets an environment's `expires_at` (RFC 3339, `""` = no TTL).
pub async fn set_expiry(
    db: &impl ConnectionTrait,
    env_id: &str,
    expires_at: &str,
) -> Result<(), ApiError> {
    environments::Entity::update_many()
        .col_expr(environments::Column::ExpiresAt, Expr::value(expires_at))
        .filter(environments::Column::Id.eq(env_id))
        .exec(db)
        .await
        .map_err(db_err)?;
    Ok(())
}

/// Inserts environments.
pub async fn insert_envs(
    db: &impl ConnectionTrait,
    team_id: &str,
    envs: &[Environment],
) -> Result<(), ApiError> {
    for e in envs {
        environments::Entity::insert(env_model(team_id, e).into_active_model())
            .exec_without_returning(db)
            .await
            .map_err(db_err)?;
    }
    Ok(())
}

/// Sets an environment's warm pool size (`-1` = follow the current version's
/// `x-denv.pool`).
pub async fn set_pool(db: &impl ConnectionTrait, env_id: &str, n: i32) -> Result<(), ApiError> {
    environments::Entity::update_many()
        .col_expr(environments::Column::Pool, Expr::value(n))
        .filter(environments::Column::Id.eq(env_id))
        .exec(db)
        .await
        .map_err(db_err)?;
    Ok(())
}

/// The pool members (stage [`super::pool::STAGE`], not destroyed) forked from any version
/// of environment `owner_id`, oldest first.
pub async fn pool_members(
    db: &DatabaseConnection,
    team_id: &str,
    owner_id: &str,
) -> Result<Vec<environments::Model>, ApiError> {
    let ids: Vec<String> = versions::Entity::find()
        .filter(versions::Column::EnvId.eq(owner_id))
        .all(db)
        .await
        .map_err(db_err)?
        .into_iter()
        .map(|v| v.id)
        .collect();
    if ids.is_empty() {
        return Ok(vec![]);
    }
    environments::Entity::find()
        .filter(environments::Column::TeamId.eq(team_id))
        .filter(environments::Column::Stage.eq(super::pool::STAGE))
        .filter(environments::Column::ParentVersionId.is_in(ids))
        .filter(environments::Column::Status.ne(EnvStatus::Destroyed.as_str()))
        .order_by_asc(environments::Column::CreatedAt)
        .order_by_asc(environments::Column::Id)
        .all(db)
        .await
        .map_err(db_err)
}

/// The healthy pool members of `version_id` on `host_id`, oldest first (hand-out order).
pub async fn pool_ready(
    db: &DatabaseConnection,
    team_id: &str,
    version_id: &str,
    host_id: &str,
) -> Result<Vec<environments::Model>, ApiError> {
    environments::Entity::find()
        .filter(environments::Column::TeamId.eq(team_id))
        .filter(environments::Column::Stage.eq(super::pool::STAGE))
        .filter(environments::Column::ParentVersionId.eq(version_id))
        .filter(environments::Column::HostId.eq(host_id))
        .filter(environments::Column::Status.eq(EnvStatus::Healthy.as_str()))
        .order_by_asc(environments::Column::CreatedAt)
        .order_by_asc(environments::Column::Id)
        .all(db)
        .await
        .map_err(db_err)
}

/// How many pool members (any team) a host holds or is filling: what
/// [`super::pool::max_per_host`] bounds. Not counted: members destroying or destroyed,
/// and members with a destroy deployment still pending (a sync that drains a member has
/// freed its room, though the destroy has not started yet).
pub async fn pool_count_on_host(db: &DatabaseConnection, host_id: &str) -> Result<u64, ApiError> {
    // One query: members with an open destroy are left out by a subquery.
    let open_destroys = sea_orm::sea_query::Query::select()
        .column(deployments::Column::EnvId)
        .from(deployments::Entity)
        .and_where(deployments::Column::Kind.eq(Kind::Destroy.as_str()))
        .and_where(deployments::Column::Status.is_in(OPEN))
        .to_owned();
    environments::Entity::find()
        .filter(environments::Column::HostId.eq(host_id))
        .filter(environments::Column::Stage.eq(super::pool::STAGE))
        .filter(environments::Column::Status.is_not_in([
            EnvStatus::Destroyed.as_str(),
            EnvStatus::Destroying.as_str(),
        ]))
        .filter(environments::Column::Id.not_in_subquery(open_destroys))
        .count(db)
        .await
        .map_err(db_err)
}

/// The hand-out, in one transaction: pool member `member_id`, if it is still a healthy
/// member, becomes environment `name` of stage `stage` with `expires_at`, and the
/// already final fork deployment `rows` (with its phases) and `events` (subject, kind,
/// body) are recorded. `Ok(false)` (nothing written) when the member was taken, drained
/// or failed meanwhile.
#[allow(clippy::too_many_arguments)]
pub async fn claim_pool_member(
    db: &DatabaseConnection,
    team_id: &str,
    member_id: &str,
    name: &str,
    stage: &str,
    expires_at: &str,
    rows: &NewRows,
    events: &[(String, &str, Value)],
) -> Result<bool, ApiError> {
    let txn = db.begin().await.map_err(db_err)?;
    let r = environments::Entity::update_many()
        .col_expr(environments::Column::Name, Expr::value(name))
        .col_expr(environments::Column::Stage, Expr::value(stage))
        .col_expr(environments::Column::ExpiresAt, Expr::value(expires_at))
        .filter(environments::Column::Id.eq(member_id))
        .filter(environments::Column::TeamId.eq(team_id))
        .filter(environments::Column::Stage.eq(super::pool::STAGE))
        .filter(environments::Column::Status.eq(EnvStatus::Healthy.as_str()))
        .exec(&txn)
        .await
        .map_err(db_err)?;
    if r.rows_affected != 1 {
        txn.rollback().await.map_err(db_err)?;
        return Ok(false);
    }
    insert_deployment(&txn, team_id, &rows.deployment, &rows.phases).await?;
    for (subject, kind, body) in events {
        event(&txn, team_id, subject, kind, body).await?;
    }
    txn.commit().await.map_err(db_err)?;
    Ok(true)
}

/// Inserts an environment of the team with status `pending`, no host, no current
/// version, no TTL, and returns its row.
pub async fn create_env(
    db: &impl ConnectionTrait,
    team_id: &str,
    project_id: &str,
    name: &str,
    stage: &str,
    parent_version_id: &str,
) -> Result<environments::Model, ApiError> {
    let m = environments::Model {
        id: crate::ids::new_id("env"),
        project_id: project_id.to_string(),
        team_id: team_id.to_string(),
        name: name.to_string(),
        stage: stage.to_string(),
        host_id: String::new(),
        parent_version_id: parent_version_id.to_string(),
        current_version_id: String::new(),
        status: EnvStatus::Pending.as_str().to_string(),
        endpoints: "{}".to_string(),
        created_at: now(),
        expires_at: String::new(),
        pool: -1,
    };
    environments::Entity::insert(m.clone().into_active_model())
        .exec_without_returning(db)
        .await
        .map_err(db_err)?;
    Ok(m)
}

/// The environment row with this id, whatever its team (orchestrator, hub).
pub async fn env_row(
    db: &impl ConnectionTrait,
    id: &str,
) -> Result<Option<environments::Model>, ApiError> {
    environments::Entity::find_by_id(id.to_string())
        .one(db)
        .await
        .map_err(db_err)
}

/// The team's environments across projects, oldest first: only `project_id` when set,
/// only `status` when set, else (unless `all`) every status but `destroyed`.
pub async fn envs_of_team(
    db: &impl ConnectionTrait,
    team_id: &str,
    project_id: Option<&str>,
    status: Option<EnvStatus>,
    all: bool,
) -> Result<Vec<environments::Model>, ApiError> {
    let mut q = environments::Entity::find().filter(environments::Column::TeamId.eq(team_id));
    if let Some(p) = project_id {
        q = q.filter(environments::Column::ProjectId.eq(p));
    }
    match status {
        Some(s) => q = q.filter(environments::Column::Status.eq(s.as_str())),
        None if !all => {
            q = q.filter(environments::Column::Status.ne(EnvStatus::Destroyed.as_str()))
        }
        None => {}
    }
    q.order_by_asc(environments::Column::Id)
        .all(db)
        .await
        .map_err(db_err)
}

/// Environments placed on `host_id` (any team), oldest first.
pub async fn envs_on_host(
    db: &impl ConnectionTrait,
    host_id: &str,
) -> Result<Vec<environments::Model>, ApiError> {
    environments::Entity::find()
        .filter(environments::Column::HostId.eq(host_id))
        .order_by_asc(environments::Column::Id)
        .all(db)
        .await
        .map_err(db_err)
}

/// Environments (any team) whose TTL has passed (`expires_at` set and `<= now`, RFC
/// 3339 in the store's format) that are not `destroying` or `destroyed`, oldest first.
pub async fn expired_envs(
    db: &impl ConnectionTrait,
    now: &str,
) -> Result<Vec<environments::Model>, ApiError> {
    environments::Entity::find()
        .filter(environments::Column::ExpiresAt.ne(""))
        .filter(environments::Column::ExpiresAt.lte(now))
        .filter(environments::Column::Status.is_not_in([
            EnvStatus::Destroying.as_str(),
            EnvStatus::Destroyed.as_str(),
        ]))
        .order_by_asc(environments::Column::Id)
        .all(db)
        .await
        .map_err(db_err)
}

// ---------------------------------------------------------------- versions

/// A version of the team by id.
pub async fn version(
    db: &DatabaseConnection,
    team_id: &str,
    id: &str,
) -> Result<Option<Version>, ApiError> {
    let m = versions::Entity::find_by_id(id.to_string())
        .one(db)
        .await
        .map_err(db_err)?;
    m.filter(|m| m.team_id == team_id)
        .map(|m| version_row(&m))
        .transpose()
}

/// An environment's versions, oldest first.
pub async fn versions_of(db: &DatabaseConnection, env_id: &str) -> Result<Vec<Version>, ApiError> {
    let rows = versions::Entity::find()
        .filter(versions::Column::EnvId.eq(env_id))
        .order_by_asc(versions::Column::Number)
        .all(db)
        .await
        .map_err(db_err)?;
    rows.iter().map(version_row).collect()
}

/// The next version number of an environment (1 for the first).
pub async fn next_version_number(db: &impl ConnectionTrait, env_id: &str) -> Result<i32, ApiError> {
    let last = versions::Entity::find()
        .filter(versions::Column::EnvId.eq(env_id))
        .order_by_desc(versions::Column::Number)
        .one(db)
        .await
        .map_err(db_err)?;
    Ok(last.map(|m| m.number + 1).unwrap_or(1))
}

/// Writes every column of a version.
pub async fn save_version(
    db: &impl ConnectionTrait,
    team_id: &str,
    v: &Version,
) -> Result<(), ApiError> {
    let am = version_model(team_id, v).into_active_model().reset_all();
    versions::Entity::update(am)
        .exec(db)
        .await
        .map_err(db_err)?;
    Ok(())
}

// ---------------------------------------------------------------- deployments

/// Rows created together when a deployment is accepted: new environments and versions,
/// the deployment and its phases (all `pending`).
pub struct NewRows {
    pub envs: Vec<Environment>,
    pub versions: Vec<Version>,
    pub deployment: Deployment,
    pub phases: Vec<Phase>,
}

/// Inserts a deployment row and its phase rows (inside the caller's transaction).
async fn insert_deployment(
    txn: &impl ConnectionTrait,
    team_id: &str,
    deployment: &Deployment,
    phase_rows: &[Phase],
) -> Result<(), ApiError> {
    deployments::Entity::insert(deployment_model(team_id, deployment).into_active_model())
        .exec_without_returning(txn)
        .await
        .map_err(db_err)?;
    if !phase_rows.is_empty() {
        phases::Entity::insert_many(
            phase_rows
                .iter()
                .map(|p| phase_model(p).into_active_model()),
        )
        .exec_without_returning(txn)
        .await
        .map_err(db_err)?;
    }
    Ok(())
}

/// Inserts [`NewRows`] in one transaction.
pub async fn insert_rows(
    db: &DatabaseConnection,
    team_id: &str,
    rows: &NewRows,
) -> Result<(), ApiError> {
    let txn = db.begin().await.map_err(db_err)?;
    insert_envs(&txn, team_id, &rows.envs).await?;
    for v in &rows.versions {
        versions::Entity::insert(version_model(team_id, v).into_active_model())
            .exec_without_returning(&txn)
            .await
            .map_err(db_err)?;
    }
    insert_deployment(&txn, team_id, &rows.deployment, &rows.phases).await?;
    txn.commit().await.map_err(db_err)?;
    Ok(())
}

/// Writes every column of a deployment. `Internal` (naming both states, nothing
/// written) when the stored status may not become the new one
/// ([`DeploymentStatus::can_become`]).
pub async fn save_deployment(
    db: &impl ConnectionTrait,
    team_id: &str,
    d: &Deployment,
) -> Result<(), ApiError> {
    let to = d.status;
    let from = may_become(
        DeploymentStatus::ALL,
        to,
        DeploymentStatus::can_become,
        DeploymentStatus::as_str,
    );
    for _ in 0..GUARDED_TRIES {
        let am = deployment_model(team_id, d).into_active_model().reset_all();
        match deployments::Entity::update(am)
            .filter(deployments::Column::Status.is_in(from.clone()))
            .exec(db)
            .await
        {
            Ok(_) => return Ok(()),
            Err(sea_orm::DbErr::RecordNotUpdated) => {
                let stored = deployments::Entity::find_by_id(d.id.clone())
                    .one(db)
                    .await
                    .map_err(db_err)?
                    .map(|m| m.status);
                if after_refused_write(
                    "deployment",
                    &d.id,
                    stored,
                    to,
                    DeploymentStatus::can_become,
                )? {
                    return Ok(());
                }
            }
            Err(err) => return Err(db_err(err)),
        }
    }
    Err(raced("deployment", &d.id))
}

/// Writes a phase's status, evidence, error and times. `Internal` (naming both states,
/// nothing written) when the stored status may not become the new one
/// ([`PhaseStatus::can_become`]).
pub async fn save_phase(db: &impl ConnectionTrait, p: &Phase) -> Result<(), ApiError> {
    let m = phase_model(p);
    let id = format!("{}/{}", p.deployment_id, p.name);
    let to = p.status;
    let from = may_become(
        PhaseStatus::ALL,
        to,
        PhaseStatus::can_become,
        PhaseStatus::as_str,
    );
    for _ in 0..GUARDED_TRIES {
        let res = phases::Entity::update_many()
            .col_expr(phases::Column::Status, Expr::value(m.status.clone()))
            .col_expr(phases::Column::Evidence, Expr::value(m.evidence.clone()))
            .col_expr(phases::Column::Error, Expr::value(m.error.clone()))
            .col_expr(phases::Column::StartedAt, Expr::value(m.started_at.clone()))
            .col_expr(
                phases::Column::FinishedAt,
                Expr::value(m.finished_at.clone()),
            )
            .filter(phases::Column::DeploymentId.eq(m.deployment_id.clone()))
            .filter(phases::Column::Seq.eq(m.seq))
            .filter(phases::Column::Status.is_in(from.clone()))
            .exec(db)
            .await
            .map_err(db_err)?;
        if res.rows_affected > 0 {
            return Ok(());
        }
        let stored = phases::Entity::find_by_id((p.deployment_id.clone(), p.seq))
            .one(db)
            .await
            .map_err(db_err)?
            .map(|m| m.status);
        if after_refused_write("phase", &id, stored, to, PhaseStatus::can_become)? {
            return Ok(());
        }
    }
    Err(raced("phase", &id))
}

/// Sets every phase of a deployment back to `pending` (no evidence, error or times): a
/// deployment resumed after a control-plane restart runs its phases again from the
/// first (the one move outside [`PhaseStatus::can_become`], made only here).
pub async fn rewind_phases(db: &impl ConnectionTrait, dep_id: &str) -> Result<(), ApiError> {
    phases::Entity::update_many()
        .col_expr(
            phases::Column::Status,
            Expr::value(PhaseStatus::Pending.as_str()),
        )
        .col_expr(
            phases::Column::Evidence,
            Expr::value(serde_json::Value::Null.to_string()),
        )
        .col_expr(phases::Column::Error, Expr::value(""))
        .col_expr(phases::Column::StartedAt, Expr::value(""))
        .col_expr(phases::Column::FinishedAt, Expr::value(""))
        .filter(phases::Column::DeploymentId.eq(dep_id))
        .exec(db)
        .await
        .map_err(db_err)?;
    Ok(())
}

/// The phase rows of a deployment, in order.
async fn phase_models(
    db: &DatabaseConnection,
    dep_id: &str,
) -> Result<Vec<phases::Model>, ApiError> {
    phases::Entity::find()
        .filter(phases::Column::DeploymentId.eq(dep_id))
        .order_by_asc(phases::Column::Seq)
        .all(db)
        .await
        .map_err(db_err)
}

/// A deployment row with its phase rows as the domain rows.
fn state_row(
    m: &deployments::Model,
    phases: &[phases::Model],
) -> Result<DeploymentState, ApiError> {
    Ok(DeploymentState {
        deployment: deployment_row(m)?,
        phases: phases.iter().map(phase_row).collect::<Result<_, _>>()?,
    })
}

/// A deployment row with its phases, read.
async fn state_of(
    db: &DatabaseConnection,
    m: &deployments::Model,
) -> Result<DeploymentState, ApiError> {
    state_row(m, &phase_models(db, &m.id).await?)
}

/// A deployment of the team with its phases (in order).
pub async fn deployment(
    db: &DatabaseConnection,
    team_id: &str,
    id: &str,
) -> Result<Option<DeploymentState>, ApiError> {
    let Some(m) = deployments::Entity::find_by_id(id.to_string())
        .one(db)
        .await
        .map_err(db_err)?
        .filter(|m| m.team_id == team_id)
    else {
        return Ok(None);
    };
    state_of(db, &m).await.map(Some)
}

/// An environment's deployments, newest first.
pub async fn deployments_of(
    db: &DatabaseConnection,
    env_id: &str,
) -> Result<Vec<Deployment>, ApiError> {
    let rows = deployments::Entity::find()
        .filter(deployments::Column::EnvId.eq(env_id))
        .order_by_desc(deployments::Column::CreatedAt)
        .order_by_desc(deployments::Column::Id)
        .all(db)
        .await
        .map_err(db_err)?;
    rows.iter().map(deployment_row).collect()
}

/// The team's deployments of `kind` that name version `version_id`, newest first, each
/// with its phases.
pub async fn deployments_of_version(
    db: &DatabaseConnection,
    team_id: &str,
    version_id: &str,
    kind: Kind,
) -> Result<Vec<DeploymentState>, ApiError> {
    let rows = deployments::Entity::find()
        .filter(deployments::Column::TeamId.eq(team_id))
        .filter(deployments::Column::VersionId.eq(version_id))
        .filter(deployments::Column::Kind.eq(kind.as_str()))
        .order_by_desc(deployments::Column::CreatedAt)
        .order_by_desc(deployments::Column::Id)
        .all(db)
        .await
        .map_err(db_err)?;
    let mut out = Vec::with_capacity(rows.len());
    for m in &rows {
        out.push(state_of(db, m).await?);
    }
    Ok(out)
}

/// The environment's newest destroy deployment that is still `pending` or `running`.
pub async fn open_destroy(
    db: &DatabaseConnection,
    env_id: &str,
) -> Result<Option<Deployment>, ApiError> {
    let m = deployments::Entity::find()
        .filter(deployments::Column::EnvId.eq(env_id))
        .filter(deployments::Column::Kind.eq(Kind::Destroy.as_str()))
        .filter(deployments::Column::Status.is_in(OPEN))
        .order_by_desc(deployments::Column::Id)
        .one(db)
        .await
        .map_err(db_err)?;
    m.as_ref().map(deployment_row).transpose()
}

/// Every deployment still `pending` or `running` (any team), oldest first, with its
/// team id and phases. A deployment whose rows this code cannot read (a kind or phase
/// name it does not know) is left out and logged.
pub async fn unfinished(
    db: &DatabaseConnection,
) -> Result<Vec<(String, DeploymentState)>, ApiError> {
    let rows = deployments::Entity::find()
        .filter(deployments::Column::Status.is_in(OPEN))
        .order_by_asc(deployments::Column::CreatedAt)
        .order_by_asc(deployments::Column::Id)
        .all(db)
        .await
        .map_err(db_err)?;
    let mut out = Vec::with_capacity(rows.len());
    for m in rows {
        let phases = phase_models(db, &m.id).await?;
        match state_row(&m, &phases) {
            Ok(state) => out.push((m.team_id.clone(), state)),
            Err(e) => {
                tracing::error!(deployment = %m.id, error = %e, "unreadable deployment left as it is");
            }
        }
    }
    Ok(out)
}

/// Deployment `id` with its team id and phases, read now, when it is still `pending` or
/// `running`; `None` when it is final (or gone). Replica takeover reads it again after
/// taking the lease: the list it chose from may predate the end the last owner wrote
/// (an owner writes the final status before it releases the lease).
pub async fn unfinished_one(
    db: &DatabaseConnection,
    id: &str,
) -> Result<Option<(String, DeploymentState)>, ApiError> {
    let Some(m) = deployments::Entity::find_by_id(id)
        .filter(deployments::Column::Status.is_in(OPEN))
        .one(db)
        .await
        .map_err(db_err)?
    else {
        return Ok(None);
    };
    let phases = phase_models(db, &m.id).await?;
    Ok(Some((m.team_id.clone(), state_row(&m, &phases)?)))
}

/// Marks every command still open (`sent`/`acked`) for these environments `failed` with
/// `reason`, so the hub does not send it again when the host reconnects. Returns how
/// many rows changed.
pub async fn fail_open_commands(
    db: &DatabaseConnection,
    env_ids: &[String],
    reason: &str,
) -> Result<usize, ApiError> {
    use crate::store::commands;
    let open = commands::Entity::find()
        .filter(commands::Column::EnvId.is_in(env_ids.iter().filter(|e| !e.is_empty()).cloned()))
        .filter(commands::Column::Status.is_in([commands::SENT, commands::ACKED]))
        .all(db)
        .await
        .map_err(db_err)?;
    let mut n = 0;
    for c in open {
        if commands::fail_open(db, &c.id, reason, &now())
            .await
            .map_err(db_err)?
        {
            n += 1;
        }
    }
    Ok(n)
}

// ---------------------------------------------------------------- events, projects

/// Appends an event `{kind, body}` on `subject`.
pub async fn event(
    db: &impl ConnectionTrait,
    team_id: &str,
    subject: &str,
    kind: &str,
    body: &Value,
) -> Result<(), ApiError> {
    let m = events::Model {
        id: crate::ids::new_id("evt"),
        team_id: team_id.to_string(),
        subject: subject.to_string(),
        kind: kind.to_string(),
        body: body.to_string(),
        at: now(),
    };
    events::Entity::insert(m.into_active_model())
        .exec_without_returning(db)
        .await
        .map_err(db_err)?;
    Ok(())
}

/// A project of the team by id or name.
pub async fn project(
    db: &DatabaseConnection,
    team_id: &str,
    id_or_name: &str,
) -> Result<Option<projects::Model>, ApiError> {
    let by_id = projects::Entity::find_by_id(id_or_name.to_string())
        .one(db)
        .await
        .map_err(db_err)?
        .filter(|p| p.team_id == team_id);
    if by_id.is_some() {
        return Ok(by_id);
    }
    projects::Entity::find()
        .filter(projects::Column::TeamId.eq(team_id))
        .filter(projects::Column::Name.eq(id_or_name))
        .one(db)
        .await
        .map_err(db_err)
}

/// The team's project named `name`, created (kind `rl-environment`) when missing.
/// Used for image sandboxes (`sandboxes`).
pub async fn ensure_project(
    db: &DatabaseConnection,
    team_id: &str,
    name: &str,
) -> Result<projects::Model, ApiError> {
    if let Some(p) = project(db, team_id, name).await? {
        return Ok(p);
    }
    let m = projects::Model {
        id: crate::ids::new_id("prj"),
        team_id: team_id.to_string(),
        name: name.to_string(),
        kind: "rl-environment".into(),
        source: String::new(),
        created_at: now(),
    };
    let am = projects::ActiveModel {
        id: Set(m.id.clone()),
        ..m.clone().into_active_model()
    };
    match projects::Entity::insert(am)
        .exec_without_returning(db)
        .await
    {
        Ok(_) => Ok(m),
        // Lost a race with a concurrent creator: read theirs.
        Err(e) => project(db, team_id, name).await?.ok_or_else(|| db_err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use denv_proto::json::{from_struct, to_struct};
    use serde_json::json;

    #[test]
    fn numbers_come_back_from_struct_as_integers() {
        let spec =
            denv_compose::parse("services:\n  a:\n    image: busybox:1.36\n    mem_limit: 512m\n")
                .unwrap();
        // Through Struct (and through any JSON that made whole numbers doubles) the
        // spec reads back exactly once normalised.
        let through = from_struct(&to_struct(&serde_json::to_value(&spec).unwrap()));
        let back: denv_compose::Spec = serde_json::from_value(normalize_numbers(through)).unwrap();
        assert_eq!(back, spec);
        let doubled = json!({"resources": {"memory_mb": 512.0}});
        assert!(
            serde_json::from_value::<denv_compose::Resources>(doubled["resources"].clone())
                .is_err()
        );
        assert_eq!(
            normalize_numbers(doubled)["resources"]["memory_mb"],
            json!(512)
        );
        assert_eq!(
            normalize_numbers(json!({"exit": 3.0, "reward": 0.5, "l": [1.0, 2.5]})).to_string(),
            r#"{"exit":3,"l":[1,2.5],"reward":0.5}"#
        );
    }
}
