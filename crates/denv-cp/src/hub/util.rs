//! Small helpers of the hub: ids, clock, secrets, JSON of payloads, events.

use super::HubError;
use denv_proto::json::to_json;
use denv_proto::v1::{command, command_result, Command, CommandResult};
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
    }
}

/// The oneof field name of a kind (`env.create` → `env_create`).
fn field_of(kind: &str) -> String {
    kind.replace('.', "_")
}

/// The JSON of a command's payload message (what the `payload` column holds).
pub(crate) fn payload_json(cmd: &Command) -> Value {
    let mut j = to_json(cmd);
    j.get_mut(field_of(&cmd.kind))
        .map(Value::take)
        .unwrap_or_else(|| Value::Object(Default::default()))
}

/// Fields of command payloads that hold bulk bytes (tar archives), by kind. They are
/// never written to the `commands` table: the stored JSON has the field emptied and
/// `not_stored: {<field>: <bytes>}` added (ignored when the row is read back).
const BULK_PAYLOAD_FIELDS: &[(&str, &str)] = &[
    ("env.put", "tar"),
    ("image.build", "context"),
    ("env.exec", "stdin"),
];
/// Fields of result payloads that hold bulk bytes, by the result's oneof field.
const BULK_RESULT_FIELDS: &[(&str, &str)] = &[("env_get", "tar")];

/// Empties the bulk fields of `j` named for `key` in `table`; whether any was emptied.
fn strip_bulk(table: &[(&str, &str)], key: &str, j: &mut Value) -> bool {
    let mut gone = serde_json::Map::new();
    for (_, field) in table.iter().filter(|(k, _)| *k == key) {
        if let Some(Value::String(b64)) = j.get_mut(*field).filter(|v| v != &"") {
            // base64: 4 characters per 3 bytes, less the padding.
            let bytes = b64.len() / 4 * 3 - b64.chars().rev().take_while(|c| *c == '=').count();
            gone.insert((*field).to_string(), Value::from(bytes));
            b64.clear();
        }
    }
    if gone.is_empty() {
        return false;
    }
    j["not_stored"] = Value::Object(gone);
    true
}

/// What the `payload` column holds for `cmd`: [`payload_json`] without its bulk fields,
/// and whether any was left out (such a command can be re-sent only from memory).
pub(crate) fn stored_payload_json(cmd: &Command) -> (Value, bool) {
    let mut j = payload_json(cmd);
    let stripped = strip_bulk(BULK_PAYLOAD_FIELDS, &cmd.kind, &mut j);
    (j, stripped)
}

/// Whether a stored payload had bulk fields left out: its top-level `not_stored` object
/// (an argument or a variable that merely contains the words does not count).
pub(crate) fn payload_was_stripped(row: &crate::store::commands::Model) -> bool {
    serde_json::from_str::<Value>(&row.payload)
        .is_ok_and(|v| v.get("not_stored").is_some_and(Value::is_object))
}

/// What the `result` column holds for `res`: [`result_json`] without its bulk fields.
pub(crate) fn stored_result_json(res: &CommandResult) -> Value {
    let mut j = result_json(res);
    if let Some(p) = &res.payload {
        strip_bulk(BULK_RESULT_FIELDS, result_field(p), &mut j);
    }
    j
}

/// The JSON of a result's payload message (what the `result` column holds; `{}` when
/// the result has none).
pub(crate) fn result_json(res: &CommandResult) -> Value {
    let Some(p) = &res.payload else {
        return Value::Object(Default::default());
    };
    let field = result_field(p);
    let mut j = to_json(res);
    j.get_mut(field)
        .map(Value::take)
        .unwrap_or_else(|| Value::Object(Default::default()))
}

fn result_field(p: &command_result::Payload) -> &'static str {
    use command_result::Payload as P;
    match p {
        P::HostReport(_) => "host_report",
        P::EnvCreate(_) => "env_create",
        P::EnvSnapshot(_) => "env_snapshot",
        P::EnvFork(_) => "env_fork",
        P::EnvRollback(_) => "env_rollback",
        P::EnvExec(_) => "env_exec",
        P::EnvPut(_) => "env_put",
        P::EnvGet(_) => "env_get",
        P::VerifyCollect(_) => "verify_collect",
        P::VerifyRun(_) => "verify_run",
        P::EnvDestroy(_) => "env_destroy",
        P::ImageBuild(_) => "image_build",
        P::EnvLogs(_) => "env_logs",
    }
}

/// The command frame of a stored row (for re-delivery after a reconnect).
pub(crate) fn command_from_row(row: &crate::store::commands::Model) -> Result<Command, String> {
    let payload: Value = if row.payload.is_empty() {
        Value::Object(Default::default())
    } else {
        serde_json::from_str(&row.payload).map_err(|e| format!("command {}: {e}", row.id))?
    };
    let mut j = serde_json::json!({
        "command_id": row.id,
        "kind": row.kind,
        "env_id": row.env_id,
    });
    j[field_of(&row.kind)] = payload;
    let cmd: Command =
        denv_proto::json::from_json(j).map_err(|e| format!("command {}: {e}", row.id))?;
    if cmd.payload.is_none() {
        return Err(format!("command {}: unknown kind {}", row.id, row.kind));
    }
    Ok(cmd)
}

/// The outcome a closed row records, as [`super::Hub::send`] returns it: `done` → its
/// result payload (rebuilt from the `result` column); `failed` → the row's error as
/// [`HubError::Failed`]. `None` for an open row (`sent`/`acked`). A stored result whose
/// bulk bytes were left out cannot be rebuilt: [`HubError::Protocol`].
pub(crate) fn outcome_of_row(
    row: &crate::store::commands::Model,
) -> Option<Result<command_result::Payload, HubError>> {
    use crate::store::commands::{DONE, FAILED};
    match row.status.as_str() {
        DONE => Some(payload_of_result_row(row)),
        FAILED => Some(Err(HubError::Failed(row.error.clone()))),
        _ => None,
    }
}

fn payload_of_result_row(
    row: &crate::store::commands::Model,
) -> Result<command_result::Payload, HubError> {
    let bad = |e: String| HubError::Protocol(format!("stored result of {}: {e}", row.id));
    let result: Value = if row.result.is_empty() {
        Value::Object(Default::default())
    } else {
        serde_json::from_str(&row.result).map_err(|e| bad(e.to_string()))?
    };
    if result.get("not_stored").is_some_and(Value::is_object) {
        return Err(bad("its bytes are not kept; run it again".into()));
    }
    let mut j = serde_json::json!({"command_id": row.id, "ok": true});
    j[field_of(&row.kind)] = result;
    let res: CommandResult = denv_proto::json::from_json(j).map_err(|e| bad(e.to_string()))?;
    res.payload
        .ok_or_else(|| bad(format!("no {} payload", row.kind)))
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

#[cfg(test)]
mod tests {
    use super::*;
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

    #[test]
    fn payload_round_trips_through_the_row() {
        let cmd = Command {
            command_id: "cmd_1".into(),
            kind: "env.put".into(),
            env_id: "env_1".into(),
            payload: Some(command::Payload::EnvPut(v1::EnvPut {
                service: "box".into(),
                path: "/work".into(),
                tar: vec![1, 2, 3, 255],
            })),
        };
        let j = payload_json(&cmd);
        assert_eq!(j["service"], "box");
        let row = crate::store::commands::Model {
            id: "cmd_1".into(),
            team_id: "team_1".into(),
            host_id: "host_1".into(),
            env_id: "env_1".into(),
            kind: "env.put".into(),
            payload: j.to_string(),
            status: "sent".into(),
            result: String::new(),
            error: String::new(),
            created_at: String::new(),
            updated_at: String::new(),
        };
        assert_eq!(command_from_row(&row).unwrap(), cmd);
    }

    #[test]
    fn tar_bytes_are_not_stored() {
        let cmd = Command {
            command_id: "cmd_1".into(),
            kind: "env.put".into(),
            env_id: "env_1".into(),
            payload: Some(command::Payload::EnvPut(v1::EnvPut {
                service: "box".into(),
                path: "/work".into(),
                tar: vec![7u8; 1000],
            })),
        };
        let (j, stripped) = stored_payload_json(&cmd);
        assert!(stripped);
        assert_eq!(j["tar"], "");
        assert_eq!(j["not_stored"]["tar"], 1000);
        assert_eq!(j["service"], "box");
        let exec = Command {
            kind: "env.exec".into(),
            payload: Some(command::Payload::EnvExec(v1::EnvExec::default())),
            ..cmd.clone()
        };
        assert!(!stored_payload_json(&exec).1, "no stdin: nothing left out");
        let with_stdin = Command {
            payload: Some(command::Payload::EnvExec(v1::EnvExec {
                stdin: b"secret".to_vec(),
                ..Default::default()
            })),
            ..exec.clone()
        };
        // An exec whose argument is the marker's own name is stored whole and is not
        // taken for a stripped one.
        let marker_arg = Command {
            payload: Some(command::Payload::EnvExec(v1::EnvExec {
                cmd: vec!["echo".into(), "\"not_stored\"".into(), "not_stored".into()],
                ..Default::default()
            })),
            ..exec.clone()
        };
        let (j, stripped) = stored_payload_json(&marker_arg);
        assert!(!stripped);
        let row = crate::store::commands::Model {
            id: "cmd_1".into(),
            team_id: String::new(),
            host_id: String::new(),
            env_id: String::new(),
            kind: "env.exec".into(),
            payload: j.to_string(),
            status: String::new(),
            result: String::new(),
            error: String::new(),
            created_at: String::new(),
            updated_at: String::new(),
        };
        assert!(!payload_was_stripped(&row), "{}", row.payload);
        let (j, stripped) = stored_payload_json(&with_stdin);
        assert!(payload_was_stripped(&crate::store::commands::Model {
            payload: j.to_string(),
            ..row.clone()
        }));
        assert!(stripped);
        assert_eq!(
            (j["stdin"].clone(), j["not_stored"]["stdin"].clone()),
            (Value::from(""), Value::from(6))
        );
        let r = CommandResult {
            command_id: "cmd_2".into(),
            ok: true,
            error: String::new(),
            payload: Some(command_result::Payload::EnvGet(v1::GetResult {
                tar: vec![1; 10],
            })),
        };
        let j = stored_result_json(&r);
        assert_eq!(
            (j["tar"].clone(), j["not_stored"]["tar"].clone()),
            (Value::from(""), Value::from(10))
        );
        assert_eq!(
            result_json(&r)["tar"].as_str().unwrap().len(),
            16,
            "what the caller gets is whole"
        );
    }

    #[test]
    fn result_json_is_the_inner_message() {
        let r = CommandResult {
            command_id: "cmd_1".into(),
            ok: true,
            error: String::new(),
            payload: Some(command_result::Payload::EnvExec(v1::ExecOutput {
                exit_code: 3,
                stdout: "hi".into(),
                stderr: String::new(),
                ..Default::default()
            })),
        };
        let j = result_json(&r);
        assert_eq!(j["exit_code"], 3);
        assert_eq!(j["stdout"], "hi");
    }
}
