//! Per-source rate limits: a token bucket per source that sets
//! `rate_limit`, spent by signed deliveries just before their claim, so an
//! unsigned request never spends it. The global in-flight limit
//! ([`crate::receive::State::in_flight`]) stays in front of everything.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use hookinbox::config::Source;
use hookinbox::key::SourceName;

use crate::answer::{Outcome, Reject};

/// The buckets of the sources that have one.
pub(crate) struct RateLimits {
    buckets: BTreeMap<SourceName, DefaultDirectRateLimiter>,
    clock: DefaultClock,
}

impl RateLimits {
    /// One bucket per limited source, full at start.
    pub(crate) fn new<'a>(sources: impl IntoIterator<Item = &'a Source>) -> Self {
        let buckets = sources
            .into_iter()
            .filter_map(|source| {
                let limit = source.rate_limit?;
                let quota = Quota::per_second(limit.per_second).allow_burst(limit.burst);
                Some((source.name.clone(), RateLimiter::direct(quota)))
            })
            .collect();
        Self {
            buckets,
            clock: DefaultClock::default(),
        }
    }

    /// Takes a token for one delivery of `source`, or refuses it with 429
    /// and the whole seconds until a token is there (at least 1).
    pub(crate) fn admit(&self, source: &SourceName) -> Result<(), Reject> {
        let Some(bucket) = self.buckets.get(source) else {
            return Ok(());
        };
        bucket.check().map_err(|not_until| {
            let wait = not_until.wait_time_from(self.clock.now());
            let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            Reject::new(
                StatusCode::TOO_MANY_REQUESTS,
                Outcome::RateLimited,
                "this source's rate limit is reached, retry later",
            )
            .retry_after(seconds.max(1))
        })
    }
}
