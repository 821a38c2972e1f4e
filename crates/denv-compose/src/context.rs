//! Build contexts: the uncompressed tar a client uploads for a compose `build:` service
//! (`13-ref-compose.md`, "Builds"). Checked twice, by the control plane when the deploy
//! arrives (a `400` naming the problem) and by the sidecar before the engine sees it.
//!
//! What is checked is what is ours: the size limit, that the archive parses to its end,
//! that every member is a file, directory or link whose path stays inside the context
//! (no absolute path, no `..`; a link's target is the engine's business, it resolves
//! them inside the build's own root), and that the Dockerfile is a regular file in it.

use sha2::{Digest, Sha256};
use std::collections::BTreeSet;

/// Largest build context accepted, bytes (32 MiB: it travels in one host command frame).
pub use denv_proto::contract::BUILD_CONTEXT_MAX_BYTES as MAX_CONTEXT_BYTES;

/// What a valid context holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextInfo {
    /// `sha256:<hex>` of the tar bytes.
    pub digest: String,
    /// Members (files, directories, links).
    pub entries: usize,
    /// Sum of the regular files' sizes, bytes.
    pub file_bytes: u64,
}

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Checks one build context of service `service` (context `context` as written) whose
/// Dockerfile is `dockerfile` (relative, as in [`crate::Build::dockerfile`]).
///
/// Errors (one message each, naming the service and context):
/// `build context "<ctx>" of service "<svc>" is <n> bytes; the limit is 33554432 bytes (32 MiB)`,
/// `… is not a tar archive: <detail>`, `… has a member "<path>" outside the context`,
/// `… has a member "<path>" of type <t>; only files, directories and links are accepted`,
/// `… has no Dockerfile "<dockerfile>"`.
pub fn check_context(
    service: &str,
    context: &str,
    dockerfile: &str,
    bytes: &[u8],
) -> Result<ContextInfo, String> {
    let what = format!("build context \"{context}\" of service \"{service}\"");
    if bytes.len() > MAX_CONTEXT_BYTES {
        return Err(format!(
            "{what} is {} bytes; the limit is {MAX_CONTEXT_BYTES} bytes (32 MiB); leave large files out of the context",
            bytes.len()
        ));
    }
    let mut archive = tar::Archive::new(bytes);
    let entries = archive
        .entries()
        .map_err(|e| format!("{what} is not a tar archive: {e}"))?;
    let mut seen = BTreeSet::new();
    let mut count = 0usize;
    let mut file_bytes = 0u64;
    let mut dockerfile_found = false;
    let want = dockerfile.trim_start_matches("./");
    for entry in entries {
        let entry = entry.map_err(|e| format!("{what} is not a tar archive: {e}"))?;
        let raw = entry.path_bytes();
        let path = String::from_utf8_lossy(&raw).to_string();
        let norm = normalise(&path)
            .ok_or_else(|| format!("{what} has a member \"{path}\" outside the context"))?;
        let ty = entry.header().entry_type();
        use tar::EntryType as T;
        match ty {
            T::Regular | T::Continuous => {
                file_bytes = file_bytes.saturating_add(entry.size());
                if norm == want {
                    dockerfile_found = true;
                }
            }
            T::Directory | T::Symlink => {}
            T::Link => {
                // A hard link names another member of the archive.
                let target = entry
                    .link_name_bytes()
                    .map(|b| String::from_utf8_lossy(&b).to_string())
                    .unwrap_or_default();
                if normalise(&target).is_none() {
                    return Err(format!(
                        "{what} has a member \"{path}\" linking to \"{target}\" outside the context"
                    ));
                }
            }
            other => {
                return Err(format!(
                    "{what} has a member \"{path}\" of type {other:?}; only files, directories and links are accepted"
                ))
            }
        }
        seen.insert(norm);
        count += 1;
    }
    if !dockerfile_found {
        return Err(format!("{what} has no Dockerfile \"{want}\""));
    }
    Ok(ContextInfo {
        digest: digest(bytes),
        entries: count,
        file_bytes,
    })
}

/// A member path relative to the context root without `.` components, or `None` when
/// it is absolute or climbs out with `..`.
fn normalise(path: &str) -> Option<String> {
    if path.starts_with('/') || path.contains('\0') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => return None,
            c => parts.push(c),
        }
    }
    Some(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (p, data) in members {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, p, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// A member whose raw name bypasses the builder's own path checks.
    fn raw_member(name: &str, ty: tar::EntryType, link: &str) -> Vec<u8> {
        let mut h = tar::Header::new_old();
        {
            let o = h.as_old_mut();
            o.name[..name.len()].copy_from_slice(name.as_bytes());
            o.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_entry_type(ty);
        h.set_size(0);
        h.set_mode(0o644);
        h.set_cksum();
        let mut out = h.as_bytes().to_vec();
        out.extend_from_slice(&[0u8; 1024]);
        out
    }

    #[test]
    fn a_plain_context_passes_with_its_digest() {
        let t = tar_of(&[
            ("Dockerfile", b"FROM busybox:1.36\n"),
            ("./app/x.txt", b"hi"),
        ]);
        let i = check_context("main", ".", "Dockerfile", &t).unwrap();
        assert_eq!(i.entries, 2);
        assert_eq!(i.file_bytes, 20);
        assert_eq!(i.digest, digest(&t));
        assert!(i.digest.starts_with("sha256:") && i.digest.len() == 71);
        check_context("main", ".", "./app/x.txt", &t).unwrap();
    }

    #[test]
    fn escapes_and_odd_members_are_refused() {
        let dot = raw_member("../evil", tar::EntryType::Regular, "");
        assert_eq!(
            check_context("m", "c", "Dockerfile", &dot).unwrap_err(),
            "build context \"c\" of service \"m\" has a member \"../evil\" outside the context"
        );
        let abs = raw_member("/etc/x", tar::EntryType::Regular, "");
        assert!(check_context("m", "c", "Dockerfile", &abs)
            .unwrap_err()
            .contains("\"/etc/x\" outside the context"));
        let hard = raw_member("h", tar::EntryType::Link, "../../etc/shadow");
        assert!(check_context("m", "c", "Dockerfile", &hard)
            .unwrap_err()
            .contains("linking to \"../../etc/shadow\" outside the context"));
        let dev = raw_member("null", tar::EntryType::Char, "");
        assert_eq!(
            check_context("m", "c", "Dockerfile", &dev).unwrap_err(),
            "build context \"c\" of service \"m\" has a member \"null\" of type Char; only files, directories and links are accepted"
        );
    }

    #[test]
    fn size_garbage_and_missing_dockerfile() {
        let big = vec![0u8; MAX_CONTEXT_BYTES + 1];
        assert_eq!(
            check_context("m", ".", "Dockerfile", &big).unwrap_err(),
            "build context \".\" of service \"m\" is 33554433 bytes; the limit is 33554432 bytes (32 MiB); leave large files out of the context"
        );
        let t = tar_of(&[("Dockerfile.dev", b"FROM x\n")]);
        assert_eq!(
            check_context("m", ".", "Dockerfile", &t).unwrap_err(),
            "build context \".\" of service \"m\" has no Dockerfile \"Dockerfile\""
        );
        let mut junk = t.clone();
        junk[0..100].copy_from_slice(&[b'z'; 100]);
        assert!(check_context("m", ".", "Dockerfile.dev", &junk)
            .unwrap_err()
            .contains("is not a tar archive"));
    }
}
