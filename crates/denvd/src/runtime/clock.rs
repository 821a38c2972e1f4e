//! `x-denv.clock: frozen` (spec `13-ref-compose.md`, `30-blog-creating-an-environment.md`):
//! every process of an environment created from a snapshot observes the wall clock of the
//! snapshot's world instant at the environment's start, advancing normally from there.
//!
//! Linux has no per-container `CLOCK_REALTIME` (time namespaces offset only the monotonic
//! and boot clocks), so the clock is moved inside the processes: the host's libfaketime
//! (`libfaketime.so.1`, Debian package `libfaketime`) is bind-mounted read-only into every
//! container of the environment and preloaded (`LD_PRELOAD`), with one relative offset
//! for the whole environment, `offset = world instant − real time at the start`, in a
//! per-environment file (`<data>/envs/<env>/clock/faketimerc`, mounted read-only at
//! [`SPEC_IN_CONTAINER`], named by `FAKETIME_TIMESTAMP_FILE`). A relative offset keeps
//! every process of the environment on one clock whenever it starts (libfaketime's
//! absolute `@…` form would restart for each process).
//!
//! What it covers: dynamically linked programs of glibc images (`time`, `gettimeofday`,
//! `clock_gettime(CLOCK_REALTIME…)` through libc). Statically linked programs (busybox,
//! Go binaries) do not load the preload and see the real clock. A musl program would not
//! start with the glibc library preloaded and a jemalloc program would hang, so services
//! of images with one of [`uncovered_markers`] get neither the mounts nor the variables
//! and stay on the real clock, reported per fork. The monotonic clocks are not moved (`FAKETIME_DONT_FAKE_MONOTONIC=1`)
//! and file timestamps are the kernel's (`NO_FAKE_STAT=1`). A process can unset
//! `LD_PRELOAD` for itself and its children: the clock serves replay, not containment.

use std::path::{Path, PathBuf};

/// Where the library is mounted in every container of a frozen-clock environment.
pub const LIB_IN_CONTAINER: &str = "/run/denv/libfaketime.so.1";

/// Where the environment's offset file is mounted (read-only) in its containers.
pub const SPEC_IN_CONTAINER: &str = "/run/denv/faketimerc";

/// libfaketime 0.9.10 keeps a POSIX semaphore per process tree named after the pid that
/// created it (`/dev/shm/sem.faketime_sem_<pid>`, mode 0600). An entrypoint that starts
/// as root and re-executes itself as another user under the same pid (`gosu`/`su-exec`,
/// as the postgres and redis images do as pid 1) would find its own root-owned semaphore,
/// fail to open it and exit. An empty read-only file at pid 1's name makes the creation
/// fail, which libfaketime tolerates (it then keeps no shared state, which a plain offset
/// does not need).
pub const SHM_BLOCKER_IN_CONTAINER: &str = "/dev/shm/sem.faketime_sem_1";

/// The musl dynamic loader of this machine's architecture inside an image
/// (`/lib/ld-musl-x86_64.so.1`, `/lib/ld-musl-aarch64.so.1`): an image that has it is
/// musl-based, and its services are left on the real clock (a musl program preloading
/// the glibc libfaketime fails to start: `Error relocating …: __snprintf_chk: symbol not
/// found`, exit 127).
pub fn musl_loader() -> String {
    format!("/lib/ld-musl-{}.so.1", std::env::consts::ARCH)
}

/// Files whose presence in an image leaves its services on the real clock under a
/// frozen one, in the order they are looked for, each with why (the reason's first word
/// is the kind):
///
/// - the musl loader ([`musl_loader`]): `musl` (the program would not start);
/// - a shared jemalloc (`libjemalloc.so.2` in the usual library directories):
///   `jemalloc` (jemalloc reads the clock while libfaketime initialises and the program
///   hangs, libfaketime issue 130: Debian's `redis-server` and `redis-cli` do).
///
/// A program that links jemalloc statically (upstream redis builds) hangs the same way
/// and is not detected.
pub fn uncovered_markers() -> Vec<(String, &'static str)> {
    let arch = std::env::consts::ARCH;
    let mut v = vec![(musl_loader(), "musl")];
    for p in [
        format!("/usr/lib/{arch}-linux-gnu/libjemalloc.so.2"),
        "/usr/lib/libjemalloc.so.2".to_string(),
        "/usr/lib64/libjemalloc.so.2".to_string(),
        "/usr/local/lib/libjemalloc.so.2".to_string(),
    ] {
        v.push((p, "jemalloc"));
    }
    v
}

/// Environment variable naming the library on the host (overrides [`LIB_CANDIDATES`]).
pub const LIB_ENV: &str = "DENV_LIBFAKETIME";

/// Where the library is looked for on the host, in order (Debian's multiarch paths first).
pub const LIB_CANDIDATES: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/lib64/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
];

/// `$DENV_LIBFAKETIME` when set and not empty.
pub fn lib_from_env() -> Option<PathBuf> {
    std::env::var_os(LIB_ENV)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// The host's libfaketime: `configured` (from `DENV_LIBFAKETIME`) when given, else the
/// first of [`LIB_CANDIDATES`] that is a file. The error says what was looked for and
/// how to fix it.
pub fn find_lib(configured: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = configured {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(format!(
                "x-denv.clock: frozen needs libfaketime on this host: {LIB_ENV}={} is not a file",
                p.display()
            ))
        };
    }
    LIB_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "x-denv.clock: frozen needs libfaketime on this host and it is not installed \
                 (looked for {}; install the libfaketime package or set {LIB_ENV})",
                LIB_CANDIDATES.join(", ")
            )
        })
}

/// The offset (ms) that makes the world's clock read `world_instant_ms` at the real
/// instant `real_now_ms` (both ms since the Unix epoch): `world − real`, negative for a
/// snapshot in the past.
pub fn offset_ms(world_instant_ms: i64, real_now_ms: i64) -> i64 {
    world_instant_ms.saturating_sub(real_now_ms)
}

/// The world's clock at the real instant `real_now_ms` for an environment with
/// `offset_ms`.
pub fn world_ms(real_now_ms: i64, offset_ms: i64) -> i64 {
    real_now_ms.saturating_add(offset_ms)
}

/// libfaketime's relative-offset spelling of `offset_ms`: a sign, whole seconds, `.` and
/// three digits (`-86400.250`, `+0.000`). libfaketime reads the fraction with the C
/// library's `strtod`, so a process whose numeric locale uses another decimal mark when
/// the file is read again (every 10 s) would see the offset truncated to whole seconds.
pub fn offset_spec(offset_ms: i64) -> String {
    let sign = if offset_ms < 0 { '-' } else { '+' };
    let a = offset_ms.unsigned_abs();
    format!("{sign}{}.{:03}", a / 1000, a % 1000)
}

/// [`offset_spec`] read back (`None` for anything else).
pub fn parse_offset_spec(s: &str) -> Option<i64> {
    let s = s.trim();
    let (neg, rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => return None,
    };
    let (secs, frac) = rest.split_once('.').unwrap_or((rest, ""));
    if secs.is_empty()
        || !secs.bytes().all(|b| b.is_ascii_digit())
        || frac.len() > 3
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let ms =
        secs.parse::<i64>().ok()?.checked_mul(1000)? + format!("{frac:0<3}").parse::<i64>().ok()?;
    Some(if neg { -ms } else { ms })
}

/// Real time now, ms since the Unix epoch.
pub fn real_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `ms` since the Unix epoch as RFC 3339 UTC with milliseconds (`2026-12-01T14:19:15.750Z`).
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// The environment's clock directory on the host (`<env dir>/clock`).
pub fn dir(env_dir: &Path) -> PathBuf {
    env_dir.join("clock")
}

/// The offset file on the host.
pub fn spec_file(env_dir: &Path) -> PathBuf {
    dir(env_dir).join("faketimerc")
}

/// The empty file mounted at [`SHM_BLOCKER_IN_CONTAINER`].
pub fn blocker_file(env_dir: &Path) -> PathBuf {
    dir(env_dir).join("no-shm")
}

/// What every container of a frozen-clock environment gets: its bind mounts
/// (`host:container:ro`) and environment variables (`KEY=VALUE`).
#[derive(Debug, Clone, PartialEq)]
pub struct Mounts {
    /// Bind mounts, read-only.
    pub binds: Vec<String>,
    /// `LD_PRELOAD` and libfaketime's settings.
    pub env: Vec<(String, String)>,
    /// The environment's offset, ms.
    pub offset_ms: i64,
}

/// The mounts and variables for an environment whose clock files are in `env_dir`, with
/// the host library at `lib`. A service's own `LD_PRELOAD` is kept after the library.
pub fn mounts(env_dir: &Path, lib: &Path, offset_ms: i64) -> Mounts {
    Mounts {
        binds: vec![
            format!("{}:{LIB_IN_CONTAINER}:ro", lib.display()),
            format!("{}:{SPEC_IN_CONTAINER}:ro", spec_file(env_dir).display()),
            format!(
                "{}:{SHM_BLOCKER_IN_CONTAINER}:ro",
                blocker_file(env_dir).display()
            ),
        ],
        env: vec![
            ("LD_PRELOAD".into(), LIB_IN_CONTAINER.into()),
            ("FAKETIME_TIMESTAMP_FILE".into(), SPEC_IN_CONTAINER.into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
            ("NO_FAKE_STAT".into(), "1".into()),
        ],
        offset_ms,
    }
}

/// A service's environment with the clock's variables: the clock's `LD_PRELOAD` goes
/// first, a service's own preload is kept after it (space-separated).
pub fn merge_env(
    service_env: &std::collections::BTreeMap<String, String>,
    m: &Mounts,
) -> Vec<String> {
    let mut env = service_env.clone();
    for (k, v) in &m.env {
        let v = match (k.as_str(), service_env.get(k)) {
            ("LD_PRELOAD", Some(own)) if !own.is_empty() => format!("{v} {own}"),
            _ => v.clone(),
        };
        env.insert(k.clone(), v);
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// Writes the clock files of an environment (`faketimerc` with `offset_ms`, the empty
/// blocker), replacing earlier ones.
pub fn write_files(env_dir: &Path, offset_ms: i64) -> std::io::Result<()> {
    let d = dir(env_dir);
    std::fs::create_dir_all(&d)?;
    let tmp = d.join(".faketimerc.tmp");
    std::fs::write(&tmp, format!("{}\n", offset_spec(offset_ms)))?;
    std::fs::rename(&tmp, spec_file(env_dir))?;
    std::fs::write(blocker_file(env_dir), b"")?;
    Ok(())
}

/// The offset the environment's processes run with: its `faketimerc`, 0 when it has none
/// (the real clock).
pub fn current_offset_ms(env_dir: &Path) -> i64 {
    std::fs::read_to_string(spec_file(env_dir))
        .ok()
        .and_then(|s| parse_offset_spec(&s))
        .unwrap_or(0)
}

/// Removes the clock files (the environment runs on the real clock).
pub fn remove_files(env_dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir(env_dir)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_is_world_minus_real() {
        // A snapshot at T, forked 90.5 s later: the clock runs 90.5 s behind.
        assert_eq!(offset_ms(1_000_000, 1_090_500), -90_500);
        assert_eq!(world_ms(1_090_500, -90_500), 1_000_000);
        // The world instant of a snapshot of that fork, taken 10 s after its start, is
        // 10 s after the first snapshot: offsets compose.
        assert_eq!(world_ms(1_100_500, -90_500), 1_010_000);
        assert_eq!(offset_ms(5, 5), 0);
        assert_eq!(offset_ms(i64::MIN, i64::MAX), i64::MIN);
    }

    #[test]
    fn a_missing_library_is_named() {
        let e = find_lib(Some(Path::new("/nonexistent/libfaketime.so.1"))).unwrap_err();
        assert_eq!(
            e,
            "x-denv.clock: frozen needs libfaketime on this host: \
             DENV_LIBFAKETIME=/nonexistent/libfaketime.so.1 is not a file"
        );
        let here = std::env::current_exe().unwrap();
        assert_eq!(find_lib(Some(&here)).unwrap(), here);
    }

    #[test]
    fn instants_print_as_rfc3339() {
        assert_eq!(rfc3339(1_796_134_755_750), "2026-12-01T14:19:15.750Z");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn spec_spelling() {
        assert_eq!(offset_spec(-86_400_250), "-86400.250");
        assert_eq!(offset_spec(0), "+0.000");
        assert_eq!(offset_spec(7), "+0.007");
        assert_eq!(offset_spec(-1), "-0.001");
        assert_eq!(offset_spec(12_345), "+12.345");
        for ms in [0, 1, -1, 999, -1000, 86_400_250, -86_400_250, i64::MIN / 2] {
            assert_eq!(parse_offset_spec(&offset_spec(ms)), Some(ms), "{ms}");
        }
        assert_eq!(parse_offset_spec("-120\n"), Some(-120_000));
        assert_eq!(parse_offset_spec("+1.5"), Some(1_500));
        for bad in [
            "",
            "120",
            "-",
            "-1.2345",
            "+1,5",
            "-1d",
            "@2020-01-01",
            "+-1",
        ] {
            assert_eq!(parse_offset_spec(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn files_round_trip() {
        let d = std::env::temp_dir().join(format!("denv-clock-test-{}", rand::random::<u32>()));
        assert_eq!(current_offset_ms(&d), 0, "no file: the real clock");
        write_files(&d, -3_600_042).unwrap();
        assert_eq!(current_offset_ms(&d), -3_600_042);
        assert_eq!(
            std::fs::read_to_string(spec_file(&d)).unwrap(),
            "-3600.042\n"
        );
        assert_eq!(std::fs::read(blocker_file(&d)).unwrap().len(), 0);
        remove_files(&d).unwrap();
        remove_files(&d).unwrap();
        assert_eq!(current_offset_ms(&d), 0);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn env_keeps_a_service_preload() {
        let m = mounts(Path::new("/d/envs/e"), Path::new("/lib/ft.so.1"), -5);
        assert_eq!(
            m.binds,
            [
                "/lib/ft.so.1:/run/denv/libfaketime.so.1:ro",
                "/d/envs/e/clock/faketimerc:/run/denv/faketimerc:ro",
                "/d/envs/e/clock/no-shm:/dev/shm/sem.faketime_sem_1:ro",
            ]
        );
        let own = [
            ("LD_PRELOAD".to_string(), "/x/own.so".to_string()),
            ("A".to_string(), "1".to_string()),
        ]
        .into_iter()
        .collect();
        let env = merge_env(&own, &m);
        assert!(env.contains(&"LD_PRELOAD=/run/denv/libfaketime.so.1 /x/own.so".to_string()));
        assert!(env.contains(&"A=1".to_string()));
        assert!(env.contains(&"FAKETIME_TIMESTAMP_FILE=/run/denv/faketimerc".to_string()));
        let env = merge_env(&Default::default(), &m);
        assert!(env.contains(&"LD_PRELOAD=/run/denv/libfaketime.so.1".to_string()));
        assert_eq!(env.len(), 4);
    }
}
