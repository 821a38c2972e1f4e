//! Hub and TargetService over the network: a real SQLite store, the hub and the
//! TargetService mounted on a tonic server on a local port, and the fake sidecar
//! speaking the real host stream to it.

use denv_cp::domain::{EnvRow, EnvStatus};
use denv_cp::hub::{HubError, HubOptions};
use denv_cp::orchestrator::repo;
use denv_cp::store::{self, commands, hosts, join_tokens};
use denv_proto::v1::{self, command, command_result, target_service_client::TargetServiceClient};
use denv_testkit::{CpInProcess as Cp, Denvd, FakeOptions, FakeSidecar, Identity, TestDb};
use prost::Message;
use std::time::Duration;
use tonic::transport::Channel;

const KEY: &str = "dak_hubtest_0123456789";

/// The hub and TargetService in-process over a fresh SQLite store.
async fn start(opts: HubOptions) -> Cp {
    Cp::start(TestDb::sqlite(), KEY, opts).await
}

fn quick() -> HubOptions {
    HubOptions {
        hello_timeout: Duration::from_secs(2),
        grace: Duration::from_secs(60),
        ..HubOptions::default()
    }
}

fn authed<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {KEY}").parse().unwrap());
    r
}

async fn targets(cp: &Cp) -> TargetServiceClient<Channel> {
    TargetServiceClient::connect(cp.url.clone()).await.unwrap()
}

async fn join_token(cp: &Cp, cloud_id: &str) -> v1::CreateJoinTokenResponse {
    targets(cp)
        .await
        .create_join_token(authed(v1::CreateJoinTokenRequest {
            cloud_id: cloud_id.into(),
        }))
        .await
        .unwrap()
        .into_inner()
}

async fn eventually<F: Fn() -> bool>(what: &str, f: F) {
    for _ in 0..100 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn host_row(cp: &Cp, id: &str) -> hosts::Model {
    hosts::get(&cp.db, id).await.unwrap().unwrap()
}

fn exec(cmd: &[&str]) -> command::Payload {
    command::Payload::EnvExec(v1::EnvExec {
        service: "box".into(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        timeout_sec: 5,
        ..Default::default()
    })
}

fn create() -> command::Payload {
    command::Payload::EnvCreate(v1::EnvCreate {
        version: "ver_1".into(),
        services: vec![v1::ServiceSpec {
            name: "box".into(),
            image: "busybox:1.36".into(),
            ports: vec![8080],
            ..Default::default()
        }],
        volumes: vec!["home".into()],
        egress: "allow".into(),
        ..Default::default()
    })
}

#[tokio::test]
async fn join_token_is_single_use_and_becomes_a_host_secret() {
    let cp = start(quick()).await;
    let jt = join_token(&cp, "").await;
    assert!(jt.token.starts_with("djt_"));
    assert_eq!(jt.expires_in_sec, 3600);
    assert_eq!(
        jt.command,
        format!(
            "curl -fsSL http://cp.test:8080/denvd -o /usr/local/bin/denvd && chmod +x /usr/local/bin/denvd && denvd join --server http://cp.test:8080 --token {}",
            jt.token
        )
    );

    let sc = FakeSidecar::join(&cp.url, &jt.token, FakeOptions::default())
        .await
        .unwrap();
    let id = sc.identity();
    assert!(id.host_id.starts_with("host_"), "{}", id.host_id);
    assert!(id.secret.starts_with("dhs_"));
    eventually("connected", || cp.hub.is_connected(&id.host_id)).await;
    assert_eq!(
        cp.hub.first_connected_host(&cp.team_id),
        Some(id.host_id.clone())
    );
    assert_eq!(cp.hub.first_connected_host("team_other"), None);

    let row = host_row(&cp, &id.host_id).await;
    assert_eq!(row.team_id, cp.team_id);
    assert_eq!(row.name, "fake-sidecar");
    assert_eq!(row.status, "connected");
    assert_eq!(row.secret_hash, denv_cp::ids::hash_secret(&id.secret));
    assert_ne!(row.secret_hash, id.secret);
    use sea_orm::EntityTrait;
    let trow = join_tokens::Entity::find_by_id(denv_cp::ids::hash_secret(&jt.token))
        .one(&cp.db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(trow.host_id, id.host_id);
    assert!(!trow.used_at.is_empty());

    // The token is refused the second time.
    let err = FakeSidecar::join(&cp.url, &jt.token, FakeOptions::default())
        .await
        .err()
        .expect("second join refused");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert_eq!(err.message(), "join: join token already used");

    // A made-up token and a missing token are refused too.
    let err = FakeSidecar::join(&cp.url, "djt_nope", FakeOptions::default())
        .await
        .err()
        .unwrap();
    assert_eq!(
        (err.code(), err.message()),
        (tonic::Code::PermissionDenied, "join: unknown join token")
    );
}

#[tokio::test]
async fn expired_token_is_refused() {
    let cp = start(quick()).await;
    let token = denv_cp::ids::new_secret("djt");
    join_tokens::insert(
        &cp.db,
        join_tokens::Model {
            token_hash: denv_cp::ids::hash_secret(&token),
            team_id: cp.team_id.clone(),
            cloud_id: String::new(),
            created_at: "2026-01-01T00:00:00.000Z".into(),
            expires_at: "2026-01-01T01:00:00.000Z".into(),
            used_at: String::new(),
            host_id: String::new(),
        },
    )
    .await
    .unwrap();
    let err = FakeSidecar::join(&cp.url, &token, FakeOptions::default())
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert_eq!(err.message(), "join: join token expired");
    assert!(hosts::list(&cp.db, &cp.team_id).await.unwrap().is_empty());
}

#[tokio::test]
async fn secrets_are_checked_and_a_reconnect_replaces_the_older_stream() {
    let cp = start(quick()).await;
    let jt = join_token(&cp, "").await;
    let first = FakeSidecar::join(&cp.url, &jt.token, FakeOptions::default())
        .await
        .unwrap();
    let id = first.identity();

    let bad = Identity {
        host_id: id.host_id.clone(),
        secret: "dhs_wrong".into(),
    };
    let err = FakeSidecar::reconnect(&cp.url, &bad, FakeOptions::default())
        .await
        .err()
        .unwrap();
    assert_eq!(
        (err.code(), err.message()),
        (tonic::Code::PermissionDenied, "host secret rejected")
    );
    let unknown = Identity {
        host_id: "host_01UNKNOWN".into(),
        secret: id.secret.clone(),
    };
    let err = FakeSidecar::reconnect(&cp.url, &unknown, FakeOptions::default())
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert_eq!(err.message(), "unknown host host_01UNKNOWN");

    // The right secret: admitted, and the older stream is ended.
    let second = FakeSidecar::reconnect(&cp.url, &id, FakeOptions::default())
        .await
        .unwrap();
    assert_eq!(second.host_id(), id.host_id);
    eventually("older stream closed", || first.is_closed()).await;
    assert!(!second.is_closed());
    assert!(cp.hub.is_connected(&id.host_id));
    // The replaced stream's end does not mark the host unreachable.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(host_row(&cp, &id.host_id).await.status, "connected");
    assert_eq!(
        cp.hub.connected_hosts(&cp.team_id),
        vec![id.host_id.clone()]
    );
}

/// Claims protocol versions `min..=max` in hello.
fn speaking(min: u32, max: u32) -> FakeOptions {
    FakeOptions {
        min_protocol: min,
        protocol: max,
        ..Default::default()
    }
}

#[tokio::test]
async fn protocol_versions_are_negotiated_in_hello_and_welcome() {
    // A control plane speaking 1 to 3.
    let cp = start(HubOptions {
        protocols: (1, 3),
        ..quick()
    })
    .await;
    let jt = join_token(&cp, "").await;

    // No overlap: refused naming both ranges, and the join token is not consumed.
    let err = FakeSidecar::join(&cp.url, &jt.token, speaking(4, 6))
        .await
        .err()
        .expect("refused");
    assert_eq!(
        (err.code(), err.message()),
        (
            tonic::Code::PermissionDenied,
            "protocol: no version in common: the sidecar speaks 4 to 6, this control plane speaks 1 to 3"
        )
    );
    assert!(hosts::list(&cp.db, &cp.team_id).await.unwrap().is_empty());

    // A sidecar speaking 2 to 5 joins on 3, the highest both speak.
    let sc = FakeSidecar::join(&cp.url, &jt.token, speaking(2, 5))
        .await
        .unwrap();
    assert_eq!(sc.protocol(), 3);
    let id = sc.identity();
    eventually("connected", || cp.hub.is_connected(&id.host_id)).await;

    // 1 to 2: 2.
    let sc = FakeSidecar::reconnect(&cp.url, &id, speaking(1, 2))
        .await
        .unwrap();
    assert_eq!(sc.protocol(), 2);
    // A sidecar older than the negotiation sends no min_protocol: it speaks only its
    // `protocol`, and one that sends no version at all speaks 1.
    let sc = FakeSidecar::reconnect(&cp.url, &id, speaking(0, 2))
        .await
        .unwrap();
    assert_eq!(sc.protocol(), 2);
    let sc = FakeSidecar::reconnect(&cp.url, &id, speaking(0, 0))
        .await
        .unwrap();
    assert_eq!(sc.protocol(), 1);
    assert!(!sc.is_closed());

    // Above the control plane's range, and a malformed range.
    let err = FakeSidecar::reconnect(&cp.url, &id, speaking(0, 4))
        .await
        .err()
        .expect("refused");
    assert_eq!(
        (err.code(), err.message()),
        (
            tonic::Code::PermissionDenied,
            "protocol: no version in common: the sidecar speaks 4, this control plane speaks 1 to 3"
        )
    );
    let err = FakeSidecar::reconnect(&cp.url, &id, speaking(3, 2))
        .await
        .err()
        .expect("refused");
    assert_eq!(
        (err.code(), err.message()),
        (
            tonic::Code::PermissionDenied,
            "protocol: min_protocol 3 is above protocol 2"
        )
    );
    // A refused hello does not replace the admitted stream.
    assert!(!sc.is_closed());
    assert!(cp.hub.is_connected(&id.host_id));
}

#[tokio::test]
async fn this_builds_protocol_range_is_the_contract_one() {
    // The default hub speaks denv_proto::contract's range (1 today): a sidecar of this
    // build gets its newest version, an old one (no min, protocol 1) gets 1, a newer
    // sidecar that dropped 1 is refused.
    let cp = start(quick()).await;
    let jt = join_token(&cp, "").await;
    let sc = FakeSidecar::join(&cp.url, &jt.token, FakeOptions::default())
        .await
        .unwrap();
    assert_eq!(sc.protocol(), denv_proto::contract::PROTOCOL);
    assert_eq!(sc.protocol(), 1);
    let id = sc.identity();
    let old = FakeSidecar::reconnect(&cp.url, &id, speaking(0, 1))
        .await
        .unwrap();
    assert_eq!(old.protocol(), 1);
    let err = FakeSidecar::reconnect(&cp.url, &id, speaking(2, 3))
        .await
        .err()
        .expect("refused");
    assert_eq!(
        (err.code(), err.message()),
        (
            tonic::Code::PermissionDenied,
            "protocol: no version in common: the sidecar speaks 2 to 3, this control plane speaks 1"
        )
    );
}

#[tokio::test]
async fn heartbeats_update_last_seen_and_silence_or_a_drop_marks_unreachable() {
    let cp = start(HubOptions {
        hello_timeout: Duration::from_secs(2),
        grace: Duration::from_millis(1500),
        ..HubOptions::default()
    })
    .await;
    let jt = join_token(&cp, "").await;
    let opts = FakeOptions {
        heartbeat: Duration::from_millis(200),
        ..Default::default()
    };
    let sc = FakeSidecar::join(&cp.url, &jt.token, opts).await.unwrap();
    let id = sc.identity();
    let seen0 = host_row(&cp, &id.host_id).await.last_seen_at;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    // Heartbeats kept it alive past the grace window and moved last_seen_at.
    assert!(cp.hub.is_connected(&id.host_id));
    let seen1 = host_row(&cp, &id.host_id).await.last_seen_at;
    assert!(seen1 > seen0, "{seen1} > {seen0}");

    // A dropped stream: unreachable.
    sc.disconnect().await;
    eventually("drop noticed", || !cp.hub.is_connected(&id.host_id)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(host_row(&cp, &id.host_id).await.status, "unreachable");

    // Silence (no heartbeat within the grace window): unreachable and the call ends.
    let silent = FakeSidecar::reconnect(
        &cp.url,
        &id,
        FakeOptions {
            heartbeat: Duration::from_secs(3600),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(cp.hub.is_connected(&id.host_id));
    assert_eq!(host_row(&cp, &id.host_id).await.status, "connected");
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert!(!cp.hub.is_connected(&id.host_id));
    assert_eq!(host_row(&cp, &id.host_id).await.status, "unreachable");
    eventually("silent stream ended", || silent.is_closed()).await;
}

#[tokio::test]
async fn commands_are_recorded_and_answered_with_progress_events() {
    let cp = start(quick()).await;
    let jt = join_token(&cp, "").await;
    let sc = FakeSidecar::join(
        &cp.url,
        &jt.token,
        FakeOptions::default().failing("env.snapshot", "volume \"home\": disk full"),
    )
    .await
    .unwrap();
    let host = sc.host_id().to_string();

    let (id, res) = cp
        .hub
        .send_with_id(
            &cp.team_id,
            &host,
            "env_a",
            create(),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let Ok(command_result::Payload::EnvCreate(r)) = res else {
        panic!("{res:?}")
    };
    assert_eq!(r.egress, "allowed");
    assert_eq!(r.endpoints["box"], "127.0.0.1:38080");
    assert!(id.starts_with("cmd_"));
    let row = commands::get(&cp.db, &id).await.unwrap().unwrap();
    assert_eq!(row.status, "done");
    assert_eq!(row.env_id, "env_a");
    assert_eq!(row.host_id, host);
    // The row holds the typed frame and its typed result.
    let sent = v1::Command::decode(row.message.as_slice()).unwrap();
    assert_eq!(
        (sent.command_id.as_str(), sent.kind.as_str()),
        (id.as_str(), "env.create")
    );
    let Some(command::Payload::EnvCreate(c)) = sent.payload else {
        panic!("{sent:?}")
    };
    assert_eq!(c.services[0].image, "busybox:1.36");
    let got = v1::CommandResult::decode(row.result.as_deref().unwrap()).unwrap();
    let Some(command_result::Payload::EnvCreate(r)) = got.payload else {
        panic!("{got:?}")
    };
    assert_eq!(r.storage, "dir");
    // Progress lines are events on cmd:<id>.
    let evs = store::events::list(&cp.db, &cp.team_id, &format!("cmd:{id}"), 10)
        .await
        .unwrap();
    let mut lines: Vec<String> = evs
        .iter()
        .map(|e| e.body_json()["message"].as_str().unwrap_or("").to_string())
        .collect();
    lines.sort();
    assert_eq!(lines, vec!["env.create finishing", "env.create started"]);
    assert!(evs.iter().all(|e| e.kind == "progress"));

    // The sidecar's error comes back verbatim and is stored on the row.
    let (id, res) = cp
        .hub
        .send_with_id(
            &cp.team_id,
            &host,
            "env_a",
            command::Payload::EnvSnapshot(v1::EnvSnapshot {
                name: "ver_2".into(),
                keep_paused: vec![],
            }),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    match res {
        Err(HubError::Failed { code, message }) => {
            assert_eq!(message, "volume \"home\": disk full");
            assert_eq!(code, v1::HostErrorCode::Failed);
        }
        other => panic!("{other:?}"),
    }
    let row = commands::get(&cp.db, &id).await.unwrap().unwrap();
    assert_eq!(
        (row.status.as_str(), row.error.as_str()),
        ("failed", "volume \"home\": disk full")
    );

    // Unknown host of the team.
    let err = cp
        .hub
        .send(
            &cp.team_id,
            "host_nope",
            "env_a",
            exec(&["id"]),
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, HubError::UnknownHost(_)), "{err}");

    // A caller's timeout marks the row failed.
    sc.set_answering(false);
    let (id, res) = cp
        .hub
        .send_with_id(
            &cp.team_id,
            &host,
            "env_a",
            exec(&["sleep", "9"]),
            Duration::from_millis(700),
        )
        .await
        .unwrap();
    match res {
        Err(HubError::Timeout(after)) => assert_eq!(after, "700ms"),
        other => panic!("{other:?}"),
    }
    let row = commands::get(&cp.db, &id).await.unwrap().unwrap();
    assert_eq!(
        (row.status.as_str(), row.error.as_str()),
        ("failed", "timed out after 700ms")
    );
    // The ack had arrived before the timeout, but the failure is what stays.
    assert_eq!(sc.executions().len(), 2);
}

#[tokio::test]
async fn a_command_sent_while_the_host_is_away_is_delivered_on_reconnect_with_the_same_id() {
    let cp = start(quick()).await;
    let jt = join_token(&cp, "").await;
    let sc = FakeSidecar::join(&cp.url, &jt.token, FakeOptions::default())
        .await
        .unwrap();
    let host = sc.host_id().to_string();
    cp.hub
        .send(
            &cp.team_id,
            &host,
            "env_b",
            create(),
            Duration::from_secs(5),
        )
        .await
        .unwrap();

    // Case 1: delivered, acked, no result, then the stream drops; the sidecar's process
    // lives on (same journal) and reconnects.
    sc.set_answering(false);
    let hub = cp.hub.clone();
    let team = cp.team_id.clone();
    let h = host.clone();
    let waiting = tokio::spawn(async move {
        hub.send_with_id(
            &team,
            &h,
            "env_b",
            exec(&["echo", "one"]),
            Duration::from_secs(10),
        )
        .await
    });
    assert_eq!(sc.wait_received(2, Duration::from_secs(5)).await, 2);
    let first_id = sc.received()[1].command_id.clone();
    let sc = sc.reconnect_same(&cp.url).await.unwrap();
    let (id, res) = waiting.await.unwrap().unwrap();
    assert_eq!(id, first_id);
    let Ok(command_result::Payload::EnvExec(out)) = res else {
        panic!("{res:?}")
    };
    assert_eq!(out.stdout, "echo one\n");
    // The reconnected stream got the same id again.
    assert!(sc.received().iter().any(|c| c.command_id == first_id));
    assert_eq!(
        sc.executions().iter().filter(|c| **c == first_id).count(),
        1,
        "executed once"
    );

    // Case 2: the host is away when the command is sent.
    let before = sc.received().len();
    let parked = sc.disconnect().await;
    eventually("drop noticed", || !cp.hub.is_connected(&host)).await;
    let hub = cp.hub.clone();
    let team = cp.team_id.clone();
    let h = host.clone();
    let waiting = tokio::spawn(async move {
        hub.send_with_id(
            &team,
            &h,
            "env_b",
            exec(&["echo", "two"]),
            Duration::from_secs(10),
        )
        .await
    });
    // The row exists (status sent) before the host is back.
    let mut open = vec![];
    for _ in 0..50 {
        open = commands::open_for_host(&cp.db, &host).await.unwrap();
        if !open.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].status, "sent");
    let sc = parked.reconnect(&cp.url).await.unwrap();
    let (id, res) = waiting.await.unwrap().unwrap();
    assert_eq!(id, open[0].id);
    assert_eq!(sc.received()[before].command_id, open[0].id);
    let Ok(command_result::Payload::EnvExec(out)) = res else {
        panic!("{res:?}")
    };
    assert_eq!(out.stdout, "echo two\n");
    assert_eq!(
        commands::get(&cp.db, &id).await.unwrap().unwrap().status,
        "done"
    );

    // Case 3: the timeout passes while the host is away.
    sc.disconnect().await;
    eventually("drop noticed", || !cp.hub.is_connected(&host)).await;
    let err = cp
        .hub
        .send(
            &cp.team_id,
            &host,
            "env_b",
            exec(&["true"]),
            Duration::from_millis(300),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("host {host} is not connected (timed out after 300ms)")
    );
}

#[tokio::test]
async fn hosts_and_targets_show_connected_and_capabilities() {
    let cp = start(quick()).await;
    let mut api = targets(&cp).await;

    // Clouds: shape validation, defaults, masking.
    let err = api
        .create_cloud(authed(v1::CreateCloudRequest {
            provider: "hetzner".into(),
            name: "hz".into(),
            config: Some(denv_proto::json::to_struct(&serde_json::json!({}))),
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(err.message(), "hetzner: config.token is required");
    let err = api
        .create_cloud(authed(v1::CreateCloudRequest {
            provider: "aws".into(),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let cloud = api
        .create_cloud(authed(v1::CreateCloudRequest {
            provider: "hetzner".into(),
            name: "hz".into(),
            config: Some(denv_proto::json::to_struct(
                &serde_json::json!({"token": "hcloud-secret", "location": "fsn1"}),
            )),
        }))
        .await
        .unwrap()
        .into_inner()
        .cloud
        .unwrap();
    let cfg = denv_proto::json::from_struct(cloud.config.as_ref().unwrap());
    assert_eq!(cfg["token"], "•••");
    assert_eq!(cfg["server_type"], "cpx31");
    assert_eq!(cfg["location"], "fsn1");
    assert!(cloud.id.starts_with("cloud_"));
    let dup = api
        .create_cloud(authed(v1::CreateCloudRequest {
            provider: "manual".into(),
            name: "hz".into(),
            config: None,
        }))
        .await
        .unwrap_err();
    assert_eq!(dup.code(), tonic::Code::AlreadyExists);
    let listed = api
        .list_clouds(authed(v1::ListCloudsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .clouds;
    assert_eq!(listed.len(), 1);
    let json = denv_proto::json::to_json(&listed[0]);
    assert_eq!(json["Config"]["token"], "•••");
    assert_eq!(json["Provider"], "hetzner");
    let err = api
        .connect_target(authed(v1::ConnectTargetRequest {
            provider: "e2b".into(),
            token: "e2b_x".into(),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(err.message(), "driver hosts are not available yet");

    // A host joined through the cloud.
    let jt = join_token(&cp, &cloud.id).await;
    let sc = FakeSidecar::join(
        &cp.url,
        &jt.token,
        FakeOptions {
            hostname: "box-1".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let host_id = sc.host_id().to_string();
    let hosts = api
        .list_hosts(authed(v1::ListHostsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .hosts;
    assert_eq!(hosts.len(), 1);
    let j = denv_proto::json::to_json(&hosts[0]);
    assert_eq!(j["ID"], host_id);
    assert_eq!(j["CloudID"], cloud.id);
    assert_eq!(j["Name"], "box-1");
    assert_eq!(j["Status"], "connected");
    assert_eq!(j["connected"], true);
    assert_eq!(j["Capabilities"]["hostname"], "box-1");
    assert_eq!(j["Capabilities"]["storage"], "dir");
    assert_eq!(j["Capabilities"]["cpus"], 2.0);

    let t = api
        .list_targets(authed(v1::ListTargetsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .targets;
    assert_eq!(t.len(), 1);
    let j = denv_proto::json::to_json(&t[0]);
    assert_eq!(j["kind"], "sidecar");
    assert_eq!(j["connected"], true);
    assert_eq!(j["capabilities"]["docker"], "20.10.24");

    sc.disconnect().await;
    eventually("drop noticed", || !cp.hub.is_connected(&host_id)).await;
    let hosts = api
        .list_hosts(authed(v1::ListHostsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .hosts;
    assert!(!hosts[0].connected);
    assert_eq!(hosts[0].status, "unreachable");

    // Without a credential: unauthenticated.
    let err = api
        .list_hosts(tonic::Request::new(v1::ListHostsRequest {}))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
}

/// `env.failed` from the environment's own host turns `healthy` into `failed`; the same
/// event from another host, or for an environment being deployed, changes nothing.
#[tokio::test]
async fn env_failed_event_marks_a_healthy_environment_failed() {
    let cp = start(quick()).await;
    let jt = join_token(&cp, "").await;
    let side = FakeSidecar::join(&cp.url, &jt.token, FakeOptions::default())
        .await
        .unwrap();
    let host = side.host_id().to_string();
    let mk = |status: EnvStatus, on: String| {
        let (db, team) = (cp.db.clone(), cp.team_id.clone());
        async move {
            // A row already in `status` on host `on`, written as a fixture.
            let mut e = repo::create_env(&db, &team, "prj_x", "e", "fork", "")
                .await
                .unwrap();
            e.host_id = on;
            e.set_status(status);
            use sea_orm::{ActiveModelTrait, IntoActiveModel};
            e.clone()
                .into_active_model()
                .reset_all()
                .update(&db)
                .await
                .unwrap();
            e.id
        }
    };
    let mine = mk(EnvStatus::Healthy, host.clone()).await;
    let other = mk(EnvStatus::Healthy, "host_other".into()).await;
    let busy = mk(EnvStatus::Deploying, host.clone()).await;
    let reason = "service \"box\" is not running (exited with code 137)";
    for id in [&mine, &other, &busy] {
        side.send_event(v1::host_event::Event::EnvFailed(v1::EnvFailed {
            env_id: id.clone(),
            reason: reason.into(),
        }))
        .await;
    }
    let status = |id: String| {
        let db = cp.db.clone();
        async move { repo::env_row(&db, &id).await.unwrap().unwrap().status() }
    };
    for _ in 0..100 {
        if status(mine.clone()).await == EnvStatus::Failed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(status(mine.clone()).await, EnvStatus::Failed);
    assert_eq!(status(other).await, EnvStatus::Healthy);
    assert_eq!(status(busy).await, EnvStatus::Deploying);
    // Stored on the host's subject as before the events were typed: kind `env.failed`,
    // body `{env_id, reason}` (what `GET /v1/events` shows).
    let evs = store::events::list(&cp.db, &cp.team_id, &format!("host:{host}"), 50)
        .await
        .unwrap();
    let ev = evs
        .iter()
        .find(|e| e.kind == "env.failed" && e.body_json()["env_id"] == mine.as_str())
        .expect("env.failed stored");
    assert_eq!(
        ev.body_json(),
        serde_json::json!({"env_id": mine, "reason": reason})
    );
}

#[tokio::test]
#[ignore = "needs Docker, busybox:1.36 and target/<profile>/denvd; run with --ignored"]
async fn real_denvd_runs_commands_sent_through_the_hub() {
    let cp = start(quick()).await;
    let jt = join_token(&cp, "").await;
    let dir = tempfile::tempdir().unwrap();
    let d = Denvd::join(&cp.url, &jt.token, dir.path());
    let mut host = None;
    for _ in 0..200 {
        if let Some(h) = cp.hub.first_connected_host(&cp.team_id) {
            host = Some(h);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let host = host.expect("denvd joined");
    let t = Duration::from_secs(120);
    let env = format!("env_hubtest{}", std::process::id());

    let r = cp
        .hub
        .send(
            &cp.team_id,
            &host,
            "",
            command::Payload::HostReport(v1::HostReport {}),
            t,
        )
        .await
        .unwrap();
    let command_result::Payload::HostReport(rep) = r else {
        panic!("{r:?}")
    };
    assert_eq!(rep.capabilities.unwrap().storage, "dir");

    let create = command::Payload::EnvCreate(v1::EnvCreate {
        version: "ver_1".into(),
        services: vec![v1::ServiceSpec {
            name: "box".into(),
            image: "busybox:1.36".into(),
            command: vec!["sleep".into(), "3600".into()],
            volumes: vec![v1::VolumeMountSpec {
                name: "work".into(),
                path: "/work".into(),
                read_only: false,
            }],
            ..Default::default()
        }],
        volumes: vec!["work".into()],
        egress: "allow".into(),
        ..Default::default()
    });
    let res = cp
        .hub
        .send_with_id(&cp.team_id, &host, &env, create, t)
        .await
        .unwrap();
    let log = || std::fs::read_to_string(dir.path().join("denvd.log")).unwrap_or_default();
    let (create_id, r) = res;
    let r = r.unwrap_or_else(|e| panic!("create: {e}\n{}", log()));
    let command_result::Payload::EnvCreate(c) = r else {
        panic!("{r:?}")
    };
    assert_eq!(c.egress, "allowed");
    assert!(c.digests["box"].contains("sha256:"), "{:?}", c.digests);
    let evs = store::events::list(&cp.db, &cp.team_id, &format!("cmd:{create_id}"), 50)
        .await
        .unwrap();
    assert!(!evs.is_empty(), "progress lines recorded as events");

    let r = cp
        .hub
        .send(
            &cp.team_id,
            &host,
            &env,
            exec(&["sh", "-c", "echo hi > /work/f; cat /work/f; exit 3"]),
            t,
        )
        .await
        .unwrap();
    let command_result::Payload::EnvExec(out) = r else {
        panic!("{r:?}")
    };
    assert_eq!((out.exit_code, out.stdout.as_str()), (3, "hi\n"));

    // A streamed exec: the output comes as frames to the caller, in order, before the
    // result (which carries only the exit code), and none of it is recorded as events.
    let (otx, mut orx) = tokio::sync::mpsc::unbounded_channel();
    let mut p = exec(&["sh", "-c", "echo a; sleep 1; echo b >&2; echo c; exit 4"]);
    if let command::Payload::EnvExec(x) = &mut p {
        x.stream = true;
    }
    let r = cp
        .hub
        .send_with_output(&cp.team_id, &host, &env, p, t, otx)
        .await
        .unwrap();
    let command_result::Payload::EnvExec(out) = r else {
        panic!("{r:?}")
    };
    assert_eq!(out.exit_code, 4);
    assert!(out.stdout.is_empty() && out.stderr.is_empty());
    let mut seen = Vec::new();
    while let Ok(f) = orx.try_recv() {
        assert!(f.message.is_empty());
        seen.push((f.stdout, f.stderr));
    }
    // Each stream keeps its order; across the two pipes only what the sleep separates
    // is ordered (stderr's "b" and stdout's "c" are written back to back).
    let out: Vec<u8> = seen.iter().flat_map(|(o, _)| o.clone()).collect();
    let err: Vec<u8> = seen.iter().flat_map(|(_, e)| e.clone()).collect();
    assert_eq!(out, b"a\nc\n", "stdout in the order written: {seen:?}");
    assert_eq!(err, b"b\n", "stderr: {seen:?}");
    assert_eq!(seen[0], (b"a\n".to_vec(), vec![]), "a came first: {seen:?}");

    let err = cp
        .hub
        .send(&cp.team_id, &host, "env_nope", exec(&["true"]), t)
        .await
        .unwrap_err();
    // The environment is not on the host: the sidecar says NOT_FOUND, which the API
    // answers 404 (the message as the sidecar wrote it).
    match &err {
        HubError::Failed { code, message } => {
            assert_eq!(*code, v1::HostErrorCode::NotFound, "{message}");
            assert_eq!(message, "service \"box\" of env_nope not found");
        }
        other => panic!("{other:?}"),
    }
    let api = denv_cp::error::ApiError::from(err);
    assert_eq!(api.http_status().as_u16(), 404, "{api}");

    let r = cp
        .hub
        .send(
            &cp.team_id,
            &host,
            &env,
            command::Payload::EnvDestroy(v1::EnvDestroy {}),
            t,
        )
        .await
        .unwrap();
    let command_result::Payload::EnvDestroy(dr) = r else {
        panic!("{r:?}")
    };
    assert_eq!(dr.destroyed, env);
    // The journal holds every result.
    let journal = std::fs::read_dir(dir.path().join("data/commands"))
        .unwrap()
        .count();
    assert_eq!(journal, 6);
    drop(d);
}
