//! Build contexts for `denv deploy` (`docs/reference/compose.md` "Builds"): for every
//! compose service with a `build:`, the context directory (relative to the compose file's
//! directory, or absolute) is packed by [`denv_client::context::pack`] (the packer the
//! Python package uses too: `.dockerignore` honoured, deterministic, at most 32 MiB) and
//! sent with the deploy, keyed by the context as written.

use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The contexts of `compose_text`'s build services, keyed by the context as written:
/// each packed once, keeping the Dockerfiles of every service that builds from it. A
/// file the parser refuses yields no contexts (the control plane then reports it).
pub fn contexts_for(compose_text: &str, compose_dir: &Path) -> Result<HashMap<String, Vec<u8>>> {
    let Ok(spec) = denv_compose::parse(compose_text) else {
        return Ok(HashMap::new());
    };
    let mut dockerfiles: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for b in spec.builds.values() {
        dockerfiles
            .entry(b.context.as_str())
            .or_default()
            .push(b.dockerfile.as_str());
    }
    let mut out = HashMap::new();
    for (context, dockerfiles) in dockerfiles {
        let dir = compose_dir.join(context);
        if !dir.is_dir() {
            bail!(
                "build context \"{}\" ({}) is not a directory",
                context,
                dir.display()
            );
        }
        let tar = denv_client::context::pack(&dir, &dockerfiles)
            .with_context(|| format!("packing build context {}", dir.display()))?;
        out.insert(context.to_string(), tar);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_deterministically_and_keys_by_context_as_written() {
        let d = tempfile::tempdir().unwrap();
        let app = d.path().join("app");
        std::fs::create_dir_all(app.join("sub")).unwrap();
        std::fs::write(app.join("Dockerfile"), "FROM busybox:1.36\n").unwrap();
        std::fs::write(app.join("sub/x"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", app.join("link")).unwrap();
        let compose = "services:\n  a: {build: ./app}\n  b: {build: {context: ./app, target: t}}\n  c: {image: busybox:1.36}\n";
        let one = contexts_for(compose, d.path()).unwrap();
        assert_eq!(one.keys().collect::<Vec<_>>(), ["./app"]);
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(app.join("sub/x"), "x").unwrap(); // new mtime, same content
        let two = contexts_for(compose, d.path()).unwrap();
        assert_eq!(one["./app"], two["./app"], "same files, same bytes");
        let info = denv_compose::context::check_context("a", "./app", "Dockerfile", &one["./app"])
            .unwrap();
        assert_eq!(info.entries, 4);
        let mut ar = tar::Archive::new(&one["./app"][..]);
        let names: Vec<(String, String)> = ar
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let link = e
                    .link_name()
                    .unwrap()
                    .map(|l| l.display().to_string())
                    .unwrap_or_default();
                (e.path().unwrap().display().to_string(), link)
            })
            .collect();
        assert_eq!(
            names,
            [
                ("Dockerfile".to_string(), String::new()),
                ("link".to_string(), "/etc/passwd".to_string()),
                ("sub".to_string(), String::new()),
                ("sub/x".to_string(), String::new())
            ],
            "the symlink is stored, not followed"
        );
        let e = contexts_for("services:\n  a: {build: ./nope}\n", d.path()).unwrap_err();
        assert!(e.to_string().starts_with("build context \"./nope\""), "{e}");
    }

    #[test]
    fn every_dockerfile_of_a_context_is_kept_and_dockerignore_applies() {
        let d = tempfile::tempdir().unwrap();
        let app = d.path().join("app");
        std::fs::create_dir_all(app.join("docker")).unwrap();
        std::fs::write(app.join(".dockerignore"), "docker\n*.tmp\n").unwrap();
        std::fs::write(app.join("docker/a.Dockerfile"), "FROM x\n").unwrap();
        std::fs::write(app.join("docker/b.Dockerfile"), "FROM x\n").unwrap();
        std::fs::write(app.join("docker/notes"), "n").unwrap();
        std::fs::write(app.join("x.tmp"), "t").unwrap();
        let compose = "services:\n  a: {build: {context: app, dockerfile: docker/a.Dockerfile}}\n  b: {build: {context: app, dockerfile: ./docker/b.Dockerfile}}\n";
        let c = contexts_for(compose, d.path()).unwrap();
        let names: Vec<String> = tar::Archive::new(&c["app"][..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(
            names,
            [
                ".dockerignore",
                "docker",
                "docker/a.Dockerfile",
                "docker/b.Dockerfile"
            ]
        );
        for (svc, df) in [("a", "docker/a.Dockerfile"), ("b", "./docker/b.Dockerfile")] {
            denv_compose::context::check_context(svc, "app", df, &c["app"]).unwrap();
        }
    }
}
