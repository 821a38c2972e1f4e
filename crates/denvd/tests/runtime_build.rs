//! `image.build` against the real engine: a build from a small context (args, target),
//! the image run as a service, the cache hit of a second identical build (no rebuild),
//! a failing Dockerfile failing with its own output, and the sidecar's own refusals
//! (oversize context, a tag that is not the build's, a digest that does not match, a
//! member escaping the context).

mod runtime_support;

use denv_compose::context::{digest, MAX_CONTEXT_BYTES};
use denv_compose::Egress;
use denvd::runtime::{BuildRequest, Runtime};
use runtime_support::*;
use std::process::Command;
use std::time::Duration;

/// An uncompressed tar of `(path, contents)` members.
fn tar_of(members: &[(&str, String)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (p, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, p, data.as_bytes()).unwrap();
    }
    b.into_inner().unwrap()
}

/// A request whose tag is the build's own (what the control plane sends).
fn request(
    service: &str,
    context: Vec<u8>,
    dockerfile: &str,
    args: &[(&str, &str)],
    target: &str,
) -> BuildRequest {
    let args: std::collections::BTreeMap<String, String> = args
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let b = denv_compose::Build {
        context: ".".into(),
        dockerfile: dockerfile.into(),
        args: args.clone(),
        target: target.into(),
        context_digest: digest(&context),
        scope: "team_runtime_build".into(),
    };
    BuildRequest {
        service: service.into(),
        tag: b.tag(),
        context_digest: b.context_digest.clone(),
        context,
        dockerfile: dockerfile.into(),
        args,
        target: target.into(),
        scope: b.scope.clone(),
    }
}

/// Removes the images this test built.
struct Images(Vec<String>);
impl Drop for Images {
    fn drop(&mut self) {
        for t in &self.0 {
            let _ = Command::new("docker").args(["rmi", "-f", t]).output();
        }
    }
}

fn nonce() -> String {
    format!("{:016x}", rand::random::<u64>())
}

async fn exec_out(rt: &Runtime, env: &str, svc: &str, cmd: &[&str]) -> String {
    let r = rt
        .exec(env, svc, &argv(cmd), Duration::from_secs(30))
        .await
        .expect("exec");
    assert_eq!(r.exit_code, 0, "{cmd:?}: {}", r.stderr);
    r.stdout
}

#[tokio::test]
#[ignore = "needs Docker (run with --include-ignored)"]
async fn build_runs_as_a_service_and_a_second_build_is_a_cache_hit() {
    let (rt, _tmp) = runtime("dir").await;
    let n = nonce();
    let dockerfile = "\
FROM busybox:1.36 AS first
ARG GREETING=unset
RUN echo \"stage first $GREETING\" > /stage
FROM busybox:1.36 AS second
ARG GREETING=unset
COPY app/greeting.txt /greeting.txt
RUN echo \"stage second $GREETING\" > /stage
USER 1000:1000
";
    let ctx = tar_of(&[
        ("docker/Dockerfile.test", dockerfile.to_string()),
        ("app/greeting.txt", format!("hello {n}\n")),
    ]);
    let req = request(
        "main",
        ctx.clone(),
        "docker/Dockerfile.test",
        &[("GREETING", "hi-arg")],
        "",
    );
    let _images = Images(vec![req.tag.clone()]);
    assert!(req.tag.starts_with("denv-build/") && req.tag.len() == "denv-build/".len() + 64);

    let (p, mut rx) = progress();
    let first = rt.build_image(&req, &p).await.expect("build");
    let lines = drain(&mut rx);
    assert!(!first.cached);
    assert_eq!(first.tag, req.tag);
    assert!(first.image_id.starts_with("sha256:"), "{first:?}");
    assert!(
        lines.iter().any(|l| l.starts_with("build main: Step 1/")),
        "the engine's output arrives as progress lines: {lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("build main: built {}", req.tag))),
        "{lines:?}"
    );
    assert!(!first.log_tail.is_empty());

    // The image runs as a service under the usual rules.
    let env = env_id("bld");
    let _cleanup = Cleanup(vec![env.clone()]);
    let mut svc = svc("main", &req.tag);
    svc.command = argv(&["sleep", "3600"]);
    let c = rt
        .create(&env, &spec(vec![svc], &[], Egress::Deny), &p)
        .await
        .expect("create");
    assert_eq!(
        c.digests["main"], first.image_id,
        "the built image's id is the pinned digest"
    );
    assert_eq!(
        exec_out(&rt, &env, "main", &["cat", "/greeting.txt"]).await,
        format!("hello {n}\n")
    );
    assert_eq!(
        exec_out(&rt, &env, "main", &["cat", "/stage"]).await,
        "stage second hi-arg\n"
    );
    assert_eq!(exec_out(&rt, &env, "main", &["id", "-u"]).await, "1000\n");
    rt.destroy(&env).await.expect("destroy");

    // Same context, args, target: nothing is built.
    drain(&mut rx);
    let second = rt.build_image(&req, &p).await.expect("second build");
    let lines = drain(&mut rx);
    assert!(second.cached, "{second:?}");
    assert_eq!(second.image_id, first.image_id);
    assert!(second.log_tail.is_empty());
    assert_eq!(lines, vec![format!("build main: cached {}", req.tag)]);
    assert!(
        second.took_ms < 2_000,
        "a cache hit is an inspect: {} ms",
        second.took_ms
    );

    // Another target is another image.
    let t = request(
        "main",
        ctx,
        "docker/Dockerfile.test",
        &[("GREETING", "hi-arg")],
        "first",
    );
    let _more = Images(vec![t.tag.clone()]);
    assert_ne!(t.tag, req.tag);
    let built = rt.build_image(&t, &p).await.expect("target build");
    assert!(!built.cached);
    let out = Command::new("docker")
        .args(["run", "--rm", "--network", "none", &t.tag, "cat", "/stage"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "stage first hi-arg\n");
}

#[tokio::test]
#[ignore = "needs Docker (run with --include-ignored)"]
async fn a_failing_dockerfile_fails_with_its_own_output() {
    let (rt, _tmp) = runtime("dir").await;
    let n = nonce();
    let df = format!("FROM busybox:1.36\nRUN echo boom-{n} && exit 3\n");
    let req = request("web", tar_of(&[("Dockerfile", df)]), "Dockerfile", &[], "");
    let _images = Images(vec![req.tag.clone()]);
    let (p, _rx) = progress();
    let err = rt.build_image(&req, &p).await.unwrap_err().to_string();
    assert!(
        err.starts_with("build of service \"web\" failed: "),
        "{err}"
    );
    assert!(err.contains("returned a non-zero code: 3"), "{err}");
    assert!(
        err.contains(&format!("boom-{n}")),
        "the log tail names the cause: {err}"
    );
    assert!(
        rt.docker().inspect_image(&req.tag).await.is_err(),
        "no image is left tagged"
    );

    let bad_base = request(
        "web",
        tar_of(&[("Dockerfile", "FROM denv-test/absent-base:never\n".into())]),
        "Dockerfile",
        &[],
        "",
    );
    let err = rt.build_image(&bad_base, &p).await.unwrap_err().to_string();
    assert!(
        err.starts_with("build of service \"web\" failed: "),
        "{err}"
    );
    assert!(err.contains("denv-test/absent-base"), "{err}");
}

#[tokio::test]
#[ignore = "needs Docker (run with --include-ignored)"]
async fn the_sidecar_refuses_what_the_control_plane_should_never_send() {
    let (rt, _tmp) = runtime("dir").await;
    let (p, _rx) = progress();
    let ok_ctx = tar_of(&[("Dockerfile", "FROM busybox:1.36\n".into())]);

    // Oversize: refused before anything is parsed or sent to the engine.
    let mut big = request("main", ok_ctx.clone(), "Dockerfile", &[], "");
    big.context = vec![0u8; MAX_CONTEXT_BYTES + 10];
    let err = rt.build_image(&big, &p).await.unwrap_err().to_string();
    assert_eq!(
        err,
        format!("build context of service \"main\" is {} bytes; the limit is 33554432 bytes (32 MiB); leave large files out of the context", MAX_CONTEXT_BYTES + 10)
    );

    // A tag that is not the build's own: could otherwise overwrite any local image.
    let mut retag = request("main", ok_ctx.clone(), "Dockerfile", &[], "");
    retag.tag = BUSYBOX.into();
    let err = rt.build_image(&retag, &p).await.unwrap_err().to_string();
    assert!(
        err.contains("tag \"busybox:1.36\" is not the build's own tag \"denv-build/"),
        "{err}"
    );

    // A digest that does not match the bytes.
    let mut swapped = request("main", ok_ctx.clone(), "Dockerfile", &[], "");
    swapped.context = tar_of(&[("Dockerfile", "FROM busybox:1.36\nRUN true\n".into())]);
    let err = rt.build_image(&swapped, &p).await.unwrap_err().to_string();
    assert!(err.contains("context digest mismatch"), "{err}");

    // A member climbing out of the context (raw header: the tar builder refuses `..`).
    let mut h = tar::Header::new_old();
    h.as_old_mut().name[..12].copy_from_slice(b"../../escape");
    h.set_size(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let mut evil = h.as_bytes().to_vec();
    evil.extend_from_slice(&ok_ctx);
    let req = request("main", evil, "Dockerfile", &[], "");
    let err = rt.build_image(&req, &p).await.unwrap_err().to_string();
    assert_eq!(
        err,
        "build context \".\" of service \"main\" has a member \"../../escape\" outside the context"
    );
}
