//! The client against a real tonic server on loopback: auth metadata, deployment
//! watching (stream and polling fallback), large messages, error mapping.

use denv_client::{v1, Client, Code};
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status};
use v1::deployment_service_server::{DeploymentService, DeploymentServiceServer};
use v1::environment_service_server::{EnvironmentService, EnvironmentServiceServer};
use v1::health_service_server::{HealthService, HealthServiceServer};

/// Answers `Health` with the auth metadata it received: `"<authorization>|<x-denv-team>"`.
struct EchoHealth;

#[tonic::async_trait]
impl HealthService for EchoHealth {
    async fn health(
        &self,
        req: Request<v1::HealthRequest>,
    ) -> Result<Response<v1::HealthResponse>, Status> {
        let get = |k: &str| {
            req.metadata()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_string()
        };
        Ok(Response::new(v1::HealthResponse {
            status: format!("{}|{}", get("authorization"), get("x-denv-team")),
        }))
    }
}

fn dep(status: &str, phases: &[(&str, &str)]) -> v1::DeploymentResponse {
    v1::DeploymentResponse {
        deployment: Some(v1::Deployment {
            id: "dep_1".into(),
            status: status.into(),
            ..Default::default()
        }),
        phases: phases
            .iter()
            .enumerate()
            .map(|(i, (n, s))| v1::Phase {
                deployment_id: "dep_1".into(),
                seq: i as i32 + 1,
                name: n.to_string(),
                status: s.to_string(),
                ..Default::default()
            })
            .collect(),
    }
}

/// Scripted deployment states. `watch` streams `states` (with a duplicate of each, to
/// prove duplicates are not reported); when `watch_fails` the stream errors after the
/// first state and `get` serves the states one per call.
struct Scripted {
    states: Vec<v1::DeploymentResponse>,
    watch_fails: bool,
    gets: Arc<Mutex<usize>>,
}

#[tonic::async_trait]
impl DeploymentService for Scripted {
    async fn get_deployment(
        &self,
        req: Request<v1::GetDeploymentRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        if req.get_ref().id != "dep_1" {
            return Err(Status::not_found("deployment not found"));
        }
        let mut n = self.gets.lock().unwrap();
        let i = (*n).min(self.states.len() - 1);
        *n += 1;
        Ok(Response::new(self.states[i].clone()))
    }

    type WatchDeploymentStream =
        futures::stream::BoxStream<'static, Result<v1::DeploymentResponse, Status>>;

    async fn watch_deployment(
        &self,
        req: Request<v1::GetDeploymentRequest>,
    ) -> Result<Response<Self::WatchDeploymentStream>, Status> {
        use futures::StreamExt;
        if req.get_ref().id != "dep_1" {
            return Err(Status::not_found("deployment not found"));
        }
        let items: Vec<Result<v1::DeploymentResponse, Status>> = if self.watch_fails {
            vec![
                Ok(self.states[0].clone()),
                Err(Status::internal("watch broke")),
            ]
        } else {
            self.states
                .iter()
                .flat_map(|s| [Ok(s.clone()), Ok(s.clone())])
                .collect()
        };
        Ok(Response::new(futures::stream::iter(items).boxed()))
    }
}

/// Echoes files: `get_files` returns what the last `put_files` sent.
#[derive(Default)]
struct Files {
    last: Mutex<Vec<u8>>,
}

#[allow(clippy::result_large_err)]
fn unimpl<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("not in this test"))
}

#[tonic::async_trait]
impl EnvironmentService for Files {
    type ExecStreamStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<v1::ExecChunk, Status>> + Send>>;
    async fn exec_stream(
        &self,
        _: Request<v1::ExecRequest>,
    ) -> Result<Response<Self::ExecStreamStream>, Status> {
        unimpl()
    }
    async fn get_env(
        &self,
        _: Request<v1::EnvRequest>,
    ) -> Result<Response<v1::GetEnvResponse>, Status> {
        Err(Status::not_found("environment not found"))
    }
    async fn get_sheet(
        &self,
        _: Request<v1::SheetRequest>,
    ) -> Result<Response<v1::SheetResponse>, Status> {
        unimpl()
    }
    async fn list_versions(
        &self,
        _: Request<v1::EnvRequest>,
    ) -> Result<Response<v1::ListVersionsResponse>, Status> {
        unimpl()
    }
    async fn list_deployments(
        &self,
        _: Request<v1::EnvRequest>,
    ) -> Result<Response<v1::ListDeploymentsResponse>, Status> {
        unimpl()
    }
    async fn fork(
        &self,
        _: Request<v1::ForkRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        unimpl()
    }
    async fn snapshot(
        &self,
        _: Request<v1::EnvRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        unimpl()
    }
    async fn rollback(
        &self,
        _: Request<v1::RollbackRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        unimpl()
    }
    async fn verify(
        &self,
        _: Request<v1::VerifyRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        unimpl()
    }
    async fn exec(
        &self,
        _: Request<v1::ExecRequest>,
    ) -> Result<Response<v1::ExecResponse>, Status> {
        // What the control plane answers when the host did not answer in time.
        let mut s = Status::deadline_exceeded("timed out after 11s");
        s.metadata_mut()
            .insert(denv_client::HTTP_STATUS_KEY, "504".parse().unwrap());
        Err(s)
    }
    async fn put_files(
        &self,
        req: Request<v1::PutFilesRequest>,
    ) -> Result<Response<v1::PutFilesResponse>, Status> {
        let r = req.into_inner();
        let n = r.tar.len() as i32;
        *self.last.lock().unwrap() = r.tar;
        Ok(Response::new(v1::PutFilesResponse { ok: true, bytes: n }))
    }
    async fn get_files(
        &self,
        _: Request<v1::GetFilesRequest>,
    ) -> Result<Response<v1::GetFilesResponse>, Status> {
        Ok(Response::new(v1::GetFilesResponse {
            tar: self.last.lock().unwrap().clone(),
        }))
    }
    async fn destroy(
        &self,
        _: Request<v1::EnvRequest>,
    ) -> Result<Response<v1::DestroyResponse>, Status> {
        unimpl()
    }
    async fn list_all_envs(
        &self,
        _: Request<v1::ListAllEnvsRequest>,
    ) -> Result<Response<v1::ListAllEnvsResponse>, Status> {
        unimpl()
    }
    type LogsStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<v1::LogEntry, Status>> + Send>>;
    async fn logs(
        &self,
        _: Request<v1::LogsRequest>,
    ) -> Result<Response<Self::LogsStream>, Status> {
        unimpl()
    }
}

const BIG: usize = 64 * 1024 * 1024;

async fn serve(deployments: Scripted) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(HealthServiceServer::new(EchoHealth))
            .add_service(DeploymentServiceServer::new(deployments))
            .add_service(
                EnvironmentServiceServer::new(Files::default())
                    .max_decoding_message_size(BIG)
                    .max_encoding_message_size(BIG),
            )
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    format!("http://{addr}")
}

fn script() -> Vec<v1::DeploymentResponse> {
    vec![
        dep("running", &[("resolve", "running"), ("verdict", "pending")]),
        dep("running", &[("resolve", "ok"), ("verdict", "running")]),
        dep("succeeded", &[("resolve", "ok"), ("verdict", "ok")]),
    ]
}

#[tokio::test]
async fn every_call_carries_the_bearer_key_and_team() {
    let url = serve(Scripted {
        states: script(),
        watch_fails: false,
        gets: Default::default(),
    })
    .await;
    let c = Client::connect(&url, Some("dak_local"), Some("team_7")).unwrap();
    let h = c.health(Default::default()).await.unwrap();
    assert_eq!(h.status, "Bearer dak_local|team_7");
    let c = Client::connect(&format!("{url}/"), None, None).unwrap();
    let h = c.health(Default::default()).await.unwrap();
    assert_eq!(h.status, "-|-");
}

#[tokio::test]
async fn wait_follows_the_stream_and_reports_each_change_once() {
    let gets = Arc::new(Mutex::new(0));
    let url = serve(Scripted {
        states: script(),
        watch_fails: false,
        gets: gets.clone(),
    })
    .await;
    let c = Client::connect(&url, Some("dak_local"), None).unwrap();
    let mut seen = vec![];
    let last = c
        .wait_deployment("dep_1", |d| seen.push(d.clone()))
        .await
        .unwrap();
    assert_eq!(seen, script());
    assert_eq!(last.deployment.unwrap().status, "succeeded");
    assert_eq!(*gets.lock().unwrap(), 0, "the stream sufficed; no polling");
}

#[tokio::test]
async fn wait_falls_back_to_polling_when_the_stream_errors() {
    let gets = Arc::new(Mutex::new(0));
    let url = serve(Scripted {
        states: script(),
        watch_fails: true,
        gets: gets.clone(),
    })
    .await;
    let c = Client::connect(&url, Some("dak_local"), None).unwrap();
    let mut seen = vec![];
    let t0 = std::time::Instant::now();
    let last = c
        .wait_deployment("dep_1", |d| seen.push(d.clone()))
        .await
        .unwrap();
    // First state from the stream, then the poll serves states 0 (unchanged, not
    // reported), 1 and 2.
    assert_eq!(seen, script());
    assert_eq!(last.deployment.unwrap().status, "succeeded");
    assert_eq!(*gets.lock().unwrap(), 3);
    assert!(t0.elapsed() >= std::time::Duration::from_millis(1400));
}

#[tokio::test]
async fn server_errors_keep_code_and_message() {
    let url = serve(Scripted {
        states: script(),
        watch_fails: false,
        gets: Default::default(),
    })
    .await;
    let c = Client::connect(&url, Some("dak_local"), None).unwrap();
    let e = c
        .get_env(v1::EnvRequest {
            env: "env_x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::NotFound);
    assert_eq!(e.to_string(), "environment not found");
    assert_eq!(e.http_status, None, "no x-denv-http-status, no status");
    // The status the server sent travels with the error.
    let e = c.exec(Default::default()).await.unwrap_err();
    assert_eq!(e.code, Code::DeadlineExceeded);
    assert_eq!(e.http_status, Some(504));
    assert_eq!(e.to_string(), "timed out after 11s");
    // Polling a deployment that does not exist is an error, not a hang.
    let e = c.wait_deployment("dep_nope", |_| {}).await.unwrap_err();
    assert_eq!(e.code, Code::NotFound);
    // A service the server does not have.
    let e = c.me(Default::default()).await.unwrap_err();
    assert_eq!(e.code, Code::Unimplemented);
}

#[tokio::test]
async fn files_of_tens_of_mebibytes_travel_both_ways() {
    let url = serve(Scripted {
        states: script(),
        watch_fails: false,
        gets: Default::default(),
    })
    .await;
    let c = Client::connect(&url, Some("dak_local"), None).unwrap();
    // Over tonic's 4 MiB default, under the 32 MiB archive limit.
    let body: Vec<u8> = (0..30 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    let r = c
        .put_files(v1::PutFilesRequest {
            env: "env_1".into(),
            service: "box".into(),
            path: "/work".into(),
            tar: body.clone(),
        })
        .await
        .unwrap();
    assert_eq!(r.bytes, body.len() as i32);
    let back = c
        .get_files(v1::GetFilesRequest {
            env: "env_1".into(),
            service: "box".into(),
            path: "/work".into(),
        })
        .await
        .unwrap();
    assert!(back.tar == body);
}

/// Answers `Health` with the control plane's rate-limit refusal for the first `refuse`
/// calls (`retry-after` when `wait` is set), then `ok`; counts the calls.
struct Limited {
    refuse: usize,
    wait: Option<&'static str>,
    calls: Arc<Mutex<usize>>,
}

#[tonic::async_trait]
impl HealthService for Limited {
    async fn health(
        &self,
        _req: Request<v1::HealthRequest>,
    ) -> Result<Response<v1::HealthResponse>, Status> {
        let n = {
            let mut c = self.calls.lock().unwrap();
            *c += 1;
            *c
        };
        if n <= self.refuse {
            let mut s = Status::resource_exhausted(
                "rate limited: too many requests for this credential; retry in 1 s",
            );
            if let Some(w) = self.wait {
                s.metadata_mut().insert("retry-after", w.parse().unwrap());
            }
            return Err(s);
        }
        Ok(Response::new(v1::HealthResponse {
            status: "ok".into(),
        }))
    }
}

async fn serve_limited(l: Limited) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(HealthServiceServer::new(l))
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn rate_limited_calls_wait_and_are_sent_again() {
    let calls = Arc::new(Mutex::new(0));
    let url = serve_limited(Limited {
        refuse: 2,
        wait: Some("1"),
        calls: calls.clone(),
    })
    .await;
    let c = Client::connect(&url, Some("dak_local"), None).unwrap();
    let t = std::time::Instant::now();
    assert_eq!(c.health(v1::HealthRequest {}).await.unwrap().status, "ok");
    assert_eq!(*calls.lock().unwrap(), 3);
    let took = t.elapsed();
    assert!(took >= std::time::Duration::from_secs(2), "waited {took:?}");
    assert!(took < std::time::Duration::from_secs(4), "waited {took:?}");

    // Without retry-after it is another error: reported at once, not retried.
    let calls = Arc::new(Mutex::new(0));
    let url = serve_limited(Limited {
        refuse: 1,
        wait: None,
        calls: calls.clone(),
    })
    .await;
    let c = Client::connect(&url, Some("dak_local"), None).unwrap();
    let e = c.health(v1::HealthRequest {}).await.unwrap_err();
    assert_eq!(e.code, Code::ResourceExhausted);
    assert_eq!(*calls.lock().unwrap(), 1);

    // A limit that does not lift gives up after the retries, with the server's message.
    let calls = Arc::new(Mutex::new(0));
    let url = serve_limited(Limited {
        refuse: usize::MAX,
        wait: Some("0"),
        calls: calls.clone(),
    })
    .await;
    let c = Client::connect(&url, Some("dak_local"), None).unwrap();
    let e = c.health(v1::HealthRequest {}).await.unwrap_err();
    assert_eq!(e.code, Code::ResourceExhausted);
    assert!(e.to_string().starts_with("rate limited: "), "{e}");
    assert_eq!(
        *calls.lock().unwrap(),
        1 + denv_client::RATE_LIMIT_RETRIES as usize
    );
}
