//! The `HostStream.Open` server: hello → welcome, then the read loop.

use super::util::{self, append_event_logged, command_from_row, now};
use super::{Conn, Hub};
use crate::domain::{EnvRow, EnvStatus};
use crate::orchestrator::repo;
use crate::store::{commands, hosts};
use denv_proto::v1::{
    control_frame, host_event, host_stream_server::HostStream, sidecar_frame, ControlFrame,
    SidecarFrame, Welcome,
};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// Frames buffered towards one sidecar.
const OUTBOUND_BUFFER: usize = 64;

/// The tonic service (obtain it with [`Hub::service`]).
#[derive(Clone)]
pub struct HubService {
    pub(crate) hub: Hub,
}

#[tonic::async_trait]
impl HostStream for HubService {
    type OpenStream = ReceiverStream<Result<ControlFrame, Status>>;

    async fn open(
        &self,
        request: Request<Streaming<SidecarFrame>>,
    ) -> Result<Response<Self::OpenStream>, Status> {
        let hub = self.hub.clone();
        let mut inbound = request.into_inner();
        let hello_timeout = hub.inner.opts.hello_timeout;
        let first = match tokio::time::timeout(hello_timeout, inbound.message()).await {
            Err(_) => {
                return Err(Status::permission_denied(format!(
                    "hello expected within {}",
                    super::go_duration(hello_timeout)
                )))
            }
            Ok(Err(s)) => return Err(s),
            Ok(Ok(None)) => return Err(Status::permission_denied("hello expected")),
            Ok(Ok(Some(f))) => f,
        };
        let Some(sidecar_frame::Frame::Hello(hello)) = first.frame else {
            return Err(Status::permission_denied("the first frame must be hello"));
        };
        let admitted = match hub.admit(&hello).await {
            Ok(a) => a,
            Err(s) => {
                tracing::warn!(host_id = %hello.host_id, reason = %s.message(), "host refused");
                return Err(s);
            }
        };

        let (tx, rx) = mpsc::channel(OUTBOUND_BUFFER);
        let welcome = ControlFrame {
            sent_at: now(),
            frame: Some(control_frame::Frame::Welcome(Welcome {
                host_id: admitted.host_id.clone(),
                secret: admitted.secret.clone().unwrap_or_default(),
                protocol: admitted.protocol,
            })),
        };
        // Capacity is OUTBOUND_BUFFER and the channel is fresh: this cannot block.
        let _ = tx.send(Ok(welcome)).await;

        let generation = hub.next_generation();
        let (stop_tx, stop_rx) = oneshot::channel();
        let old = hub.conns().insert(
            admitted.host_id.clone(),
            Conn {
                generation,
                team_id: admitted.team_id.clone(),
                tx: tx.clone(),
                _stop: stop_tx,
            },
        );
        if let Some(old) = old {
            tracing::info!(host_id = %admitted.host_id, "reconnect replaces the older stream");
            let _ = old.tx.try_send(Err(Status::aborted(
                "replaced by a newer connection of the same host",
            )));
        }
        tracing::info!(host_id = %admitted.host_id, generation, protocol = admitted.protocol, "host connected");
        if let Some(rep) = hub.replica() {
            // Before the open commands are sent again: a replica that wrote one after
            // this finds the host here and relays it.
            if let Err(e) = rep.hold_host(&admitted.host_id).await {
                tracing::error!(host_id = %admitted.host_id, error = %e, "recording the host's replica failed");
            }
        }

        // Commands still open are sent again, same ids, after the welcome.
        let resend_hub = hub.clone();
        let resend_host = admitted.host_id.clone();
        let resend_tx = tx.clone();
        tokio::spawn(async move {
            resend_open(&resend_hub, &resend_host, resend_tx).await;
        });

        tokio::spawn(read_loop(
            hub,
            admitted.host_id,
            admitted.team_id,
            generation,
            inbound,
            tx,
            stop_rx,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

async fn resend_open(hub: &Hub, host_id: &str, tx: mpsc::Sender<Result<ControlFrame, Status>>) {
    let rows = match commands::open_for_host(hub.db(), host_id).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(host_id, error = %e, "loading open commands failed");
            return;
        }
    };
    for row in rows {
        let whole = if row.left_out > 0 {
            let kept = hub
                .inner
                .bulk
                .lock()
                .ok()
                .and_then(|b| b.get(&row.id).cloned());
            let Some(cmd) = kept else {
                // Its caller is gone (a control-plane restart): nobody waits for it and
                // its bytes were never stored.
                let msg =
                    "its archive is not kept across control-plane restarts; send the files again";
                if let Err(e) = commands::fail_open(hub.db(), &row.id, msg, &now()).await {
                    tracing::error!(host_id, error = %e, "failing an unsendable command failed");
                }
                continue;
            };
            Ok(cmd)
        } else {
            command_from_row(&row)
        };
        match whole {
            Ok(cmd) => {
                tracing::info!(host_id, command_id = %row.id, kind = %cmd.kind, "re-sending open command");
                let frame = ControlFrame {
                    sent_at: now(),
                    frame: Some(control_frame::Frame::Command(cmd)),
                };
                if tx.send(Ok(frame)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                // Nothing can send it: its waiter (if any) gets the failure now, not at
                // its timeout.
                tracing::error!(host_id, error = %e, "cannot re-send command");
                if let Err(e) = commands::fail_open(hub.db(), &row.id, &e, &now()).await {
                    tracing::error!(host_id, error = %e, "failing an unreadable command failed");
                }
                hub.resolve(denv_proto::v1::CommandResult {
                    command_id: row.id.clone(),
                    ok: false,
                    error: e,
                    ..Default::default()
                });
            }
        }
    }
}

/// Reads frames until the stream ends, the grace window passes, or a newer stream of
/// the same host replaces this one.
async fn read_loop(
    hub: Hub,
    host_id: String,
    team_id: String,
    generation: u64,
    mut inbound: Streaming<SidecarFrame>,
    tx: mpsc::Sender<Result<ControlFrame, Status>>,
    mut stop: oneshot::Receiver<()>,
) {
    let grace = hub.inner.opts.grace;
    let reason: String = loop {
        let msg = tokio::select! {
            _ = &mut stop => {
                // Replaced: the newer stream owns the host's status now.
                tracing::debug!(%host_id, generation, "older stream stopped");
                return;
            }
            m = tokio::time::timeout(grace, inbound.message()) => m,
        };
        let frame = match msg {
            Err(_) => {
                let _ = tx.try_send(Err(Status::unavailable(format!(
                    "no frame for {}",
                    super::go_duration(grace)
                ))));
                break format!("no frame for {}", super::go_duration(grace));
            }
            Ok(Err(s)) => break format!("stream error: {}", s.message()),
            Ok(Ok(None)) => break "stream closed".to_string(),
            Ok(Ok(Some(f))) => f,
        };
        handle_frame(&hub, &host_id, &team_id, frame).await;
    };
    drop(tx);
    let mine = {
        let mut conns = hub.conns();
        match conns.get(&host_id) {
            Some(c) if c.generation == generation => {
                conns.remove(&host_id);
                true
            }
            _ => false,
        }
    };
    if mine {
        hub.forget_load(&host_id);
        if let Some(rep) = hub.replica() {
            // Unreachable unless another replica holds its stream by now.
            match rep.release_host(&host_id).await {
                Ok(true) => tracing::warn!(%host_id, %reason, "host unreachable"),
                Ok(false) => {
                    tracing::info!(%host_id, %reason, "stream ended; the host is on another replica")
                }
                Err(e) => tracing::error!(%host_id, error = %e, "marking host unreachable failed"),
            }
            return;
        }
        tracing::warn!(%host_id, %reason, "host unreachable");
        if let Err(e) = hosts::set_status(hub.db(), &host_id, hosts::STATUS_UNREACHABLE).await {
            tracing::error!(%host_id, error = %e, "marking host unreachable failed");
        }
    }
}

async fn handle_frame(hub: &Hub, host_id: &str, team_id: &str, frame: SidecarFrame) {
    let db = hub.db();
    let Some(f) = frame.frame else { return };
    match f {
        sidecar_frame::Frame::Heartbeat(h) => {
            if let Some(load) = h.load {
                hub.record_load(host_id, load);
                if let Some(rep) = hub.replica() {
                    if let Err(e) = rep.record_load(host_id, &load).await {
                        tracing::error!(host_id, error = %e, "recording the host's load failed");
                    }
                }
            }
            if let Err(e) = hosts::record_seen(db, host_id, &now()).await {
                tracing::error!(host_id, error = %e, "recording heartbeat failed");
            }
        }
        sidecar_frame::Frame::Hello(_) => {
            tracing::warn!(host_id, "unexpected hello on an open stream ignored");
        }
        sidecar_frame::Frame::Ack(a) => {
            if owned(hub, host_id, &a.command_id).await {
                if let Err(e) = commands::mark_acked(db, &a.command_id, &now()).await {
                    tracing::error!(host_id, error = %e, "recording ack failed");
                }
            }
        }
        sidecar_frame::Frame::Progress(p) if !p.stdout.is_empty() || !p.stderr.is_empty() => {
            // Streamed exec output: to its caller only, never recorded.
            if !hub.route_output(host_id, p) {
                tracing::debug!(host_id, "output for a command nobody follows dropped");
            }
        }
        sidecar_frame::Frame::Progress(p) => {
            if owned(hub, host_id, &p.command_id).await {
                append_event_logged(
                    db,
                    team_id,
                    &format!("cmd:{}", p.command_id),
                    "progress",
                    serde_json::json!({ "message": p.message }),
                )
                .await;
            }
        }
        sidecar_frame::Frame::Result(r) => {
            if !owned(hub, host_id, &r.command_id).await {
                return;
            }
            let stored = util::stored_result(&r);
            match commands::record_result(db, &r.command_id, r.ok, stored, &r.error, &now()).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::info!(host_id, command_id = %r.command_id, "late or repeated result stored")
                }
                Err(e) => tracing::error!(host_id, error = %e, "recording result failed"),
            }
            hub.resolve(r);
        }
        sidecar_frame::Frame::Event(ev) => {
            let Some(ev) = ev.event else {
                // A sidecar older than the typed events (their `{kind, body}` fields
                // are reserved), or newer than this control plane.
                tracing::warn!(
                    host_id,
                    "event of a kind this control plane does not know ignored"
                );
                return;
            };
            if let host_event::Event::EnvFailed(f) = &ev {
                mark_failed(db, host_id, f).await;
            }
            if let Some(notice) = super::Notice::of(&ev) {
                // Nobody subscribed (tests of the hub alone) is fine.
                let _ = hub.inner.notices.send(super::HostNotice {
                    host_id: host_id.to_string(),
                    team_id: team_id.to_string(),
                    notice,
                });
            }
            let (kind, body) = super::event_record(&ev);
            append_event_logged(db, team_id, &format!("host:{host_id}"), kind, body).await;
        }
    }
}

/// `env.failed` from a sidecar (its containers died: killed, OOM, engine restart): a
/// `healthy` environment placed on that host becomes `failed`. Environments of other
/// hosts, and ones in any other status (a deployment is changing it), are left alone.
async fn mark_failed(
    db: &sea_orm::DatabaseConnection,
    host_id: &str,
    f: &denv_proto::v1::EnvFailed,
) {
    let env_id = f.env_id.as_str();
    match repo::env_row(db, env_id).await {
        Ok(Some(e)) if e.host_id == host_id && e.status() == EnvStatus::Healthy => {
            if let Err(err) = repo::set_env_status(db, env_id, EnvStatus::Failed).await {
                tracing::error!(host_id, env_id, error = %err, "marking environment failed");
            } else {
                tracing::warn!(host_id, env_id, reason = %f.reason, "environment failed on its host");
            }
        }
        Ok(_) => {}
        Err(err) => tracing::error!(host_id, env_id, error = %err, "loading environment"),
    }
}

/// Whether the command exists and is addressed to this host (a host cannot answer or
/// write events for another host's commands).
async fn owned(hub: &Hub, host_id: &str, command_id: &str) -> bool {
    match commands::get(hub.db(), command_id).await {
        Ok(Some(c)) if c.host_id == host_id => true,
        Ok(_) => {
            tracing::warn!(
                host_id,
                command_id,
                "frame for a command not addressed to this host ignored"
            );
            false
        }
        Err(e) => {
            tracing::error!(host_id, error = %e, "loading command failed");
            false
        }
    }
}
