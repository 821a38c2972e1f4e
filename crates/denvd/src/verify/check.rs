//! The limits of a submission and collect-path normalisation (spec
//! `19-ref-protections.md` §3). The walk that enforces them is [`super::collect`].

use std::path::{Component, Path};

/// Total size limit of a submission (regular file bytes).
pub const MAX_BYTES: u64 = 256 << 20;
/// Entry limit of a submission (files, directories, everything; each existing collect
/// path counts as one entry itself).
pub const MAX_FILES: u64 = 20_000;
/// Directory depth limit below a collected path.
pub const MAX_DEPTH: usize = 32;

/// `/home/agent/x` → `home/agent/x`.
pub fn rel_of(abs: &str) -> String {
    abs.trim_start_matches('/').to_string()
}

/// Normalises an absolute collect path (`//a/./b/` → `/a/b`); `None` when it is not
/// absolute, is `/`, or contains `..`.
pub fn normalize(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let mut parts = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => parts.push(n.to_str()?.to_string()),
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(format!("/{}", parts.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes() {
        assert_eq!(normalize("//home/./agent/"), Some("/home/agent".into()));
        assert_eq!(normalize("home/agent"), None);
        assert_eq!(normalize("/home/../etc"), None);
        assert_eq!(normalize("/"), None);
    }
}
