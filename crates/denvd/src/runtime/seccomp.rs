//! The seccomp profile of every container denvd starts (spec `19-ref-protections.md` §4):
//! an allow-list, so a system call this list does not name fails.
//!
//! Why denvd has its own profile rather than Docker's default: on a btrfs host a volume's
//! disk cap is a qgroup limit on its subvolume, and any uid with write access to a
//! directory can create a subvolume there (`BTRFS_IOC_SUBVOL_CREATE`, no capability
//! needed), which is a qgroup of its own with no limit. Docker's default profile allows
//! every `ioctl`; this one refuses the btrfs subvolume and snapshot ioctls, comparing only
//! the request's low 16 bits, its type and number (the kernel ignores the upper 32 bits
//! and musl sign-extends, so setting upper bits is no way round the rule). The limit is
//! on a volume's exclusive bytes, and extents two volumes share are exclusive to neither,
//! so the profile also refuses every way to share extents: the clone and dedupe ioctls
//! (`EPERM`) and `copy_file_range` (`ENOSYS`, so programs copy with reads and writes).
//!
//! The shape (the engine's `seccomp=<json>` security option, the format of Docker's
//! `--security-opt seccomp=<file>`):
//!
//! - `defaultAction: SCMP_ACT_ERRNO` with `ENOSYS`: a call the list does not know (a
//!   system call newer than this list, or one the engine's libseccomp cannot name) looks
//!   unimplemented, so C libraries take their fallback (glibc retries `clone3` as
//!   `clone`, `fchmodat2` as `fchmodat`);
//! - [`UNIMPLEMENTED`] fail with `ENOSYS` too;
//! - [`ALLOWED`] unconditionally; `clone` only without namespace flags; `personality`
//!   only for the personas Docker allows; `ioctl` except [`REFUSED_IOCTLS`];
//! - [`REFUSED`] and the refused ioctls fail with `EPERM` (they exist but are not for a
//!   sandbox: mounts, namespaces, kernel keyrings, BPF, perf, module loading, clock
//!   setting, NUMA policy, io_uring);
//! - only the host's native architecture: a call through another table (`int 0x80` on
//!   x86-64) kills the process with `SIGSYS`.
//!
//! Capabilities still gate what the list allows (`chroot` needs `SYS_CHROOT`,
//! `sethostname` `SYS_ADMIN`, which no container has).

use serde_json::{json, Value};
use std::sync::OnceLock;

/// `errno` for calls the profile does not know: `ENOSYS`.
pub const UNKNOWN_ERRNO: u32 = 38;

/// `errno` for calls and ioctls the profile refuses by name: `EPERM`.
pub const REFUSED_ERRNO: u32 = 1;

/// Namespace flags of `clone` (`CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS |
/// CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET`): a `clone` with any of
/// them fails with `EPERM`.
pub const CLONE_NAMESPACE_FLAGS: u64 = 0x7E02_0000;

/// ioctl requests refused with `EPERM` (name, request): everything that makes a btrfs
/// subvolume (a qgroup outside the volume's limit) or changes a subvolume's flags or
/// received identity, and
/// everything that makes two files share extents (a reflink or a dedupe): on btrfs, data
/// two volumes share is exclusive to neither, so it would not count against either
/// volume's limit. `cp --reflink=auto` falls back to copying when the clone is refused.
pub const REFUSED_IOCTLS: &[(&str, u32)] = &[
    ("BTRFS_IOC_SNAP_CREATE", 0x5000_9401),
    // Also `BTRFS_IOC_CLONE`.
    ("FICLONE", 0x4004_9409),
    // Also `BTRFS_IOC_CLONE_RANGE`.
    ("FICLONERANGE", 0x4020_940D),
    ("BTRFS_IOC_SUBVOL_CREATE", 0x5000_940E),
    ("BTRFS_IOC_SNAP_CREATE_V2", 0x5000_9417),
    // Number 24 is also `BTRFS_IOC_START_SYNC` (`0x8008_9418`), refused with it: only
    // the type and number are compared.
    ("BTRFS_IOC_SUBVOL_CREATE_V2", 0x5000_9418),
    ("BTRFS_IOC_SUBVOL_SETFLAGS", 0x4008_941A),
    // The volume's owner could rewrite its subvolume's received UUID and transids.
    ("BTRFS_IOC_SET_RECEIVED_SUBVOL", 0xC0C8_9425),
    // Also `BTRFS_IOC_FILE_EXTENT_SAME`.
    ("FIDEDUPERANGE", 0xC018_9436),
];

/// System calls that look unimplemented (`ENOSYS`), so callers fall back to plain reads
/// and writes: `copy_file_range`, which on btrfs reflinks (the kernel clones when source
/// and target are on one file system, across mounts too); and `clone3`, whose flags are
/// in memory a filter cannot read (glibc retries as `clone`, whose flags are checked).
pub const UNIMPLEMENTED: &[&str] = &["clone3", "copy_file_range"];

/// `personality` values allowed (`PER_LINUX`, `PER_LINUX32`, `UNAME26`, both, and the
/// query `0xffffffff`).
const PERSONAS: &[u64] = &[0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

/// System calls refused with `EPERM`.
pub const REFUSED: &[&str] = &[
    // mounts and namespaces
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "open_tree_attr",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    // kernel keyrings, BPF, perf, userfaultfd, file handles
    "add_key",
    "request_key",
    "keyctl",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "name_to_handle_at",
    "open_by_handle_at",
    "fanotify_init",
    "fanotify_mark",
    "lookup_dcookie",
    // io_uring (a second way into most of the kernel, outside this list's view)
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    // the machine: modules, kexec, reboot, swap, accounting, quotas, clocks, logs
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "query_module",
    "get_kernel_syms",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "settimeofday",
    "stime",
    "clock_settime",
    "clock_adjtime",
    "syslog",
    "vhangup",
    "iopl",
    "ioperm",
    "modify_ldt",
    "vm86",
    "vm86old",
    // NUMA placement of other processes' memory
    "mbind",
    "set_mempolicy",
    "get_mempolicy",
    "set_mempolicy_home_node",
    "migrate_pages",
    "move_pages",
    // obsolete
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "nfsservctl",
];

#[rustfmt::skip]
/// System calls allowed without conditions: what programs in a container use (files,
/// memory, processes, signals, time, sockets, IPC, polling, scheduling).
pub const ALLOWED: &[&str] = &[
    // files and directories
    "read", "write", "open", "openat", "openat2", "close", "close_range", "creat",
    "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs", "lseek",
    "pread64", "pwrite64", "readv", "writev", "preadv", "pwritev", "preadv2", "pwritev2",
    "access", "faccessat", "faccessat2", "dup", "dup2", "dup3", "pipe", "pipe2", "fcntl",
    "flock", "fsync", "fdatasync", "sync", "syncfs", "sync_file_range", "truncate",
    "ftruncate", "fallocate", "fadvise64", "readahead", "getdents", "getdents64",
    "getcwd", "chdir", "fchdir", "rename", "renameat", "renameat2", "mkdir", "mkdirat",
    "rmdir", "link", "linkat", "unlink", "unlinkat", "symlink", "symlinkat", "readlink",
    "readlinkat", "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown",
    "lchown", "fchownat", "umask", "utime", "utimes", "utimensat", "futimesat", "mknod",
    "mknodat", "chroot", "sendfile", "splice", "tee", "vmsplice",
    "setxattr", "lsetxattr", "fsetxattr", "getxattr", "lgetxattr", "fgetxattr",
    "listxattr", "llistxattr", "flistxattr", "removexattr", "lremovexattr",
    "fremovexattr", "setxattrat", "getxattrat", "listxattrat", "removexattrat",
    "file_getattr", "file_setattr", "inotify_init", "inotify_init1", "inotify_add_watch",
    "inotify_rm_watch", "memfd_create", "memfd_secret", "cachestat",
    // memory
    "mmap", "mprotect", "munmap", "brk", "mremap", "msync", "mincore", "madvise",
    "mlock", "mlock2", "munlock", "mlockall", "munlockall", "remap_file_pages",
    "pkey_mprotect", "pkey_alloc", "pkey_free", "mseal", "map_shadow_stack",
    "process_madvise", "process_mrelease", "membarrier",
    // processes, credentials, limits
    "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid",
    "kill", "tkill", "tgkill", "getpid", "getppid", "gettid", "getpgid", "setpgid",
    "getpgrp", "getsid", "setsid", "getuid", "geteuid", "getgid", "getegid", "setuid",
    "setgid", "setreuid", "setregid", "setresuid", "getresuid", "setresgid",
    "getresgid", "setfsuid", "setfsgid", "getgroups", "setgroups", "capget", "capset",
    "prctl", "arch_prctl", "set_tid_address", "set_robust_list", "get_robust_list",
    "rseq", "seccomp", "getrlimit", "setrlimit", "prlimit64", "getrusage", "times",
    "uname", "sysinfo", "sethostname", "setdomainname", "getpriority", "setpriority",
    "ioprio_get", "ioprio_set", "sched_yield", "sched_setparam", "sched_getparam",
    "sched_setscheduler", "sched_getscheduler", "sched_get_priority_max",
    "sched_get_priority_min", "sched_rr_get_interval", "sched_setaffinity",
    "sched_getaffinity", "sched_setattr", "sched_getattr", "getcpu", "ptrace",
    "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_send_signal",
    "pidfd_getfd", "set_thread_area", "get_thread_area", "landlock_create_ruleset",
    "landlock_add_rule", "landlock_restrict_self", "lsm_get_self_attr",
    "lsm_set_self_attr", "lsm_list_modules", "restart_syscall", "getrandom",
    // signals
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending",
    "rt_sigtimedwait", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "rt_sigsuspend",
    "sigaltstack", "pause", "signalfd", "signalfd4", "alarm", "getitimer", "setitimer",
    // time
    "nanosleep", "clock_nanosleep", "clock_gettime", "clock_getres", "gettimeofday",
    "time", "adjtimex", "timer_create", "timer_settime", "timer_gettime",
    "timer_getoverrun", "timer_delete", "timerfd_create", "timerfd_settime",
    "timerfd_gettime",
    // polling, events, futexes, asynchronous I/O
    "poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl",
    "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2", "futex",
    "futex_waitv", "futex_wake", "futex_wait", "futex_requeue", "io_setup", "io_destroy",
    "io_getevents", "io_pgetevents", "io_submit", "io_cancel",
    // sockets
    "socket", "socketpair", "connect", "accept", "accept4", "bind", "listen", "shutdown",
    "getsockname", "getpeername", "setsockopt", "getsockopt", "sendto", "recvfrom",
    "sendmsg", "recvmsg", "sendmmsg", "recvmmsg",
    // System V and POSIX IPC
    "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
    "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend",
    "mq_timedreceive", "mq_notify", "mq_getsetattr",
];

/// Docker's name of the host's native seccomp architecture.
fn native_arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "SCMP_ARCH_AARCH64",
        "arm" => "SCMP_ARCH_ARM",
        "riscv64" => "SCMP_ARCH_RISCV64",
        "s390x" => "SCMP_ARCH_S390X",
        "powerpc64" => "SCMP_ARCH_PPC64LE",
        _ => "SCMP_ARCH_X86_64",
    }
}

/// A rule for `name` when argument `index` masked by `mask` equals `value`, with
/// `action` (`{"action": ..}` and maybe `errnoRet`).
fn masked(name: &str, action: &Value, index: u32, mask: u64, value: u64) -> Value {
    let mut rule = json!({
        "names": [name],
        "args": [{"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}],
    });
    if let (Some(r), Some(a)) = (rule.as_object_mut(), action.as_object()) {
        r.extend(a.clone());
    }
    rule
}

/// The 16-bit values other than `refused` as disjoint `(mask, value)` patterns: the
/// leaves of a binary trie over the bits, from the top bit down, that branch off every
/// refused value (at most 16 patterns per refused value).
fn complement16(refused: &[u16]) -> Vec<(u16, u16)> {
    fn walk(mask: u16, value: u16, bit: u32, set: &[u16], out: &mut Vec<(u16, u16)>) {
        for side in [0u16, 1] {
            let m = mask | (1 << bit);
            let v = value | (side << bit);
            let sub: Vec<u16> = set.iter().copied().filter(|r| r & m == v).collect();
            if sub.is_empty() {
                out.push((m, v));
            } else if bit > 0 {
                walk(m, v, bit - 1, &sub, out);
            }
        }
    }
    let mut out = Vec::new();
    if refused.is_empty() {
        out.push((0, 0));
    } else {
        walk(0, 0, 15, refused, &mut out);
    }
    out
}

/// The profile as Docker's JSON document (see the module doc).
///
/// libseccomp lets a plain rule for a system call win over every conditional rule for
/// it, whatever the order, so a call with conditions has only conditional rules here,
/// and they never overlap: `clone` is allowed without namespace flags and refused with
/// any; `ioctl` is allowed for every type and number (the low 16 bits of the request)
/// except those of [`REFUSED_IOCTLS`], which are refused. The upper 48 bits are not
/// compared: the kernel reads a 32-bit request, and musl sign-extends it.
pub fn profile() -> Value {
    let allow = json!({"action": "SCMP_ACT_ALLOW"});
    let refuse = json!({"action": "SCMP_ACT_ERRNO", "errnoRet": REFUSED_ERRNO});
    let mut rules = vec![
        json!({"names": ALLOWED, "action": "SCMP_ACT_ALLOW"}),
        json!({"names": REFUSED, "action": "SCMP_ACT_ERRNO", "errnoRet": REFUSED_ERRNO}),
        json!({"names": UNIMPLEMENTED, "action": "SCMP_ACT_ERRNO", "errnoRet": UNKNOWN_ERRNO}),
        masked("clone", &allow, 0, CLONE_NAMESPACE_FLAGS, 0),
    ];
    for bit in 0..64 {
        let flag = 1u64 << bit;
        if CLONE_NAMESPACE_FLAGS & flag != 0 {
            rules.push(masked("clone", &refuse, 0, flag, flag));
        }
    }
    rules.extend(PERSONAS.iter().map(|p| {
        json!({"names": ["personality"], "action": "SCMP_ACT_ALLOW",
               "args": [{"index": 0, "value": p, "op": "SCMP_CMP_EQ"}]})
    }));
    let mut low: Vec<u16> = REFUSED_IOCTLS.iter().map(|(_, r)| *r as u16).collect();
    low.sort_unstable();
    low.dedup();
    for (m, v) in complement16(&low) {
        rules.push(masked("ioctl", &allow, 1, u64::from(m), u64::from(v)));
    }
    for r in low {
        rules.push(masked("ioctl", &refuse, 1, 0xffff, u64::from(r)));
    }
    json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": UNKNOWN_ERRNO,
        "architectures": [native_arch()],
        "syscalls": rules,
    })
}

/// The engine's security option carrying [`profile`]: `seccomp=<json>` (built once).
pub fn security_opt() -> &'static str {
    static OPT: OnceLock<String> = OnceLock::new();
    OPT.get_or_init(|| format!("seccomp={}", profile()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn lists_are_disjoint_and_unique() {
        let allowed: HashSet<_> = ALLOWED.iter().collect();
        let refused: HashSet<_> = REFUSED.iter().collect();
        assert_eq!(allowed.len(), ALLOWED.len(), "a name twice in ALLOWED");
        assert_eq!(refused.len(), REFUSED.len(), "a name twice in REFUSED");
        let both: Vec<_> = allowed.intersection(&refused).collect();
        assert!(both.is_empty(), "allowed and refused: {both:?}");
        for special in ["clone", "personality", "ioctl"]
            .iter()
            .chain(UNIMPLEMENTED)
        {
            assert!(!allowed.contains(&special) && !refused.contains(&special));
        }
    }

    /// Whether `rules` (conditional rules on argument `index`) decide `arg`, and how.
    fn decide(rules: &[&Value], arg: u64) -> Vec<String> {
        rules
            .iter()
            .filter(|r| {
                let a = &r["args"][0];
                let (m, v) = (
                    a["value"].as_u64().unwrap(),
                    a["valueTwo"].as_u64().unwrap(),
                );
                arg & m == v
            })
            .map(|r| format!("{}{}", r["action"].as_str().unwrap(), r["errnoRet"]))
            .collect()
    }

    #[test]
    fn complement_is_disjoint_and_complete() {
        let refused = [
            0x9401u16, 0x9409, 0x940d, 0x940e, 0x9417, 0x9418, 0x941a, 0x9425, 0x9436,
        ];
        let pats = complement16(&refused);
        assert!(pats.len() <= 16 * refused.len(), "{}", pats.len());
        for x in 0..=u16::MAX {
            let n = pats.iter().filter(|(m, v)| x & m == *v).count();
            assert_eq!(n, usize::from(!refused.contains(&x)), "{x:#06x}");
        }
        assert_eq!(complement16(&[]), vec![(0, 0)]);
    }

    #[test]
    fn profile_shape() {
        let p = profile();
        assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(p["defaultErrnoRet"], 38);
        let rules = p["syscalls"].as_array().unwrap();
        // No system call has both a plain and a conditional rule.
        for r in rules.iter().filter(|r| r["args"].is_null()) {
            for n in r["names"].as_array().unwrap() {
                assert!(
                    !rules
                        .iter()
                        .any(|c| !c["args"].is_null() && c["names"][0] == *n),
                    "{n} has a plain and a conditional rule"
                );
            }
        }
        let ioctl: Vec<&Value> = rules.iter().filter(|r| r["names"][0] == "ioctl").collect();
        // Exactly one rule decides each request; the upper bits change nothing.
        for (req, want) in [
            (0x5000_940Eu64, "SCMP_ACT_ERRNO1"),
            (0x1_5000_940E, "SCMP_ACT_ERRNO1"),
            (0xffff_ffff_5000_9418, "SCMP_ACT_ERRNO1"),
            (0x4008_941A, "SCMP_ACT_ERRNO1"),
            (0x5401, "SCMP_ACT_ALLOWnull"),                // TCGETS
            (0xffff_ffff_8004_5430, "SCMP_ACT_ALLOWnull"), // TIOCGPTN, sign-extended
            (0x8008_6601, "SCMP_ACT_ALLOWnull"),           // FS_IOC_GETFLAGS
            (0x4004_9409, "SCMP_ACT_ERRNO1"),              // FICLONE
            (0x4020_940D, "SCMP_ACT_ERRNO1"),              // FICLONERANGE
            (0xffff_ffff_c018_9436, "SCMP_ACT_ERRNO1"),    // FIDEDUPERANGE, sign-extended
            (0xc0c8_9425, "SCMP_ACT_ERRNO1"),              // BTRFS_IOC_SET_RECEIVED_SUBVOL
            (0x8008_9418, "SCMP_ACT_ERRNO1"),              // BTRFS_IOC_START_SYNC (number 24)
            (0x4030_9410, "SCMP_ACT_ALLOWnull"),           // BTRFS_IOC_DEFRAG_RANGE
        ] {
            assert_eq!(decide(&ioctl, req), vec![want], "{req:#x}");
        }
        let enosys: Vec<&Value> = rules.iter().filter(|r| r["errnoRet"] == 38).collect();
        assert_eq!(enosys.len(), 1);
        assert_eq!(enosys[0]["names"], json!(["clone3", "copy_file_range"]));
        let clone: Vec<&Value> = rules.iter().filter(|r| r["names"][0] == "clone").collect();
        assert_eq!(decide(&clone, 0x11), vec!["SCMP_ACT_ALLOWnull"]);
        assert_eq!(decide(&clone, 0x3d0f00), vec!["SCMP_ACT_ALLOWnull"]); // a thread
        let userns = decide(&clone, 0x1000_0011);
        assert_eq!(userns, vec!["SCMP_ACT_ERRNO1"]);
        assert!(decide(&clone, 0x7E02_0011)
            .iter()
            .all(|d| d == "SCMP_ACT_ERRNO1"));
        assert!(security_opt().starts_with("seccomp={"));
    }
}
