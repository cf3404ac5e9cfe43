//! Failed sign-ins, slowed per client. A valid token always passes: it is
//! verified before the throttle is consulted, so a flood of bad tokens
//! from an address (a NAT, a proxy, `kubectl port-forward`, where every
//! operator shares one) never locks its owner out. A client's first
//! [`FREE_FAILURES`] failures are answered 401, the last of them starting
//! a wait of [`FIRST_WAIT`], doubled by each further failure up to
//! [`MAX_WAIT`]; a bad token presented before the wait has passed is
//! answered 429 with `Retry-After` (and doubles it). A client with no
//! failure for [`FORGET_AFTER`] starts afresh.
//!
//! What this does and does not do: it tells a well-behaved client to stop,
//! and keeps the count a clear signal (`hookinbox_admin_sign_in_failures_total`,
//! alerted on). It cannot stop a guesser from learning that a guess is
//! wrong (a right guess passes, so every answer but a pass says "wrong");
//! the defence against guessing is the secrets' length. No rate-limiter
//! crate fits: one that spends a cell on each check would spend the
//! owner's cells too.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures a client may make before it is throttled.
pub const FREE_FAILURES: u32 = 5;

/// The wait after the last free failure; it doubles with each further
/// failure.
pub const FIRST_WAIT: Duration = Duration::from_secs(5);

/// The longest wait.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// A client with no failure for this long is forgotten.
pub const FORGET_AFTER: Duration = Duration::from_secs(900);

/// Clients remembered at most; the longest quiet are forgotten first, so
/// a flood of addresses cannot grow memory without bound.
const MAX_CLIENTS: usize = 10_000;

/// One client's failures.
#[derive(Clone, Copy, Debug)]
struct Record {
    failures: u32,
    last: Instant,
}

impl Record {
    /// How long after its last failure the client waits.
    fn wait(&self) -> Duration {
        if self.failures < FREE_FAILURES {
            return Duration::ZERO;
        }
        let doublings = (self.failures - FREE_FAILURES).min(20);
        FIRST_WAIT.saturating_mul(1 << doublings).min(MAX_WAIT)
    }
}

/// Failed sign-ins by client.
#[derive(Default)]
pub struct Throttle {
    clients: Mutex<HashMap<IpAddr, Record>>,
}

impl Throttle {
    /// How long `client` must still wait, if it must.
    pub fn wait(&self, client: IpAddr) -> Option<Duration> {
        self.wait_at(client, Instant::now())
    }

    /// Counts a failure of `client`; returns the wait it now has (zero
    /// while it has free failures left).
    pub fn fail(&self, client: IpAddr) -> Duration {
        self.fail_at(client, Instant::now())
    }

    fn wait_at(&self, client: IpAddr, now: Instant) -> Option<Duration> {
        let clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let record = clients.get(&client)?;
        let since = now.saturating_duration_since(record.last);
        if since >= FORGET_AFTER {
            return None;
        }
        record.wait().checked_sub(since).filter(|w| !w.is_zero())
    }

    fn fail_at(&self, client: IpAddr, now: Instant) -> Duration {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if clients.len() >= MAX_CLIENTS && !clients.contains_key(&client) {
            clients.retain(|_, r| now.saturating_duration_since(r.last) < FORGET_AFTER);
            if clients.len() >= MAX_CLIENTS
                && let Some(quietest) = clients.iter().min_by_key(|(_, r)| r.last).map(|(k, _)| *k)
            {
                clients.remove(&quietest);
            }
        }
        let record = clients.entry(client).or_insert(Record {
            failures: 0,
            last: now,
        });
        if now.saturating_duration_since(record.last) >= FORGET_AFTER {
            record.failures = 0;
        }
        record.failures = record.failures.saturating_add(1);
        record.last = now;
        record.wait()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_waits_after_its_free_failures_and_the_wait_doubles_to_a_cap() {
        let throttle = Throttle::default();
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let t0 = Instant::now();
        for _ in 1..FREE_FAILURES {
            assert_eq!(throttle.fail_at(a, t0), Duration::ZERO);
        }
        assert_eq!(throttle.wait_at(a, t0), None);
        assert_eq!(throttle.fail_at(a, t0), FIRST_WAIT, "the last free one");
        assert_eq!(throttle.wait_at(a, t0), Some(FIRST_WAIT));
        assert_eq!(throttle.fail_at(a, t0), FIRST_WAIT * 2);
        assert_eq!(throttle.fail_at(a, t0), FIRST_WAIT * 4);
        assert_eq!(throttle.wait_at(a, t0), Some(FIRST_WAIT * 4));
        let almost = FIRST_WAIT * 4 - Duration::from_secs(1);
        assert_eq!(
            throttle.wait_at(a, t0 + almost),
            Some(Duration::from_secs(1))
        );
        assert_eq!(throttle.wait_at(a, t0 + FIRST_WAIT * 4), None);
        assert_eq!(throttle.wait_at(b, t0), None, "another client");
        for _ in 0..100 {
            throttle.fail_at(a, t0);
        }
        assert_eq!(throttle.wait_at(a, t0), Some(MAX_WAIT));
    }

    #[test]
    fn a_quiet_client_is_forgotten() {
        let throttle = Throttle::default();
        let a: IpAddr = [10, 0, 0, 1].into();
        let t0 = Instant::now();
        for _ in 0..FREE_FAILURES + 3 {
            throttle.fail_at(a, t0);
        }
        let later = t0 + FORGET_AFTER;
        assert_eq!(throttle.wait_at(a, later), None);
        assert_eq!(throttle.fail_at(a, later), Duration::ZERO, "counted afresh");
    }
}
