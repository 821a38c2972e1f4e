//! Small helpers of the hub: ids, clock, secrets, the stored form of commands, events.

use super::HubError;
use denv_proto::v1::{command, command_result, Command, CommandResult};
use prost::Message;
use sea_orm::ConnectionTrait;
use serde_json::Value;
use std::time::Duration;

pub(crate) use crate::ids::{ct_eq, new_id};
pub use crate::ids::{hash_secret, new_secret};
pub(crate) use crate::store::now;

/// A duration as Go prints it (`15m0s`, `2m10s`, `1h0m0s`, `1.5s`, `250ms`), the format
/// of the `timed out after …` messages.
pub fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let total = d.as_secs();
    let (h, m, s) = (total / 3600, (total % 3600) / 60, total % 60);
    let frac = d.subsec_millis();
    let secs = if frac == 0 {
        format!("{s}s")
    } else {
        format!("{s}.{}s", format!("{frac:03}").trim_end_matches('0'))
    };
    if h > 0 {
        format!("{h}h{m}m{secs}")
    } else if m > 0 {
        format!("{m}m{secs}")
    } else {
        secs
    }
}

/// The protocol kind of a payload (`env.create`, …).
pub(crate) fn kind_of(p: &command::Payload) -> &'static str {
    use command::Payload as P;
    match p {
        P::HostReport(_) => "host.report",
        P::EnvCreate(_) => "env.create",
        P::EnvSnapshot(_) => "env.snapshot",
        P::EnvFork(_) => "env.fork",
        P::EnvRollback(_) => "env.rollback",
        P::EnvExec(_) => "env.exec",
        P::EnvPut(_) => "env.put",
        P::EnvGet(_) => "env.get",
        P::VerifyCollect(_) => "verify.collect",
        P::VerifyRun(_) => "verify.run",
        P::EnvDestroy(_) => "env.destroy",
        P::ImageBuild(_) => "image.build",
        P::EnvLogs(_) => "env.logs",
        P::CommandCancel(_) => "command.cancel",
        P::SnapshotSend(_) => "snapshot.send",
        P::SnapshotReceive(_) => "snapshot.receive",
        P::ImageSend(_) => "image.send",
        P::ImageReceive(_) => "image.receive",
    }
}

/// Empties the bulk fields of a command (tar archives, exec stdin) and the tokens of
/// `snapshot.receive` / `image.receive`; the bytes emptied.
/// These are never written to the `commands` table.
fn strip_command(cmd: &mut Command) -> i64 {
    use command::Payload as P;
    let taken = match &mut cmd.payload {
        Some(P::EnvPut(p)) => std::mem::take(&mut p.tar),
        Some(P::ImageBuild(b)) => std::mem::take(&mut b.context),
        Some(P::EnvExec(e)) => std::mem::take(&mut e.stdin),
        // A shipment's one-time token is never stored (the source holds its hash).
        Some(P::SnapshotReceive(r)) => std::mem::take(&mut r.token).into_bytes(),
        Some(P::ImageReceive(r)) => std::mem::take(&mut r.token).into_bytes(),
        _ => Vec::new(),
    };
    taken.len() as i64
}

/// Empties the bulk fields of a result (a `files get` archive); the bytes emptied.
fn strip_result(res: &mut CommandResult) -> i64 {
    match &mut res.payload {
        Some(command_result::Payload::EnvGet(g)) => std::mem::take(&mut g.tar).len() as i64,
        _ => 0,
    }
}

/// What the `message` and `left_out` columns hold for `cmd`: its encoding without its
/// bulk bytes, and how many were left out (such a command can be sent again only from
/// memory).
pub(crate) fn stored_command(cmd: &Command) -> (Vec<u8>, i64) {
    let mut kept = cmd.clone();
    let left_out = strip_command(&mut kept);
    (kept.encode_to_vec(), left_out)
}

/// What the `result` and `result_left_out` columns hold for `res`.
pub(crate) fn stored_result(res: &CommandResult) -> (Vec<u8>, i64) {
    let mut kept = res.clone();
    let left_out = strip_result(&mut kept);
    (kept.encode_to_vec(), left_out)
}

/// The command frame of a stored row (for re-delivery after a reconnect). A row whose
/// bulk bytes were left out ([`stored_command`]) decodes without them: check
/// `left_out` first.
pub(crate) fn command_from_row(row: &crate::store::commands::Model) -> Result<Command, String> {
    let cmd = Command::decode(row.message.as_slice())
        .map_err(|e| format!("command {}: stored message: {e}", row.id))?;
    if cmd.payload.is_none() {
        return Err(format!("command {}: stored message has no payload", row.id));
    }
    Ok(cmd)
}

/// The outcome a closed row records, as [`super::Hub::send`] returns it: `done` → its
/// result payload (decoded from the `result` column); `failed` → the row's error as
/// [`HubError::Failed`], with the code of the stored result (`Unspecified` for a row
/// failed here, by a timeout, without one). `None` for an open row (`sent`/`acked`). A
/// stored result whose bulk bytes were left out cannot be rebuilt: [`HubError::Protocol`].
pub(crate) fn outcome_of_row(
    row: &crate::store::commands::Model,
) -> Option<Result<command_result::Payload, HubError>> {
    use crate::store::commands::{DONE, FAILED};
    match row.status.as_str() {
        DONE => Some(payload_of_result_row(row)),
        FAILED => Some(Err(HubError::Failed {
            code: row
                .result
                .as_deref()
                .and_then(|b| CommandResult::decode(b).ok())
                .map(|r| r.code())
                .unwrap_or_default(),
            message: row.error.clone(),
        })),
        _ => None,
    }
}

fn payload_of_result_row(
    row: &crate::store::commands::Model,
) -> Result<command_result::Payload, HubError> {
    let bad = |e: String| HubError::Protocol(format!("stored result of {}: {e}", row.id));
    if row.result_left_out > 0 {
        return Err(bad("its bytes are not kept; run it again".into()));
    }
    let bytes = row
        .result
        .as_deref()
        .ok_or_else(|| bad("none stored".into()))?;
    let res = CommandResult::decode(bytes).map_err(|e| bad(e.to_string()))?;
    res.payload.ok_or_else(|| bad("it has no payload".into()))
}

/// Appends an event (`events` table); a store failure is logged, not returned (an
/// event never fails the frame that caused it).
pub(crate) async fn append_event_logged<C: ConnectionTrait>(
    db: &C,
    team_id: &str,
    subject: &str,
    kind: &str,
    body: Value,
) {
    if let Err(e) = crate::store::events::append(db, team_id, subject, kind, body).await {
        tracing::error!(subject, kind, error = %e, "appending event failed");
    }
}

/// How often a command whose host may be on another replica has its row read.
pub(crate) const ROW_POLL: Duration = Duration::from_millis(250);

/// Waits until the command's row is closed (`done`/`failed`, by whichever replica
/// recorded it) and returns its outcome; a row that cannot be read is read again. Not
/// read while `local()` holds (the host's stream is here: its result frame answers the
/// waiter, with any bulk bytes the row does not keep).
pub(crate) async fn row_outcome(
    db: &sea_orm::DatabaseConnection,
    id: &str,
    local: impl Fn() -> bool,
) -> Result<command_result::Payload, HubError> {
    loop {
        tokio::time::sleep(ROW_POLL).await;
        if local() {
            continue;
        }
        match crate::store::commands::get(db, id).await {
            Ok(Some(row)) => {
                if let Some(o) = outcome_of_row(&row) {
                    return o;
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(command_id = id, error = %e, "reading a command row"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ship_tokens_are_not_stored() {
        let cmd = Command {
            command_id: "cmd_1".into(),
            kind: "snapshot.receive".into(),
            env_id: "env_1".into(),
            payload: Some(command::Payload::SnapshotReceive(v1::SnapshotReceive {
                snapshot: "ver_1".into(),
                volumes: vec!["w".into()],
                url: "http://10.0.0.2:7070/v1/ship/off_1".into(),
                token: "dsh_secret".into(),
                max_bytes: 1 << 20,
            })),
        };
        let (bytes, left_out) = stored_command(&cmd);
        assert_eq!(left_out, "dsh_secret".len() as i64);
        let back = Command::decode(bytes.as_slice()).unwrap();
        match back.payload {
            Some(command::Payload::SnapshotReceive(s)) => {
                assert_eq!((s.token.as_str(), s.snapshot.as_str()), ("", "ver_1"))
            }
            other => panic!("{other:?}"),
        }
        let cmd = Command {
            command_id: "cmd_2".into(),
            kind: "image.receive".into(),
            env_id: "env_1".into(),
            payload: Some(command::Payload::ImageReceive(v1::ImageReceive {
                image_ids: vec![format!("sha256:{}", "a".repeat(64))],
                url: "http://10.0.0.2:7070/v1/images/off_2".into(),
                token: "dsh_other".into(),
            })),
        };
        let (bytes, left_out) = stored_command(&cmd);
        assert_eq!(left_out, "dsh_other".len() as i64);
        match Command::decode(bytes.as_slice()).unwrap().payload {
            Some(command::Payload::ImageReceive(r)) => assert_eq!(r.token, ""),
            other => panic!("{other:?}"),
        }
    }
    use denv_proto::v1;

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(Duration::from_secs(900)), "15m0s");
        assert_eq!(go_duration(Duration::from_secs(130)), "2m10s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(go_duration(Duration::from_secs(5)), "5s");
    }

    #[test]
    fn secrets_hash_and_compare() {
        let s = new_secret("dhs");
        assert!(s.starts_with("dhs_") && s.len() == 68);
        assert!(ct_eq(&hash_secret(&s), &hash_secret(&s)));
        assert!(!ct_eq(&hash_secret(&s), &hash_secret("dhs_x")));
        assert_eq!(
            hash_secret("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    fn row(cmd: &Command) -> crate::store::commands::Model {
        let (message, left_out) = stored_command(cmd);
        crate::store::commands::Model {
            id: cmd.command_id.clone(),
            team_id: "team_1".into(),
            host_id: "host_1".into(),
            env_id: cmd.env_id.clone(),
            status: "sent".into(),
            message,
            left_out,
            result: None,
            result_left_out: 0,
            error: String::new(),
            created_at: String::new(),
            updated_at: String::new(),
        }
    }

    #[test]
    fn a_command_round_trips_through_its_row() {
        let cmd = Command {
            command_id: "cmd_1".into(),
            kind: "env.create".into(),
            env_id: "env_1".into(),
            payload: Some(command::Payload::EnvCreate(v1::EnvCreate {
                version: "ver_1".into(),
                ..Default::default()
            })),
        };
        let r = row(&cmd);
        assert_eq!(r.left_out, 0);
        assert_eq!(command_from_row(&r).unwrap(), cmd);
        // A row that is not a command is refused by name, not sent.
        let junk = crate::store::commands::Model {
            message: b"\xff\xffnot protobuf".to_vec(),
            ..r.clone()
        };
        assert!(command_from_row(&junk)
            .unwrap_err()
            .starts_with("command cmd_1: stored message"));
        let empty = crate::store::commands::Model {
            message: Vec::new(),
            ..r
        };
        assert_eq!(
            command_from_row(&empty).unwrap_err(),
            "command cmd_1: stored message has no payload"
        );
    }

    #[test]
    fn bulk_bytes_are_not_stored() {
        let put = Command {
            command_id: "cmd_1".into(),
            kind: "env.put".into(),
            env_id: "env_1".into(),
            payload: Some(command::Payload::EnvPut(v1::EnvPut {
                service: "box".into(),
                path: "/work".into(),
                tar: vec![7u8; 1000],
            })),
        };
        let r = row(&put);
        assert_eq!(r.left_out, 1000);
        assert!(r.message.len() < 100, "{} bytes stored", r.message.len());
        let Some(command::Payload::EnvPut(p)) = command_from_row(&r).unwrap().payload else {
            panic!()
        };
        assert_eq!(
            (p.service.as_str(), p.path.as_str(), p.tar.len()),
            ("box", "/work", 0)
        );

        let exec = |stdin: &[u8]| Command {
            kind: "env.exec".into(),
            payload: Some(command::Payload::EnvExec(v1::EnvExec {
                cmd: vec!["cat".into()],
                stdin: stdin.to_vec(),
                ..Default::default()
            })),
            ..put.clone()
        };
        assert_eq!(row(&exec(b"")).left_out, 0, "no stdin: nothing left out");
        assert_eq!(row(&exec(b"secret")).left_out, 6);
        let build = Command {
            kind: "image.build".into(),
            payload: Some(command::Payload::ImageBuild(v1::ImageBuild {
                context: vec![1; 64],
                ..Default::default()
            })),
            ..put.clone()
        };
        assert_eq!(row(&build).left_out, 64);

        let got = CommandResult {
            command_id: "cmd_2".into(),
            ok: true,
            payload: Some(command_result::Payload::EnvGet(v1::GetResult {
                tar: vec![1; 10],
            })),
            ..Default::default()
        };
        let (bytes, left_out) = stored_result(&got);
        assert_eq!(left_out, 10);
        let done = crate::store::commands::Model {
            status: "done".into(),
            result: Some(bytes),
            result_left_out: left_out,
            ..row(&put)
        };
        match outcome_of_row(&done) {
            Some(Err(HubError::Protocol(m))) => {
                assert_eq!(
                    m,
                    "stored result of cmd_1: its bytes are not kept; run it again"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_finished_row_answers_with_its_result_or_its_error() {
        let exec = Command {
            command_id: "cmd_3".into(),
            kind: "env.exec".into(),
            env_id: "env_1".into(),
            payload: Some(command::Payload::EnvExec(v1::EnvExec::default())),
        };
        let out = CommandResult {
            command_id: "cmd_3".into(),
            ok: true,
            payload: Some(command_result::Payload::EnvExec(v1::ExecOutput {
                exit_code: 3,
                stdout: "hi".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let (result, result_left_out) = stored_result(&out);
        let done = crate::store::commands::Model {
            status: "done".into(),
            result: Some(result),
            result_left_out,
            ..row(&exec)
        };
        match outcome_of_row(&done) {
            Some(Ok(command_result::Payload::EnvExec(o))) => {
                assert_eq!((o.exit_code, o.stdout.as_str()), (3, "hi"))
            }
            other => panic!("{other:?}"),
        }
        let failed = crate::store::commands::Model {
            status: "failed".into(),
            error: "timed out after 5s".into(),
            ..row(&exec)
        };
        match outcome_of_row(&failed) {
            Some(Err(HubError::Failed { code, message })) => {
                assert_eq!(message, "timed out after 5s");
                assert_eq!(code, v1::HostErrorCode::Unspecified);
            }
            other => panic!("{other:?}"),
        }
        // A failure the host answered keeps its code (another replica recorded it).
        let refused = CommandResult {
            command_id: "cmd_3".into(),
            ok: false,
            error: "service \"box\" of env_1 not found".into(),
            code: v1::HostErrorCode::NotFound.into(),
            payload: None,
        };
        let (result, _) = stored_result(&refused);
        let failed = crate::store::commands::Model {
            status: "failed".into(),
            error: refused.error.clone(),
            result: Some(result),
            ..row(&exec)
        };
        match outcome_of_row(&failed) {
            Some(Err(HubError::Failed { code, message })) => {
                assert_eq!(message, refused.error);
                assert_eq!(code, v1::HostErrorCode::NotFound);
            }
            other => panic!("{other:?}"),
        }
        assert!(
            outcome_of_row(&row(&exec)).is_none(),
            "an open row has no outcome"
        );
        let lost = crate::store::commands::Model {
            status: "done".into(),
            ..row(&exec)
        };
        assert!(matches!(
            outcome_of_row(&lost),
            Some(Err(HubError::Protocol(_)))
        ));
    }
}
