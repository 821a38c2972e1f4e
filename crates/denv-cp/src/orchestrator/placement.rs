//! Placement by capacity: the connected host a new environment goes to, for a deploy's
//! `place` phase and the image-sandbox request's early check (manual
//! `docs/reference/targets.md`, "Placement"; spec `17-ref-targets.md`, step 3).
//!
//! [`choose`] is pure. Its input: the candidate hosts (connected; of the team, or of the
//! pinned cloud), oldest first, each with its latest [`Report`] (the `load` of its last
//! heartbeat) and what this control plane placed on it whose deploys are still running
//! ([`Claimed`]: caps no report counts yet); and the environment's [`Need`].
//!
//! - **Need**: the spec's caps summed over its services, an unset cap counting as its
//!   default (2.0 CPUs, 4096 MiB per service), and the disk quota (`x-denv.disk` or
//!   `resources.disk`, else 10240 MiB): what the environment may take at most.
//! - **Fits**: the host reported a load; its free memory holds the largest memory cap of
//!   one service (the most a single service may take: a host with less could not give
//!   it). The sum of the caps is not required to fit: caps are ceilings the sidecar
//!   enforces, not reservations, and the defaults are generous (three services that set
//!   nothing cap 12 GiB together and usually use a small part of it), so requiring the
//!   sum would refuse ordinary stacks on ordinary machines. Likewise the disk quota, set
//!   or not (btrfs and zfs hand quotas out thinly, `dir` does not enforce one; an
//!   imported version carries its quota, which a smaller test file system must still
//!   take), and CPUs, which environments share (each container's CPU cap is clamped to
//!   what the host has). Free disk ranks hosts.
//! - **Room**, among the hosts that fit: the most free memory left after the claims on
//!   it, then the fewest environments (reported and claimed), then the most CPUs left
//!   (its allocatable CPUs less its environments' caps and the claims), then the most free
//!   disk left, then the oldest host. The claims make a group of new environments spread
//!   over hosts instead of piling on the one that reported the most room.
//! - **No report** (a `denvd` older than the load report, or a host that connected a
//!   moment ago): such a host is taken only when no host with a report fits, the oldest
//!   first (the placement before capacity was known: `first connected host in team`).
//! - **Nothing fits**: [`NoCapacity`], `no host has capacity for <need>: <host>: <its
//!   free memory and disk>; …`; the `place` phase fails with it, and an image sandbox
//!   request answers `503` with it ([`ApiError::NoCapacity`]).
//!
//! - **Forks: locality and load.** A fork ([`Locality`]) goes to the fitting host with the
//!   least estimated time before it can start, `ship_s + queue_s`:
//!   - `ship_s` is 0 on a host that holds the version's snapshot (its own host, or one a
//!     copy was shipped to; the images travel with the snapshot), else `bytes / rate`:
//!     `bytes` the size of a recorded copy of the version's snapshot, else
//!     [`SHIP_GUESS_BYTES`]; `rate` the median throughput of the team's last
//!     [`RATE_SAMPLES`] shipments (bytes over their `shipped_ms`), else
//!     [`SHIP_GUESS_RATE`];
//!   - `queue_s` = [`FORK_SECONDS`] × the forks and deploys under way on the host (its
//!     claims) / its CPUs (at least 1): what the new fork waits for the host's CPUs.
//!
//!   Ties (within a millisecond) go to the host with the most room, as above. A group of
//!   forks of one version so starts on the host that holds the data, and spreads to other
//!   hosts once waiting there would take longer than shipping (the claims of the forks
//!   under way raise `queue_s`).
//!
//! [`place`] gathers the candidates from the store and the hub, runs [`choose`] and
//! returns the `place` phase's evidence with a [`Claim`] the runner holds until the
//! deploy ends (choice and claim under one lock: deploys placed at the same moment see
//! each other's claims). Forks, verifies and every other deployment stay on the
//! environment's own host (the snapshot is there); a redeploy stays on the host the
//! environment is on.

use super::{Orchestrator, Pin};
use crate::error::ApiError;
use crate::hub::{Claim, Claimed, Figures};
use denv_compose::{Spec, DEFAULT_CPUS, DEFAULT_DISK_MB, DEFAULT_MEMORY_MB};
use serde_json::{json, Value};
use std::cmp::Ordering;
use std::fmt;

/// What an environment may take at most: its caps summed ([`Need::of`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Need {
    /// Services in the spec.
    pub services: usize,
    /// CPU caps summed.
    pub cpus: f64,
    /// Memory caps summed, MiB.
    pub memory_mb: u64,
    /// The largest memory cap of one service, MiB: what a host's free memory must hold.
    pub largest_memory_mb: u64,
    /// The disk quota, MiB (the default when the spec sets none).
    pub disk_mb: u64,
}

impl Need {
    /// The need of `spec`, defaults filled in as the sidecar applies them.
    pub fn of(spec: &Spec) -> Need {
        let mut n = Need {
            services: spec.services.len(),
            cpus: 0.0,
            memory_mb: 0,
            largest_memory_mb: 0,
            disk_mb: if spec.disk_mb == 0 {
                DEFAULT_DISK_MB
            } else {
                spec.disk_mb
            },
        };
        for s in &spec.services {
            let memory = if s.resources.memory_mb == 0 {
                DEFAULT_MEMORY_MB
            } else {
                s.resources.memory_mb
            };
            n.cpus += if s.resources.cpus <= 0.0 {
                DEFAULT_CPUS
            } else {
                s.resources.cpus
            };
            n.memory_mb += memory;
            n.largest_memory_mb = n.largest_memory_mb.max(memory);
        }
        n
    }

    /// As counted against a host while its deploy runs.
    pub fn claimed(&self) -> Claimed {
        Claimed {
            environments: 1,
            cpus: self.cpus,
            memory_mb: self.memory_mb,
            disk_mb: self.disk_mb,
        }
    }

    /// For evidence: `{cpus, memory_mb, largest_memory_mb, disk_mb}`.
    pub fn to_json(&self) -> Value {
        json!({
            "cpus": self.cpus,
            "memory_mb": self.memory_mb,
            "largest_memory_mb": self.largest_memory_mb,
            "disk_mb": self.disk_mb,
        })
    }
}

impl fmt::Display for Need {
    /// `2 CPUs, 8192 MiB memory (4096 MiB in one service), 10240 MiB disk`; the part in
    /// brackets only with more than one service.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} CPUs, {} MiB memory", self.cpus, self.memory_mb)?;
        if self.services > 1 {
            write!(f, " ({} MiB in one service)", self.largest_memory_mb)?;
        }
        write!(f, ", {} MiB disk", self.disk_mb)
    }
}

/// A host's latest load report (`HostLoad` of its last heartbeat).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Report {
    /// Free memory (`MemAvailable`), MiB.
    pub memory_free_mb: u64,
    /// Free disk under its data directory, MiB.
    pub disk_free_mb: u64,
    /// CPUs a container may be given.
    pub cpus: f64,
    /// Environments on it.
    pub environments: u32,
    /// Their CPU caps summed.
    pub reserved_cpus: f64,
}

impl From<&denv_proto::v1::HostLoad> for Report {
    fn from(l: &denv_proto::v1::HostLoad) -> Self {
        Report {
            memory_free_mb: l.memory_free_mb,
            disk_free_mb: l.disk_free_mb,
            cpus: l.cpus,
            environments: l.environments,
            reserved_cpus: l.reserved_cpus,
        }
    }
}

/// A host placement may choose.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// `host_…`.
    pub host_id: String,
    /// Its name (the hostname it joined with), for messages.
    pub name: String,
    /// Its latest report; `None` before one arrived.
    pub report: Option<Report>,
    /// What this control plane placed on it whose deploys are still running.
    pub claimed: Claimed,
}

/// What is left on a host after its claims (the room [`choose`] compares).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Room {
    memory_mb: i64,
    environments: u32,
    cpus: f64,
    disk_mb: i64,
}

impl Room {
    fn of(r: &Report, c: &Claimed) -> Room {
        let left = |free: u64, taken: u64| {
            i64::try_from(free).unwrap_or(i64::MAX) - i64::try_from(taken).unwrap_or(i64::MAX)
        };
        Room {
            memory_mb: left(r.memory_free_mb, c.memory_mb),
            environments: r.environments + c.environments,
            cpus: r.cpus - r.reserved_cpus - c.cpus,
            disk_mb: left(r.disk_free_mb, c.disk_mb),
        }
    }

    /// `Greater` when `self` has more room than `o`.
    fn cmp(&self, o: &Room) -> Ordering {
        self.memory_mb
            .cmp(&o.memory_mb)
            .then(o.environments.cmp(&self.environments))
            .then(self.cpus.total_cmp(&o.cpus))
            .then(self.disk_mb.cmp(&o.disk_mb))
    }
}

/// Whether a host that reported `r` can take `need` (see the module docs).
fn fits(need: &Need, r: &Report) -> bool {
    need.largest_memory_mb <= r.memory_free_mb
}

/// The host [`choose`] picked, and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pick<'a> {
    /// It fits, with the most room.
    Room(&'a Candidate),
    /// No host with a report fits (or none has one): the oldest host without a report.
    Unreported(&'a Candidate),
}

impl<'a> Pick<'a> {
    /// The host.
    pub fn host(&self) -> &'a Candidate {
        match self {
            Pick::Room(c) | Pick::Unreported(c) => c,
        }
    }
}

/// No candidate can take the environment.
#[derive(Debug, Clone, PartialEq)]
pub struct NoCapacity {
    /// What it needed.
    pub need: Need,
    /// Each candidate: id, name, its report.
    pub hosts: Vec<(String, String, Report)>,
}

impl fmt::Display for NoCapacity {
    /// `no host has capacity for <need>: host_… (<name>): <n> MiB memory, <n> MiB disk
    /// free; …`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no host has capacity for {}: ", self.need)?;
        if self.hosts.is_empty() {
            return write!(f, "no connected host");
        }
        for (i, (id, name, r)) in self.hosts.iter().enumerate() {
            if i > 0 {
                write!(f, "; ")?;
            }
            write!(
                f,
                "{id} ({name}): {} MiB memory, {} MiB disk free",
                r.memory_free_mb, r.disk_free_mb
            )?;
        }
        Ok(())
    }
}

impl From<NoCapacity> for ApiError {
    fn from(e: NoCapacity) -> Self {
        ApiError::NoCapacity(e.to_string())
    }
}

/// The seconds one fork takes of a host's CPU, for `queue_s`: 1.0 (a fork of the
/// quickstart world to a usable child measured 0.76 to 0.91 s).
pub const FORK_SECONDS: f64 = 1.0;

/// The size assumed for a version's snapshot archive before one was shipped: 64 MiB.
pub const SHIP_GUESS_BYTES: u64 = 64 << 20;

/// The host-to-host throughput assumed before any shipment was measured: 100 MiB/s.
pub const SHIP_GUESS_RATE: f64 = (100u64 << 20) as f64;

/// How many of the team's latest shipments the throughput is measured over: 20.
pub const RATE_SAMPLES: usize = 20;

/// Where a fork's data is, for placing it ([`choose_for_fork`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Locality {
    /// Hosts holding the version's snapshot: its own host and the hosts with a copy.
    pub holders: Vec<String>,
    /// Seconds to ship the snapshot to any other host (`bytes / rate`).
    pub ship_s: f64,
}

impl Locality {
    /// `ship_s` from the archive size of a recorded copy (`None`: not shipped yet) and
    /// the `(bytes, ms)` of recent shipments (see the module docs).
    pub fn new(holders: Vec<String>, copy_bytes: Option<u64>, recent: &[(u64, u64)]) -> Self {
        let bytes = copy_bytes.unwrap_or(SHIP_GUESS_BYTES) as f64;
        let mut rates: Vec<f64> = recent
            .iter()
            .filter(|(b, ms)| *b > 0 && *ms > 0)
            .map(|(b, ms)| *b as f64 * 1000.0 / *ms as f64)
            .collect();
        rates.sort_by(f64::total_cmp);
        let rate = if rates.is_empty() {
            SHIP_GUESS_RATE
        } else {
            rates[rates.len() / 2]
        };
        Locality {
            holders,
            ship_s: bytes / rate,
        }
    }

    /// `(ship_s, queue_s)` of a fork on candidate `c`.
    pub fn cost(&self, c: &Candidate) -> (f64, f64) {
        let ship = if self.holders.contains(&c.host_id) {
            0.0
        } else {
            self.ship_s
        };
        let cpus = c.report.map_or(1.0, |r| r.cpus).max(1.0);
        let queue = FORK_SECONDS * f64::from(c.claimed.environments) / cpus;
        (ship, queue)
    }
}

/// [`choose`] for a fork: among the hosts that fit, the least `ship_s + queue_s`
/// ([`Locality::cost`]), ties to the most room; with none fitting, as [`choose`].
pub fn choose_for_fork<'a>(
    need: &Need,
    candidates: &'a [Candidate],
    loc: &Locality,
) -> Result<Pick<'a>, NoCapacity> {
    let mut best: Option<(&Candidate, f64, Room)> = None;
    for c in candidates {
        let Some(r) = &c.report else { continue };
        if !fits(need, r) {
            continue;
        }
        let (ship, queue) = loc.cost(c);
        let cost = ship + queue;
        let room = Room::of(r, &c.claimed);
        let better = match &best {
            None => true,
            Some((_, b, _)) if cost < b - 0.001 => true,
            Some((_, b, broom)) if cost <= b + 0.001 => room.cmp(broom) == Ordering::Greater,
            Some(_) => false,
        };
        if better {
            best = Some((c, cost, room));
        }
    }
    match best {
        Some((c, _, _)) => Ok(Pick::Room(c)),
        None => choose(need, candidates),
    }
}

/// The host `need` goes to among `candidates` (oldest first), or why none can take it
/// (see the module docs).
pub fn choose<'a>(need: &Need, candidates: &'a [Candidate]) -> Result<Pick<'a>, NoCapacity> {
    let mut best: Option<(&Candidate, Room)> = None;
    for c in candidates {
        let Some(r) = &c.report else { continue };
        if !fits(need, r) {
            continue;
        }
        let room = Room::of(r, &c.claimed);
        // Strictly more room wins; a tie keeps the older host.
        if best.is_none_or(|(_, b)| room.cmp(&b) == Ordering::Greater) {
            best = Some((c, room));
        }
    }
    if let Some((c, _)) = best {
        return Ok(Pick::Room(c));
    }
    if let Some(c) = candidates.iter().find(|c| c.report.is_none()) {
        return Ok(Pick::Unreported(c));
    }
    Err(NoCapacity {
        need: *need,
        hosts: candidates
            .iter()
            .filter_map(|c| Some((c.host_id.clone(), c.name.clone(), c.report?)))
            .collect(),
    })
}

/// The connected hosts of `team` (of the pinned cloud only, with `pin`), oldest first:
/// `(id, name)`.
async fn connected(
    orch: &Orchestrator,
    team: &str,
    pin: Option<&Pin>,
) -> Result<Vec<(String, String)>, sea_orm::DbErr> {
    let hub = orch.link().hub();
    Ok(crate::store::hosts::list(orch.db(), team)
        .await?
        .into_iter()
        .filter(|h| hub.is_connected(&h.id) && pin.is_none_or(|p| h.cloud_id == p.cloud_id))
        .map(|h| (h.id, h.name))
        .collect())
}

/// Candidates from the hosts and their figures (same order).
fn candidates(hosts: &[(String, String)], figures: &[Figures]) -> Vec<Candidate> {
    hosts
        .iter()
        .zip(figures)
        .map(|((id, name), (load, claimed))| Candidate {
            host_id: id.clone(),
            name: name.clone(),
            report: load.as_ref().map(Report::from),
            claimed: *claimed,
        })
        .collect()
}

/// A deploy's placement: the host (`""` when the team has no connected host and no pin:
/// provisioning follows), the `place` phase's evidence, and the claim to hold until the
/// deploy ends.
#[derive(Debug)]
pub(crate) struct Placed {
    pub host_id: String,
    pub evidence: Value,
    pub claim: Option<Claim>,
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// A failed placement: the `place` phase's error and evidence.
#[derive(Debug)]
pub(crate) struct Unplaced {
    pub error: String,
    pub evidence: Value,
}

/// Places a new environment of `spec` for `team` (pinned to a cloud's hosts with `pin`);
/// the choice and its claim are made in one step ([`crate::hub::Hub::claim_by`]), so
/// deploys placed at the same moment see each other's claims. Evidence `{host,
/// reason}`: `reason` is `most room in team` (or `target <name>`) for a host chosen by its
/// report, with `need` and the host's `free` (`{memory_mb, disk_mb, cpus,
/// environments}`, claims deducted); `first connected host in team` (or `target <name>`)
/// for a host without a report; `no connected host; provisioning` with no host at all.
/// Fails with `target "<name>" (<provider>): no connected host` (a pin without a
/// connected host) or [`NoCapacity`]'s message.
///
/// With `locality` (a fork), the host is chosen by [`choose_for_fork`]; the evidence's
/// `reason` is then `least time to start in team`, with `cost: {ship_s, queue_s}`.
pub(crate) async fn place(
    orch: &Orchestrator,
    team: &str,
    pin: Option<&Pin>,
    spec: &Spec,
    locality: Option<&Locality>,
) -> Result<Placed, Unplaced> {
    let target = pin.map(|p| format!("target {}", p.name));
    let hosts = connected(orch, team, pin).await.map_err(|e| Unplaced {
        error: format!("store: {e}"),
        evidence: Value::Null,
    })?;
    if hosts.is_empty() {
        return match pin {
            Some(p) => Err(Unplaced {
                error: format!("target \"{}\" ({}): no connected host", p.name, p.provider),
                evidence: json!({"host": "", "reason": target}),
            }),
            None => Ok(Placed {
                host_id: String::new(),
                evidence: json!({"host": "", "reason": "no connected host; provisioning"}),
                claim: None,
            }),
        };
    }
    let need = Need::of(spec);
    let ids: Vec<String> = hosts.iter().map(|(id, _)| id.clone()).collect();
    let (outcome, claim) = orch.link().hub().claim_by(&ids, |figures| {
        let cands = candidates(&hosts, figures);
        let chosen = match locality {
            Some(loc) => choose_for_fork(&need, &cands, loc),
            None => choose(&need, &cands),
        };
        let pick = match chosen {
            Ok(p) => p,
            Err(no) => return (Err(no), None),
        };
        let c = pick.host();
        let evidence = match pick {
            Pick::Room(c) => {
                let room = c.report.as_ref().map(|r| Room::of(r, &c.claimed));
                let reason = match locality {
                    Some(_) => "least time to start in team",
                    None => "most room in team",
                };
                let mut ev = json!({
                    "host": c.host_id,
                    "reason": target.clone().unwrap_or_else(|| reason.into()),
                    "need": need.to_json(),
                    "free": room.map(|r| json!({
                        "memory_mb": r.memory_mb, "disk_mb": r.disk_mb,
                        "cpus": r.cpus, "environments": r.environments,
                    })),
                });
                if let Some(loc) = locality {
                    let (ship, queue) = loc.cost(c);
                    ev["cost"] = json!({"ship_s": round3(ship), "queue_s": round3(queue)});
                }
                ev
            }
            Pick::Unreported(c) => json!({
                "host": c.host_id,
                "reason": target.clone().unwrap_or_else(|| "first connected host in team".into()),
            }),
        };
        let i = cands.iter().position(|x| x.host_id == c.host_id);
        (
            Ok((c.host_id.clone(), evidence)),
            i.map(|i| (i, need.claimed())),
        )
    });
    match outcome {
        Ok((host_id, evidence)) => Ok(Placed {
            host_id,
            evidence,
            claim,
        }),
        Err(no) => Err(Unplaced {
            evidence: json!({
                "host": "",
                "reason": target.unwrap_or_else(|| "no host has capacity".into()),
                "need": need.to_json(),
                "hosts": no.hosts.iter().map(|(id, name, r)| json!({
                    "host": id, "name": name,
                    "memory_free_mb": r.memory_free_mb, "disk_free_mb": r.disk_free_mb,
                })).collect::<Vec<_>>(),
            }),
            error: no.to_string(),
        }),
    }
}

/// The image-sandbox request's check before anything is created: placement as the
/// runner will run it. No candidate: nothing to check (the runner provisions or fails
/// the pin). A host picked: `caps` (the request's `resources`) checked against it
/// (`400` above its capacity). Nothing fits: `400` when `caps` is above the capacity of
/// every candidate (the request could never run: the first one's message), else `503`
/// [`NoCapacity`].
pub(crate) async fn check_sandbox(
    orch: &Orchestrator,
    team: &str,
    pin: Option<&Pin>,
    spec: &Spec,
    caps: &super::resources::Request,
) -> Result<(), ApiError> {
    let hosts = connected(orch, team, pin).await?;
    if hosts.is_empty() {
        return Ok(());
    }
    let ids: Vec<String> = hosts.iter().map(|(id, _)| id.clone()).collect();
    let (cands, _) = orch
        .link()
        .hub()
        .claim_by(&ids, |figures| (candidates(&hosts, figures), None));
    match choose(&Need::of(spec), &cands) {
        Ok(pick) => orch.check_caps_on_host(&pick.host().host_id, caps).await,
        Err(no) => {
            let mut first = None;
            for c in &cands {
                match orch.check_caps_on_host(&c.host_id, caps).await {
                    Ok(()) => return Err(no.into()),
                    Err(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
            Err(first.unwrap_or_else(|| no.into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(memory_mb: u64, largest: u64) -> Need {
        Need {
            services: if memory_mb == largest { 1 } else { 2 },
            cpus: 2.0,
            memory_mb,
            largest_memory_mb: largest,
            disk_mb: DEFAULT_DISK_MB,
        }
    }

    fn report(memory_free_mb: u64, disk_free_mb: u64, environments: u32) -> Option<Report> {
        Some(Report {
            memory_free_mb,
            disk_free_mb,
            cpus: 3.5,
            environments,
            reserved_cpus: 0.0,
        })
    }

    fn host(id: &str, report: Option<Report>) -> Candidate {
        Candidate {
            host_id: id.into(),
            name: format!("{id}-name"),
            report,
            claimed: Claimed::default(),
        }
    }

    /// The host picked and whether by its report, or the error's text.
    type Picked = Result<(String, bool), String>;

    fn picked(need: &Need, cands: &[Candidate]) -> Picked {
        choose(need, cands)
            .map(|p| (p.host().host_id.clone(), matches!(p, Pick::Room(_))))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn need_sums_the_caps_with_defaults() {
        let spec = denv_compose::parse(
            "x-denv:\n  disk: 2g\nservices:\n  db:\n    image: redis:7\n    mem_limit: 512m\n    cpus: 0.5\n  app:\n    image: busybox:1.36\n",
        )
        .unwrap();
        let n = Need::of(&spec);
        assert_eq!(
            n,
            Need {
                services: 2,
                cpus: 2.5,
                memory_mb: 512 + 4096,
                largest_memory_mb: 4096,
                disk_mb: 2048,
            }
        );
        assert_eq!(
            n.to_string(),
            "2.5 CPUs, 4608 MiB memory (4096 MiB in one service), 2048 MiB disk"
        );
        let one =
            Need::of(&denv_compose::parse("services:\n  app:\n    image: busybox:1.36\n").unwrap());
        assert_eq!(one.disk_mb, 10240);
        assert_eq!(one.to_string(), "2 CPUs, 4096 MiB memory, 10240 MiB disk");
    }

    /// Each row: the need, the candidates (oldest first), the host picked (and whether
    /// by its report) or the error.
    #[test]
    fn choose_table() {
        let small = need(1024, 1024);
        let big = need(65536, 65536);
        let disk = Need {
            disk_mb: 50_000,
            ..small
        };
        let ok = |h: &str| Ok::<_, String>((h.to_string(), true));
        let rows: Vec<(&str, Need, Vec<Candidate>, Picked)> = vec![
            (
                "fits on the only host",
                small,
                vec![host("h1", report(8192, 100_000, 0))],
                ok("h1"),
            ),
            (
                "the roomier host wins, though younger",
                small,
                vec![
                    host("h1", report(4096, 100_000, 0)),
                    host("h2", report(16384, 100_000, 5)),
                ],
                ok("h2"),
            ),
            (
                "a host too small for the largest service is passed over",
                need(6144, 3072),
                vec![
                    host("h1", report(2048, 100_000, 0)),
                    host("h2", report(3072, 100_000, 9)),
                ],
                ok("h2"),
            ),
            (
                "the sum of the caps need not fit: caps are ceilings",
                need(12288, 4096),
                vec![host("h1", report(6000, 100_000, 0))],
                ok("h1"),
            ),
            (
                "does not fit anywhere: the need and each host's free figures",
                big,
                vec![
                    host("h1", report(8192, 51200, 1)),
                    host("h2", report(16384, 1000, 0)),
                ],
                Err(
                    "no host has capacity for 2 CPUs, 65536 MiB memory, 10240 MiB disk: \
                     h1 (h1-name): 8192 MiB memory, 51200 MiB disk free; \
                     h2 (h2-name): 16384 MiB memory, 1000 MiB disk free"
                        .into(),
                ),
            ),
            (
                "a set disk quota need not fit in free disk: quotas are ceilings",
                disk,
                vec![
                    host("h1", report(16384, 40_000, 0)),
                    host("h2", report(2048, 60_000, 0)),
                ],
                ok("h1"),
            ),
            (
                "the default disk quota is not required to fit",
                small,
                vec![host("h1", report(8192, 2000, 0))],
                ok("h1"),
            ),
            (
                "ties on memory: fewer environments",
                small,
                vec![
                    host("h1", report(8192, 100_000, 3)),
                    host("h2", report(8192, 100_000, 1)),
                ],
                ok("h2"),
            ),
            (
                "a full tie keeps the oldest",
                small,
                vec![
                    host("h1", report(8192, 100_000, 1)),
                    host("h2", report(8192, 100_000, 1)),
                ],
                ok("h1"),
            ),
            (
                "a host without a report loses to one that fits",
                small,
                vec![host("h1", None), host("h2", report(2048, 100_000, 4))],
                ok("h2"),
            ),
            (
                "a host without a report is taken when none with one fits",
                big,
                vec![host("h1", report(8192, 100_000, 0)), host("h2", None)],
                Ok(("h2".into(), false)),
            ),
            (
                "no reports at all: the oldest host, as before capacity was known",
                small,
                vec![host("h1", None), host("h2", None)],
                Ok(("h1".into(), false)),
            ),
            (
                "no candidate",
                small,
                vec![],
                Err(
                    "no host has capacity for 2 CPUs, 1024 MiB memory, 10240 MiB disk: \
                     no connected host"
                        .into(),
                ),
            ),
        ];
        for (what, n, cands, want) in rows {
            assert_eq!(picked(&n, &cands), want, "{what}");
        }
    }

    #[test]
    fn claims_spread_a_group_over_hosts() {
        // Two hosts, one reporting much more free memory; eight environments placed one
        // after the other before any new report: each claim lowers its host's room.
        let n = need(4096, 4096);
        let mut cands = vec![
            host("h1", report(30_000, 100_000, 0)),
            host("h2", report(18_000, 100_000, 0)),
        ];
        let mut order = vec![];
        for _ in 0..8 {
            let id = choose(&n, &cands).unwrap().host().host_id.clone();
            let c = cands.iter_mut().find(|c| c.host_id == id).unwrap();
            let mut sum = c.claimed;
            let one = n.claimed();
            sum.environments += one.environments;
            sum.cpus += one.cpus;
            sum.memory_mb += one.memory_mb;
            sum.disk_mb += one.disk_mb;
            c.claimed = sum;
            order.push(id);
        }
        assert_eq!(
            order,
            ["h1", "h1", "h1", "h2", "h1", "h2", "h1", "h2"],
            "the roomier host first, then both in turn once it is down to the other's level"
        );
        // Claims never refuse: the last ones overcommit rather than fail.
        assert_eq!(cands[0].claimed.memory_mb, 5 * 4096);
        assert_eq!(
            cands[1].claimed,
            Claimed {
                environments: 3,
                cpus: 6.0,
                memory_mb: 3 * 4096,
                disk_mb: 3 * 10240
            }
        );
    }

    #[test]
    fn cpus_left_break_a_tie_in_memory_and_environments() {
        let n = need(1024, 1024);
        let mut busy = host("h1", report(8192, 100_000, 1));
        busy.report.as_mut().unwrap().reserved_cpus = 3.0;
        let idle = host("h2", report(8192, 100_000, 1));
        assert_eq!(picked(&n, &[busy, idle]), Ok(("h2".into(), true)));
    }

    #[test]
    fn the_ship_estimate_comes_from_the_copy_and_the_measured_rate() {
        // Nothing shipped yet: 64 MiB at 100 MiB/s.
        let l = Locality::new(vec!["a".into()], None, &[]);
        assert!((l.ship_s - 0.64).abs() < 1e-9, "{}", l.ship_s);
        // A recorded copy of 200 MiB, shipments at 50, 100 and 400 MiB/s (median 100),
        // and a sample without a time, ignored.
        let mib = 1u64 << 20;
        let l = Locality::new(
            vec!["a".into()],
            Some(200 * mib),
            &[
                (50 * mib, 1000),
                (100 * mib, 1000),
                (400 * mib, 1000),
                (mib, 0),
            ],
        );
        assert!((l.ship_s - 2.0).abs() < 1e-9, "{}", l.ship_s);
    }

    #[test]
    fn a_fork_starts_where_its_data_is_and_spreads_once_waiting_costs_more() {
        let n = need(4096, 4096);
        let loc = Locality {
            holders: vec!["owner".into()],
            ship_s: 0.64,
        };
        let mut cands = vec![
            host("owner", report(8192, 100_000, 0)),
            // More room, but no copy.
            host("roomy", report(16384, 100_000, 0)),
            host("other", report(16384, 100_000, 0)),
        ];
        let pick = |c: &[Candidate]| choose_for_fork(&n, c, &loc).unwrap().host().host_id.clone();
        // The data is on the owner: it starts there though another host has more room.
        assert_eq!(pick(&cands), "owner");
        assert_eq!(loc.cost(&cands[0]), (0.0, 0.0));
        // Two forks under way on the owner (3.5 CPUs): 2/3.5 = 0.57 s < 0.64 s, still there.
        cands[0].claimed.environments = 2;
        assert_eq!(pick(&cands), "owner");
        // Three: 0.86 s > 0.64 s, so shipping wins; between the two equal hosts, the
        // one with more room (the first of equals otherwise).
        cands[0].claimed.environments = 3;
        cands[2].claimed.memory_mb = 4096;
        assert_eq!(pick(&cands), "roomy");
        // A host holding a copy costs nothing to ship to.
        let loc2 = Locality {
            holders: vec!["owner".into(), "other".into()],
            ship_s: 0.64,
        };
        assert_eq!(
            choose_for_fork(&n, &cands, &loc2).unwrap().host().host_id,
            "other"
        );
        // A holder that cannot fit the fork is passed over; none fitting: as choose.
        let tight = vec![
            host("owner", report(1024, 100_000, 0)),
            host("roomy", report(16384, 100_000, 0)),
        ];
        assert_eq!(
            choose_for_fork(&n, &tight, &loc).unwrap().host().host_id,
            "roomy"
        );
        let none = vec![host("owner", report(1024, 100_000, 0))];
        assert!(choose_for_fork(&n, &none, &loc).is_err());
    }
}
