//! Request rate limits, checked for every request before it reaches the REST gateway or
//! a gRPC service (GCRA through the `governor` crate; documented in `docs/reference/
//! rest-api.md`, *Rate limits*).
//!
//! | limit | counted per | default | setting |
//! |---|---|---|---|
//! | credential | the `Authorization` header's value (held as its SHA-256) | 500 requests/s, bursts of 1000 | `DENV_RATE_LIMIT_KEY` |
//! | client address | the peer's IP address | 1000 requests/s, bursts of 2000 | `DENV_RATE_LIMIT_IP` |
//! | unauthenticated writes | the peer's IP address | 20 per minute | `DENV_RATE_LIMIT_ANON` |
//! | device approvals | the approving user | 10, then one per minute | — |
//!
//! Unauthenticated writes are the routes anyone can call that create state: `POST
//! /v1/device/code`, `POST /auth/dev-login`, `GET /auth/github/start` and their gRPC
//! methods. A setting of `0` turns that limit off. Over a limit, REST answers `429
//! {"error": "rate limited: <which>; retry in N s"}` with `Retry-After: N` (whole
//! seconds, at least 1); gRPC answers `RESOURCE_EXHAUSTED` with the same message and
//! `retry-after` metadata. The peer address is the TCP peer: behind a proxy every client
//! shares the proxy's address.

use crate::config::Config;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use sha2::{Digest, Sha256};
use std::hash::Hash;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A request over one of the limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    /// Which limit: `"this credential"`, `"this address"`, `"unauthenticated writes from
    /// this address"`, `"device approvals by this user"`.
    pub what: &'static str,
    /// Whole seconds until a request would be allowed again (at least 1).
    pub retry_after: u64,
}

impl Limited {
    /// `rate limited: <what>; retry in N s`.
    pub fn message(&self) -> String {
        format!(
            "rate limited: too many requests for {}; retry in {} s",
            self.what, self.retry_after
        )
    }
}

/// The control plane's limiters (one set per process).
pub struct RateLimits {
    per_key: Option<DefaultKeyedRateLimiter<[u8; 32]>>,
    per_ip: Option<DefaultKeyedRateLimiter<IpAddr>>,
    anon_writes: Option<DefaultKeyedRateLimiter<IpAddr>>,
    approvals: DefaultKeyedRateLimiter<String>,
    checks: AtomicU64,
}

impl std::fmt::Debug for RateLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimits").finish_non_exhaustive()
    }
}

/// Checks `key` against `limiter`; the wait when over.
fn check<K: Hash + Eq + Clone>(
    limiter: &DefaultKeyedRateLimiter<K>,
    key: &K,
    what: &'static str,
) -> Result<(), Limited> {
    limiter.check_key(key).map_err(|not_until| {
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        Limited {
            what,
            retry_after: (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1),
        }
    })
}

fn per_second(n: u32) -> Option<Quota> {
    let n = NonZeroU32::new(n)?;
    let two = NonZeroU32::new(2).expect("non-zero");
    Some(Quota::per_second(n).allow_burst(n.saturating_mul(two)))
}

impl RateLimits {
    /// The limiters `config` asks for.
    pub fn new(config: &Config) -> RateLimits {
        RateLimits {
            per_key: per_second(config.rate_limit_key).map(RateLimiter::keyed),
            per_ip: per_second(config.rate_limit_ip).map(RateLimiter::keyed),
            anon_writes: NonZeroU32::new(config.rate_limit_anon)
                .map(|n| RateLimiter::keyed(Quota::per_minute(n))),
            approvals: RateLimiter::keyed(
                Quota::with_period(Duration::from_secs(60))
                    .expect("non-zero period")
                    .allow_burst(NonZeroU32::new(10).expect("non-zero")),
            ),
            checks: AtomicU64::new(0),
        }
    }

    /// Counts one request from `peer` carrying `credential` (the `Authorization` value)
    /// against the address and credential limits, and against the unauthenticated-write
    /// limit when `anon_write`.
    pub fn check_request(
        &self,
        peer: Option<IpAddr>,
        credential: Option<&[u8]>,
        anon_write: bool,
    ) -> Result<(), Limited> {
        // Forget keys that have fully recovered, now and then, so a stream of made-up
        // credentials cannot grow the tables without bound.
        if self.checks.fetch_add(1, Ordering::Relaxed) % 4096 == 4095 {
            self.forget_idle();
        }
        if let (Some(l), Some(ip)) = (&self.per_ip, peer) {
            check(l, &ip, "this address")?;
        }
        if let (true, Some(l), Some(ip)) = (anon_write, &self.anon_writes, peer) {
            check(l, &ip, "unauthenticated writes from this address")?;
        }
        if let (Some(l), Some(c)) = (&self.per_key, credential) {
            check(l, &Sha256::digest(c).into(), "this credential")?;
        }
        Ok(())
    }

    /// Counts one device approval attempt by `user` (user codes are short, so guessing
    /// them is limited per user).
    pub fn check_approval(&self, user: &str) -> Result<(), Limited> {
        check(
            &self.approvals,
            &user.to_string(),
            "device approvals by this user",
        )
    }

    fn forget_idle(&self) {
        if let Some(l) = &self.per_key {
            l.retain_recent();
        }
        if let Some(l) = &self.per_ip {
            l.retain_recent();
        }
        if let Some(l) = &self.anon_writes {
            l.retain_recent();
        }
        self.approvals.retain_recent();
    }
}

/// Whether `method path` is an unauthenticated route that creates state (REST or gRPC).
pub fn is_anon_write(method: &http::Method, path: &str) -> bool {
    matches!(
        (method.as_str(), path),
        ("POST", "/v1/device/code")
            | ("POST", "/auth/dev-login")
            | ("GET", "/auth/github/start")
            | ("POST", "/denv.v1.AuthService/DeviceCode")
            | ("POST", "/denv.v1.AuthService/DevLogin")
            | ("POST", "/denv.v1.AuthService/GithubStart")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(key: u32, ip: u32, anon: u32) -> RateLimits {
        RateLimits::new(&Config {
            rate_limit_key: key,
            rate_limit_ip: ip,
            rate_limit_anon: anon,
            ..Config::default()
        })
    }

    #[test]
    fn each_credential_has_its_own_budget_and_the_wait_is_whole_seconds() {
        let l = limits(2, 0, 0);
        let ip = Some("10.0.0.1".parse().unwrap());
        for _ in 0..4 {
            l.check_request(ip, Some(b"Bearer a"), false).unwrap();
        }
        let e = l.check_request(ip, Some(b"Bearer a"), false).unwrap_err();
        assert_eq!(e.what, "this credential");
        assert_eq!(e.retry_after, 1);
        assert_eq!(
            e.message(),
            "rate limited: too many requests for this credential; retry in 1 s"
        );
        l.check_request(ip, Some(b"Bearer b"), false).unwrap();
        l.check_request(ip, None, false).unwrap();
    }

    #[test]
    fn unauthenticated_writes_are_counted_per_address_per_minute() {
        let l = limits(0, 0, 3);
        let a = Some("10.0.0.1".parse().unwrap());
        for _ in 0..3 {
            l.check_request(a, None, true).unwrap();
        }
        let e = l.check_request(a, None, true).unwrap_err();
        assert_eq!(e.what, "unauthenticated writes from this address");
        assert!((19..=20).contains(&e.retry_after), "{e:?}");
        l.check_request(a, None, false).unwrap();
        l.check_request(Some("10.0.0.2".parse().unwrap()), None, true)
            .unwrap();
    }

    #[test]
    fn zero_turns_a_limit_off() {
        let l = limits(0, 0, 0);
        for _ in 0..10_000 {
            l.check_request(Some("10.0.0.1".parse().unwrap()), Some(b"k"), true)
                .unwrap();
        }
    }
}
