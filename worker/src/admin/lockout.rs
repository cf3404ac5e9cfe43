//! Failed sign-ins, limited per client address. A failure (a bad token on
//! the sign-in form, or a bad bearer token on the API) is counted; past
//! [`MAX_FAILURES`] within [`WINDOW`], that address is refused (429) before
//! any token it presents is checked, until the window has passed. A
//! lockout must be checked *before* verifying, without spending anything,
//! which a rate limiter that consumes a cell per check cannot do; so it is
//! this small fixed-window counter.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures allowed per address within [`WINDOW`].
pub const MAX_FAILURES: u32 = 10;

/// The window failures are counted in.
pub const WINDOW: Duration = Duration::from_secs(300);

/// Addresses remembered at most; the oldest windows are forgotten first,
/// so a flood of addresses cannot grow memory without bound.
const MAX_ADDRESSES: usize = 10_000;

/// Failed sign-ins by address.
#[derive(Default)]
pub struct Lockout {
    failures: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl Lockout {
    /// How long `ip` is still locked out, if it is.
    pub fn locked(&self, ip: IpAddr) -> Option<Duration> {
        let failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let &(since, n) = failures.get(&ip)?;
        let left = WINDOW.checked_sub(since.elapsed())?;
        (n >= MAX_FAILURES).then_some(left)
    }

    /// Counts a failure of `ip`; returns whether it is now locked out.
    pub fn fail(&self, ip: IpAddr) -> bool {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if failures.len() >= MAX_ADDRESSES && !failures.contains_key(&ip) {
            failures.retain(|_, (since, _)| since.elapsed() < WINDOW);
            if failures.len() >= MAX_ADDRESSES
                && let Some(oldest) = failures
                    .iter()
                    .min_by_key(|(_, (s, _))| *s)
                    .map(|(k, _)| *k)
            {
                failures.remove(&oldest);
            }
        }
        let entry = failures.entry(ip).or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= WINDOW {
            *entry = (Instant::now(), 0);
        }
        entry.1 += 1;
        entry.1 >= MAX_FAILURES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_locked_after_its_failures_and_others_are_not() {
        let lockout = Lockout::default();
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        for _ in 0..MAX_FAILURES - 1 {
            assert!(!lockout.fail(a));
        }
        assert_eq!(lockout.locked(a), None);
        assert!(lockout.fail(a));
        assert!(lockout.locked(a).is_some());
        assert_eq!(lockout.locked(b), None);
    }
}
