//! The checks on a collected tree (spec `19-ref-protections.md` §3). Pure: a tar from
//! the Engine's archive API in, accepted items or one refusal out.

use std::path::{Component, Path};

/// Total size limit of a submission (regular file bytes).
pub const MAX_BYTES: u64 = 256 << 20;
/// Entry limit of a submission (files, directories, everything).
pub const MAX_FILES: u64 = 20_000;
/// Directory depth limit below a collected path.
pub const MAX_DEPTH: usize = 32;

/// One accepted entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// A directory; `rel` is relative to `/` (`home/agent/out`).
    Dir { rel: String, mode: u32 },
    /// A regular file and its content.
    File {
        rel: String,
        mode: u32,
        data: Vec<u8>,
    },
}

impl Item {
    /// The path relative to `/`.
    pub fn rel(&self) -> &str {
        match self {
            Item::Dir { rel, .. } | Item::File { rel, .. } => rel,
        }
    }
}

/// Running totals over every collected path of one submission.
#[derive(Debug, Default, Clone, Copy)]
pub struct Budget {
    /// Entries so far.
    pub files: u64,
    /// Regular file bytes so far.
    pub bytes: u64,
}

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

/// Checks one archive of the collected path `collect` (normalised, absolute) and returns
/// its items, or the refusal `<path>: <reason>` (paths relative to `/`). The first
/// finding wins. Reasons: `symlink`, `hard link`, `fifo`, `device`,
/// `unsupported entry type`, `path escapes the collected root`, `deeper than 32`,
/// `submission larger than 256 MiB`, `more than 20000 files`.
///
/// Depth: a directory `d` levels below the collected path (its children are level 1)
/// is refused when `d > 32`; a file counts the level of the directory holding it.
pub fn check_archive(collect: &str, tar: &[u8], budget: &mut Budget) -> Result<Vec<Item>, String> {
    let collect_rel = rel_of(collect);
    let base = Path::new(collect)
        .file_name()
        .and_then(|b| b.to_str())
        .unwrap_or_default()
        .to_string();
    let parent_rel = Path::new(&collect_rel)
        .parent()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut items = Vec::new();
    let mut ar = tar::Archive::new(tar);
    let entries = ar
        .entries()
        .map_err(|e| format!("{collect_rel}: unreadable archive: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("{collect_rel}: unreadable archive: {e}"))?;
        let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let mut comps: Vec<String> = Vec::new();
        for c in Path::new(&raw).components() {
            match c {
                Component::Normal(n) => comps.push(n.to_string_lossy().into_owned()),
                Component::CurDir => {}
                _ => {
                    return Err(format!(
                        "{collect_rel}/{raw}: path escapes the collected root"
                    ))
                }
            }
        }
        if comps.is_empty() || comps[0] != base {
            return Err(format!(
                "{collect_rel}: path escapes the collected root ({raw})"
            ));
        }
        let rel = if parent_rel.is_empty() {
            comps.join("/")
        } else {
            format!("{parent_rel}/{}", comps.join("/"))
        };
        let kind = entry.header().entry_type();
        let reason = match kind {
            tar::EntryType::Symlink => Some("symlink"),
            tar::EntryType::Link => Some("hard link"),
            tar::EntryType::Fifo => Some("fifo"),
            tar::EntryType::Char | tar::EntryType::Block => Some("device"),
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::Directory => {
                None
            }
            _ => Some("unsupported entry type"),
        };
        if let Some(r) = reason {
            return Err(format!("{rel}: {r}"));
        }
        let is_dir = kind == tar::EntryType::Directory;
        let below = comps.len() - 1;
        let depth = if is_dir {
            below
        } else {
            below.saturating_sub(1)
        };
        if depth > MAX_DEPTH {
            return Err(format!("{rel}: deeper than {MAX_DEPTH}"));
        }
        budget.files += 1;
        if budget.files > MAX_FILES {
            return Err(format!("{collect_rel}: more than {MAX_FILES} files"));
        }
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        if is_dir {
            items.push(Item::Dir { rel, mode });
        } else {
            let size = entry.size();
            budget.bytes += size;
            if budget.bytes > MAX_BYTES {
                return Err(format!("{collect_rel}: submission larger than 256 MiB"));
            }
            let mut data = Vec::with_capacity(size as usize);
            std::io::Read::read_to_end(&mut entry, &mut data)
                .map_err(|e| format!("{rel}: unreadable archive: {e}"))?;
            items.push(Item::File { rel, mode, data });
        }
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            if *kind == tar::EntryType::Symlink || *kind == tar::EntryType::Link {
                h.set_link_name("target").unwrap();
            }
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn accepts_files_and_dirs() {
        let t = tar_of(&[
            ("agent/", tar::EntryType::Directory, b""),
            ("agent/answer.txt", tar::EntryType::Regular, b"hello\n"),
        ]);
        let mut b = Budget::default();
        let items = check_archive("/home/agent", &t, &mut b).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[1].rel(), "home/agent/answer.txt");
        assert_eq!((b.files, b.bytes), (2, 6));
    }

    #[test]
    fn refuses_special_entries() {
        for (kind, why) in [
            (tar::EntryType::Symlink, "symlink"),
            (tar::EntryType::Link, "hard link"),
            (tar::EntryType::Fifo, "fifo"),
            (tar::EntryType::Char, "device"),
            (tar::EntryType::Block, "device"),
        ] {
            let t = tar_of(&[("answer.txt", kind, b"")]);
            let e =
                check_archive("/home/agent/answer.txt", &t, &mut Budget::default()).unwrap_err();
            assert_eq!(e, format!("home/agent/answer.txt: {why}"));
        }
    }

    #[test]
    fn refuses_escapes() {
        // tar::Builder refuses ".." names, so write the header bytes directly.
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(0);
        h.as_gnu_mut().unwrap().name[..12].copy_from_slice(b"x/../../etc/");
        h.set_cksum();
        let mut t = h.as_bytes().to_vec();
        t.extend_from_slice(&[0u8; 1024]);
        let e = check_archive("/home/x", &t, &mut Budget::default()).unwrap_err();
        assert!(e.ends_with("path escapes the collected root"), "{e}");
        let t = tar_of(&[("other", tar::EntryType::Regular, b"")]);
        let e = check_archive("/home/x", &t, &mut Budget::default()).unwrap_err();
        assert!(e.contains("path escapes the collected root"), "{e}");
    }

    #[test]
    fn depth_limit() {
        let mut names = vec!["d".to_string()];
        for i in 1..=33 {
            let last = names.last().unwrap().clone();
            names.push(format!("{last}/{i}"));
        }
        let ok: Vec<(String, tar::EntryType, &[u8])> = names[..33]
            .iter()
            .map(|n| (format!("{n}/"), tar::EntryType::Directory, &b""[..]))
            .collect();
        let mut with_file = ok.clone();
        with_file.push((format!("{}/f", names[32]), tar::EntryType::Regular, b"x"));
        let refs: Vec<(&str, tar::EntryType, &[u8])> = with_file
            .iter()
            .map(|(n, k, d)| (n.as_str(), *k, *d))
            .collect();
        // 32 levels of directories and a file at the bottom: accepted.
        assert!(check_archive("/w/d", &tar_of(&refs), &mut Budget::default()).is_ok());
        let deep: Vec<(String, tar::EntryType, &[u8])> = names
            .iter()
            .map(|n| (format!("{n}/"), tar::EntryType::Directory, &b""[..]))
            .collect();
        let refs: Vec<(&str, tar::EntryType, &[u8])> =
            deep.iter().map(|(n, k, d)| (n.as_str(), *k, *d)).collect();
        let e = check_archive("/w/d", &tar_of(&refs), &mut Budget::default()).unwrap_err();
        assert!(e.starts_with("w/d/1/2/3/"), "{e}");
        assert!(e.ends_with("/33: deeper than 32"), "{e}");
    }

    #[test]
    fn count_and_size_limits() {
        let mut b = Budget {
            files: MAX_FILES,
            bytes: 0,
        };
        let t = tar_of(&[("a", tar::EntryType::Regular, b"x")]);
        assert_eq!(
            check_archive("/a", &t, &mut b).unwrap_err(),
            "a: more than 20000 files"
        );
        let mut b = Budget {
            files: 0,
            bytes: MAX_BYTES,
        };
        assert_eq!(
            check_archive("/a", &t, &mut b).unwrap_err(),
            "a: submission larger than 256 MiB"
        );
    }

    #[test]
    fn normalizes() {
        assert_eq!(normalize("//home/./agent/"), Some("/home/agent".into()));
        assert_eq!(normalize("home/agent"), None);
        assert_eq!(normalize("/home/../etc"), None);
        assert_eq!(normalize("/"), None);
    }
}
