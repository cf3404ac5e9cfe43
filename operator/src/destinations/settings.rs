//! A destination's settings as operators may read them: what it is, where
//! it goes, what it takes, how it is paced, retried and broken, how it
//! signs. Never a secret or a header's value: a header is shown by its
//! name (and whether its value came from a file), the signing secret as
//! set or unset, the URL without its userinfo and with its query hidden.

use hookinbox::config::{DestinationKind, ForwardConfig, Route};
use hookinbox::retry::Retries;
use serde::Serialize;

/// An extra request header: its name, never its value.
#[derive(Clone, Debug, Serialize)]
pub struct HeaderSetting {
    /// Its name, lower case.
    pub name: String,
    /// Whether its value was read from a file (a secret).
    pub secret: bool,
}

/// How a destination is retried.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RetrySetting {
    /// Its own delays (`retry = [...]`, or forward's default schedule).
    Schedule {
        /// Each delay, as humans write it (`5s`, `1m`).
        delays: Vec<String>,
        /// Attempts in all.
        max_attempts: i32,
    },
    /// The exponential policy of the worker's settings.
    Exponential {
        /// The first delay, in milliseconds.
        base_ms: u64,
        /// The longest delay, in milliseconds.
        max_ms: u64,
        /// Attempts in all.
        max_attempts: i32,
    },
}

/// A destination's circuit breaker.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct BreakerSetting {
    /// Opens when at least this share of the window's attempts failed...
    pub failure_ratio: f64,
    /// ...and the window holds at least this many.
    pub min_requests: u32,
    /// The window, in seconds.
    pub window_secs: u64,
    /// Between probes while open, in seconds.
    pub probe_secs: u64,
}

/// A rate limit.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct RateSetting {
    /// Legs started per second, per worker.
    pub per_second: u32,
    /// At once after a quiet spell.
    pub burst: u32,
}

/// A destination's settings, for display.
#[derive(Clone, Debug, Serialize)]
pub struct Settings {
    /// `forward`, `store` or a handler's name.
    pub kind: String,
    /// A forward's URL, without userinfo; a query is shown as `?…`.
    pub url: Option<String>,
    /// The events it takes (`push`, `pull_request.opened`); empty: all.
    pub events: Vec<String>,
    /// The repositories it takes (`owner/*`); empty: all.
    pub repositories: Vec<String>,
    /// A forward's request timeout, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Handlers at once, per worker.
    pub concurrency: u16,
    /// Legs started per second, per worker, if limited.
    pub rate_limit: Option<RateSetting>,
    /// How its legs are retried.
    pub retry: RetrySetting,
    /// Its circuit breaker, if on.
    pub breaker: Option<BreakerSetting>,
    /// How long its breaker may stay open before it is disabled, in
    /// seconds.
    pub disable_after_secs: u64,
    /// A forward's signature (`github`, `hookinbox`, `none`).
    pub signature: Option<&'static str>,
    /// Whether a forward has its own signing secret: `set` or `unset`
    /// (never the secret).
    pub secret: Option<&'static str>,
    /// A forward's extra headers, by name (never a value).
    pub headers: Vec<HeaderSetting>,
}

/// A forward's URL as shown: no userinfo, no fragment, and a query (which
/// may carry a token) as `?…`.
pub fn shown_url(forward: &ForwardConfig) -> String {
    let mut shown = forward.url.clone();
    // Only fails for URLs that cannot have userinfo, which have none.
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_fragment(None);
    let had_query = shown.query().is_some();
    shown.set_query(None);
    let mut text = shown.to_string();
    if had_query {
        text.push_str("?…");
    }
    text
}

impl Settings {
    /// The settings of `route`, as a worker resolves them.
    pub fn of(route: &Route) -> Self {
        let d = &route.destination;
        let retry = match &route.retries {
            Retries::Schedule(schedule) => RetrySetting::Schedule {
                delays: schedule
                    .delays()
                    .iter()
                    .map(|delay| humantime::format_duration(*delay).to_string())
                    .collect(),
                max_attempts: schedule.max_attempts(),
            },
            Retries::Exponential(policy) => RetrySetting::Exponential {
                base_ms: u64::try_from(policy.base.as_millis()).unwrap_or(u64::MAX),
                max_ms: u64::try_from(policy.max.as_millis()).unwrap_or(u64::MAX),
                max_attempts: policy.max_attempts,
            },
        };
        let mut settings = Self {
            kind: d.kind.name().to_owned(),
            url: None,
            events: d.events.entries(),
            repositories: d.repositories.patterns().to_vec(),
            timeout_ms: None,
            concurrency: route.concurrency,
            rate_limit: d.rate_limit.map(|r| RateSetting {
                per_second: r.per_second.get(),
                burst: r.burst.get(),
            }),
            retry,
            breaker: d.breaker.map(|b| BreakerSetting {
                failure_ratio: b.failure_ratio,
                min_requests: b.min_requests,
                window_secs: b.window.as_secs(),
                probe_secs: b.probe.as_secs(),
            }),
            disable_after_secs: d.disable_after.as_secs(),
            signature: None,
            secret: None,
            headers: Vec::new(),
        };
        if let DestinationKind::Forward(forward) = &d.kind {
            settings.url = Some(shown_url(forward));
            settings.timeout_ms =
                Some(u64::try_from(forward.timeout.as_millis()).unwrap_or(u64::MAX));
            settings.signature = Some(forward.signature.as_str());
            settings.secret = Some(if forward.secret.is_some() {
                "set"
            } else {
                "unset"
            });
            settings.headers = forward
                .headers
                .iter()
                .map(|h| HeaderSetting {
                    name: h.name.as_str().to_owned(),
                    secret: h.is_secret(),
                })
                .collect();
        }
        settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_userinfo_and_with_its_query_hidden() {
        let shown = |raw: &str| {
            let url = hookinbox::config::parse_forward_url("url", raw).expect("a URL");
            shown_url(&ForwardConfig::new(
                url,
                None,
                std::time::Duration::from_secs(1),
            ))
        };
        assert_eq!(
            shown("https://user:pa55word@example.com:8443/hook?token=abc#x"),
            "https://example.com:8443/hook?…"
        );
        assert_eq!(shown("http://127.0.0.1:9/h"), "http://127.0.0.1:9/h");
    }
}
