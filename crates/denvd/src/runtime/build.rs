//! Images built on the host: the `image.build` command (compose `build:`, Harbor's
//! Dockerfile-only tasks; `13-ref-compose.md` "Builds", `15-ref-protocol.md`).
//!
//! The context arrives as one uncompressed tar in the command (at most
//! [`MAX_CONTEXT_BYTES`]); it is checked again here ([`check_context`]: size, digest,
//! members inside the context, the Dockerfile present) before the engine's build API
//! (`POST /build`, the classic builder) sees it. The tag is `denv-build/<key>` where the
//! key is recomputed here from the digest, dockerfile, target and args, so a command
//! cannot retag any other image. An image already tagged so is reused without building
//! (the cache). Build output lines are progress lines; a failed build fails the command
//! with its last lines.
//!
//! The build's RUN steps run in the engine's own build containers with the engine's
//! default network, capped at [`BUILD_MEMORY_BYTES`] and [`BUILD_TIMEOUT`]; the image
//! that comes out is then run under every containment rule like any pulled image. No
//! labels are added (the classic builder would append a `LABEL` step, a second commit
//! per build); the `denv-build/` repository names the images built here.

use super::{Progress, Result, Runtime, RuntimeError};
use bollard::image::BuildImageOptions;
use denv_compose::context::{check_context, MAX_CONTEXT_BYTES};
use futures::StreamExt;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Memory of one build's RUN steps (and no swap beyond it), bytes.
pub const BUILD_MEMORY_BYTES: u64 = 4 << 30;
/// Longest a build may run before it is abandoned with a `timed out` error.
pub const BUILD_TIMEOUT: Duration = Duration::from_secs(600);
/// Build output lines kept for the result (and the error of a failed build).
pub const LOG_TAIL_LINES: usize = 30;

/// One `image.build` request (the `ImageBuild` message).
#[derive(Debug, Clone, Default)]
pub struct BuildRequest {
    /// The service the image is for (named in progress lines and errors).
    pub service: String,
    /// `denv-build/<key>`; must equal the tag recomputed from the other fields.
    pub tag: String,
    /// The context tar.
    pub context: Vec<u8>,
    /// `sha256:<hex>` of `context`.
    pub context_digest: String,
    /// Dockerfile path inside the context ("" = `Dockerfile`).
    pub dockerfile: String,
    /// Build args.
    pub args: std::collections::BTreeMap<String, String>,
    /// Stage to build ("" = the last).
    pub target: String,
    /// Who may share the image (the team id; part of the key).
    pub scope: String,
}

/// The outcome of `image.build`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildOutcome {
    /// The tag built or reused.
    pub tag: String,
    /// `sha256:…` image id.
    pub image_id: String,
    /// True when the tag existed and nothing was built.
    pub cached: bool,
    /// Wall time, ms.
    pub took_ms: u64,
    /// Last build output lines (empty on a cache hit).
    pub log_tail: Vec<String>,
}

fn fail<T>(msg: impl Into<String>) -> Result<T> {
    Err(RuntimeError::Failed(msg.into()))
}

impl Runtime {
    /// Builds (or reuses) the image of one build request; see the module docs.
    ///
    /// Errors: the context check's message; `build of service "<s>": tag "<t>" is not
    /// the build's own tag "<want>"`; `… context digest mismatch`; `build of service
    /// "<s>" failed: <engine error>` followed by the output's last lines; `build of
    /// service "<s>" timed out after 600 s`.
    pub async fn build_image(
        &self,
        req: &BuildRequest,
        progress: &Progress,
    ) -> Result<BuildOutcome> {
        let t0 = Instant::now();
        let svc = &req.service;
        let dockerfile = if req.dockerfile.is_empty() {
            "Dockerfile".to_string()
        } else {
            req.dockerfile.clone()
        };
        if req.context.len() > MAX_CONTEXT_BYTES {
            return fail(format!(
                "build context of service \"{svc}\" is {} bytes; the limit is {MAX_CONTEXT_BYTES} bytes (32 MiB); leave large files out of the context",
                req.context.len()
            ));
        }
        let info =
            check_context(svc, ".", &dockerfile, &req.context).map_err(RuntimeError::Failed)?;
        if info.digest != req.context_digest {
            return fail(format!(
                "build of service \"{svc}\": context digest mismatch (sent {}, received {})",
                req.context_digest, info.digest
            ));
        }
        let want = denv_compose::Build {
            context: String::new(),
            dockerfile: dockerfile.clone(),
            args: req.args.clone(),
            target: req.target.clone(),
            context_digest: info.digest.clone(),
            scope: req.scope.clone(),
        }
        .tag();
        if req.tag != want {
            return fail(format!(
                "build of service \"{svc}\": tag \"{}\" is not the build's own tag \"{want}\"",
                req.tag
            ));
        }
        let docker = self.docker();
        match docker.inspect_image(&want).await {
            Ok(i) => {
                super::say(progress, format!("build {svc}: cached {want}"));
                return Ok(BuildOutcome {
                    tag: want,
                    image_id: i.id.unwrap_or_default(),
                    cached: true,
                    took_ms: t0.elapsed().as_millis() as u64,
                    log_tail: vec![],
                });
            }
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            Err(e) => return Err(RuntimeError::docker(format!("inspect image {want}"), e)),
        }
        super::say(
            progress,
            format!(
                "build {svc}: building {want} from {} files ({} bytes)",
                info.entries, info.file_bytes
            ),
        );
        let opts = BuildImageOptions::<String> {
            dockerfile: dockerfile.clone(),
            t: want.clone(),
            buildargs: req.args.clone().into_iter().collect::<HashMap<_, _>>(),
            target: req.target.clone(),
            rm: true,
            forcerm: true,
            pull: false,
            memory: Some(BUILD_MEMORY_BYTES),
            memswap: Some(BUILD_MEMORY_BYTES as i64),
            ..Default::default()
        };
        let mut tail: VecDeque<String> = VecDeque::new();
        let keep = |line: &str, tail: &mut VecDeque<String>| {
            let line = line.trim_end();
            if line.trim().is_empty() {
                return;
            }
            let line: String = line.chars().take(2000).collect();
            tracing::debug!(target: "denvd::build", service = %svc, "{line}");
            let _ = progress.send(format!("build {svc}: {line}"));
            if tail.len() == LOG_TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line);
        };
        let body = bytes::Bytes::from(req.context.clone());
        let run = async {
            let mut s = docker.build_image(opts, None, Some(body));
            while let Some(item) = s.next().await {
                match item {
                    Ok(info) => {
                        for text in [info.stream.as_deref(), info.status.as_deref()]
                            .into_iter()
                            .flatten()
                        {
                            for l in text.lines() {
                                keep(l, &mut tail);
                            }
                        }
                        if let Some(err) = info.error {
                            return Err(err);
                        }
                    }
                    Err(bollard::errors::Error::DockerStreamError { error }) => return Err(error),
                    Err(e) => return Err(RuntimeError::docker("build", e).to_string()),
                }
            }
            Ok(())
        };
        let outcome = tokio::time::timeout(BUILD_TIMEOUT, run).await;
        let tail: Vec<String> = tail.into_iter().collect();
        match outcome {
            Err(_) => {
                return fail(format!(
                    "build of service \"{svc}\" timed out after {} s\n{}",
                    BUILD_TIMEOUT.as_secs(),
                    tail.join("\n")
                ))
            }
            Ok(Err(e)) => {
                return fail(format!(
                    "build of service \"{svc}\" failed: {}\n{}",
                    e.trim(),
                    tail.join("\n")
                ))
            }
            Ok(Ok(())) => {}
        }
        let image_id = match docker.inspect_image(&want).await {
            Ok(i) => i.id.unwrap_or_default(),
            Err(e) => {
                return fail(format!(
                    "build of service \"{svc}\" produced no image {want}: {}\n{}",
                    RuntimeError::docker("inspect", e),
                    tail.join("\n")
                ))
            }
        };
        super::say(
            progress,
            format!(
                "build {svc}: built {want} ({image_id}) in {} ms",
                t0.elapsed().as_millis()
            ),
        );
        Ok(BuildOutcome {
            tag: want,
            image_id,
            cached: false,
            took_ms: t0.elapsed().as_millis() as u64,
            log_tail: tail,
        })
    }
}
