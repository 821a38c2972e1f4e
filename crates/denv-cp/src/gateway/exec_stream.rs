//! `POST /v1/envs/{env}/exec/stream`: a command's output as it is written, over plain
//! HTTP (our manual's `docs/reference/rest-api.md`, "Streamed output"; the REST face of
//! `EnvironmentService.ExecStream`).
//!
//! The body is the one of `POST /v1/envs/{env}/exec` (`service`, `cmd`, `timeout_sec`,
//! `user`, `workdir`, `stdin` in base64, `env_vars`). The answer is JSON lines
//! (`application/x-ndjson`, chunked), one `ExecChunk` per line in the order the pieces
//! were written:
//!
//! - `{"stdout": "<base64>"}` or `{"stderr": "<base64>"}`: a piece of output, bytes as
//!   written (base64, so a piece that splits a UTF-8 character or holds binary data
//!   arrives intact); no 4 MiB cap;
//! - a last `{"result": {"exit_code": N, "timed_out": bool, …}}`;
//! - an empty line every 15 s while the command writes nothing (readers skip empty lines).
//!
//! Errors before the first line are ordinary JSON errors with their status (`400` for a
//! bad field, `404`, `409` for a destroyed environment, `502` when the host has no
//! stream). What the host reports once the stream started (a service it does not have, a
//! paused service, the host going away) is a last `{"error": msg}` line, with no result.

use super::{error_response, Call, Gateway};
use axum::extract::State;
use axum::response::Response;
use denv_proto::v1::{environment_service_server::EnvironmentService, ExecRequest};

/// The handler (see the module documentation).
pub async fn exec_stream(State(gw): State<Gateway>, call: Call) -> Response {
    let res = async {
        let req: ExecRequest = call.decode()?;
        gw.envs.exec_stream(call.request(req)).await
    }
    .await;
    let chunks = match res {
        Ok(r) => r.into_inner(),
        Err(s) => return error_response(&s),
    };
    super::message_lines(chunks)
}
