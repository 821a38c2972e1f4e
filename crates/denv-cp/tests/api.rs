//! The API surface owned by cp-api, end to end: the real `denv-cp` binary on a fresh
//! SQLite file and on a fresh Postgres database, driven over REST and gRPC. Every test
//! runs on both backends (`sqlite::…`, `postgres::…`).

use denv_proto::v1::{
    auth_service_client::AuthServiceClient, project_service_client::ProjectServiceClient,
    CreateProjectRequest, ListProjectsRequest, MeRequest,
};
use denv_testkit::{
    on_both_backends, sidecar as fake_sidecar, Backend, CpBinary as Cp, Start, TestDb,
};
use serde_json::{json, Value};
use tonic::Code;

const KEY: &str = "dak_cp_api_test_key_0123456789";

on_both_backends!(
    bootstrap_key_is_printed_once_and_only_on_an_empty_database,
    bootstrap_key_from_env_and_team_name,
    credentials_are_checked_and_revoked_keys_refused_at_once,
    teams_are_isolated,
    project_and_environment_lifecycle,
    refused_compose_is_400_with_the_parsers_message_and_no_deployment,
    device_flow,
    cors_only_with_a_console_url,
    grpc_clients_see_the_same_api,
    github_is_off_without_configuration,
    releases_and_body_limits,
    github_sign_in_against_a_fake_github,
    sigterm_shuts_down_gracefully,
    github_app_webhook_installations_and_links,
    rate_limits_answer_429_with_retry_after,
    device_approvals_are_limited_per_user,
    cloud_credentials_are_sealed_at_rest_and_never_returned,
    resources_are_validated_applied_and_recorded,
    a_version_pins_the_image_ids_its_host_ran,
    a_frozen_clock_version_records_its_world_instant_and_forks_start_there,
);

/// Starts denv-cp with the test key on a fresh database (None = backend skipped).
async fn start(backend: Backend, extra: &[(&'static str, &str)]) -> (TestDb, Cp) {
    let db = TestDb::fresh(backend).await;
    let mut s = Start::new(env!("CARGO_BIN_EXE_denv-cp"), &db).key(KEY);
    for (k, v) in extra {
        s = s.env(k, v.to_string());
    }
    let cp = Cp::start(s).await;
    (db, cp)
}

async fn dev_login(cp: &Cp, email: &str) -> String {
    let (st, v) = cp
        .call(
            "POST",
            "/auth/dev-login",
            None,
            Some(json!({ "email": email })),
            &[],
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let tok = v["token"].as_str().unwrap().to_string();
    assert!(tok.starts_with("dst_"), "{tok}");
    tok
}

async fn bootstrap_key_is_printed_once_and_only_on_an_empty_database(backend: Backend) {
    let db = TestDb::fresh(backend).await;
    let first = Cp::start(Start::new(env!("CARGO_BIN_EXE_denv-cp"), &db)).await;
    let keys = first.printed_keys();
    assert_eq!(keys.len(), 1, "one key printed: {}", first.log_text());
    let key = keys[0].clone();
    assert_eq!(key.len(), 4 + 64);
    let (st, me) = first.get_as("/v1/me", &key).await;
    assert_eq!(st, 200, "{me}");
    assert_eq!(me["team"]["Name"], "default");
    assert_eq!(me["team"]["Role"], "key");
    assert_eq!(me["teams"].as_array().unwrap().len(), 1);
    assert!(me.get("user").is_none() || me["user"].is_null());
    drop(first);

    let mut s = Start::new(env!("CARGO_BIN_EXE_denv-cp"), &db);
    s = s.log_name("second.log");
    let second = Cp::start(s).await;
    assert!(
        second.printed_keys().is_empty(),
        "no key on a database with teams: {}",
        second.log_text()
    );
    let (st, _) = second.get_as("/v1/me", &key).await;
    assert_eq!(st, 200, "the first key still works after a restart");
}

async fn bootstrap_key_from_env_and_team_name(backend: Backend) {
    let (_db, cp) = start(backend, &[("DENV_TEAM", "acme")]).await;
    assert!(cp.printed_keys().is_empty(), "a given key is never printed");
    let (st, me) = cp.get_as("/v1/me", KEY).await;
    assert_eq!(st, 200);
    assert_eq!(me["team"]["Name"], "acme");
    assert!(me["team"]["ID"].as_str().unwrap().starts_with("team_"));
}

async fn credentials_are_checked_and_revoked_keys_refused_at_once(backend: Backend) {
    let (_db, cp) = start(backend, &[]).await;
    let (st, v) = cp.call("GET", "/v1/projects", None, None, &[]).await;
    assert_eq!(st, 401);
    assert!(
        v["error"].as_str().unwrap().contains("missing credential"),
        "{v}"
    );
    let (st, v) = cp.get_as("/v1/projects", "dak_nope").await;
    assert_eq!((st, v["error"].as_str().unwrap()), (401, "invalid api key"));
    let (st, _) = cp.get_as("/v1/projects", "dst_nope").await;
    assert_eq!(st, 401);
    let (st, _) = cp.get_as("/v1/projects", "xyz").await;
    assert_eq!(st, 401);

    // a second key: shown once, never listed, usable, then revoked
    let (st, v) = cp.post_as("/v1/keys", KEY, json!({"name": "ci"})).await;
    assert_eq!(st, 201, "{v}");
    let ci = v["api_key"].as_str().unwrap().to_string();
    let ci_id = v["key"]["ID"].as_str().unwrap().to_string();
    assert!(ci.starts_with("dak_") && ci_id.starts_with("key_"));
    assert_eq!(v["key"]["Name"], "ci");
    assert_eq!(v["key"]["RevokedAt"], "");
    let (st, _) = cp.get_as("/v1/projects", &ci).await;
    assert_eq!(st, 200);
    let (st, v) = cp.post_as("/v1/keys", KEY, json!({})).await;
    assert_eq!((st, v["key"]["Name"].as_str().unwrap()), (201, "key"));

    let (_, list) = cp.get_as("/v1/keys", KEY).await;
    let text = list.to_string();
    assert!(!text.contains(&ci), "key material is never returned");
    let keys = list["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 3);
    let ci_row = keys.iter().find(|k| k["ID"] == ci_id.as_str()).unwrap();
    assert_ne!(ci_row["LastUsedAt"], "", "LastUsedAt is kept");
    for field in [
        "ID",
        "TeamID",
        "Name",
        "CreatedBy",
        "CreatedAt",
        "LastUsedAt",
        "RevokedAt",
    ] {
        assert!(ci_row.get(field).is_some(), "field {field}");
    }

    let (st, v) = cp
        .call("DELETE", &format!("/v1/keys/{ci_id}"), Some(KEY), None, &[])
        .await;
    assert_eq!((st, v.clone()), (200, json!({"revoked": true})), "{v}");
    let (st, v) = cp.get_as("/v1/projects", &ci).await;
    assert_eq!((st, v["error"].as_str().unwrap()), (401, "api key revoked"));
    let (st, _) = cp
        .call("DELETE", "/v1/keys/key_nope", Some(KEY), None, &[])
        .await;
    assert_eq!(st, 404);

    // user-only routes refuse keys; dev-login is off by default
    let (st, _) = cp.get_as("/v1/teams", KEY).await;
    assert_eq!(st, 403);
    let (st, _) = cp
        .call(
            "POST",
            "/auth/dev-login",
            None,
            Some(json!({"email": "a@b.c"})),
            &[],
        )
        .await;
    assert_eq!(st, 404);
}

async fn teams_are_isolated(backend: Backend) {
    let (_db, cp) = start(backend, &[("DENV_DEV_LOGIN", "1")]).await;
    let (_, me) = cp.get_as("/v1/me", KEY).await;
    let team1 = me["team"]["ID"].as_str().unwrap().to_string();
    let (st, v) = cp
        .post_as("/v1/projects", KEY, json!({"name": "secret-world"}))
        .await;
    assert_eq!(st, 201, "{v}");
    let prj1 = v["project"]["ID"].as_str().unwrap().to_string();
    let env1 = v["environments"][0]["ID"].as_str().unwrap().to_string();

    let sess = dev_login(&cp, "mallory@example.com").await;
    let (st, me) = cp.get_as("/v1/me", &sess).await;
    assert_eq!(st, 200, "{me}");
    assert_eq!(me["user"]["Email"], "mallory@example.com");
    assert_eq!(
        me["team"]["Name"], "mallory",
        "personal team named after the login"
    );
    assert_eq!(me["team"]["Role"], "owner");
    let (st, v) = cp
        .post_as("/v1/teams", &sess, json!({"name": "team-two"}))
        .await;
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["team"]["Role"], "owner");
    let team2 = v["team"]["ID"].as_str().unwrap().to_string();
    let (_, teams) = cp.get_as("/v1/teams", &sess).await;
    assert_eq!(teams["teams"].as_array().unwrap().len(), 2);

    let in2 = [("x-denv-team", team2.as_str())];
    let (st, v) = cp
        .call(
            "POST",
            "/v1/projects",
            Some(&sess),
            Some(json!({"name": "mine"})),
            &in2,
        )
        .await;
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["project"]["TeamID"], team2.as_str());

    // the other team's objects are 404, by name and by id, never 403
    for path in [
        "/v1/projects/secret-world/envs".to_string(),
        format!("/v1/projects/{prj1}/envs"),
        format!("/v1/projects/{prj1}/source"),
        format!("/v1/envs/{env1}"),
    ] {
        let (st, v) = cp.call("GET", &path, Some(&sess), None, &in2).await;
        assert_eq!(st, 404, "{path}: {v}");
    }
    let (st, _) = cp
        .call(
            "POST",
            "/v1/projects/secret-world/deploy",
            Some(&sess),
            Some(json!({"compose": "services: {a: {image: busybox}}"})),
            &in2,
        )
        .await;
    assert_eq!(st, 404);
    let (_, list) = cp
        .call("GET", "/v1/projects", Some(&sess), None, &in2)
        .await;
    let names: Vec<&str> = list["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["Name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["mine"]);
    // and team 1 does not see team 2's project
    let (st, _) = cp.get_as("/v1/projects/mine/envs", KEY).await;
    assert_eq!(st, 404);

    // a session naming a team it is not a member of is 403
    let (st, v) = cp
        .call(
            "GET",
            "/v1/projects",
            Some(&sess),
            None,
            &[("x-denv-team", team1.as_str())],
        )
        .await;
    assert_eq!(st, 403, "{v}");
    // without the header the first team (the personal one) is used
    let (_, list) = cp.call("GET", "/v1/projects", Some(&sess), None, &[]).await;
    assert_eq!(list["projects"].as_array().unwrap().len(), 0);
}

async fn project_and_environment_lifecycle(backend: Backend) {
    let (_db, cp) = start(backend, &[]).await;
    let (st, v) = cp
        .post_as(
            "/v1/projects",
            KEY,
            json!({"name": "ops-world", "kind": "rl-environment", "source": "github:you/ops-world"}),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let p = &v["project"];
    assert!(p["ID"].as_str().unwrap().starts_with("prj_"));
    assert_eq!(p["Kind"], "rl-environment");
    assert_eq!(p["Source"], "github:you/ops-world");
    let envs = v["environments"].as_array().unwrap();
    assert_eq!(envs.len(), 1);
    let alpha = &envs[0];
    assert!(alpha["ID"].as_str().unwrap().starts_with("env_"));
    assert_eq!(alpha["Name"], "alpha");
    assert_eq!(alpha["Stage"], "alpha");
    assert_eq!(alpha["Status"], "pending");
    assert_eq!(alpha["ProjectID"], p["ID"]);
    assert_eq!(alpha["Endpoints"], json!({}));
    for f in ["HostID", "ParentVersionID", "CurrentVersionID", "CreatedAt"] {
        assert!(alpha.get(f).is_some(), "{f}");
    }

    let (st, v) = cp
        .post_as("/v1/projects", KEY, json!({"name": "ops-world"}))
        .await;
    assert_eq!(
        (st, v["error"].as_str().unwrap()),
        (409, "project ops-world already exists")
    );
    let (st, v) = cp
        .post_as("/v1/projects", KEY, json!({"name": "x", "kind": "game"}))
        .await;
    assert_eq!(st, 400, "{v}");
    let (st, _) = cp.post_as("/v1/projects", KEY, json!({})).await;
    assert_eq!(st, 400);
    let (st, v) = cp
        .post_as("/v1/projects", KEY, json!({"name": "helper"}))
        .await;
    assert_eq!(
        (st, v["project"]["Kind"].as_str().unwrap()),
        (201, "rl-environment")
    );
    for kind in ["agent", "service", "website", "inference"] {
        let (st, v) = cp
            .post_as(
                "/v1/projects",
                KEY,
                json!({"name": format!("p-{kind}"), "kind": kind}),
            )
            .await;
        assert_eq!((st, v["project"]["Kind"].as_str().unwrap()), (201, kind));
    }
    let (_, list) = cp.get_as("/v1/projects", KEY).await;
    assert_eq!(list["projects"].as_array().unwrap().len(), 6);

    // envs by name and by id
    let pid = p["ID"].as_str().unwrap();
    let (st, by_name) = cp.get_as("/v1/projects/ops-world/envs", KEY).await;
    assert_eq!(st, 200);
    let (_, by_id) = cp.get_as(&format!("/v1/projects/{pid}/envs"), KEY).await;
    assert_eq!(by_name, by_id);
    assert_eq!(by_name["environments"][0]["ID"], alpha["ID"]);
    let (st, _) = cp.get_as("/v1/projects/nope/envs", KEY).await;
    assert_eq!(st, 404);

    // templates
    let (st, t) = cp.get_as("/v1/templates", KEY).await;
    assert_eq!(st, 200);
    assert_eq!(t["kinds"], json!(["rl-environment", "agent"]));
    let names: Vec<&str> = t["templates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["rl-environment-ops", "agent-runtime"]);
    let (_, t) = cp.get_as("/v1/templates?kind=agent", KEY).await;
    assert_eq!(t["templates"].as_array().unwrap().len(), 1);
    assert_eq!(t["templates"][0]["kind"], "agent");
    let (_, t) = cp.get_as("/v1/templates?kind=rl-environment", KEY).await;
    let ops = &t["templates"][0];
    assert!(ops["compose"].as_str().unwrap().contains("opsbox"));
    assert!(!ops["warm"].as_array().unwrap().is_empty());

    // source
    let (st, s) = cp.get_as("/v1/projects/ops-world/source", KEY).await;
    assert_eq!(st, 200, "{s}");
    assert_eq!(s["source"]["Repo"], "you/ops-world");
    assert_eq!(s["source"]["ComposePath"], "docker-compose.yaml");
    assert_eq!(s["source"]["DeployBranches"], false);
    let (st, s) = cp
        .post_as(
            "/v1/projects/ops-world/source",
            KEY,
            json!({"default_branch": "main", "compose_path": "", "deploy_branches": true}),
        )
        .await;
    assert_eq!(st, 200, "{s}");
    assert_eq!(s["source"]["DefaultBranch"], "main");
    assert_eq!(s["source"]["ComposePath"], "docker-compose.yaml");
    assert_eq!(s["source"]["DeployBranches"], true);
    let (st, s) = cp
        .post_as(
            "/v1/projects/ops-world/source",
            KEY,
            json!({"compose_path": "env/compose.yaml"}),
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(
        s["source"]["DeployBranches"], true,
        "omitted leaves it unchanged"
    );
    assert_eq!(s["source"]["DefaultBranch"], "main");
    assert_eq!(s["source"]["ComposePath"], "env/compose.yaml");
    let (st, _) = cp
        .post_as(
            "/v1/projects/ops-world/source",
            KEY,
            json!({"installation_id": 42}),
        )
        .await;
    assert_eq!(st, 400, "an installation not linked to the team");
    let (st, _) = cp
        .post_as("/v1/projects/ops-world/deploy-from-source", KEY, json!({}))
        .await;
    assert_eq!(st, 503);

    // events: none yet for this env, team-filtered
    let (st, ev) = cp
        .get_as(
            &format!("/v1/events?subject=env:{}", alpha["ID"].as_str().unwrap()),
            KEY,
        )
        .await;
    assert_eq!((st, ev.clone()), (200, json!({"events": []})), "{ev}");
}

async fn refused_compose_is_400_with_the_parsers_message_and_no_deployment(backend: Backend) {
    let (_db, cp) = start(backend, &[]).await;
    let (_, v) = cp.post_as("/v1/projects", KEY, json!({"name": "w"})).await;
    let alpha = v["environments"][0]["ID"].as_str().unwrap().to_string();
    let refused = "services:\n  box:\n    image: busybox\n    network_mode: host\n";
    let want = denv_compose::parse(refused)
        .expect_err("refused")
        .to_string();
    let (st, v) = cp
        .post_as(
            "/v1/projects/w/deploy",
            KEY,
            json!({"env": "alpha", "compose": refused}),
        )
        .await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"].as_str().unwrap(), want);
    let (st, v) = cp
        .post_as(
            "/v1/projects/w/deploy",
            KEY,
            json!({"compose": "services: ["}),
        )
        .await;
    assert_eq!(st, 400, "{v}");
    let (st, deps) = cp
        .get_as(&format!("/v1/envs/{alpha}/deployments"), KEY)
        .await;
    assert_eq!(st, 200, "{deps}");
    assert_eq!(deps["deployments"], json!([]), "no deployment row");
    let (_, envs) = cp.get_as("/v1/projects/w/envs", KEY).await;
    assert_eq!(
        envs["environments"].as_array().unwrap().len(),
        1,
        "no new environment"
    );
    assert_eq!(envs["environments"][0]["Status"], "pending");
}

async fn device_flow(backend: Backend) {
    let (_db, cp) = start(
        backend,
        &[
            ("DENV_DEV_LOGIN", "1"),
            ("DENV_CONSOLE_URL", "http://console.test/"),
        ],
    )
    .await;
    let (st, d) = cp.call("POST", "/v1/device/code", None, None, &[]).await;
    assert_eq!(st, 200, "{d}");
    let dc = d["device_code"].as_str().unwrap().to_string();
    let uc = d["user_code"].as_str().unwrap().to_string();
    assert!(dc.starts_with("ddc_"));
    assert_eq!(uc.len(), 9);
    assert_eq!(&uc[4..5], "-");
    assert_eq!(d["verification_uri"], "http://console.test/app/device/");
    assert_eq!(
        d["verification_uri_complete"],
        format!("http://console.test/app/device/?code={uc}").as_str()
    );
    assert_eq!(d["expires_in"], 900);
    assert_eq!(d["interval"], 5);

    let token = |code: String| {
        let cp = &cp;
        async move {
            cp.call(
                "POST",
                "/v1/device/token",
                None,
                Some(json!({"device_code": code})),
                &[],
            )
            .await
        }
    };
    assert_eq!(
        token(dc.clone()).await,
        (428, json!({"error": "authorization_pending"}))
    );
    // Polling sooner than the interval: RFC 8628 slow_down, every time.
    for _ in 0..2 {
        assert_eq!(
            token(dc.clone()).await,
            (428, json!({"error": "slow_down"}))
        );
    }
    assert_eq!(
        token("ddc_unknown".into()).await,
        (400, json!({"error": "invalid_device_code"}))
    );

    // approving needs a user session that is a member of team_id
    let (st, _) = cp
        .post_as("/v1/device/approve", KEY, json!({"user_code": uc}))
        .await;
    assert_eq!(st, 403, "an API key cannot approve");
    let sess = dev_login(&cp, "dev@example.com").await;
    let (_, me) = cp.get_as("/v1/me", &sess).await;
    let my_team = me["team"]["ID"].as_str().unwrap().to_string();
    let (_, other) = cp.get_as("/v1/me", KEY).await;
    let other_team = other["team"]["ID"].as_str().unwrap().to_string();
    let (st, _) = cp
        .post_as(
            "/v1/device/approve",
            &sess,
            json!({"user_code": uc, "team_id": other_team}),
        )
        .await;
    assert_eq!(st, 403, "not a member of the bootstrap team");
    let (st, _) = cp
        .post_as(
            "/v1/device/approve",
            &sess,
            json!({"user_code": "ZZZZ-ZZZZ", "team_id": my_team}),
        )
        .await;
    assert_eq!(st, 404);
    let (st, a) = cp
        .post_as(
            "/v1/device/approve",
            &sess,
            json!({"user_code": uc, "team_id": my_team}),
        )
        .await;
    assert_eq!(st, 200, "{a}");
    assert_eq!(a["approved"], true);
    assert_eq!(a["team_id"], my_team.as_str());
    let key_id = a["key_id"].as_str().unwrap().to_string();

    let (st, t) = token(dc.clone()).await;
    assert_eq!(st, 200, "{t}");
    let api_key = t["api_key"].as_str().unwrap().to_string();
    assert!(api_key.starts_with("dak_"));
    assert_eq!(t["team"]["ID"], my_team.as_str());
    assert!(t["team"]["Name"].is_string() && t["team"]["CreatedAt"].is_string());
    let (st, _) = token(dc.clone()).await;
    assert_eq!(st, 410, "the key is handed out exactly once");

    let (st, me) = cp.get_as("/v1/me", &api_key).await;
    assert_eq!(st, 200);
    assert_eq!(me["team"]["ID"], my_team.as_str());
    let (_, keys) = cp.get_as("/v1/keys", &api_key).await;
    let row = keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["ID"] == key_id.as_str())
        .cloned()
        .unwrap();
    assert_eq!(row["Name"], "cli");

    // a custom name
    let (_, d2) = cp.call("POST", "/v1/device/code", None, None, &[]).await;
    let (st, a2) = cp
        .post_as(
            "/v1/device/approve",
            &sess,
            json!({"user_code": d2["user_code"], "team_id": my_team, "name": "laptop"}),
        )
        .await;
    assert_eq!(st, 200, "{a2}");
    let (_, keys) = cp.get_as("/v1/keys", &api_key).await;
    assert!(keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k["ID"] == a2["key_id"] && k["Name"] == "laptop"));
}

async fn cors_only_with_a_console_url(backend: Backend) {
    let (_db, cp) = start(backend, &[("DENV_CONSOLE_URL", "https://console.example")]).await;
    let opts = |path: &'static str, origin: &'static str| {
        let cp = &cp;
        async move {
            cp.http
                .request(reqwest::Method::OPTIONS, format!("{}{}", cp.url, path))
                .header("origin", origin)
                .send()
                .await
                .unwrap()
        }
    };
    for origin in [
        "https://console.example",
        "http://localhost:3100",
        "http://127.0.0.1:5173",
    ] {
        let r = opts("/v1/projects", origin).await;
        assert_eq!(r.status().as_u16(), 204);
        let h = r.headers();
        assert_eq!(h["access-control-allow-origin"], origin);
        assert_eq!(
            h["access-control-allow-headers"],
            "Authorization, Content-Type, X-Denv-Team"
        );
        assert_eq!(
            h["access-control-allow-methods"],
            "GET, POST, PUT, DELETE, OPTIONS"
        );
        assert_eq!(h["access-control-max-age"], "600");
    }
    let r = opts("/auth/dev-login", "http://localhost:1").await;
    assert_eq!(r.status().as_u16(), 204);
    let r = opts("/v1/projects", "https://evil.example").await;
    assert!(r.headers().get("access-control-allow-origin").is_none());
    // a real request carries the header too; /health is outside /v1 and /auth
    let r = cp
        .http
        .get(format!("{}/v1/me", cp.url))
        .bearer_auth(KEY)
        .header("origin", "http://localhost:3100")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://localhost:3100"
    );
    let r = cp
        .http
        .get(format!("{}/health", cp.url))
        .header("origin", "http://localhost:3100")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());

    // without DENV_CONSOLE_URL: no CORS headers at all
    let (_db2, plain) = start(backend, &[]).await;
    let r = plain
        .http
        .get(format!("{}/v1/me", plain.url))
        .bearer_auth(KEY)
        .header("origin", "http://localhost:3100")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.headers().get("access-control-allow-origin").is_none());
}

fn authed<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

async fn grpc_clients_see_the_same_api(backend: Backend) {
    let (_db, cp) = start(backend, &[]).await;
    let ch = tonic::transport::Endpoint::from_shared(cp.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut auth = AuthServiceClient::new(ch.clone());
    let me = auth
        .me(authed(MeRequest {}, KEY))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(me.team.unwrap().role, "key");
    let err = auth
        .me(tonic::Request::new(MeRequest {}))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert_eq!(err.metadata().get("x-denv-http-status").unwrap(), "401");

    let mut projects = ProjectServiceClient::new(ch);
    let created = projects
        .create_project(authed(
            CreateProjectRequest {
                name: "grpc-world".into(),
                kind: "agent".into(),
                source: String::new(),
            },
            KEY,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(created.project.as_ref().unwrap().kind, "agent");
    assert_eq!(created.environments[0].name, "alpha");
    let dup = projects
        .create_project(authed(
            CreateProjectRequest {
                name: "grpc-world".into(),
                ..Default::default()
            },
            KEY,
        ))
        .await
        .unwrap_err();
    assert_eq!(dup.code(), Code::AlreadyExists);
    assert_eq!(dup.message(), "project grpc-world already exists");

    // REST sees what gRPC created, with the same JSON as the message
    let (_, rest) = cp.get_as("/v1/projects", KEY).await;
    let listed = projects
        .list_projects(authed(ListProjectsRequest {}, KEY))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rest, denv_proto::json::to_json(&listed));
}

async fn github_is_off_without_configuration(backend: Backend) {
    let (_db, cp) = start(backend, &[]).await;
    let (st, v) = cp.get_as("/v1/github/installations", KEY).await;
    assert_eq!(
        (st, v.clone()),
        (200, json!({"installations": [], "configured": false})),
        "{v}"
    );
    let (st, _) = cp
        .post_as("/v1/github/installations/7/link", KEY, json!({}))
        .await;
    assert_eq!(st, 503);
    let (st, _) = cp.get_as("/v1/github/repos?installation=7", KEY).await;
    assert_eq!(st, 503);
    let (st, _) = cp
        .call(
            "POST",
            "/webhooks/github",
            None,
            Some(json!({"zen": "hi"})),
            &[("x-github-event", "ping")],
        )
        .await;
    assert_eq!(st, 503);
    let r = cp
        .http
        .get(format!(
            "{}/auth/github/start?return=http://localhost:3100/app/",
            cp.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    let r = cp
        .http
        .get(format!("{}/auth/github/callback?code=x&state=y", cp.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
}

async fn releases_and_body_limits(backend: Backend) {
    let db = TestDb::fresh(backend).await;
    let rel = db.dir.path().join("releases");
    std::fs::create_dir_all(&rel).unwrap();
    std::fs::write(rel.join("denvd-linux-amd64"), b"amd64-binary").unwrap();
    let mut s = Start::new(env!("CARGO_BIN_EXE_denv-cp"), &db)
        .env("DENV_BOOTSTRAP_KEY", KEY)
        .env("DENV_RELEASES_DIR", rel.display().to_string());
    s = s.double_dash(); // --addr/--db/--public-url work too
    let cp = Cp::start(s).await;
    let get = |path: &'static str| {
        let cp = &cp;
        async move {
            let r = cp
                .http
                .get(format!("{}{}", cp.url, path))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
        }
    };
    assert_eq!(get("/denvd").await, (200, b"amd64-binary".to_vec()));
    assert_eq!(
        get("/denvd-linux-amd64").await,
        (200, b"amd64-binary".to_vec())
    );
    assert_eq!(get("/denvd-linux-arm64").await.0, 404);
    assert_eq!(get("/denvd?arch=arm64").await.0, 404);
    std::fs::write(rel.join("denvd-linux-arm64"), b"arm64-binary").unwrap();
    assert_eq!(
        get("/denvd?arch=arm64").await,
        (200, b"arm64-binary".to_vec())
    );

    // 32 MiB body limit on the tar upload
    let big = vec![0u8; denv_proto::contract::REST_BODY_MAX_BYTES + 1];
    let r = cp
        .http
        .put(format!(
            "{}/v1/envs/env_x/files?service=a&path=/tmp",
            cp.url
        ))
        .bearer_auth(KEY)
        .header("content-type", "application/x-tar")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().contains("32 MiB"), "{v}");

    // unknown paths and bad JSON
    let (st, v) = cp.get_as("/v1/nope", KEY).await;
    assert_eq!((st, v), (404, json!({"error": "not found"})));
    let r = cp
        .http
        .post(format!("{}/v1/projects", cp.url))
        .bearer_auth(KEY)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
}

/// A stand-in for github.com and api.github.com (`DENV_GITHUB_API_URL`): the OAuth code
/// exchange and the user endpoints.
async fn fake_github() -> String {
    use axum::routing::{get, post};
    let app = axum::Router::new()
        .route(
            "/login/oauth/access_token",
            post(|body: String| async move {
                if body.contains("code=good") && body.contains("client_secret=shh") {
                    axum::Json(json!({"access_token": "gho_test", "token_type": "bearer"}))
                } else {
                    axum::Json(json!({"error": "bad_verification_code"}))
                }
            }),
        )
        .route(
            "/user",
            get(|| async {
                axum::Json(json!({"id": 4242, "login": "octocat", "name": "Mona", "email": null}))
            }),
        )
        .route(
            "/user/emails",
            get(|| async {
                axum::Json(json!([
                    {"email": "other@x", "primary": false},
                    {"email": "mona@github.test", "primary": true}
                ]))
            }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    url
}

async fn github_sign_in_against_a_fake_github(backend: Backend) {
    let gh = fake_github().await;
    let (_db, cp) = start(
        backend,
        &[
            ("DENV_GITHUB_CLIENT_ID", "cid"),
            ("DENV_GITHUB_CLIENT_SECRET", "shh"),
            ("DENV_GITHUB_API_URL", gh.as_str()),
            ("DENV_CONSOLE_URL", "https://console.example"),
        ],
    )
    .await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = http
        .get(format!(
            "{}/auth/github/start?return=https://evil.example/",
            cp.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        400,
        "return must be the console or loopback"
    );
    // Forms a browser would take to another host (userinfo, scheme-relative, backslash).
    for bad in [
        "//evil.example/",
        "/%5Cevil.example/",
        "http://localhost:3100@evil.example/",
        "https://console.example@evil.example/",
        "http://127.0.0.1.evil.example/",
    ] {
        let r = http
            .get(format!("{}/auth/github/start?return={bad}", cp.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400, "{bad}");
        let v: Value = r.json().await.unwrap();
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .starts_with("return must be the console origin or a loopback url"),
            "{v}"
        );
    }
    let r = http
        .get(format!(
            "{}/auth/github/start?return=http://localhost:3100/app/",
            cp.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 302);
    let loc = r.headers()["location"].to_str().unwrap().to_string();
    assert!(
        loc.starts_with(&format!("{gh}/login/oauth/authorize?client_id=cid&")),
        "{loc}"
    );
    assert!(loc.contains("scope=read%3Auser%20user%3Aemail"), "{loc}");
    assert!(
        loc.contains(&format!(
            "redirect_uri={}",
            format!("{}/auth/github/callback", cp.url)
                .replace(':', "%3A")
                .replace('/', "%2F")
        )),
        "{loc}"
    );
    let state = loc.split("state=").nth(1).unwrap().to_string();

    let r = http
        .get(format!(
            "{}/auth/github/callback?code=good&state=dos_unknown",
            cp.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let r = http
        .get(format!(
            "{}/auth/github/callback?code=good&state={state}",
            cp.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 302);
    let loc = r.headers()["location"].to_str().unwrap().to_string();
    let token = loc
        .strip_prefix("http://localhost:3100/app/#token=")
        .unwrap_or_else(|| panic!("{loc}"))
        .to_string();
    assert!(token.starts_with("dst_"));
    let (st, me) = cp.get_as("/v1/me", &token).await;
    assert_eq!(st, 200, "{me}");
    // int64 fields: pbjson prints them as JSON strings today (reported to the lead)
    let gh_id = &me["user"]["GithubID"];
    assert!(gh_id == &json!(4242) || gh_id == &json!("4242"), "{gh_id}");
    assert_eq!(me["user"]["Login"], "octocat");
    assert_eq!(me["user"]["Email"], "mona@github.test");
    assert_eq!(me["team"]["Name"], "octocat");
    // the state is single use
    let r = http
        .get(format!(
            "{}/auth/github/callback?code=good&state={state}",
            cp.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    // a default return goes to the console
    let r = http
        .get(format!("{}/auth/github/start", cp.url))
        .send()
        .await
        .unwrap();
    let loc = r.headers()["location"].to_str().unwrap().to_string();
    let state = loc.split("state=").nth(1).unwrap();
    let r = http
        .get(format!(
            "{}/auth/github/callback?code=good&state={state}",
            cp.url
        ))
        .send()
        .await
        .unwrap();
    let loc = r.headers()["location"].to_str().unwrap();
    assert!(
        loc.starts_with("https://console.example/app/#token=dst_"),
        "{loc}"
    );
}

async fn sigterm_shuts_down_gracefully(backend: Backend) {
    let (_db, mut cp) = start(backend, &[]).await;
    let pid = cp.child.id().to_string();
    let st = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(st.success());
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = cp.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(12),
            "still running after 12s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}");
    assert!(cp.log_text().contains("stopped"), "{}", cp.log_text());
}

async fn github_app_webhook_installations_and_links(backend: Backend) {
    let (_db, cp) = start(
        backend,
        &[
            ("DENV_GITHUB_APP_ID", "1"),
            (
                "DENV_GITHUB_APP_PRIVATE_KEY",
                "-----BEGIN RSA PRIVATE KEY-----",
            ),
            ("DENV_GITHUB_WEBHOOK_SECRET", "hook-secret"),
            ("DENV_DEV_LOGIN", "1"),
        ],
    )
    .await;
    let next = std::sync::atomic::AtomicU32::new(0);
    let send = |event: &'static str, body: Value, secret: &'static str, delivery: String| {
        let cp = &cp;
        async move {
            use hmac::Mac;
            let raw = serde_json::to_vec(&body).unwrap();
            let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
            mac.update(&raw);
            let sig = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
            let mut r = cp
                .http
                .post(format!("{}/webhooks/github", cp.url))
                .header("x-github-event", event)
                .header("x-hub-signature-256", sig)
                .header("content-type", "application/json");
            if !delivery.is_empty() {
                r = r.header("x-github-delivery", delivery);
            }
            let r = r.body(raw).send().await.unwrap();
            let st = r.status().as_u16();
            (st, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // A fresh delivery id per call.
    let hook = |event: &'static str, body: Value, secret: &'static str| {
        let n = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        send(event, body, secret, format!("d-{n}"))
    };
    let created =
        json!({"action": "created", "installation": {"id": 77, "account": {"login": "you"}}});
    let (st, _) = hook("installation", created.clone(), "wrong").await;
    assert_eq!(st, 401, "signature mismatch");
    let (st, v) = send(
        "installation",
        created.clone(),
        "hook-secret",
        String::new(),
    )
    .await;
    assert_eq!(st, 400, "no delivery id: {v}");
    assert_eq!(
        v["error"],
        "X-GitHub-Delivery is required (at most 200 characters)"
    );
    // A body refused as not JSON is not recorded: its delivery id stays usable.
    {
        use hmac::Mac;
        let raw = b"{not json".to_vec();
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(b"hook-secret").unwrap();
        mac.update(&raw);
        let sig = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
        let r = cp
            .http
            .post(format!("{}/webhooks/github", cp.url))
            .header("x-github-event", "installation")
            .header("x-hub-signature-256", sig)
            .header("x-github-delivery", "first")
            .body(raw)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400);
    }
    let (st, v) = send(
        "installation",
        created.clone(),
        "hook-secret",
        "first".into(),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["ok"].clone(), v["duplicate"].clone()),
        (json!(true), json!(false))
    );
    let (st, v) = hook("ping", json!({"zen": "x"}), "hook-secret").await;
    assert_eq!((st, v["ok"].clone()), (200, json!(true)));

    let (st, v) = cp.get_as("/v1/github/installations", KEY).await;
    assert_eq!((st, v["configured"].clone()), (200, json!(true)));
    assert_eq!(v["installations"], json!([]), "seen but not linked yet");
    let (st, _) = cp
        .post_as("/v1/github/installations/78/link", KEY, json!({}))
        .await;
    assert_eq!(st, 404, "never reported by the app");
    let (st, v) = cp
        .post_as("/v1/github/installations/77/link", KEY, json!({}))
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["installation"]["AccountLogin"], "you");
    let (_, v) = cp.get_as("/v1/github/installations", KEY).await;
    assert_eq!(v["installations"].as_array().unwrap().len(), 1);

    // another team cannot take it
    let sess = dev_login(&cp, "eve@example.com").await;
    let (st, _) = cp
        .post_as("/v1/github/installations/77/link", &sess, json!({}))
        .await;
    assert_eq!(st, 409);

    // the linked installation can be set on a project source; push events answer per project
    let (_, _) = cp
        .post_as(
            "/v1/projects",
            KEY,
            json!({"name": "hooked", "source": "github:you/hooked"}),
        )
        .await;
    let (st, s) = cp
        .post_as(
            "/v1/projects/hooked/source",
            KEY,
            json!({"installation_id": 77}),
        )
        .await;
    assert_eq!(st, 200, "{s}");
    let iid = &s["source"]["InstallationID"];
    assert!(iid == &json!(77) || iid == &json!("77"), "{iid}");
    let (st, v) = hook(
        "push",
        json!({"ref": "refs/heads/main", "after": "abc123", "repository": {"full_name": "you/hooked"}}),
        "hook-secret",
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["sha"].as_str(), v["branch"].as_str()),
        (Some("abc123"), Some("main"))
    );
    assert_eq!(v["projects"][0]["project"], "hooked");

    let (st, _) = hook(
        "installation",
        json!({"action": "deleted", "installation": {"id": 77, "account": {"login": "you"}}}),
        "hook-secret",
    )
    .await;
    assert_eq!(st, 200);
    let (_, v) = cp.get_as("/v1/github/installations", KEY).await;
    assert_eq!(v["installations"], json!([]));

    // Replays are answered and not processed: the same delivery id with another body,
    // and the same signed body under a new delivery id (GitHub signs only the body).
    let (st, v) = send(
        "installation",
        created.clone(),
        "hook-secret",
        "first".into(),
    )
    .await;
    assert_eq!((st, v["duplicate"].clone()), (200, json!(true)), "{v}");
    let (st, v) = send(
        "installation",
        created.clone(),
        "hook-secret",
        "replayed-later".into(),
    )
    .await;
    assert_eq!((st, v["duplicate"].clone()), (200, json!(true)), "{v}");
    let other = json!({"action": "created", "installation": {"id": 99, "account": {"login": "x"}}});
    let (st, v) = send("installation", other, "hook-secret", "first".into()).await;
    assert_eq!((st, v["duplicate"].clone()), (200, json!(true)), "{v}");
    let (st, _) = cp
        .post_as("/v1/github/installations/77/link", KEY, json!({}))
        .await;
    assert_eq!(
        st, 404,
        "the replayed `created` did not bring the installation back"
    );
    let (st, _) = cp
        .post_as("/v1/github/installations/99/link", KEY, json!({}))
        .await;
    assert_eq!(
        st, 404,
        "a new body under a used delivery id is not processed"
    );
    // Two copies of one new delivery at once: exactly one is processed.
    let fresh = json!({"action": "created", "installation": {"id": 55, "account": {"login": "y"}}});
    let (a, b) = tokio::join!(
        send("installation", fresh.clone(), "hook-secret", "race".into()),
        send("installation", fresh, "hook-secret", "race".into())
    );
    assert_eq!((a.0, b.0), (200, 200));
    let dups = [&a.1, &b.1]
        .iter()
        .filter(|v| v["duplicate"] == json!(true))
        .count();
    assert_eq!(dups, 1, "{a:?} {b:?}");
}

async fn rate_limits_answer_429_with_retry_after(backend: Backend) {
    let (_db, cp) = start(
        backend,
        &[("DENV_RATE_LIMIT_KEY", "5"), ("DENV_RATE_LIMIT_ANON", "3")],
    )
    .await;
    let (st, k) = cp.post_as("/v1/keys", KEY, json!({"name": "second"})).await;
    assert_eq!(st, 201, "{k}");
    let second = k["api_key"].as_str().unwrap().to_string();
    // One key floods: bursts of 10, then 429 with a whole-second Retry-After.
    let mut limited = None;
    for _ in 0..40 {
        let r = cp
            .http
            .get(format!("{}/v1/me", cp.url))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap();
        if r.status().as_u16() == 429 {
            limited = Some(r);
            break;
        }
        assert_eq!(r.status().as_u16(), 200);
    }
    let r = limited.expect("40 requests at once were never limited");
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["error"],
        "rate limited: too many requests for this credential; retry in 1 s"
    );
    // Another key of the same team, from the same address, is not affected.
    let (st, _) = cp.get_as("/v1/me", &second).await;
    assert_eq!(st, 200);
    // Made-up credentials are limited too (before they are looked up).
    let mut statuses = Vec::new();
    for _ in 0..15 {
        statuses.push(cp.get_as("/v1/me", "dak_made_up").await.0);
    }
    assert_eq!(statuses[..10], [401; 10]);
    assert!(statuses.contains(&429), "{statuses:?}");
    // gRPC: RESOURCE_EXHAUSTED with retry-after metadata.
    let ch = tonic::transport::Endpoint::from_shared(cp.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut auth = AuthServiceClient::new(ch);
    let mut err = None;
    for _ in 0..40 {
        if let Err(e) = auth.me(authed(MeRequest {}, &second)).await {
            err = Some(e);
            break;
        }
    }
    let err = err.expect("gRPC calls were never limited");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert_eq!(err.metadata().get("retry-after").unwrap(), "1");
    assert_eq!(err.metadata().get("x-denv-http-status").unwrap(), "429");
    // Unauthenticated writes: 3 device codes a minute per address, then 429.
    for _ in 0..3 {
        let (st, d) = cp.call("POST", "/v1/device/code", None, None, &[]).await;
        assert_eq!(st, 200, "{d}");
    }
    let r = cp
        .http
        .post(format!("{}/v1/device/code", cp.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((19..=20).contains(&wait), "one code every 20 s: {wait}");
    let (st, _) = cp.call("GET", "/health", None, None, &[]).await;
    assert_eq!(st, 200, "reads without a credential are not writes");
}

async fn device_approvals_are_limited_per_user(backend: Backend) {
    let (_db, cp) = start(backend, &[("DENV_DEV_LOGIN", "1")]).await;
    let sess = dev_login(&cp, "guesser@example.com").await;
    let (_, me) = cp.get_as("/v1/me", &sess).await;
    let team = me["team"]["ID"].as_str().unwrap().to_string();
    let (_, d) = cp.call("POST", "/v1/device/code", None, None, &[]).await;
    let mut statuses = Vec::new();
    for i in 0..11 {
        let (st, _) = cp
            .post_as(
                "/v1/device/approve",
                &sess,
                json!({"user_code": format!("AAAA-{i:04}"), "team_id": team}),
            )
            .await;
        statuses.push(st);
    }
    assert_eq!(statuses[..10], [404; 10], "{statuses:?}");
    assert_eq!(statuses[10], 429, "{statuses:?}");
    // Even the right code waits now: guessing cannot continue by luck.
    let r = cp
        .http
        .post(format!("{}/v1/device/approve", cp.url))
        .bearer_auth(&sess)
        .json(&json!({"user_code": d["user_code"], "team_id": team}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    // Another user is not affected.
    let other = dev_login(&cp, "owner@example.com").await;
    let (_, me) = cp.get_as("/v1/me", &other).await;
    let (st, a) = cp
        .post_as(
            "/v1/device/approve",
            &other,
            json!({"user_code": d["user_code"], "team_id": me["team"]["ID"]}),
        )
        .await;
    assert_eq!(st, 200, "{a}");
}

async fn cloud_credentials_are_sealed_at_rest_and_never_returned(backend: Backend) {
    let create = json!({"provider": "hetzner", "name": "hz", "config": {"token": "hc-plain-token", "location": "fsn1"}});
    // Without a key, a credential is refused rather than stored in clear.
    let (_db, cp) = start(backend, &[]).await;
    let (st, v) = cp.post_as("/v1/clouds", KEY, create.clone()).await;
    assert_eq!(st, 503, "{v}");
    assert_eq!(
        v["error"],
        "config.token is a credential and this control plane has no DENV_SECRET_KEY to \
         encrypt it with (32 bytes: `openssl rand -hex 32`)"
    );
    let (st, _) = cp
        .post_as(
            "/v1/clouds",
            KEY,
            json!({"provider": "manual", "name": "lab"}),
        )
        .await;
    assert_eq!(st, 201, "a cloud without credentials needs no key");
    drop(cp);

    let key = "ab".repeat(32);
    let (db, cp) = start(backend, &[("DENV_SECRET_KEY", key.as_str())]).await;
    let (st, v) = cp.post_as("/v1/clouds", KEY, create).await;
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["cloud"]["Config"]["token"], "•••");
    assert_eq!(v["cloud"]["Config"]["location"], "fsn1");
    let id = v["cloud"]["ID"].as_str().unwrap().to_string();
    let (_, v) = cp.get_as("/v1/clouds", KEY).await;
    assert!(!v.to_string().contains("hc-plain-token"), "{v}");
    // The stored row holds a sealed value that opens with the key for this row only.
    let store = denv_cp::store::connect(&db.dsn).await.unwrap();
    let row = denv_cp::store::clouds::get_in_team(
        &store,
        v["clouds"][0]["TeamID"].as_str().unwrap(),
        &id,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(!row.config.contains("hc-plain-token"), "{}", row.config);
    let stored: Value = serde_json::from_str(&row.config).unwrap();
    let k = denv_cp::config::parse_secret_key(&key).unwrap();
    let opened = denv_cp::sealed::open_secrets(&stored, &id, &k).unwrap();
    assert_eq!(opened["token"], "hc-plain-token");
    assert!(denv_cp::sealed::open_secrets(&stored, "cloud_other", &k).is_err());
    assert!(denv_cp::sealed::open_secrets(&stored, &id, &[0u8; 32]).is_err());
}

/// Polls `GET /v1/deployments/{id}` until a final status.
/// A fake sidecar joined to `cp` with a fresh join token (2 CPUs, 24000 MiB, 100 GB free).
async fn join_fake_host(cp: &Cp) -> fake_sidecar::FakeSidecar {
    let (s, tok) = cp.post_as("/v1/join-tokens", KEY, json!({})).await;
    assert_eq!(s, 201, "{tok}");
    fake_sidecar::FakeSidecar::join(
        &cp.url,
        tok["token"].as_str().unwrap(),
        fake_sidecar::FakeOptions::default(),
    )
    .await
    .unwrap()
}

async fn wait_deployment(cp: &Cp, dep: &str) -> Value {
    for _ in 0..600 {
        let (s, d) = cp.get_as(&format!("/v1/deployments/{dep}"), KEY).await;
        assert_eq!(s, 200, "{d}");
        let st = d["deployment"]["Status"].as_str().unwrap_or_default();
        if ["succeeded", "failed", "rolled_back"].contains(&st) {
            return d;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("deployment {dep} did not finish");
}

fn phase_evidence<'a>(d: &'a Value, name: &str) -> &'a Value {
    &denv_testkit::phase(d, name)["Evidence"]
}

fn service_caps(s: &denv_proto::v1::ServiceSpec) -> (u64, i64, f64) {
    let r = s.resources.unwrap_or_default();
    (r.memory_mb, r.pids, r.cpus)
}

/// `resources` of `POST /v1/sandboxes` and `POST /v1/envs/{env}/fork`: bad values are
/// 400 naming the key (before anything is created), values above the host's capacity
/// are 400 naming the host's limit (never clamped), accepted caps reach the sidecar for
/// the agent's service only and are recorded in the deployment's evidence.
async fn resources_are_validated_applied_and_recorded(backend: Backend) {
    use denv_proto::v1::command::Payload;
    let (_db, cp) = start(backend, &[]).await;
    let img = |res: Value| json!({"image": "busybox:1.36", "cmd": ["sleep", "infinity"], "resources": res});
    for (res, want) in [
        (json!({"cpus": 0}), "resources.cpus 0 must be more than 0"),
        (
            json!({"cpus": -0.5}),
            "resources.cpus -0.5 must be more than 0",
        ),
        (
            json!({"cpus": "1e400"}),
            "resources.cpus \"1e400\" must be a number",
        ),
        (
            json!({"cpus": 100000}),
            "resources.cpus 100000 is above the maximum of 256 CPUs",
        ),
        (
            json!({"memory": "64 bananas"}),
            "resources.memory \"64 bananas\" must be a size",
        ),
        (
            json!({"memory": "-64m"}),
            "resources.memory \"-64m\" must be a size",
        ),
        (
            json!({"memory": "0"}),
            "resources.memory \"0\" must be more than 0",
        ),
        (
            json!({"memory": 64}),
            "resources.memory 64 is below the minimum of 6 MiB",
        ),
        (
            json!({"memory": "4t"}),
            "resources.memory \"4t\" is above the maximum of 1048576 MiB",
        ),
        (json!({"pids": -1}), "resources.pids -1 must be at least 1"),
        (json!({"pids": 0}), "resources.pids 0 must be at least 1"),
        (
            json!({"pids": "many"}),
            "resources.pids \"many\" must be a whole number",
        ),
        (
            json!({"disk": "1m"}),
            "resources.disk \"1m\" is below the minimum of 16 MiB",
        ),
        (json!({"disk": [1]}), "resources.disk [1] must be a size"),
        (
            json!({"memroy": "64m"}),
            "resources.memroy is not a resource; the keys are cpus, memory, pids, disk",
        ),
    ] {
        let (s, e) = cp.post_as("/v1/sandboxes", KEY, img(res.clone())).await;
        assert_eq!(s, 400, "{res}: {e}");
        let msg = e["error"].as_str().unwrap_or_default();
        assert!(msg.starts_with(want), "{res}: {msg}");
        // The same over fork, before the environment is even looked up.
        let (s, e) = cp
            .post_as("/v1/envs/env_none/fork", KEY, json!({"resources": res}))
            .await;
        assert_eq!(s, 400, "fork {res}: {e}");
        assert!(
            e["error"].as_str().unwrap_or_default().starts_with(want),
            "fork {res}: {e}"
        );
    }
    let (s, e) = cp
        .post_as(
            "/v1/sandboxes",
            KEY,
            json!({"image": "busybox:1.36", "resources": "64m"}),
        )
        .await;
    assert_eq!(s, 400, "{e}");
    // Nothing was created by the refusals.
    let (_, projects) = cp.get_as("/v1/projects", KEY).await;
    assert!(
        !projects["projects"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["Name"] == "sandboxes"),
        "{projects}"
    );

    // A host: 2 CPUs, 24000 MiB, 100 GB free.
    let sc = join_fake_host(&cp).await;
    for (res, want) in [
        (json!({"cpus": 2}), "resources.cpus 2 is more than host fake-sidecar allows: 1.5 (its 2 CPUs minus the 0.5 CPU the host keeps)"),
        (json!({"memory": "24001m"}), "resources.memory 24001 MiB is more than host fake-sidecar has: 24000 MiB"),
        (json!({"disk": "101g"}), "resources.disk 103424 MiB is more than host fake-sidecar has free: 102400 MiB"),
    ] {
        let (s, e) = cp.post_as("/v1/sandboxes", KEY, img(res.clone())).await;
        assert_eq!(s, 400, "{res}: {e}");
        assert_eq!(e["error"], want, "{res}");
    }
    assert!(
        sc.received().iter().all(|c| c.kind != "env.create"),
        "a refused request reached the host"
    );

    // Accepted: the caps go to service main and to the environment's quota.
    let (s, sb) = cp
        .post_as(
            "/v1/sandboxes",
            KEY,
            img(json!({"cpus": 0.5, "memory": "64m", "pids": 64, "disk": "64m"})),
        )
        .await;
    assert_eq!(s, 201, "{sb}");
    let sbx = sb["environment"]["ID"].as_str().unwrap().to_string();
    let create = sc
        .received()
        .into_iter()
        .find(|c| c.kind == "env.create")
        .unwrap();
    let Some(Payload::EnvCreate(c)) = create.payload else {
        panic!()
    };
    assert_eq!(service_caps(&c.services[0]), (64, 64, 0.5));
    assert_eq!(c.disk_mb, 64);
    let d = wait_deployment(&cp, sb["deployment"]["ID"].as_str().unwrap()).await;
    let ev = &phase_evidence(&d, "prepare")["resources"];
    assert_eq!(
        ev["services"]["main"],
        json!({"cpus": 0.5, "memory_mb": 64, "pids": 64}),
        "{ev}"
    );
    assert_eq!(ev["disk_mb"], 64, "{ev}");
    let (_, vs) = cp.get_as(&format!("/v1/envs/{sbx}/versions"), KEY).await;
    assert_eq!(
        vs["versions"][0]["Spec"]["services"][0]["resources"],
        json!({"memory_mb": 64, "pids": 64, "cpus": 0.5})
    );
    assert_eq!(vs["versions"][0]["Spec"]["disk_mb"], 64);

    // A fork with caps of its own: refused above the host, else applied to the fork only.
    let (s, e) = cp
        .post_as(
            &format!("/v1/envs/{sbx}/fork"),
            KEY,
            json!({"resources": {"cpus": 8}}),
        )
        .await;
    assert_eq!(s, 400, "{e}");
    assert_eq!(e["error"], "resources.cpus 8 is more than host fake-sidecar allows: 1.5 (its 2 CPUs minus the 0.5 CPU the host keeps)");
    let (s, f) = cp
        .post_as(
            &format!("/v1/envs/{sbx}/fork"),
            KEY,
            json!({"resources": {"memory": "256m", "cpus": 1}}),
        )
        .await;
    assert_eq!(s, 202, "{f}");
    let d = wait_deployment(&cp, f["deployment"]["ID"].as_str().unwrap()).await;
    assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
    assert_eq!(
        d["deployment"]["Params"]["resources"],
        json!({"cpus": 1, "memory_mb": 256})
    );
    let fork = sc
        .received()
        .into_iter()
        .find(|c| c.kind == "env.fork")
        .unwrap();
    let Some(Payload::EnvFork(fp)) = fork.payload else {
        panic!()
    };
    assert_eq!(
        service_caps(&fp.services[0]),
        (256, 64, 1.0),
        "pids kept from the version"
    );
    assert_eq!(fp.disk_mb, 64);
    let ev = &phase_evidence(&d, "clone")["resources"];
    assert_eq!(
        ev["services"]["main"],
        json!({"cpus": 1, "memory_mb": 256, "pids": 64}),
        "{ev}"
    );
    assert_eq!(
        ev["requested"],
        json!({"cpus": 1, "memory_mb": 256}),
        "{ev}"
    );
    assert_eq!(ev["applied_to"], "main", "{ev}");

    // The from_version form takes them too.
    let version = sb["deployment"]["VersionID"].as_str().unwrap();
    let (s, fk) = cp
        .post_as(
            "/v1/sandboxes",
            KEY,
            json!({"from_version": version, "resources": {"pids": 32, "disk": "32m"}}),
        )
        .await;
    assert_eq!(s, 201, "{fk}");
    let forks: Vec<_> = sc
        .received()
        .into_iter()
        .filter(|c| c.kind == "env.fork")
        .collect();
    let Some(Payload::EnvFork(fp)) = forks.last().unwrap().payload.clone() else {
        panic!()
    };
    assert_eq!(service_caps(&fp.services[0]), (64, 32, 0.5));
    assert_eq!(fp.disk_mb, 32);
}

/// The first deploy runs the tag (no `image_id` sent); the image id the host reports is
/// pinned in the version, and every fork of it (`fork`, `from_version`) is sent that id.
async fn a_version_pins_the_image_ids_its_host_ran(backend: Backend) {
    use denv_proto::v1::command::Payload;
    use sha2::Digest;
    let (_db, cp) = start(backend, &[]).await;
    let sc = join_fake_host(&cp).await;
    // What the fake host reports it ran for this tag.
    let id = format!(
        "sha256:{}",
        hex::encode(sha2::Sha256::digest(b"busybox:1.36"))
    );
    let (s, sb) = cp
        .post_as(
            "/v1/sandboxes",
            KEY,
            json!({"image": "busybox:1.36", "cmd": ["sleep", "infinity"]}),
        )
        .await;
    assert_eq!(s, 201, "{sb}");
    let sbx = sb["environment"]["ID"].as_str().unwrap().to_string();
    let sent = |kind: &str| -> Vec<Vec<String>> {
        sc.received()
            .into_iter()
            .filter(|c| c.kind == kind)
            .map(|c| match c.payload {
                Some(Payload::EnvCreate(p)) => {
                    p.services.iter().map(|s| s.image_id.clone()).collect()
                }
                Some(Payload::EnvFork(p)) => {
                    p.services.iter().map(|s| s.image_id.clone()).collect()
                }
                _ => panic!("{kind}"),
            })
            .collect()
    };
    assert_eq!(
        sent("env.create"),
        vec![vec![String::new()]],
        "the first deploy runs the tag"
    );
    let d = wait_deployment(&cp, sb["deployment"]["ID"].as_str().unwrap()).await;
    assert_eq!(
        phase_evidence(&d, "prepare")["image_ids"],
        json!({"main": id})
    );
    let (_, vs) = cp.get_as(&format!("/v1/envs/{sbx}/versions"), KEY).await;
    assert_eq!(
        vs["versions"][0]["Spec"]["services"][0]["image"],
        "busybox:1.36"
    );
    assert_eq!(
        vs["versions"][0]["Spec"]["services"][0]["image_id"],
        id.as_str()
    );

    let (s, f) = cp
        .post_as(&format!("/v1/envs/{sbx}/fork"), KEY, json!({}))
        .await;
    assert_eq!(s, 202, "{f}");
    let d = wait_deployment(&cp, f["deployment"]["ID"].as_str().unwrap()).await;
    assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
    let version = sb["deployment"]["VersionID"].as_str().unwrap();
    let (s, fk) = cp
        .post_as("/v1/sandboxes", KEY, json!({"from_version": version}))
        .await;
    assert_eq!(s, 201, "{fk}");
    assert_eq!(sent("env.fork"), vec![vec![id.clone()], vec![id.clone()]]);
}

/// `x-denv.clock: frozen`: the deploy is created on the real clock (`clock: "frozen"`
/// sent so the host can check it is able to freeze), the snapshot's world instant is
/// recorded with the version (spec and evidence), every fork of it is sent that instant,
/// and the version is never kept warm. A `real` version forks with no instant.
async fn a_frozen_clock_version_records_its_world_instant_and_forks_start_there(backend: Backend) {
    use denv_proto::v1::command::Payload;
    let (_db, cp) = start(backend, &[]).await;
    let sc = join_fake_host(&cp).await;
    let world = fake_sidecar::FAKE_WORLD_INSTANT_MS;
    let mut forked = Vec::new();
    // The frozen version asks for a warm pool of 2 (x-denv.pool), which it never gets.
    for (project, clock, pool) in [("frozen-world", "frozen", 2), ("real-world", "real", 0)] {
        cp.post_as("/v1/projects", KEY, json!({"name": project}))
            .await;
        let compose = format!(
            "x-denv:\n  clock: {clock}\n  pool: {pool}\nservices:\n  box:\n    image: busybox:1.36\n"
        );
        let (st, v) = cp
            .post_as(
                &format!("/v1/projects/{project}/deploy"),
                KEY,
                json!({"env": "alpha", "compose": compose}),
            )
            .await;
        assert_eq!(st, 202, "{v}");
        let d = wait_deployment(&cp, v["deployment"]["ID"].as_str().unwrap()).await;
        assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
        assert_eq!(
            phase_evidence(&d, "snapshot")["clock"],
            json!({"world_instant": "2023-11-14T22:13:20.000Z",
                   "world_instant_ms": world, "offset_ms": 0})
        );
        let env = d["deployment"]["EnvID"].as_str().unwrap().to_string();
        let (_, vs) = cp.get_as(&format!("/v1/envs/{env}/versions"), KEY).await;
        assert_eq!(vs["versions"][0]["Spec"]["world_instant_ms"], json!(world));
        let (s, f) = cp
            .post_as(&format!("/v1/envs/{env}/fork"), KEY, json!({}))
            .await;
        assert_eq!(s, 202, "{f}");
        let fd = wait_deployment(&cp, f["deployment"]["ID"].as_str().unwrap()).await;
        assert_eq!(fd["deployment"]["Status"], "succeeded", "{fd}");
        let ev = phase_evidence(&fd, "clone")["clock"].clone();
        forked.push((clock, ev));
    }
    let creates: Vec<String> = sc
        .received()
        .into_iter()
        .filter_map(|c| match c.payload {
            Some(Payload::EnvCreate(p)) => Some(p.clock),
            _ => None,
        })
        .collect();
    assert_eq!(creates, ["frozen", "real"]);
    // The pool syncs after the deploy; give it time to (wrongly) fill.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let forks: Vec<(String, i64, String)> = sc
        .received()
        .into_iter()
        .filter_map(|c| match c.payload {
            Some(Payload::EnvFork(p)) => Some((p.clock, p.world_instant_ms, c.env_id)),
            _ => None,
        })
        .collect();
    let frozen: Vec<_> = forks.iter().filter(|f| f.0 == "frozen").collect();
    assert_eq!(frozen.len(), 1, "one cold fork, no pool fills: {forks:?}");
    assert_eq!(frozen[0].1, world);
    let real: Vec<_> = forks.iter().filter(|f| f.0 == "real").collect();
    assert_eq!(real.len(), 1, "{forks:?}");
    assert_eq!(real[0].1, world, "the instant is sent; the host ignores it");
    assert_eq!(forked[0].0, "frozen");
    assert_eq!(forked[0].1["mode"], "frozen");
    assert_eq!(forked[0].1["starts_at"], "2023-11-14T22:13:20.000Z");
    assert_eq!(forked[0].1["world_instant_ms"], json!(world));
    assert!(forked[0].1["offset_ms"].as_i64().unwrap() < 0);
    assert_eq!(forked[0].1["real_clock_services"], json!({}));
    assert_eq!(forked[1].1, json!({"mode": "real"}));
}
