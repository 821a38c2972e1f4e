//! The collection mechanism of `verify.collect` (spec `19-ref-protections.md` §3,
//! `21-snapshot-and-verify-explained.md`): reads each collect path of the frozen agent
//! container straight from its mount namespace and writes a normalised copy on the host.
//!
//! **Where it reads.** `root` is `/proc/<pid>/root` of the paused agent container,
//! opened by denvd (root on the host): the container's own view of its file system,
//! its volumes and tmpfs mounts included. Every lookup below it is one name at a time,
//! `fstatat(AT_SYMLINK_NOFOLLOW)` to classify and `openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS` to open, so no
//! symlink is ever followed, on the collect path's parents or anywhere below it, and
//! nothing outside the container's root can be reached.
//!
//! **Whose permissions.** Lookups, `stat`s, directory listings and opens on the agent's
//! side run with the agent process's credentials (its fs uid, fs gid and supplementary
//! groups, read from `/proc/<pid>/status`) as the effective ids of the collecting thread
//! only (`setresuid`, `setresgid`, `setgroups` as per-thread system calls): a file
//! or directory the agent itself could not read is refused (`<path>: not readable by
//! the agent`), never copied with denvd's privileges. Writes to the copy run as root.
//!
//! **Two passes.** Pass 1 walks and checks, reading no file content: a refusal is
//! decided from metadata, nothing is written. Pass 2 walks again with the same checks,
//! checks each file is the one pass 1 saw (`changed during collection` otherwise) and
//! streams its content (at most its size from pass 1, which is within the limit) into
//! the copy. Memory is bounded by the entry limit (names of the directories being
//! walked), never by the content.
//!
//! **Limits** (over all collect paths of one submission together): [`MAX_FILES`]
//! entries, where every collect path that exists counts as one entry and so does
//! everything under it; [`MAX_BYTES`] of regular-file content by `st_size` (so a sparse
//! file counts its apparent size and is refused without being read); directories at
//! most [`MAX_DEPTH`] levels below the collect path (its children are level 1; a file
//! counts the level of its directory); `/submission/<path>` at most [`MAX_PATH`] bytes.
//!
//! **The copy.** Every entry is created new by denvd (so no extended attributes, ACLs
//! or set-id bits carry over), owned by [`COPY_UID`]:[`COPY_GID`] (not root, so tools
//! that protect their user from files owned by someone else, such as git, keep doing
//! so in a grader running as root), mode `original & 0o555` (no write, set-id or
//! sticky bits). Names are copied byte for byte; refusals show them with
//! [`show`]'s escapes.

use super::check::{MAX_BYTES, MAX_DEPTH, MAX_FILES};
use super::CollectResult;
use nix::errno::Errno;
use nix::fcntl::{openat, openat2, OFlag, OpenHow, ResolveFlag};
use nix::libc;
use nix::sys::stat::{fchmod, fstat, fstatat, mkdirat, FileStat, Mode, SFlag};
use nix::unistd::{fchown, Gid, Uid};
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

/// Owner of every entry of the copy: `nobody` (65534).
pub const COPY_UID: u32 = 65534;
/// Group of every entry of the copy: `nogroup` (65534).
pub const COPY_GID: u32 = 65534;
/// Longest path the grader sees, `/submission/<path>`, in bytes (`PATH_MAX` - 1).
pub const MAX_PATH: usize = 4095;
const PREFIX_LEN: usize = "/submission/".len();

/// File-system credentials of the agent's process (`/proc/<pid>/status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Creds {
    /// File-system uid.
    pub uid: u32,
    /// File-system gid.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Creds {
    /// Parses the `Uid:`, `Gid:` and `Groups:` lines of `/proc/<pid>/status` (the
    /// fourth field of `Uid`/`Gid` is the file-system id). `None` when absent.
    pub fn from_status(status: &str) -> Option<Creds> {
        let field = |key: &str| -> Option<Vec<u32>> {
            let line = status.lines().find(|l| l.starts_with(key))?;
            line[key.len()..]
                .split_whitespace()
                .map(|t| t.parse().ok())
                .collect()
        };
        let uid = *field("Uid:")?.get(3)?;
        let gid = *field("Gid:")?.get(3)?;
        let groups = field("Groups:").unwrap_or_default();
        Some(Creds { uid, gid, groups })
    }
}

/// A name or path for messages: valid UTF-8 is kept, except `\` and control
/// characters; other bytes are written `\xNN`. Paths longer than 160 bytes keep their
/// first 120 bytes and end in `…`.
pub fn show(bytes: &[u8]) -> String {
    let (b, cut) = if bytes.len() > 160 {
        (&bytes[..120], true)
    } else {
        (bytes, false)
    };
    let mut out = String::new();
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => {
                    let mut buf = [0u8; 4];
                    for x in c.encode_utf8(&mut buf).bytes() {
                        out.push_str(&format!("\\x{x:02x}"));
                    }
                }
                c => out.push(c),
            }
        }
        for x in chunk.invalid() {
            out.push_str(&format!("\\x{x:02x}"));
        }
    }
    if cut {
        out.push('…');
    }
    out
}

/// Why a walk stopped.
enum Stop {
    Refused(String),
    Io(io::Error),
}

type Step<T = ()> = Result<T, Stop>;

fn refuse<T>(path: &[u8], why: &str) -> Step<T> {
    Err(Stop::Refused(format!("{}: {why}", show(path))))
}

fn resolve_flags() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

/// Switches the calling thread's effective uid and gid (`setresuid`/`setresgid` as
/// system calls: this thread only). Real and saved ids stay root's, so switching back
/// restores the capabilities.
fn set_thread_ids(uid: u32, gid: u32, uid_first: bool) -> nix::Result<()> {
    use rustix::thread::{set_thread_res_gid, set_thread_res_uid, Gid as RGid, Uid as RUid};
    let errno = |e: rustix::io::Errno| Errno::from_raw(e.raw_os_error());
    let u = || set_thread_res_uid(None, RUid::from_raw(uid), None).map_err(errno);
    let g = || set_thread_res_gid(None, RGid::from_raw(gid), None).map_err(errno);
    if uid_first {
        u().and_then(|()| g())
    } else {
        g().and_then(|()| u())
    }
}

struct Walk<'a> {
    agent: Option<&'a Creds>,
    own: (u32, u32),
    entries: u64,
    files: u64,
    bytes: u64,
}

impl<'a> Walk<'a> {
    fn new(agent: Option<&'a Creds>, own: (u32, u32)) -> Self {
        Walk {
            agent,
            own,
            entries: 0,
            files: 0,
            bytes: 0,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
}

impl Walk<'_> {
    /// Runs `f` with the agent's file-system ids (when known).
    fn as_agent<T>(&self, f: impl FnOnce() -> nix::Result<T>) -> nix::Result<T> {
        match self.agent {
            Some(c) => {
                // The gid first: changing it needs the capabilities the uid drops.
                set_thread_ids(c.uid, c.gid, false)?;
                let r = f();
                set_thread_ids(self.own.0, self.own.1, true)
                    .expect("back to denvd's own ids (real and saved ids are kept)");
                r
            }
            None => f(),
        }
    }

    /// An errno on the agent's side: refusals for what the agent can cause, an infra
    /// error otherwise.
    fn src_err<T>(&self, e: Errno, path: &[u8]) -> Step<T> {
        match e {
            Errno::EACCES | Errno::EPERM => refuse(path, "not readable by the agent"),
            Errno::ELOOP => refuse(path, "symlink"),
            Errno::ENOENT | Errno::ENOTDIR | Errno::ENXIO | Errno::ESTALE => {
                refuse(path, "changed during collection")
            }
            Errno::ENAMETOOLONG => refuse(path, "name too long"),
            Errno::EOVERFLOW | Errno::EFBIG => refuse(path, "file too large"),
            e => Err(Stop::Io(io::Error::new(
                io::Error::from(e).kind(),
                format!("read {}: {e}", show(path)),
            ))),
        }
    }

    fn stat(&self, dir: BorrowedFd, name: &CStr, path: &[u8]) -> Step<FileStat> {
        self.as_agent(|| fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW))
            .or_else(|e| self.src_err(e, path))
    }

    /// Classifies `st`; special files, multiply-linked files are refusals.
    fn kind(st: &FileStat, path: &[u8]) -> Step<Kind> {
        let t = SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT);
        match t {
            SFlag::S_IFDIR => Ok(Kind::Dir),
            SFlag::S_IFREG if st.st_nlink > 1 => refuse(path, "hard link"),
            SFlag::S_IFREG => Ok(Kind::File),
            SFlag::S_IFLNK => refuse(path, "symlink"),
            SFlag::S_IFIFO => refuse(path, "fifo"),
            SFlag::S_IFCHR | SFlag::S_IFBLK => refuse(path, "device"),
            SFlag::S_IFSOCK => refuse(path, "socket"),
            _ => refuse(path, "unsupported file type"),
        }
    }

    /// Opens `name` under `dir` as the agent, and checks it is still `st`.
    fn open(
        &self,
        dir: BorrowedFd,
        name: &CStr,
        flags: OFlag,
        st: &FileStat,
        path: &[u8],
    ) -> Step<OwnedFd> {
        // openat2 refuses O_PATH with any flag but these three.
        let extra = if flags.contains(OFlag::O_PATH) {
            OFlag::empty()
        } else {
            OFlag::O_NOCTTY
        };
        let how = OpenHow::new()
            .flags(flags | extra | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(resolve_flags());
        let fd = self
            .as_agent(|| openat2(dir, name, how))
            .or_else(|e| self.src_err(e, path))?;
        let now = fstat(&fd).map_err(|e| Stop::Io(e.into()))?;
        if (now.st_dev, now.st_ino, now.st_mode & libc::S_IFMT)
            != (st.st_dev, st.st_ino, st.st_mode & libc::S_IFMT)
        {
            return refuse(path, "changed during collection");
        }
        Ok(fd)
    }

    /// Walks the entry `name` of `dir` (`path` relative to `/`, `depth` below the
    /// collect path), copying it under `dest` when given.
    fn entry(
        &mut self,
        dir: BorrowedFd,
        name: &CStr,
        path: &mut Vec<u8>,
        depth: usize,
        collect_rel: &str,
        dest: Option<BorrowedFd>,
    ) -> Step {
        self.entries += 1;
        if self.entries > MAX_FILES {
            return Err(Stop::Refused(format!(
                "{collect_rel}: more than {MAX_FILES} files"
            )));
        }
        if PREFIX_LEN + path.len() > MAX_PATH {
            return refuse(path, &format!("path longer than {MAX_PATH} bytes"));
        }
        let st = self.stat(dir, name, path)?;
        let mode = Mode::from_bits_truncate((st.st_mode & 0o555) as libc::mode_t);
        match Self::kind(&st, path)? {
            Kind::File => {
                let size = st.st_size as u64;
                self.bytes += size;
                if self.bytes > MAX_BYTES {
                    return Err(Stop::Refused(format!(
                        "{collect_rel}: submission larger than 256 MiB"
                    )));
                }
                self.files += 1;
                let Some(dest) = dest else { return Ok(()) };
                let src = self.open(dir, name, OFlag::O_RDONLY | OFlag::O_NONBLOCK, &st, path)?;
                if fstat(&src).map_err(|e| Stop::Io(e.into()))?.st_size != st.st_size {
                    return refuse(path, "changed during collection");
                }
                let out = match openat(
                    dest,
                    name,
                    OFlag::O_WRONLY
                        | OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o600),
                ) {
                    Ok(fd) => fd,
                    // Collected twice through overlapping collect paths.
                    Err(Errno::EEXIST) => return Ok(()),
                    Err(e) => return Err(dest_err(e, path)),
                };
                let mut out = File::from(out);
                let copied = io::copy(&mut File::from(src).take(size), &mut out)
                    .map_err(|e| Stop::Io(io_ctx(e, path)))?;
                if copied != size {
                    return refuse(path, "changed during collection");
                }
                finish(out.as_fd(), mode, path)
            }
            Kind::Dir => {
                if depth > MAX_DEPTH {
                    return refuse(path, &format!("deeper than {MAX_DEPTH}"));
                }
                let fd = self.open(dir, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY, &st, path)?;
                let names = self.list(&fd, collect_rel, path)?;
                let out = match dest {
                    Some(dest) => Some(dest_dir(dest, name, path)?),
                    None => None,
                };
                for n in names {
                    let len = path.len();
                    path.push(b'/');
                    path.extend_from_slice(n.to_bytes());
                    let r = self.entry(
                        fd.as_fd(),
                        &n,
                        path,
                        depth + 1,
                        collect_rel,
                        out.as_ref().map(|o| o.as_fd()),
                    );
                    path.truncate(len);
                    r?;
                }
                match out {
                    Some(o) => finish(o.as_fd(), mode, path),
                    None => Ok(()),
                }
            }
        }
    }

    /// The names in `fd` (without `.` and `..`), sorted; stops reading once they would
    /// exceed the entry limit.
    fn list(&self, fd: &OwnedFd, collect_rel: &str, path: &[u8]) -> Step<Vec<CString>> {
        let dup = fd.try_clone().map_err(Stop::Io)?;
        let mut d = nix::dir::Dir::from_fd(dup).map_err(|e| Stop::Io(e.into()))?;
        let room = MAX_FILES.saturating_sub(self.entries);
        let mut names = Vec::new();
        for e in d.iter() {
            let e = match e {
                Ok(e) => e,
                Err(e) => return self.src_err(e, path),
            };
            let n = e.file_name();
            if n.to_bytes() == b"." || n.to_bytes() == b".." {
                continue;
            }
            if names.len() as u64 >= room {
                return Err(Stop::Refused(format!(
                    "{collect_rel}: more than {MAX_FILES} files"
                )));
            }
            names.push(n.to_owned());
        }
        names.sort();
        Ok(names)
    }

    /// Resolves the parents of one collect path under `root`, one name at a time.
    /// `Ok(None)`: missing.
    fn parents(
        &self,
        root: BorrowedFd,
        comps: &[&[u8]],
        collect_rel: &str,
    ) -> Step<Option<OwnedFd>> {
        let mut cur = root.try_clone_to_owned().map_err(Stop::Io)?;
        for c in comps {
            let name =
                CString::new(*c).map_err(|_| Stop::Refused(format!("{collect_rel}: bad name")))?;
            let st = match self.as_agent(|| {
                fstatat(
                    cur.as_fd(),
                    name.as_c_str(),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                )
            }) {
                Ok(st) => st,
                Err(Errno::ENOENT | Errno::ENOTDIR) => return Ok(None),
                Err(e) => return self.src_err(e, collect_rel.as_bytes()),
            };
            match SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT) {
                SFlag::S_IFDIR => {}
                SFlag::S_IFLNK => return refuse(collect_rel.as_bytes(), "symlink"),
                _ => return Ok(None),
            }
            cur = self.open(
                cur.as_fd(),
                &name,
                OFlag::O_PATH | OFlag::O_DIRECTORY,
                &st,
                collect_rel.as_bytes(),
            )?;
        }
        Ok(Some(cur))
    }

    /// One collect path (normalised, absolute). `Ok(false)`: missing.
    fn path(&mut self, root: BorrowedFd, abs: &str, dest: Option<BorrowedFd>) -> Step<bool> {
        let collect_rel = abs.trim_start_matches('/');
        let comps: Vec<&[u8]> = collect_rel.split('/').map(str::as_bytes).collect();
        let (leaf, parents) = comps.split_last().expect("normalised paths have a name");
        let Some(dir) = self.parents(root, parents, collect_rel)? else {
            return Ok(false);
        };
        let name =
            CString::new(*leaf).map_err(|_| Stop::Refused(format!("{collect_rel}: bad name")))?;
        let leaf_st = self.as_agent(|| {
            fstatat(
                dir.as_fd(),
                name.as_c_str(),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )
        });
        if let Err(Errno::ENOENT | Errno::ENOTDIR) = leaf_st {
            return Ok(false);
        }
        let out = match dest {
            Some(d) => {
                let mut cur = d.try_clone_to_owned().map_err(Stop::Io)?;
                for p in parents {
                    let n = CString::new(*p).expect("checked above");
                    cur = dest_dir(cur.as_fd(), &n, p)?;
                    finish(cur.as_fd(), Mode::from_bits_truncate(0o555), p)?;
                }
                Some(cur)
            }
            None => None,
        };
        let mut path = collect_rel.as_bytes().to_vec();
        self.entry(
            dir.as_fd(),
            &name,
            &mut path,
            0,
            collect_rel,
            out.as_ref().map(|o| o.as_fd()),
        )?;
        Ok(true)
    }
}

fn io_ctx(e: io::Error, path: &[u8]) -> io::Error {
    io::Error::new(e.kind(), format!("copy {}: {e}", show(path)))
}

fn dest_err(e: Errno, path: &[u8]) -> Stop {
    Stop::Io(io::Error::new(
        io::Error::from(e).kind(),
        format!("write the copy of {}: {e}", show(path)),
    ))
}

/// Creates (or reuses) the directory `name` in the copy and opens it.
fn dest_dir(dest: BorrowedFd, name: &CStr, path: &[u8]) -> Step<OwnedFd> {
    match mkdirat(dest, name, Mode::from_bits_truncate(0o700)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(dest_err(e, path)),
    }
    openat(
        dest,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| dest_err(e, path))
}

/// Owner and mode of one entry of the copy.
fn finish(fd: BorrowedFd, mode: Mode, path: &[u8]) -> Step {
    fchown(
        fd,
        Some(Uid::from_raw(COPY_UID)),
        Some(Gid::from_raw(COPY_GID)),
    )
    .and_then(|()| fchmod(fd, mode))
    .map_err(|e| dest_err(e, path))
}

/// Collects `paths` (normalised, absolute) from under `root` into
/// `<dir>/submission` (see the module docs). Runs on its own thread (it changes that
/// thread's credentials). Errors are infrastructure failures (the copy cannot be
/// written, the host's disk); everything the agent can cause is in `refused`.
pub fn collect(
    root: OwnedFd,
    agent: Option<Creds>,
    paths: Vec<String>,
    dir: &Path,
) -> io::Result<CollectResult> {
    let dir = dir.to_path_buf();
    std::thread::Builder::new()
        .name("verify-collect".into())
        .spawn(move || collect_on_this_thread(root.as_fd(), agent.as_ref(), &paths, &dir))?
        .join()
        .map_err(|_| io::Error::other("verify collect thread panicked"))?
}

fn collect_on_this_thread(
    root: BorrowedFd,
    agent: Option<&Creds>,
    paths: &[String],
    dir: &Path,
) -> io::Result<CollectResult> {
    let agent = agent.filter(|c| c.uid != 0);
    if let Some(c) = agent {
        let groups: Vec<_> = c
            .groups
            .iter()
            .map(|g| rustix::thread::Gid::from_raw(*g))
            .collect();
        rustix::thread::set_thread_groups(&groups)?;
    }
    let own = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    let mut out = CollectResult::default();
    let mut w = Walk::new(agent, own);
    for p in paths {
        match w.path(root, p, None) {
            Ok(true) => {}
            Ok(false) => out.missing.push(p.clone()),
            Err(Stop::Refused(r)) => out.refused.push(r),
            Err(Stop::Io(e)) => return Err(e),
        }
    }
    if !out.refused.is_empty() {
        return Ok(out);
    }
    // Pass 2: the copy.
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    let tmp = dir.join(format!(".submission.partial-{:08x}", rand::random::<u32>()));
    std::fs::create_dir(&tmp)?;
    let r = (|| -> io::Result<Vec<String>> {
        let t = File::open(&tmp)?;
        let mut w = Walk::new(agent, own);
        let mut refused = Vec::new();
        for p in paths {
            match w.path(root, p, Some(t.as_fd())) {
                Ok(_) => {}
                Err(Stop::Refused(r)) => refused.push(r),
                Err(Stop::Io(e)) => return Err(e),
            }
        }
        finish(t.as_fd(), Mode::from_bits_truncate(0o555), b"/").map_err(|s| match s {
            Stop::Io(e) => e,
            Stop::Refused(r) => io::Error::other(r),
        })?;
        out.files = w.files;
        out.bytes = w.bytes;
        Ok(refused)
    })();
    match r {
        Ok(refused) if refused.is_empty() => {
            let sub = dir.join("submission");
            std::fs::rename(&tmp, &sub)?;
            Ok(out)
        }
        Ok(refused) => {
            std::fs::remove_dir_all(&tmp)?;
            Ok(CollectResult {
                files: 0,
                bytes: 0,
                missing: out.missing,
                refused,
            })
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_messages_are_escaped_and_cut() {
        assert_eq!(show(b"home/agent/a.txt"), "home/agent/a.txt");
        assert_eq!(show("é".as_bytes()), "é");
        assert_eq!(show(b"a\xffb\nc\\d\x01"), r"a\xffb\x0ac\\d\x01");
        let long = vec![b'a'; 161];
        assert_eq!(show(&long), format!("{}…", "a".repeat(120)));
        assert_eq!(show(&long[..160]), "a".repeat(160));
    }

    #[test]
    fn credentials_come_from_the_fs_ids_of_the_status() {
        let st =
            "Name:\tsleep\nUid:\t1000\t1001\t1002\t1003\nGid:\t50\t51\t52\t53\nGroups:\t4 24 \n";
        assert_eq!(
            Creds::from_status(st),
            Some(Creds {
                uid: 1003,
                gid: 53,
                groups: vec![4, 24]
            })
        );
        assert_eq!(
            Creds::from_status("Uid:\t1\t1\t1\t1\nGid:\t2\t2\t2\t2\nGroups:\t\n")
                .unwrap()
                .groups,
            Vec::<u32>::new()
        );
        assert_eq!(Creds::from_status("Name: x\n"), None);
    }
}
