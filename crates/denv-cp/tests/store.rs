//! The store's functions and the orchestrator's repository ([`repo`]: environments,
//! versions, deployments, phases), one suite run on SQLite and on Postgres
//! (`sqlite::…`, `postgres::…`; Postgres needs `DENV_TEST_POSTGRES_DSN`).

use denv_cp::domain::{
    Deployment, DeploymentStatus, EnvRow, EnvStatus, Environment, Kind, Phase, PhaseStatus, Version,
};
use denv_cp::orchestrator::repo;
use denv_cp::store::{
    self, api_keys, device_codes, events, installations, memberships, projects, sessions, sources,
    teams, users,
};
use denv_cp::ApiError;
use denv_proto::v1;
use denv_testkit::{Backend, TestDb};
use sea_orm::{DatabaseConnection, TransactionTrait};
use serde_json::json;

macro_rules! store_suite {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    let (_keep, db) = super::open(super::Backend::Sqlite).await;
                    super::$name(&db).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                #[ignore = "needs PostgreSQL: DENV_TEST_POSTGRES_DSN (just unit starts one)"]
                async fn $name() {
                    let (_keep, db) = super::open(super::Backend::Postgres).await;
                    super::$name(&db).await
                }
            )*
        }
    };
}

store_suite!(
    migrations_are_idempotent,
    teams_users_and_memberships,
    api_keys_hash_touch_and_revoke,
    sessions_expire_and_are_hashed,
    device_codes_move_pending_approved_handed_out,
    projects_are_unique_per_team_and_found_by_id_or_name,
    repo_environments_and_versions,
    repo_deployments_and_phases,
    repo_refuses_illegal_transitions,
    a_status_move_is_checked_and_written_in_one_statement,
    events_are_team_scoped_newest_first_and_limited,
    sources_and_installations,
    transactions_roll_back,
    finished_commands_are_pruned_open_ones_kept,
    pool_count_leaves_out_members_being_destroyed,
    snapshot_copies_are_one_per_version_and_host,
);

/// Command rows written in the JSON form of the schema before
/// `m20261202_000002_commands_typed` come out of that migration as their typed
/// messages: an open one can be sent again, a finished one still answers, a left-out
/// archive stays left out, an unreadable open one is failed by name.
mod typed_commands_migration {
    #[tokio::test]
    async fn sqlite() {
        super::old_command_rows_become_typed_messages(super::Backend::Sqlite).await
    }
    #[tokio::test]
    #[ignore = "needs PostgreSQL: DENV_TEST_POSTGRES_DSN (just unit starts one)"]
    async fn postgres() {
        super::old_command_rows_become_typed_messages(super::Backend::Postgres).await
    }
}

async fn old_command_rows_become_typed_messages(backend: Backend) {
    use denv_cp::store::commands;
    use denv_migration::{Migrator, MigratorTrait};
    use prost::Message;
    use sea_orm::{ConnectionTrait, Statement};
    let t = TestDb::fresh(backend).await;
    let db = store::open(&t.dsn).await.unwrap();
    // Every migration before the typed one (later ones may follow it).
    let before = Migrator::migrations()
        .iter()
        .position(|m| m.name() == "m20261202_000002_commands_typed")
        .expect("the typed commands migration") as u32;
    Migrator::up(&db, Some(before)).await.unwrap();
    let old = [
        // id, kind, payload, status, result, error
        (
            "cmd_open",
            "env.create",
            r#"{"version":"ver_1","services":[{"name":"db","image":"postgres:16"}]}"#,
            "acked",
            "",
            "",
        ),
        (
            "cmd_done",
            "env.exec",
            r#"{"service":"box","cmd":["id"]}"#,
            "done",
            r#"{"exit_code":3,"stdout":"hi"}"#,
            "",
        ),
        (
            "cmd_put",
            "env.put",
            r#"{"service":"box","path":"/w","tar":"","not_stored":{"tar":1000}}"#,
            "sent",
            "",
            "",
        ),
        (
            "cmd_get",
            "env.get",
            r#"{"service":"box","path":"/w"}"#,
            "done",
            r#"{"tar":"","not_stored":{"tar":10}}"#,
            "",
        ),
        (
            "cmd_failed",
            "env.snapshot",
            r#"{"name":"ver_1"}"#,
            "failed",
            "",
            "disk full",
        ),
        ("cmd_junk", "env.nope", "{}", "sent", "", ""),
    ];
    for (id, kind, payload, status, result, error) in old {
        let sql = format!(
            "INSERT INTO commands (id, team_id, host_id, env_id, kind, payload, status, result, error, created_at, updated_at) \
             VALUES ('{id}', 'team_1', 'host_1', 'env_1', '{kind}', '{payload}', '{status}', '{result}', '{error}', '2026-12-01T00:00:00.000Z', '2026-12-01T00:00:00.000Z')"
        );
        db.execute(Statement::from_string(db.get_database_backend(), sql))
            .await
            .unwrap();
    }
    Migrator::up(&db, None).await.unwrap();

    let row = |id: &'static str| {
        let db = &db;
        async move { commands::get(db, id).await.unwrap().unwrap() }
    };
    let cmd = |r: &commands::Model| v1::Command::decode(r.message.as_slice()).unwrap();

    let open = row("cmd_open").await;
    assert_eq!((open.status.as_str(), open.left_out), ("acked", 0));
    let c = cmd(&open);
    assert_eq!(
        (c.command_id.as_str(), c.kind.as_str(), c.env_id.as_str()),
        ("cmd_open", "env.create", "env_1")
    );
    let Some(v1::command::Payload::EnvCreate(create)) = c.payload else {
        panic!("{c:?}")
    };
    assert_eq!(
        (create.version.as_str(), create.services[0].image.as_str()),
        ("ver_1", "postgres:16")
    );
    assert_eq!(open.result, None);

    let done = row("cmd_done").await;
    let r = v1::CommandResult::decode(done.result.as_deref().unwrap()).unwrap();
    let Some(v1::command_result::Payload::EnvExec(out)) = r.payload else {
        panic!("{r:?}")
    };
    assert_eq!((r.ok, out.exit_code, out.stdout.as_str()), (true, 3, "hi"));

    let put = row("cmd_put").await;
    assert_eq!((put.status.as_str(), put.left_out), ("sent", 1000));
    let get = row("cmd_get").await;
    assert_eq!((get.status.as_str(), get.result_left_out), ("done", 10));

    let failed = row("cmd_failed").await;
    assert_eq!(
        (
            failed.status.as_str(),
            failed.error.as_str(),
            failed.result.is_none()
        ),
        ("failed", "disk full", true)
    );

    let junk = row("cmd_junk").await;
    assert_eq!(junk.status, "failed");
    assert_eq!(
        junk.error,
        "stored command unreadable after upgrade: unknown kind env.nope"
    );

    // The rebuilt table keeps its indexes' work: the open rows of the host, oldest first.
    let ids: Vec<String> = commands::open_for_host(&db, "host_1")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, ["cmd_open", "cmd_put"]);
    // And it cannot be undone by accident (the later migrations are undone first).
    let steps = Migrator::migrations().len() as u32 - before;
    let err = Migrator::down(&db, Some(steps)).await.unwrap_err();
    assert!(err.to_string().contains("cannot be undone"), "{err}");
}

async fn open(backend: Backend) -> (TestDb, DatabaseConnection) {
    let t = TestDb::fresh(backend).await;
    let db = store::connect(&t.dsn).await.expect("connect and migrate");
    (t, db)
}

async fn migrations_are_idempotent(db: &DatabaseConnection) {
    use denv_migration::{Migrator, MigratorTrait};
    Migrator::up(db, None).await.unwrap();
    assert!(Migrator::get_pending_migrations(db)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(teams::count(db).await.unwrap(), 0);
}

async fn teams_users_and_memberships(db: &DatabaseConnection) {
    let t1 = teams::create(db, "one").await.unwrap();
    let t2 = teams::create(db, "two").await.unwrap();
    assert!(t1.id.starts_with("team_") && t2.id > t1.id);
    assert_eq!(teams::count(db).await.unwrap(), 2);
    let (u, created) = users::upsert_by_email(db, "ann@example.com", "")
        .await
        .unwrap();
    assert!(created);
    assert_eq!(u.login, "ann");
    let (u2, created) = users::upsert_by_email(db, "ann@example.com", "Ann")
        .await
        .unwrap();
    assert!(!created);
    assert_eq!((u2.id.as_str(), u2.name.as_str()), (u.id.as_str(), "Ann"));
    assert_eq!(users::get(db, &u.id).await.unwrap().unwrap().name, "Ann");
    let (g, created) = users::upsert_github(db, 77, "gh", "G", "g@x")
        .await
        .unwrap();
    assert!(created);
    let (g2, created) = users::upsert_github(db, 77, "gh2", "G", "g@x")
        .await
        .unwrap();
    assert!(!created);
    assert_eq!((g2.id, g2.login), (g.id, "gh2".to_string()));

    memberships::add(db, &t2.id, &u.id, "owner").await.unwrap();
    // Join order is `created_at` order, stored with millisecond precision: two joins in
    // the same millisecond would tie (and fall back to team id order).
    tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    memberships::add(db, &t1.id, &u.id, "member").await.unwrap();
    assert_eq!(
        memberships::role(db, &t1.id, &u.id)
            .await
            .unwrap()
            .as_deref(),
        Some("member")
    );
    assert_eq!(memberships::role(db, &t1.id, "usr_x").await.unwrap(), None);
    let mine = memberships::teams_of_user(db, &u.id).await.unwrap();
    let names: Vec<(&str, &str)> = mine
        .iter()
        .map(|(t, r)| (t.name.as_str(), r.as_str()))
        .collect();
    assert_eq!(
        names,
        vec![("two", "owner"), ("one", "member")],
        "join order"
    );
    let dup = memberships::add(db, &t1.id, &u.id, "owner")
        .await
        .unwrap_err();
    assert!(store::is_unique_violation(&dup), "{dup}");
}

async fn api_keys_hash_touch_and_revoke(db: &DatabaseConnection) {
    let t = teams::create(db, "t").await.unwrap();
    let other = teams::create(db, "o").await.unwrap();
    let (k, secret) = api_keys::create(db, &t.id, "ci", "usr_1").await.unwrap();
    assert!(secret.starts_with("dak_"));
    assert_ne!(k.hash, secret);
    assert_eq!(k.hash, denv_cp::ids::hash_secret(&secret));
    let found = api_keys::find_by_secret(db, &secret)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.id, k.id);
    assert!(api_keys::find_by_secret(db, "dak_wrong")
        .await
        .unwrap()
        .is_none());
    assert_eq!(found.last_used_at, "");
    api_keys::touch(db, &k.id).await.unwrap();
    let touched = api_keys::get(db, &t.id, &k.id).await.unwrap().unwrap();
    assert!(store::parse_time(&touched.last_used_at).is_some());
    assert!(api_keys::get(db, &other.id, &k.id).await.unwrap().is_none());
    assert!(
        !api_keys::revoke(db, &other.id, &k.id).await.unwrap(),
        "other team"
    );
    assert!(api_keys::revoke(db, &t.id, &k.id).await.unwrap());
    let revoked = api_keys::find_by_secret(db, &secret)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(revoked.revoked_at, "");
    assert!(api_keys::revoke(db, &t.id, &k.id).await.unwrap());
    let again = api_keys::get(db, &t.id, &k.id).await.unwrap().unwrap();
    assert_eq!(
        again.revoked_at, revoked.revoked_at,
        "first revocation time kept"
    );
    let boot = api_keys::insert_with_secret(db, &t.id, "bootstrap", "", "dak_given_secret_1")
        .await
        .unwrap();
    assert_eq!(
        api_keys::find_by_secret(db, "dak_given_secret_1")
            .await
            .unwrap()
            .unwrap()
            .id,
        boot.id
    );
    assert_eq!(api_keys::list(db, &t.id).await.unwrap().len(), 2);
    assert_eq!(api_keys::list(db, &other.id).await.unwrap().len(), 0);
}

async fn sessions_expire_and_are_hashed(db: &DatabaseConnection) {
    let (s, secret) = sessions::create(db, "usr_1").await.unwrap();
    assert!(secret.starts_with("dst_"));
    let exp = store::parse_time(&s.expires_at).unwrap() - store::parse_time(&s.created_at).unwrap();
    assert_eq!(exp, chrono::Duration::days(30));
    assert_eq!(
        sessions::find_valid(db, &secret)
            .await
            .unwrap()
            .unwrap()
            .user_id,
        "usr_1"
    );
    assert!(sessions::find_valid(db, "dst_nope")
        .await
        .unwrap()
        .is_none());
    // an expired session is not valid
    use sea_orm::{sea_query::Expr, ColumnTrait, EntityTrait, QueryFilter};
    sessions::Entity::update_many()
        .col_expr(
            sessions::Column::ExpiresAt,
            Expr::value("2000-01-01T00:00:00.000Z"),
        )
        .filter(sessions::Column::Id.eq(s.id.clone()))
        .exec(db)
        .await
        .unwrap();
    assert!(sessions::find_valid(db, &secret).await.unwrap().is_none());
}

async fn device_codes_move_pending_approved_handed_out(db: &DatabaseConnection) {
    let (row, code) = device_codes::create(db).await.unwrap();
    assert!(code.starts_with("ddc_"));
    assert_eq!(row.status, device_codes::PENDING);
    assert!(!row.expired());
    let by_code = device_codes::find_by_device_code(db, &code)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(by_code.id, row.id);
    let by_user = device_codes::find_pending_by_user_code(db, &row.user_code.to_lowercase())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(by_user.id, row.id);
    assert!(
        !device_codes::mark_handed_out(db, &row.id).await.unwrap(),
        "not approved yet"
    );
    assert!(
        device_codes::approve(db, &row.id, "team_1", "key_1", "usr_1")
            .await
            .unwrap()
    );
    assert!(
        !device_codes::approve(db, &row.id, "team_1", "key_2", "usr_1")
            .await
            .unwrap()
    );
    assert!(device_codes::find_pending_by_user_code(db, &row.user_code)
        .await
        .unwrap()
        .is_none());
    let approved = device_codes::find_by_device_code(db, &code)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            approved.status.as_str(),
            approved.team_id.as_str(),
            approved.key_id.as_str()
        ),
        (device_codes::APPROVED, "team_1", "key_1")
    );
    assert!(device_codes::mark_handed_out(db, &row.id).await.unwrap());
    assert!(
        !device_codes::mark_handed_out(db, &row.id).await.unwrap(),
        "only once"
    );
}

async fn projects_are_unique_per_team_and_found_by_id_or_name(db: &DatabaseConnection) {
    let a = teams::create(db, "a").await.unwrap();
    let b = teams::create(db, "b").await.unwrap();
    let p = projects::create(db, &a.id, "world", "rl-environment", "")
        .await
        .unwrap();
    let dup = projects::create(db, &a.id, "world", "agent", "")
        .await
        .unwrap_err();
    assert!(store::is_unique_violation(&dup), "{dup}");
    projects::create(db, &b.id, "world", "agent", "github:o/r")
        .await
        .unwrap();
    assert_eq!(
        projects::find(db, &a.id, "world")
            .await
            .unwrap()
            .unwrap()
            .id,
        p.id
    );
    assert_eq!(
        projects::find(db, &a.id, &p.id)
            .await
            .unwrap()
            .unwrap()
            .name,
        "world"
    );
    assert!(
        projects::find(db, &b.id, &p.id).await.unwrap().is_none(),
        "other team by id"
    );
    assert_eq!(projects::list(db, &a.id).await.unwrap().len(), 1);
    assert_eq!(
        projects::list_by_source(db, "github:o/r")
            .await
            .unwrap()
            .len(),
        1
    );
    let proto = v1::Project::from(&p);
    assert_eq!(
        (proto.id, proto.team_id, proto.kind),
        (p.id.clone(), a.id.clone(), "rl-environment".into())
    );
}

// ---------------------------------------------------------------- the repository

/// An environment row of `team` in `status` on `host`, inserted as a fixture (an insert
/// is not a status move).
async fn put_env(
    db: &DatabaseConnection,
    team: &str,
    project: &str,
    name: &str,
    stage: &str,
    host: &str,
    status: EnvStatus,
) -> Environment {
    let e = Environment {
        id: denv_cp::ids::new_id("env"),
        project_id: project.into(),
        name: name.into(),
        stage: stage.into(),
        host_id: host.into(),
        status,
        created_at: repo::now(),
        ..Default::default()
    };
    repo::insert_envs(db, team, std::slice::from_ref(&e))
        .await
        .unwrap();
    e
}

/// A `pending` deployment of `kind` on `env` with every phase of its kind `pending`.
fn new_deployment(
    project: &str,
    env: &str,
    version: &str,
    kind: Kind,
    params: serde_json::Value,
) -> (Deployment, Vec<Phase>) {
    let id = denv_cp::ids::new_id("dep");
    let d = Deployment {
        id: id.clone(),
        project_id: project.into(),
        env_id: env.into(),
        version_id: version.into(),
        params,
        created_at: repo::now(),
        ..Deployment::new(kind)
    };
    let phases = kind
        .phases()
        .iter()
        .enumerate()
        .map(|(i, n)| Phase {
            deployment_id: id.clone(),
            seq: i as i32 + 1,
            name: *n,
            status: PhaseStatus::Pending,
            evidence: serde_json::Value::Null,
            error: String::new(),
            started_at: String::new(),
            finished_at: String::new(),
        })
        .collect();
    (d, phases)
}

async fn repo_environments_and_versions(db: &DatabaseConnection) {
    let t = teams::create(db, "t").await.unwrap();
    let p = projects::create(db, &t.id, "w", "rl-environment", "")
        .await
        .unwrap();
    let e = repo::create_env(db, &t.id, &p.id, "alpha", "alpha", "")
        .await
        .unwrap();
    assert_eq!(e.status(), EnvStatus::Pending);
    assert!(repo::env(db, "team_other", &e.id).await.unwrap().is_none());
    assert_eq!(repo::env_row(db, &e.id).await.unwrap().unwrap(), e);

    // Moves along the table, with host and endpoints.
    let mut m = repo::env(db, &t.id, &e.id).await.unwrap().unwrap();
    m.host_id = "host_1".into();
    m.endpoints.insert("web".into(), "127.0.0.1:8080".into());
    m.status = EnvStatus::Deploying;
    repo::save_env(db, &t.id, &m).await.unwrap();
    repo::set_env_status(db, &e.id, EnvStatus::Healthy)
        .await
        .unwrap();
    let got = repo::env(db, &t.id, &e.id).await.unwrap().unwrap();
    assert_eq!(got.host_id, "host_1");
    assert_eq!(got.status, EnvStatus::Healthy);
    assert_eq!(
        got.endpoints,
        std::collections::BTreeMap::from([("web".to_string(), "127.0.0.1:8080".to_string())])
    );
    assert_eq!(repo::envs_on_host(db, "host_1").await.unwrap().len(), 1);

    // Versions: numbered per environment, inserted with their deployment.
    let spec = denv_compose::parse("services:\n  a:\n    image: busybox:1.36\n").unwrap();
    let mut versions = Vec::new();
    for _ in 0..2 {
        let n = repo::next_version_number(db, &e.id).await.unwrap();
        let v = Version {
            id: denv_cp::ids::new_id("ver"),
            project_id: p.id.clone(),
            env_id: e.id.clone(),
            number: n,
            spec: spec.clone(),
            created_at: repo::now(),
            ..Default::default()
        };
        let (d, phases) = new_deployment(&p.id, &e.id, &v.id, Kind::Snapshot, json!({}));
        let rows = repo::NewRows {
            versions: vec![v.clone()],
            deployment: d,
            phases,
            envs: vec![],
        };
        repo::insert_rows(db, &t.id, &rows).await.unwrap();
        versions.push(v);
    }
    let (v1_, mut v2) = (versions[0].clone(), versions[1].clone());
    assert_eq!((v1_.number, v2.number), (1, 2));
    v2.snapshot = "ver_snap".into();
    v2.healthy = true;
    repo::save_version(db, &t.id, &v2).await.unwrap();
    let listed = repo::versions_of(db, &e.id).await.unwrap();
    assert_eq!(
        listed.iter().map(|v| v.number).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert!(listed[1].healthy && listed[1].snapshot == "ver_snap");
    assert_eq!(listed[0].spec, spec);
    assert!(repo::version(db, "team_other", &v2.id)
        .await
        .unwrap()
        .is_none());

    // By name: the newest; the team's listing leaves destroyed ones out unless asked.
    let mut m = repo::env(db, &t.id, &e.id).await.unwrap().unwrap();
    m.current_version_id = v2.id.clone();
    m.status = EnvStatus::Destroying;
    repo::save_env(db, &t.id, &m).await.unwrap();
    repo::set_env_status(db, &e.id, EnvStatus::Destroyed)
        .await
        .unwrap();
    let e2 = repo::create_env(db, &t.id, &p.id, "alpha", "alpha", "")
        .await
        .unwrap();
    assert_eq!(
        repo::env_by_name(db, &t.id, &p.id, "alpha")
            .await
            .unwrap()
            .unwrap()
            .id,
        e2.id
    );
    let ids = |v: Vec<denv_cp::store::environments::Model>| {
        v.into_iter().map(|e| e.id).collect::<Vec<_>>()
    };
    assert_eq!(
        ids(repo::envs_of_team(db, &t.id, Some(&p.id), None, true)
            .await
            .unwrap()),
        vec![e.id.clone(), e2.id.clone()]
    );
    assert_eq!(
        ids(repo::envs_of_team(db, &t.id, None, None, false)
            .await
            .unwrap()),
        vec![e2.id.clone()]
    );
    assert_eq!(
        ids(repo::envs_of_team(db, &t.id, None, None, true)
            .await
            .unwrap())
        .len(),
        2
    );
    assert_eq!(
        ids(
            repo::envs_of_team(db, &t.id, Some(&p.id), Some(EnvStatus::Destroyed), false)
                .await
                .unwrap()
        ),
        vec![e.id.clone()]
    );
    assert!(repo::envs_of_team(db, "team_other", None, None, true)
        .await
        .unwrap()
        .is_empty());

    // TTLs: only live environments whose expiry passed.
    repo::set_expiry(db, &e2.id, "2026-01-01T00:00:00.000Z")
        .await
        .unwrap();
    repo::set_expiry(db, &e.id, "2026-01-01T00:00:00.000Z")
        .await
        .unwrap();
    assert_eq!(
        ids(repo::expired_envs(db, "2026-06-01T00:00:00.000Z")
            .await
            .unwrap()),
        vec![e2.id.clone()]
    );
    assert!(repo::expired_envs(db, "2025-06-01T00:00:00.000Z")
        .await
        .unwrap()
        .is_empty());
}

async fn repo_deployments_and_phases(db: &DatabaseConnection) {
    let t = teams::create(db, "t").await.unwrap();
    let p = projects::create(db, &t.id, "w", "rl-environment", "")
        .await
        .unwrap();
    let e = put_env(db, &t.id, &p.id, "alpha", "alpha", "", EnvStatus::Pending).await;
    let (d, phases) = new_deployment(
        &p.id,
        &e.id,
        "ver_1",
        Kind::Deploy,
        json!({"warm": ["true"]}),
    );
    let rows = repo::NewRows {
        deployment: d.clone(),
        phases: phases.clone(),
        envs: vec![],
        versions: vec![],
    };
    repo::insert_rows(db, &t.id, &rows).await.unwrap();
    let got = repo::deployment(db, &t.id, &d.id).await.unwrap().unwrap();
    assert_eq!(
        got.phases.iter().map(|p| p.seq).collect::<Vec<_>>(),
        (1..=11).collect::<Vec<_>>()
    );
    assert!(got.phases.iter().all(|p| p.status == PhaseStatus::Pending));
    assert!(repo::deployment(db, "team_other", &d.id)
        .await
        .unwrap()
        .is_none());
    assert_eq!(repo::unfinished(db).await.unwrap().len(), 1);

    let mut d = got.deployment;
    let mut phases = got.phases;
    d.status = DeploymentStatus::Running;
    repo::save_deployment(db, &t.id, &d).await.unwrap();
    assert_eq!(repo::unfinished(db).await.unwrap().len(), 1);
    phases[0].status = PhaseStatus::Running;
    phases[0].started_at = repo::now();
    repo::save_phase(db, &phases[0]).await.unwrap();
    phases[0].status = PhaseStatus::Ok;
    phases[0].evidence = json!({"version": "ver_1", "number": 1.0});
    repo::save_phase(db, &phases[0]).await.unwrap();
    phases[1].status = PhaseStatus::Failed;
    phases[1].error = "no host".into();
    repo::save_phase(db, &phases[1]).await.unwrap();
    for p in &mut phases[2..10] {
        p.status = PhaseStatus::Skipped;
        repo::save_phase(db, p).await.unwrap();
    }
    d.status = DeploymentStatus::Failed;
    d.error = "place: no host".into();
    d.finished_at = repo::now();
    repo::save_deployment(db, &t.id, &d).await.unwrap();
    assert!(repo::unfinished(db).await.unwrap().is_empty());

    let resp = repo::deployment(db, &t.id, &d.id).await.unwrap().unwrap();
    let dep = &resp.deployment;
    assert!(dep.status.is_final());
    assert_eq!(dep.kind, Kind::Deploy);
    assert_eq!(dep.params, json!({"warm": ["true"]}));
    // Whole numbers come back as integers.
    assert_eq!(
        resp.phases[0].evidence,
        json!({"version": "ver_1", "number": 1})
    );
    assert_eq!(resp.phases[1].evidence, serde_json::Value::Null);
    // The wire message (the API edge's conversion).
    let j = denv_proto::json::to_json(&v1::DeploymentResponse::from(&resp));
    assert_eq!(j["deployment"]["Status"], "failed");
    assert_eq!(j["deployment"]["Kind"], "deploy");
    assert_eq!(j["deployment"]["Error"], "place: no host");
    assert_eq!(j["deployment"]["VersionID"], "ver_1");
    assert_eq!(j["deployment"]["Params"], json!({"warm": ["true"]}));
    assert_ne!(j["deployment"]["FinishedAt"], "");
    assert_eq!(j["phases"][0]["Name"], "resolve");
    assert_eq!(j["phases"][0]["Status"], "ok");
    assert_ne!(j["phases"][0]["StartedAt"], "");
    assert_eq!(j["phases"][1]["Status"], "failed");
    assert_eq!(j["phases"][1]["Error"], "no host");
    assert_eq!(j["phases"][2]["Status"], "skipped");
    assert_eq!(j["phases"][10]["Name"], "verdict");
    assert_eq!(j["phases"][10]["Status"], "pending");

    // Listings: newest first; by version and kind; the open destroy.
    let (d2, ph2) = new_deployment(&p.id, &e.id, "ver_1", Kind::Destroy, json!({}));
    let rows = repo::NewRows {
        deployment: d2.clone(),
        phases: ph2,
        envs: vec![],
        versions: vec![],
    };
    repo::insert_rows(db, &t.id, &rows).await.unwrap();
    assert_eq!(
        repo::deployments_of(db, &e.id)
            .await
            .unwrap()
            .iter()
            .map(|d| d.id.clone())
            .collect::<Vec<_>>(),
        vec![d2.id.clone(), d.id.clone()]
    );
    let of_version = repo::deployments_of_version(db, &t.id, "ver_1", Kind::Deploy)
        .await
        .unwrap();
    assert_eq!(of_version.len(), 1);
    assert_eq!(of_version[0].phases.len(), 11);
    assert_eq!(
        repo::open_destroy(db, &e.id).await.unwrap().map(|d| d.id),
        Some(d2.id)
    );
}

/// `save_*` and `set_env_status` refuse a move their status's `can_become` does not
/// allow (`Internal` naming both states) and write nothing; so do unknown strings.
/// Two writers race on one environment: a destroy (`failed → destroying → destroyed`)
/// and a late `→ healthy` that was legal when the environment was `failed`. The check
/// and the write are one statement, so the late write is refused once the destroy has
/// begun, and a destroyed environment is never seen healthy again. (Checked, then
/// written as two statements, the late write lands after the destroy in some rounds.)
async fn a_status_move_is_checked_and_written_in_one_statement(db: &DatabaseConnection) {
    let t = teams::create(db, "t").await.unwrap();
    let p = projects::create(db, &t.id, "w", "rl-environment", "")
        .await
        .unwrap();
    let mut refused = 0;
    for round in 0..40 {
        let e = put_env(
            db,
            &t.id,
            &p.id,
            &format!("e{round}"),
            "alpha",
            "h",
            EnvStatus::Failed,
        )
        .await;
        let destroy = {
            let (db, id) = (db.clone(), e.id.clone());
            tokio::spawn(async move {
                repo::set_env_status(&db, &id, EnvStatus::Destroying).await?;
                repo::set_env_status(&db, &id, EnvStatus::Destroyed).await
            })
        };
        let heal = {
            let (db, id) = (db.clone(), e.id.clone());
            tokio::spawn(async move { repo::set_env_status(&db, &id, EnvStatus::Healthy).await })
        };
        destroy
            .await
            .unwrap()
            .expect("the destroy's moves are legal from any order");
        if let Err(err) = heal.await.unwrap() {
            refused += 1;
            let m = err.to_string();
            assert!(m.contains("illegal status transition destroy"), "{m}");
        }
        let stored = repo::env(db, &t.id, &e.id).await.unwrap().unwrap();
        assert_eq!(stored.status, EnvStatus::Destroyed, "round {round}");
    }
    // Both orders happen on a real store; the assertion above holds in each.
    eprintln!("late moves refused in {refused} of 40 rounds");
}

async fn repo_refuses_illegal_transitions(db: &DatabaseConnection) {
    let t = teams::create(db, "t").await.unwrap();
    let p = projects::create(db, &t.id, "w", "rl-environment", "")
        .await
        .unwrap();
    let internal = |e: ApiError, want: &str| match e {
        ApiError::Internal(m) => assert!(m.contains(want), "{m}"),
        other => panic!("not internal: {other:?}"),
    };

    let e = put_env(db, &t.id, &p.id, "a", "alpha", "host_1", EnvStatus::Pending).await;
    let mut m = e.clone();
    m.status = EnvStatus::Healthy;
    m.host_id = "host_2".into();
    internal(
        repo::save_env(db, &t.id, &m).await.unwrap_err(),
        &format!(
            "environment {}: illegal status transition pending -> healthy",
            e.id
        ),
    );
    let stored = repo::env(db, &t.id, &e.id).await.unwrap().unwrap();
    assert_eq!(
        (stored.status, stored.host_id.as_str()),
        (EnvStatus::Pending, "host_1")
    );
    internal(
        repo::set_env_status(db, &e.id, EnvStatus::Destroyed)
            .await
            .unwrap_err(),
        "pending -> destroyed",
    );
    // A stored status this code does not know reads as failed and is never saved over.
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    store::environments::Entity::update_many()
        .col_expr(
            store::environments::Column::Status,
            sea_orm::sea_query::Expr::value("exploded"),
        )
        .filter(store::environments::Column::Id.eq(e.id.as_str()))
        .exec(db)
        .await
        .unwrap();
    let read = repo::env(db, &t.id, &e.id).await.unwrap().unwrap();
    assert_eq!(read.status, EnvStatus::Failed);
    internal(
        repo::save_env(db, &t.id, &e).await.unwrap_err(),
        "unknown environment status \"exploded\"",
    );
    store::environments::Entity::update_many()
        .col_expr(
            store::environments::Column::Status,
            sea_orm::sea_query::Expr::value("pending"),
        )
        .filter(store::environments::Column::Id.eq(e.id.as_str()))
        .exec(db)
        .await
        .unwrap();
    // Staying is not a move.
    repo::save_env(db, &t.id, &e).await.unwrap();

    let (mut d, mut phases) = new_deployment(&p.id, &e.id, "", Kind::Destroy, json!({}));
    let rows = repo::NewRows {
        deployment: d.clone(),
        phases: phases.clone(),
        envs: vec![],
        versions: vec![],
    };
    repo::insert_rows(db, &t.id, &rows).await.unwrap();
    d.status = DeploymentStatus::Succeeded;
    internal(
        repo::save_deployment(db, &t.id, &d).await.unwrap_err(),
        "illegal status transition pending -> succeeded",
    );
    d.status = DeploymentStatus::Running;
    repo::save_deployment(db, &t.id, &d).await.unwrap();
    d.status = DeploymentStatus::Succeeded;
    repo::save_deployment(db, &t.id, &d).await.unwrap();
    d.status = DeploymentStatus::Running;
    internal(
        repo::save_deployment(db, &t.id, &d).await.unwrap_err(),
        "succeeded -> running",
    );

    phases[0].status = PhaseStatus::Ok;
    internal(
        repo::save_phase(db, &phases[0]).await.unwrap_err(),
        &format!(
            "phase {}/teardown: illegal status transition pending -> ok",
            d.id
        ),
    );
    phases[0].status = PhaseStatus::Skipped;
    repo::save_phase(db, &phases[0]).await.unwrap();
    phases[0].status = PhaseStatus::Running;
    internal(
        repo::save_phase(db, &phases[0]).await.unwrap_err(),
        "skipped -> running",
    );
    let got = repo::deployment(db, &t.id, &d.id).await.unwrap().unwrap();
    assert_eq!(got.deployment.status, DeploymentStatus::Succeeded);
    assert_eq!(got.phases[0].status, PhaseStatus::Skipped);
}

async fn events_are_team_scoped_newest_first_and_limited(db: &DatabaseConnection) {
    for i in 0..5 {
        events::append(db, "team_a", "env:1", "deployment.started", json!({"i": i}))
            .await
            .unwrap();
    }
    events::append(db, "team_a", "dep:9", "deployment.finished", json!({}))
        .await
        .unwrap();
    events::append(db, "team_b", "env:1", "secret", json!({}))
        .await
        .unwrap();
    let got = events::list(db, "team_a", "env:1", 3).await.unwrap();
    let is: Vec<i64> = got
        .iter()
        .map(|e| e.body_json()["i"].as_i64().unwrap())
        .collect();
    assert_eq!(is, vec![4, 3, 2]);
    assert_eq!(events::list(db, "team_a", "", 200).await.unwrap().len(), 6);
    let b = events::list(db, "team_b", "env:1", 200).await.unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].kind, "secret");
    let proto = denv_proto::json::to_json(&v1::Event::from(&got[0]));
    // protobuf Values carry numbers as doubles
    assert_eq!(proto["Body"]["i"].as_f64(), Some(4.0));
    assert_eq!(proto["Subject"], "env:1");
}

async fn sources_and_installations(db: &DatabaseConnection) {
    let s = sources::Model {
        project_id: "prj_1".into(),
        team_id: "team_1".into(),
        repo: "o/r".into(),
        default_branch: "main".into(),
        compose_path: sources::DEFAULT_COMPOSE_PATH.into(),
        installation_id: 0,
        deploy_branches: false,
        last_deployed_sha: String::new(),
    };
    sources::upsert(db, s.clone()).await.unwrap();
    sources::upsert(
        db,
        sources::Model {
            deploy_branches: true,
            ..s.clone()
        },
    )
    .await
    .unwrap();
    sources::set_last_deployed_sha(db, "prj_1", "abc")
        .await
        .unwrap();
    let got = sources::get(db, "prj_1").await.unwrap().unwrap();
    assert!(got.deploy_branches);
    assert_eq!(got.last_deployed_sha, "abc");
    assert_eq!(sources::list_by_repo(db, "o/r").await.unwrap().len(), 1);

    installations::upsert_seen(db, 42, "octo").await.unwrap();
    assert!(installations::list_for_team(db, "team_1")
        .await
        .unwrap()
        .is_empty());
    installations::link(db, 42, "team_1").await.unwrap();
    installations::upsert_seen(db, 42, "octo2").await.unwrap();
    let i = installations::get(db, 42).await.unwrap().unwrap();
    assert_eq!(
        (i.team_id.as_str(), i.account_login.as_str()),
        ("team_1", "octo2")
    );
    assert_eq!(
        installations::list_for_team(db, "team_1")
            .await
            .unwrap()
            .len(),
        1
    );
    installations::delete(db, 42).await.unwrap();
    assert!(installations::get(db, 42).await.unwrap().is_none());
}

async fn transactions_roll_back(db: &DatabaseConnection) {
    let txn = db.begin().await.unwrap();
    let t = teams::create(&txn, "gone").await.unwrap();
    projects::create(&txn, &t.id, "p", "agent", "")
        .await
        .unwrap();
    txn.rollback().await.unwrap();
    assert!(teams::get(db, &t.id).await.unwrap().is_none());
    assert_eq!(teams::count(db).await.unwrap(), 0);
}

async fn finished_commands_are_pruned_open_ones_kept(db: &DatabaseConnection) {
    use denv_cp::store::commands;
    let row = |id: &str, status: &str, at: &str| commands::Model {
        id: id.into(),
        team_id: "team_1".into(),
        host_id: "host_1".into(),
        env_id: "env_1".into(),
        status: status.into(),
        message: Vec::new(),
        left_out: 0,
        result: None,
        result_left_out: 0,
        error: String::new(),
        created_at: at.into(),
        updated_at: at.into(),
    };
    let old = "2026-01-01T00:00:00.000Z";
    let new = "2026-11-30T00:00:00.000Z";
    for r in [
        row("cmd_old_done", commands::DONE, old),
        row("cmd_old_failed", commands::FAILED, old),
        row("cmd_old_sent", commands::SENT, old),
        row("cmd_old_acked", commands::ACKED, old),
        row("cmd_new_done", commands::DONE, new),
    ] {
        commands::insert(db, r).await.unwrap();
    }
    let n = commands::prune_finished(db, "2026-11-24T00:00:00.000Z")
        .await
        .unwrap();
    assert_eq!(n, 2);
    for (id, kept) in [
        ("cmd_old_done", false),
        ("cmd_old_failed", false),
        ("cmd_old_sent", true),
        ("cmd_old_acked", true),
        ("cmd_new_done", true),
    ] {
        assert_eq!(commands::get(db, id).await.unwrap().is_some(), kept, "{id}");
    }
}

/// `repo::pool_count_on_host` (one query, a subquery for open destroys): healthy and
/// deploying members of the host count; members destroying or destroyed, members with a
/// pending or running destroy, other hosts' members and other stages do not.
async fn pool_count_leaves_out_members_being_destroyed(db: &DatabaseConnection) {
    use denv_cp::orchestrator::{pool::STAGE, repo::pool_count_on_host};
    let t = teams::create(db, "t").await.unwrap();
    let p = projects::create(db, &t.id, "w", "rl-environment", "")
        .await
        .unwrap();
    let member = |name: &'static str, stage: &'static str, host: &'static str, status| {
        let (t, p) = (t.id.clone(), p.id.clone());
        async move { put_env(db, &t, &p, name, stage, host, status).await }
    };
    assert_eq!(pool_count_on_host(db, "host_1").await.unwrap(), 0);
    let a = member("a", STAGE, "host_1", EnvStatus::Healthy).await;
    let b = member("b", STAGE, "host_1", EnvStatus::Deploying).await;
    member("c", STAGE, "host_1", EnvStatus::Destroying).await;
    member("d", STAGE, "host_1", EnvStatus::Destroyed).await;
    member("e", STAGE, "host_2", EnvStatus::Healthy).await;
    member("f", "alpha", "host_1", EnvStatus::Healthy).await;
    assert_eq!(pool_count_on_host(db, "host_1").await.unwrap(), 2);
    // A pending destroy of `a` frees its room; a finished one of `b` does not.
    let insert = |env: String, kind: Kind, status: DeploymentStatus| {
        let (t, p) = (t.id.clone(), p.id.clone());
        async move {
            let (mut d, phases) = new_deployment(&p, &env, "", kind, json!({}));
            d.status = status;
            let rows = repo::NewRows {
                deployment: d,
                phases,
                envs: vec![],
                versions: vec![],
            };
            repo::insert_rows(db, &t, &rows).await.unwrap();
        }
    };
    insert(a.id.clone(), Kind::Destroy, DeploymentStatus::Pending).await;
    insert(b.id.clone(), Kind::Destroy, DeploymentStatus::Failed).await;
    insert(b.id.clone(), Kind::Fork, DeploymentStatus::Pending).await;
    assert_eq!(pool_count_on_host(db, "host_1").await.unwrap(), 1);
    assert_eq!(pool_count_on_host(db, "host_2").await.unwrap(), 1);
}

/// `snapshot_copies`: one row per (version, host); a second record of the same pair
/// keeps the first; listed oldest first; forgotten by pair.
async fn snapshot_copies_are_one_per_version_and_host(db: &DatabaseConnection) {
    use denv_cp::store::snapshot_copies::{self, Model};
    let copy = |host: &str, bytes: i64| Model {
        version_id: "ver_1".into(),
        host_id: host.into(),
        from_host_id: "host_a".into(),
        bytes,
        sha256: "ab".repeat(32),
        shipped_ms: 1234,
        created_at: String::new(),
    };
    assert!(snapshot_copies::record(db, copy("host_b", 5 << 30))
        .await
        .unwrap());
    assert!(!snapshot_copies::record(db, copy("host_b", 1))
        .await
        .unwrap());
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert!(snapshot_copies::record(db, copy("host_c", 7))
        .await
        .unwrap());
    let b = snapshot_copies::get(db, "ver_1", "host_b")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (b.bytes, b.from_host_id.as_str(), b.shipped_ms),
        (5 << 30, "host_a", 1234)
    );
    assert!(!b.created_at.is_empty());
    assert!(snapshot_copies::get(db, "ver_2", "host_b")
        .await
        .unwrap()
        .is_none());
    let hosts: Vec<String> = snapshot_copies::of_version(db, "ver_1")
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.host_id)
        .collect();
    assert_eq!(hosts, ["host_b", "host_c"]);
    snapshot_copies::forget(db, "ver_1", "host_b")
        .await
        .unwrap();
    assert!(snapshot_copies::get(db, "ver_1", "host_b")
        .await
        .unwrap()
        .is_none());
}
