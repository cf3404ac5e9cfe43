//! A source's destinations: where each delivery goes, each as a *leg* with
//! its own filters, pace, retries and circuit breaker (see
//! docs/architecture.md, "Destinations and legs").
//!
//! Both binaries read them: ingest decides each destination's filters at
//! the claim and names the legs; the worker runs them. A source's old
//! `handler = { … }`, and the single-source variables, describe one
//! destination named after its kind.

use std::collections::BTreeMap;
use std::num::NonZeroU16;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::forward::{FileHeaderValue, ForwardConfig, ForwardFields, forward_config};
use super::sources::{EventFilter, RateLimit};
use super::{ConfigError, parse_duration_text};
use crate::key::{DestinationName, EventName};
use crate::retry::Schedule;

/// The retry schedule of a `forward` destination that sets none: nine
/// attempts over about 33 hours (at least 26 with jitter), longer than a
/// day's outage of the receiver.
pub const DEFAULT_FORWARD_SCHEDULE: [Duration; 8] = [
    Duration::from_secs(5),
    Duration::from_secs(60),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(6 * 3600),
    Duration::from_secs(12 * 3600),
    Duration::from_secs(12 * 3600),
];

/// How long a breaker may stay open before its destination is disabled:
/// GitHub's own delivery log holds three days.
pub const DEFAULT_DISABLE_AFTER: Duration = Duration::from_secs(72 * 3600);

/// What a destination does with a leg.
// Built once at start, a few per source: the size of a forward's settings
// costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum DestinationKind {
    /// Write the event into `github_events`.
    Store,
    /// POST it to a URL.
    Forward(ForwardConfig),
    /// A handler a worker binary registers under this name.
    Custom(String),
}

impl DestinationKind {
    /// The kind's name, as the configuration spells it.
    pub fn name(&self) -> &str {
        match self {
            Self::Store => "store",
            Self::Forward(_) => "forward",
            Self::Custom(name) => name,
        }
    }
}

/// The circuit breaker of a destination (see docs/architecture.md, "The
/// circuit breaker").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Breaker {
    /// Opens when at least this share of the window's attempts failed.
    pub failure_ratio: f64,
    /// ...and the window holds at least this many attempts.
    pub min_requests: u32,
    /// The window attempts are counted over.
    pub window: Duration,
    /// Between probes while open.
    pub probe: Duration,
}

impl Default for Breaker {
    fn default() -> Self {
        Self {
            failure_ratio: 0.5,
            min_requests: 10,
            window: Duration::from_secs(60),
            probe: Duration::from_secs(30),
        }
    }
}

/// Repositories a destination takes, by `OWNER/NAME` pattern: compared
/// case-insensitively (GitHub's names are), `*` matching any run of
/// characters within one segment.
#[derive(Clone, Debug, Default)]
pub struct RepositoryFilter(Option<Vec<String>>);

impl RepositoryFilter {
    /// Parses `OWNER/NAME` patterns; `field` names the setting in errors.
    /// An empty list takes every delivery.
    pub fn parse<'a>(
        field: &str,
        patterns: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, ConfigError> {
        let mut all = Vec::new();
        for (i, raw) in patterns.into_iter().enumerate() {
            let pattern = raw.trim().to_ascii_lowercase();
            let valid = pattern.split('/').count() == 2
                && pattern.split('/').all(|segment| {
                    !segment.is_empty()
                        && segment.len() <= 100
                        && segment
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"-_.*".contains(&b))
                });
            if !valid {
                return Err(ConfigError::field(
                    &format!("{field}[{i}]"),
                    format!(
                        "'{raw}' is not OWNER/NAME (letters, digits, '-', '_', '.', and '*' \
                         within a segment)"
                    ),
                ));
            }
            all.push(pattern);
        }
        Ok(Self((!all.is_empty()).then_some(all)))
    }

    /// The patterns, lower case; empty when every repository is taken.
    pub fn patterns(&self) -> &[String] {
        self.0.as_deref().unwrap_or_default()
    }

    /// Whether every repository is taken (no filter).
    pub fn is_all(&self) -> bool {
        self.0.is_none()
    }

    /// Whether `repository` (`OWNER/NAME`, any case) is taken; a delivery
    /// without a repository is taken only when there is no filter.
    pub fn takes(&self, repository: Option<&str>) -> bool {
        let Some(patterns) = &self.0 else {
            return true;
        };
        let Some(repository) = repository else {
            return false;
        };
        let repository = repository.to_ascii_lowercase();
        let Some((owner, name)) = repository.split_once('/') else {
            return false;
        };
        patterns.iter().any(|pattern| {
            let (p_owner, p_name) = pattern.split_once('/').unwrap_or((pattern, ""));
            glob(p_owner, owner) && glob(p_name, name)
        })
    }
}

/// `*` matches any run of characters (the segment has no `/`).
fn glob(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Why a destination does not take a delivery: recorded on its filtered
/// leg, so that "why didn't `ci` get it?" has an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Filtered {
    /// The event (or its action) is not among the destination's events.
    Event,
    /// The delivery has no repository and the destination filters by one.
    NoRepository,
    /// The repository matches none of the destination's patterns.
    Repository,
}

impl Filtered {
    /// The reason as recorded on the leg.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Event => "event not taken by this destination's events filter",
            Self::NoRepository => "no repository, and this destination filters by repository",
            Self::Repository => "repository not taken by this destination's repositories filter",
        }
    }
}

/// An installation's share of a fair destination's legs in flight while
/// others wait, when neither `per_key_concurrency` nor `concurrency` is
/// set: half the worker's default `HOOKINBOX_CONCURRENCY` (16).
pub const DEFAULT_FAIR_CAP: i32 = 8;

/// How an ordered destination keys its legs (`ordering = "…"`): per key,
/// one leg in flight, in claim order (docs/architecture.md, "Ordered
/// legs").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ordering {
    /// `"repository"`: the payload's `repository.id`.
    Repository,
    /// `"pull_request"`: `repository.id` and the pull request's or issue's
    /// number.
    PullRequest,
}

impl Ordering {
    /// Reads the setting's value.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "repository" => Some(Self::Repository),
            "pull_request" => Some(Self::PullRequest),
            _ => None,
        }
    }

    /// The setting's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Repository => "repository",
            Self::PullRequest => "pull_request",
        }
    }

    /// A delivery's key under this ordering, from its payload's fields;
    /// `None` (the leg is unordered) for an event without a repository,
    /// or, ordered by pull request, without a number.
    pub fn key(self, fields: &crate::payload::Fields) -> Option<String> {
        let repository = fields.repository_id?;
        match self {
            Self::Repository => Some(repository.to_string()),
            Self::PullRequest => fields.number.map(|n| format!("{repository}#{n}")),
        }
    }
}

/// One destination of a source.
#[derive(Clone, Debug)]
pub struct Destination {
    /// Its name, unique in the source.
    pub name: DestinationName,
    /// What it does with a leg.
    pub kind: DestinationKind,
    /// The events it takes (all when empty).
    pub events: EventFilter,
    /// The repositories it takes (all when empty).
    pub repositories: RepositoryFilter,
    /// Handlers at once, per worker; `None`: `HOOKINBOX_CONCURRENCY`.
    pub concurrency: Option<NonZeroU16>,
    /// Legs started per second, per worker, if limited.
    pub rate_limit: Option<RateLimit>,
    /// Its own retry schedule; `None`: its kind's default.
    pub retry: Option<Schedule>,
    /// Its circuit breaker, if on.
    pub breaker: Option<Breaker>,
    /// How long the breaker may stay open before the destination is
    /// disabled.
    pub disable_after: Duration,
    /// Its legs' order per key, if ordered.
    pub ordering: Option<Ordering>,
    /// Whether its legs are shared out fairly across installations: on by
    /// default for an unordered destination (`fairness = false` turns it
    /// off), never for an ordered one, whose keys already take one leg at
    /// a time.
    pub fairness: bool,
    /// `per_key_concurrency`: a hard cap on an installation's legs in
    /// flight; `None`: an installation keeps half the destination's
    /// `concurrency` while another installation's legs wait, and is not
    /// held back alone.
    pub per_key_concurrency: Option<NonZeroU16>,
    /// `skip_stale = true` (ordered by pull request only): a leg whose
    /// payload's `updated_at` (the pull request's or issue's) is older than
    /// that of a completed leg of its key is completed without its effect,
    /// counted as `stale`.
    pub skip_stale: bool,
}

impl Destination {
    /// Whether a worker runs a first attempt of this destination's legs on
    /// the one-statement path, reading the body in a statement of its own:
    /// a `store` destination with no breaker, no order and no rate limit
    /// (whose takes are their gates). Ingest puts a copy of the body on
    /// such a new leg's message, which saves that read.
    pub fn reads_body_apart(&self) -> bool {
        matches!(self.kind, DestinationKind::Store)
            && self.breaker.is_none()
            && self.ordering.is_none()
            && self.rate_limit.is_none()
    }

    /// A destination with its kind's defaults and no filters: what a
    /// source's old `handler = { … }` (or the single-source variables)
    /// describe, named after its kind.
    pub fn of_kind(kind: DestinationKind) -> Self {
        let name = DestinationName::parse(kind.name()).unwrap_or_default();
        let breaker = matches!(kind, DestinationKind::Forward(_)).then(Breaker::default);
        Self {
            name,
            kind,
            events: EventFilter::all(),
            repositories: RepositoryFilter::default(),
            concurrency: None,
            rate_limit: None,
            retry: None,
            breaker,
            disable_after: DEFAULT_DISABLE_AFTER,
            ordering: None,
            fairness: true,
            per_key_concurrency: None,
            skip_stale: false,
        }
    }

    /// Whether its legs are shared out across installations: `fairness`
    /// on and no `ordering` (whose keys already take one leg at a time).
    pub fn is_fair(&self) -> bool {
        self.fairness && self.ordering.is_none()
    }

    /// A leg's installation, its share of legs in flight and whether the
    /// share is a hard cap, when this destination is fair
    /// (docs/architecture.md, "Fairness"): the payload's `installation.id`
    /// ('' for none); `per_key_concurrency` as a hard cap when set, else
    /// half the destination's `concurrency` (at least 1; [`DEFAULT_FAIR_CAP`]
    /// when `concurrency` is not set), kept only while another
    /// installation's legs wait.
    pub fn fair_key(&self, fields: &crate::payload::Fields) -> Option<(String, i32, bool)> {
        if !self.is_fair() {
            return None;
        }
        let (cap, hard) = match self.per_key_concurrency {
            Some(cap) => (i32::from(cap.get()), true),
            None => (
                self.concurrency
                    .map_or(DEFAULT_FAIR_CAP, |c| (i32::from(c.get()) / 2).max(1)),
                false,
            ),
        };
        let key = fields
            .installation_id
            .map(|id| id.to_string())
            .unwrap_or_default();
        Some((key, cap, hard))
    }

    /// The time a leg's staleness is judged by, when this destination
    /// skips stale legs: the payload's pull request's or issue's
    /// `updated_at`.
    pub fn stale_clock(
        &self,
        fields: &crate::payload::Fields,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        if self.skip_stale && self.ordering == Some(Ordering::PullRequest) {
            fields.updated_at
        } else {
            None
        }
    }

    /// Whether this destination takes a verified delivery; `Err` says why
    /// not.
    pub fn takes(
        &self,
        event: &EventName,
        action: Option<&str>,
        repository: Option<&str>,
    ) -> Result<(), Filtered> {
        if !self.events.takes(event, action) {
            return Err(Filtered::Event);
        }
        if !self.repositories.takes(repository) {
            return Err(if repository.is_none() {
                Filtered::NoRepository
            } else {
                Filtered::Repository
            });
        }
        Ok(())
    }
}

/// `[[sources.destinations]]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileDestination {
    name: String,
    kind: String,
    url: Option<String>,
    secret: Option<String>,
    secret_file: Option<PathBuf>,
    timeout_ms: Option<u64>,
    signature: Option<String>,
    headers: Option<BTreeMap<String, FileHeaderValue>>,
    allow_networks: Option<Vec<String>>,
    ca_file: Option<PathBuf>,
    client_cert_file: Option<PathBuf>,
    client_key_file: Option<PathBuf>,
    #[serde(default)]
    events: Vec<String>,
    #[serde(default)]
    repositories: Vec<String>,
    concurrency: Option<u32>,
    rate_limit: Option<super::sources::FileRateLimit>,
    retry: Option<Vec<String>>,
    breaker: Option<FileBreaker>,
    disable_after: Option<String>,
    ordering: Option<String>,
    fairness: Option<bool>,
    per_key_concurrency: Option<u32>,
    skip_stale: Option<bool>,
}

/// `breaker = false`, or its settings (each optional).
#[derive(Deserialize)]
#[serde(untagged)]
enum FileBreaker {
    Switch(bool),
    Settings(FileBreakerSettings),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileBreakerSettings {
    failure_ratio: Option<f64>,
    min_requests: Option<u32>,
    window_secs: Option<u64>,
    probe_secs: Option<u64>,
}

impl FileDestination {
    /// Validates one destination; `at("field")` names
    /// `sources[i].destinations[j].field`.
    pub(super) fn load(self, at: &dyn Fn(&str) -> String) -> Result<Destination, ConfigError> {
        let name = DestinationName::parse(&self.name)
            .map_err(|e| ConfigError::field(&at("name"), e.to_string()))?;
        let forward_only = [
            ("url", self.url.is_some()),
            ("secret", self.secret.is_some()),
            ("secret_file", self.secret_file.is_some()),
            ("timeout_ms", self.timeout_ms.is_some()),
            ("signature", self.signature.is_some()),
            ("headers", self.headers.is_some()),
            ("allow_networks", self.allow_networks.is_some()),
            ("ca_file", self.ca_file.is_some()),
            ("client_cert_file", self.client_cert_file.is_some()),
            ("client_key_file", self.client_key_file.is_some()),
        ];
        let kind = match self.kind.as_str() {
            "forward" => {
                let url = self
                    .url
                    .as_deref()
                    .ok_or_else(|| ConfigError::field(&at("url"), "is required by kind forward"))?;
                DestinationKind::Forward(forward_config(
                    at,
                    url,
                    ForwardFields {
                        secret: self.secret,
                        secret_file: self.secret_file,
                        timeout_ms: self.timeout_ms,
                        signature: self.signature,
                        headers: self.headers,
                        allow_networks: self.allow_networks,
                        ca_file: self.ca_file,
                        client_cert_file: self.client_cert_file,
                        client_key_file: self.client_key_file,
                    },
                )?)
            }
            other => {
                if let Some((field, _)) = forward_only.iter().find(|(_, given)| *given) {
                    return Err(ConfigError::field(
                        &at(field),
                        format!("is only for kind forward, not {other}"),
                    ));
                }
                if other == "store" {
                    DestinationKind::Store
                } else if DestinationName::parse(other).is_ok() {
                    DestinationKind::Custom(other.to_owned())
                } else {
                    return Err(ConfigError::field(
                        &at("kind"),
                        format!(
                            "'{other}' is not forward, store, or a handler's name (a-z, 0-9, \
                             '-', '_')"
                        ),
                    ));
                }
            }
        };
        let events = EventFilter::parse(&at("events"), self.events.iter().map(String::as_str))?;
        let repositories = RepositoryFilter::parse(
            &at("repositories"),
            self.repositories.iter().map(String::as_str),
        )?;
        let concurrency = self
            .concurrency
            .map(|n| {
                u16::try_from(n)
                    .ok()
                    .and_then(NonZeroU16::new)
                    .ok_or_else(|| ConfigError::field(&at("concurrency"), "must be 1 to 65535"))
            })
            .transpose()?;
        let rate_limit = match self.rate_limit {
            None => None,
            Some(limit) => RateLimit::from_settings(
                (&at("rate_limit.per_second"), Some(limit.per_second)),
                (&at("rate_limit.burst"), limit.burst),
            )?,
        };
        let retry = match self.retry {
            None => None,
            Some(delays) => {
                let mut parsed = Vec::with_capacity(delays.len());
                for (k, delay) in delays.iter().enumerate() {
                    let d = parse_duration_text(delay)
                        .map_err(|p| ConfigError::field(&at(&format!("retry[{k}]")), p))?;
                    if d.is_zero() {
                        return Err(ConfigError::field(
                            &at(&format!("retry[{k}]")),
                            "must be longer than 0",
                        ));
                    }
                    parsed.push(d);
                }
                if parsed.len() > 100 {
                    return Err(ConfigError::field(&at("retry"), "has more than 100 delays"));
                }
                Some(Schedule::new(parsed).ok_or_else(|| {
                    ConfigError::field(
                        &at("retry"),
                        "needs at least one delay (attempts = delays + 1)",
                    )
                })?)
            }
        };
        let default_breaker = matches!(kind, DestinationKind::Forward(_));
        let breaker = match self.breaker {
            None => default_breaker.then(Breaker::default),
            Some(FileBreaker::Switch(on)) => on.then(Breaker::default),
            Some(FileBreaker::Settings(s)) => Some(breaker_settings(at, s)?),
        };
        let disable_after = match self.disable_after {
            None => DEFAULT_DISABLE_AFTER,
            Some(text) => parse_duration_text(&text)
                .map_err(|p| ConfigError::field(&at("disable_after"), p))?,
        };
        let ordering = self
            .ordering
            .map(|value| {
                Ordering::parse(&value).ok_or_else(|| {
                    ConfigError::field(
                        &at("ordering"),
                        format!("'{value}' is not repository or pull_request"),
                    )
                })
            })
            .transpose()?;
        if ordering.is_some() && self.fairness == Some(true) {
            return Err(ConfigError::field(
                &at("fairness"),
                "cannot be on for an ordered destination (its keys already take one leg at a time)",
            ));
        }
        let per_key_concurrency =
            match self.per_key_concurrency {
                None => None,
                Some(n) => Some(u16::try_from(n).ok().and_then(NonZeroU16::new).ok_or_else(
                    || ConfigError::field(&at("per_key_concurrency"), "must be 1 to 65535"),
                )?),
            };
        if per_key_concurrency.is_some() && (ordering.is_some() || self.fairness == Some(false)) {
            return Err(ConfigError::field(
                &at("per_key_concurrency"),
                "needs fairness (on by default) and no ordering",
            ));
        }
        let skip_stale = self.skip_stale.unwrap_or(false);
        if skip_stale && ordering != Some(Ordering::PullRequest) {
            return Err(ConfigError::field(
                &at("skip_stale"),
                "needs ordering = \"pull_request\" (it compares the pull request's or issue's updated_at within a key)",
            ));
        }
        Ok(Destination {
            name,
            kind,
            events,
            repositories,
            concurrency,
            rate_limit,
            retry,
            breaker,
            disable_after,
            ordering,
            // On unless turned off, for an unordered destination.
            fairness: self.fairness.unwrap_or(ordering.is_none()),
            per_key_concurrency,
            skip_stale,
        })
    }
}

fn breaker_settings(
    at: &dyn Fn(&str) -> String,
    s: FileBreakerSettings,
) -> Result<Breaker, ConfigError> {
    let d = Breaker::default();
    let failure_ratio = s.failure_ratio.unwrap_or(d.failure_ratio);
    if !(failure_ratio > 0.0 && failure_ratio <= 1.0) {
        return Err(ConfigError::field(
            &at("breaker.failure_ratio"),
            "must be more than 0 and at most 1",
        ));
    }
    let positive = |field: &str, v: Option<u64>, default: u64| match v {
        Some(0) => Err(ConfigError::field(
            &at(&format!("breaker.{field}")),
            "must be at least 1",
        )),
        Some(n) => Ok(n),
        None => Ok(default),
    };
    Ok(Breaker {
        failure_ratio,
        min_requests: u32::try_from(positive(
            "min_requests",
            s.min_requests.map(u64::from),
            u64::from(d.min_requests),
        )?)
        .unwrap_or(u32::MAX),
        window: Duration::from_secs(positive("window_secs", s.window_secs, d.window.as_secs())?),
        probe: Duration::from_secs(positive("probe_secs", s.probe_secs, d.probe.as_secs())?),
    })
}

/// Checks a source's destinations together: at least one, names unique,
/// at most one `store` (they would write the same `github_events` row).
pub(super) fn check_all(
    at: &dyn Fn(&str) -> String,
    destinations: &[Destination],
) -> Result<(), ConfigError> {
    let mut names = std::collections::BTreeSet::new();
    let mut stores = 0;
    for (j, d) in destinations.iter().enumerate() {
        if !names.insert(d.name.clone()) {
            return Err(ConfigError::field(
                &at(&format!("destinations[{j}].name")),
                format!("'{}' is defined twice in this source", d.name),
            ));
        }
        if matches!(d.kind, DestinationKind::Store) {
            stores += 1;
            if stores > 1 {
                return Err(ConfigError::field(
                    &at(&format!("destinations[{j}].kind")),
                    "a source has at most one store destination (both would write the same \
                     github_events row)",
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(s: &str) -> EventName {
        EventName::parse(s.as_bytes()).expect("event")
    }

    #[test]
    fn only_a_plain_store_destination_reads_its_body_apart() {
        let store = Destination::of_kind(DestinationKind::Store);
        assert!(store.reads_body_apart());
        let limited = Destination {
            rate_limit: Some(super::super::sources::RateLimit {
                per_second: std::num::NonZeroU32::MIN,
                burst: std::num::NonZeroU32::MIN,
            }),
            ..store.clone()
        };
        assert!(!limited.reads_body_apart(), "its take is the limit's gate");
        let broken = Destination {
            breaker: Some(Breaker::default()),
            ..store.clone()
        };
        assert!(!broken.reads_body_apart(), "its take is the breaker's gate");
        let custom = Destination::of_kind(DestinationKind::Custom("mine".to_owned()));
        assert!(!custom.reads_body_apart(), "its handler may read more");
    }

    #[test]
    fn repository_patterns_match_case_insensitively_within_a_segment() {
        let f =
            RepositoryFilter::parse("r", ["acme/widgets", "Octo/*", "*/mirror-*"]).expect("valid");
        assert!(f.takes(Some("ACME/Widgets")));
        assert!(f.takes(Some("octo/anything")));
        assert!(f.takes(Some("someone/mirror-linux")));
        assert!(!f.takes(Some("acme/widgets2")));
        assert!(!f.takes(Some("acme/gadgets")));
        assert!(!f.takes(Some("someone/linux-mirror")));
        assert!(!f.takes(None));
        assert!(RepositoryFilter::default().takes(None));
        for bad in ["acme", "acme/", "/x", "a/b/c", "a b/c", "a/b?"] {
            let err = RepositoryFilter::parse("r", [bad])
                .expect_err(bad)
                .to_string();
            assert!(err.contains("r[0]"), "{err}");
        }
    }

    #[test]
    fn glob_star_matches_any_run() {
        assert!(glob("*", ""));
        assert!(glob("a*c", "abbbc"));
        assert!(glob("a*b*c", "axbyc"));
        assert!(!glob("a*b*c", "axbyd"));
        assert!(glob("*-x", "a-x"));
        assert!(!glob("ab*ba", "aba"));
    }

    #[test]
    fn a_destination_says_why_it_filters() {
        let mut d = Destination::of_kind(DestinationKind::Store);
        d.events = EventFilter::parse("e", ["pull_request"]).expect("events");
        d.repositories = RepositoryFilter::parse("r", ["acme/*"]).expect("repos");
        assert_eq!(
            d.takes(&ev("pull_request"), Some("opened"), Some("acme/x")),
            Ok(())
        );
        assert_eq!(
            d.takes(&ev("push"), None, Some("acme/x")),
            Err(Filtered::Event)
        );
        assert_eq!(
            d.takes(&ev("pull_request"), None, None),
            Err(Filtered::NoRepository)
        );
        assert_eq!(
            d.takes(&ev("pull_request"), None, Some("other/x")),
            Err(Filtered::Repository)
        );
    }

    #[test]
    fn the_old_handlers_are_destinations_named_after_their_kind() {
        let store = Destination::of_kind(DestinationKind::Store);
        assert_eq!(store.name.as_str(), "store");
        assert!(store.breaker.is_none());
        let forward = Destination::of_kind(DestinationKind::Forward(ForwardConfig::new(
            reqwest::Url::parse("http://127.0.0.1:1/").expect("url"),
            None,
            super::super::DEFAULT_FORWARD_TIMEOUT,
        )));
        assert_eq!(forward.name.as_str(), "forward");
        assert_eq!(forward.breaker, Some(Breaker::default()));
    }

    #[test]
    fn the_default_forward_schedule_outlasts_a_day_even_with_jitter() {
        let span: Duration = DEFAULT_FORWARD_SCHEDULE.iter().sum();
        assert!(span.mul_f64(SCHEDULE_FLOOR) >= Duration::from_secs(24 * 3600));
    }

    /// The least a scheduled delay keeps after jitter (retry.rs).
    const SCHEDULE_FLOOR: f64 = 0.8;
}
