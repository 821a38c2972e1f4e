//! Compose `build:` services on the control plane (`13-ref-compose.md` "Builds"): the
//! deploy request's uploaded contexts are matched to the services that build, checked
//! ([`denv_compose::context::check_context`]: size, members, Dockerfile present), and
//! each service's `image` becomes its build's tag `denv-build/<key>` before the version
//! row is written, so the version's spec names the image like any other. The context
//! bytes stay in memory with the deployment's runner until `prepare` sends them to the
//! host in one `image.build` command per service (a control plane restart fails the
//! deployment anyway, see the orchestrator's recovery rule).

use crate::error::ApiError;
use denv_compose::context::check_context;
use denv_compose::Spec;
use std::collections::{BTreeMap, HashMap};

/// Service → its context tar, for the services `prepare` builds.
pub(crate) type Contexts = BTreeMap<String, Vec<u8>>;

/// Matches `uploaded` (context as written → tar) to `spec.builds`, sets each building
/// service's image to its tag and its build's `context_digest` and `scope` (the team:
/// builds are never shared across teams), and returns the tars by
/// service. A service with both `image` and `build` and no uploaded context keeps its
/// image (its build is dropped from the spec).
///
/// Errors (`400`): a building service without an image whose context was not uploaded;
/// an uploaded context no service builds from; any context check failure.
pub(crate) fn resolve(
    spec: &mut Spec,
    mut uploaded: HashMap<String, Vec<u8>>,
    scope: &str,
) -> Result<Contexts, ApiError> {
    let mut out = Contexts::new();
    let names: Vec<String> = spec.builds.keys().cloned().collect();
    let mut used = std::collections::BTreeSet::new();
    for name in names {
        let Some(build) = spec.builds.get(&name).cloned() else {
            continue;
        };
        let Some(svc_idx) = spec.services.iter().position(|s| s.name == name) else {
            continue;
        };
        let bytes = match uploaded.get(&build.context) {
            Some(b) => b.clone(),
            None if !spec.services[svc_idx].image.is_empty() => {
                spec.builds.remove(&name);
                continue;
            }
            None => {
                return Err(ApiError::BadRequest(format!(
                    "compose: service \"{name}\" builds from context \"{}\", but the deploy carries no build context for it (deploy with `denv deploy` or the Python package, which upload it)",
                    build.context
                )))
            }
        };
        used.insert(build.context.clone());
        let info = check_context(&name, &build.context, &build.dockerfile, &bytes)
            .map_err(ApiError::BadRequest)?;
        let b = spec.builds.get_mut(&name).expect("present");
        b.context_digest = info.digest;
        b.scope = scope.to_string();
        spec.services[svc_idx].image = b.tag();
        out.insert(name, bytes);
    }
    uploaded.retain(|k, _| !used.contains(k));
    if let Some(k) = uploaded.keys().next() {
        return Err(ApiError::BadRequest(format!(
            "build context \"{k}\" is not the build context of any service"
        )));
    }
    Ok(out)
}

/// The refusal for a spec that still has a service with no image (a `build:` reached a
/// path that cannot upload contexts, e.g. deploy from source).
pub(crate) fn require_images(spec: &Spec) -> Result<(), ApiError> {
    for s in &spec.services {
        if s.image.is_empty() {
            let ctx = spec
                .builds
                .get(&s.name)
                .map(|b| b.context.as_str())
                .unwrap_or(".");
            return Err(ApiError::BadRequest(format!(
                "compose: service \"{}\" builds from context \"{ctx}\", but the deploy carries no build context for it (deploy with `denv deploy` or the Python package, which upload it)",
                s.name
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(members: &[(&str, &str)]) -> Vec<u8> {
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

    #[test]
    fn uploaded_contexts_become_tags_and_digests() {
        let mut spec = denv_compose::parse(
            "services:\n  main: {build: ., command: [sleep, infinity]}\n  db: {image: busybox:1.36, build: ./db}\n  web: {build: {context: ./web, dockerfile: W}}\n",
        )
        .unwrap();
        let t_main = tar_of(&[("Dockerfile", "FROM busybox:1.36\n")]);
        let t_web = tar_of(&[("W", "FROM busybox:1.36\n")]);
        let up = HashMap::from([
            (".".to_string(), t_main.clone()),
            ("./web".to_string(), t_web.clone()),
        ]);
        let ctx = resolve(&mut spec, up.clone(), "team_a").unwrap();
        assert_eq!(ctx.keys().collect::<Vec<_>>(), ["main", "web"]);
        let main = spec.service("main").unwrap();
        let b = &spec.builds["main"];
        assert_eq!(b.context_digest, denv_compose::context::digest(&t_main));
        assert_eq!(main.image, b.tag());
        assert_eq!(b.scope, "team_a");
        let mut other = denv_compose::parse(
            "services:\n  main: {build: ., command: [sleep, infinity]}\n  db: {image: busybox:1.36, build: ./db}\n  web: {build: {context: ./web, dockerfile: W}}\n",
        )
        .unwrap();
        resolve(&mut other, up, "team_b").unwrap();
        assert_ne!(
            other.service("main").unwrap().image,
            main.image,
            "another team's identical context is another image"
        );
        assert_eq!(
            spec.service("db").unwrap().image,
            "busybox:1.36",
            "no upload: the image is used"
        );
        assert!(!spec.builds.contains_key("db"));
        require_images(&spec).unwrap();
    }

    #[test]
    fn missing_extra_and_bad_contexts_are_400s_naming_them() {
        let text = "services:\n  main: {build: ./app}\n";
        let mut spec = denv_compose::parse(text).unwrap();
        assert_eq!(
            require_images(&spec).unwrap_err().to_string(),
            "compose: service \"main\" builds from context \"./app\", but the deploy carries no build context for it (deploy with `denv deploy` or the Python package, which upload it)"
        );
        let e = resolve(&mut spec, HashMap::new(), "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("carries no build context"), "{e}");
        let mut spec = denv_compose::parse(text).unwrap();
        let up = HashMap::from([
            ("./app".to_string(), tar_of(&[("Dockerfile", "FROM x\n")])),
            ("./other".to_string(), tar_of(&[("Dockerfile", "FROM x\n")])),
        ]);
        assert_eq!(
            resolve(&mut spec, up, "t").unwrap_err().to_string(),
            "build context \"./other\" is not the build context of any service"
        );
        let mut spec = denv_compose::parse(text).unwrap();
        let up = HashMap::from([("./app".to_string(), tar_of(&[("dockerfile", "FROM x\n")]))]);
        assert_eq!(
            resolve(&mut spec, up, "t").unwrap_err().to_string(),
            "build context \"./app\" of service \"main\" has no Dockerfile \"Dockerfile\""
        );
    }
}
