//! The relay between replicas (`proto/denv/v1/relay.proto`, replica mode only): a
//! command for a host whose stream another replica holds is handed to that replica,
//! which runs its own send path (`Hub::send_command`: it writes the `commands` row,
//! the ack, the result and the progress events, once) and streams the command's output
//! frames and then its outcome back.
//!
//! Calls carry `authorization: Bearer <DENV_REPLICA_SECRET>`, compared in constant
//! time; anything else is `UNAUTHENTICATED`. Without replica mode the service is not
//! mounted (`UNIMPLEMENTED`).

use super::{Hub, HubError, OutputSender};
use crate::replica::{Remote, Replica};
use denv_proto::v1::{
    command_result, relay_client::RelayClient, relay_frame, relay_server, Command, CommandResult,
    RelayFrame, RelayRequest, RelayResult,
};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// The mounted service type.
pub type RelayServer = relay_server::RelayServer<RelayService>;

/// The `denv.v1.Relay` service of one replica.
#[derive(Clone)]
pub struct RelayService {
    hub: Hub,
}

/// The service over `hub` (64 MiB messages both ways, as the host stream).
pub(crate) fn server(hub: Hub) -> RelayServer {
    relay_server::RelayServer::new(RelayService { hub })
        .max_decoding_message_size(super::MAX_FRAME_BYTES)
        .max_encoding_message_size(super::MAX_FRAME_BYTES)
}

fn bearer<T>(req: &Request<T>) -> Option<&str> {
    req.metadata()
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

#[tonic::async_trait]
impl relay_server::Relay for RelayService {
    type SendStream = ReceiverStream<Result<RelayFrame, Status>>;

    async fn send(
        &self,
        request: Request<RelayRequest>,
    ) -> Result<Response<Self::SendStream>, Status> {
        let Some(rep) = self.hub.replica() else {
            return Err(Status::unimplemented("replica mode is off"));
        };
        if !bearer(&request).is_some_and(|t| rep.secret_matches(t)) {
            return Err(Status::unauthenticated("replica secret rejected"));
        }
        let r = request.into_inner();
        let cmd = r
            .command
            .ok_or_else(|| Status::invalid_argument("command missing"))?;
        if cmd.payload.is_none() || cmd.command_id.is_empty() {
            return Err(Status::invalid_argument("command without id or payload"));
        }
        let (tx, rx) = mpsc::channel::<Result<RelayFrame, Status>>(64);
        let hub = self.hub.clone();
        tokio::spawn(async move {
            let (otx, mut orx) = mpsc::unbounded_channel();
            let output = r.stream.then_some((otx, r.cancellable));
            let ptx = tx.clone();
            let pump = tokio::spawn(async move {
                while let Some(p) = orx.recv().await {
                    let f = RelayFrame {
                        frame: Some(relay_frame::Frame::Progress(p)),
                    };
                    if ptx.send(Ok(f)).await.is_err() {
                        return;
                    }
                }
            });
            let id = cmd.command_id.clone();
            let sent = hub.send_command(
                &r.team_id,
                &r.host_id,
                cmd,
                // Any row under the id is this command's: answered from or sent again.
                true,
                false,
                Duration::from_millis(r.timeout_ms),
                output,
            );
            // The asking replica left (its caller did): the send is dropped, which
            // cancels a cancellable command on the host.
            let outcome = tokio::select! {
                o = sent => o,
                _ = tx.closed() => return,
            };
            let _ = pump.await;
            let result = to_wire(&id, outcome);
            let _ = tx
                .send(Ok(RelayFrame {
                    frame: Some(relay_frame::Frame::Result(result)),
                }))
                .await;
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

type Outcome = Result<(String, Result<command_result::Payload, HubError>), HubError>;

fn to_wire(id: &str, o: Outcome) -> RelayResult {
    let mut r = RelayResult {
        command_id: id.to_string(),
        ..Default::default()
    };
    let err = match o {
        Err(e) => {
            r.before_recorded = true;
            e
        }
        Ok((cid, Ok(p))) => {
            r.command_id = cid.clone();
            r.result = Some(CommandResult {
                command_id: cid,
                ok: true,
                payload: Some(p),
                ..Default::default()
            });
            return r;
        }
        Ok((cid, Err(e))) => {
            r.command_id = cid;
            e
        }
    };
    match err {
        HubError::Failed { code, message } => {
            r.result = Some(CommandResult {
                command_id: r.command_id.clone(),
                ok: false,
                error: message,
                code: code.into(),
                payload: None,
            })
        }
        HubError::UnknownHost(h) => (r.error_kind, r.error) = ("unknown_host".into(), h),
        HubError::NoHost => (r.error_kind, r.error) = ("no_host".into(), String::new()),
        HubError::NotConnected { host_id, after } => {
            (r.error_kind, r.error) = ("not_connected".into(), host_id);
            r.after = after.unwrap_or_default();
        }
        HubError::Timeout(a) => (r.error_kind, r.after) = ("timeout".into(), a),
        HubError::Protocol(s) => (r.error_kind, r.error) = ("protocol".into(), s),
        HubError::UnexpectedResult(k) => {
            (r.error_kind, r.error) = ("protocol".into(), format!("unexpected result for {k}"))
        }
        HubError::Db(e) => (r.error_kind, r.error) = ("store".into(), e.to_string()),
    }
    r
}

fn from_wire(r: RelayResult) -> Outcome {
    let err = match (r.result, r.error_kind.as_str()) {
        (Some(res), _) => {
            let id = r.command_id;
            return Ok((id, super::result_of(res)));
        }
        (None, "unknown_host") => HubError::UnknownHost(r.error),
        (None, "no_host") => HubError::NoHost,
        (None, "not_connected") => HubError::NotConnected {
            host_id: r.error,
            after: Some(r.after).filter(|a| !a.is_empty()),
        },
        (None, "timeout") => HubError::Timeout(r.after),
        (None, "store") => HubError::Db(sea_orm::DbErr::Custom(r.error)),
        (None, _) => HubError::Protocol(r.error),
    };
    if r.before_recorded {
        Err(err)
    } else {
        Ok((r.command_id, Err(err)))
    }
}

/// What [`forward`] got.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Forwarded {
    /// The holding replica ran the command (or the row it wrote was closed since).
    Done(Outcome),
    /// The holding replica could not be called: nothing was recorded by it.
    Unreached(String),
}

/// Hands `cmd` to the replica holding the host's stream and waits for its outcome
/// (`timeout`, plus a margin for the answer to travel). Output frames go to `output`.
/// When the call breaks after it started (the holder died), the command's row is
/// watched until it is closed (the host reconnects to a replica, which sends it again)
/// or the timeout passes (then the row is failed here).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn forward(
    hub: &Hub,
    rep: &Replica,
    remote: &Remote,
    team_id: &str,
    host_id: &str,
    cmd: &Command,
    keyed: bool,
    timeout: Duration,
    output: Option<&(OutputSender, bool)>,
) -> Forwarded {
    let deadline = tokio::time::Instant::now() + timeout;
    let channel = match rep.endpoint(&remote.url) {
        Ok(e) => e.connect_timeout(Duration::from_secs(5)).connect_lazy(),
        Err(e) => return Forwarded::Unreached(format!("replica url {}: {e}", remote.url)),
    };
    let mut client = RelayClient::new(channel)
        .max_decoding_message_size(super::MAX_FRAME_BYTES)
        .max_encoding_message_size(super::MAX_FRAME_BYTES);
    let mut req = Request::new(RelayRequest {
        team_id: team_id.to_string(),
        host_id: host_id.to_string(),
        command: Some(cmd.clone()),
        timeout_ms: timeout.as_millis() as u64,
        stream: output.is_some(),
        cancellable: output.is_some_and(|(_, c)| *c),
        keyed,
    });
    match format!("Bearer {}", rep.secret()).parse() {
        Ok(v) => {
            req.metadata_mut().insert("authorization", v);
        }
        Err(_) => return Forwarded::Unreached("the replica secret is not a header value".into()),
    }
    tracing::debug!(command_id = %cmd.command_id, host_id, replica = %remote.replica_id, "command relayed");
    let mut stream = match client.send(req).await {
        Ok(r) => r.into_inner(),
        Err(s) => return Forwarded::Unreached(format!("{}: {}", s.code(), s.message())),
    };
    loop {
        match stream.message().await {
            Ok(Some(RelayFrame {
                frame: Some(relay_frame::Frame::Progress(p)),
            })) => {
                if let Some((o, _)) = output {
                    let _ = o.send(p);
                }
            }
            Ok(Some(RelayFrame {
                frame: Some(relay_frame::Frame::Result(r)),
            })) => return Forwarded::Done(from_wire(r)),
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    // The holder went away mid-command: its row says what happened, or will.
    tracing::warn!(command_id = %cmd.command_id, host_id, replica = %remote.replica_id, "relay broke; watching the command's row");
    let id = cmd.command_id.clone();
    let db = hub.db();
    let waited =
        tokio::time::timeout_at(deadline, super::util::row_outcome(db, &id, || false)).await;
    Forwarded::Done(match waited {
        Ok(o) => Ok((id, o)),
        Err(_) => {
            let after = super::go_duration(timeout);
            let msg = format!("timed out after {after}: host not connected");
            if let Err(e) =
                crate::store::commands::fail_open(db, &id, &msg, &super::util::now()).await
            {
                return Forwarded::Done(Err(e.into()));
            }
            Ok((
                id,
                Err(HubError::NotConnected {
                    host_id: host_id.to_string(),
                    after: Some(after),
                }),
            ))
        }
    })
}
