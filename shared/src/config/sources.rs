//! Webhook sources: each has a name (its route), secrets, optionally the
//! hook ids it accepts, the events it takes, and the destinations its
//! deliveries go to.
//!
//! Several sources come from a TOML file named by `HOOKINBOX_CONFIG` (see
//! `config.example.toml`); without it, environment variables configure
//! one source named `default`. Both binaries read the same file: ingest
//! uses the secrets, pins, event filters and the destinations' names and
//! filters; the worker runs the destinations.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::destinations::{Destination, DestinationKind, FileDestination, check_all};
use super::forward::{FileHeaderValue, ForwardFields, forward_config};
use super::secrets::{inline_secret, read, secrets_from_lines};
use super::{ConfigError, GithubSettings};
use crate::key::{EventName, HookId, SourceName};
use crate::signature::Secrets;

/// The events a source takes: every event, or a list where each event may
/// be limited to some actions (`pull_request.opened`).
#[derive(Clone, Debug, Default)]
pub struct EventFilter(Option<BTreeMap<String, Option<BTreeSet<String>>>>);

impl EventFilter {
    /// Takes every event.
    pub fn all() -> Self {
        Self(None)
    }

    /// Parses entries such as `push` or `pull_request.opened`; `field`
    /// names the setting in errors. An empty list takes every event.
    pub fn parse<'a>(
        field: &str,
        entries: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, ConfigError> {
        let mut map: BTreeMap<String, Option<BTreeSet<String>>> = BTreeMap::new();
        for entry in entries {
            let entry = entry.trim();
            let (event, action) = match entry.split_once('.') {
                Some((e, a)) => (e, Some(a)),
                None => (entry, None),
            };
            let bad = || {
                ConfigError::field(
                    field,
                    format!("'{entry}' is not an event name or event.action (a-z, 0-9, '_')"),
                )
            };
            EventName::parse(event.as_bytes()).map_err(|_| bad())?;
            match action {
                None => {
                    map.insert(event.to_owned(), None);
                }
                Some(action) => {
                    EventName::parse(action.as_bytes()).map_err(|_| bad())?;
                    match map
                        .entry(event.to_owned())
                        .or_insert_with(|| Some(BTreeSet::new()))
                    {
                        // The bare event is listed too: every action already.
                        None => {}
                        Some(actions) => {
                            actions.insert(action.to_owned());
                        }
                    }
                }
            }
        }
        Ok(Self((!map.is_empty()).then_some(map)))
    }

    /// The entries as written (`push`, `pull_request.opened`), sorted;
    /// empty when every event is taken. For operators' displays.
    pub fn entries(&self) -> Vec<String> {
        let Some(map) = &self.0 else {
            return Vec::new();
        };
        map.iter()
            .flat_map(|(event, actions)| match actions {
                None => vec![event.clone()],
                Some(actions) => actions.iter().map(|a| format!("{event}.{a}")).collect(),
            })
            .collect()
    }

    /// Whether any action of `event` may be taken (checked before the body
    /// is parsed).
    pub fn takes_event(&self, event: &EventName) -> bool {
        self.0
            .as_ref()
            .is_none_or(|m| m.contains_key(event.as_str()))
    }

    /// Whether `event` with `action` is taken.
    pub fn takes(&self, event: &EventName, action: Option<&str>) -> bool {
        match &self.0 {
            None => true,
            Some(map) => match map.get(event.as_str()) {
                None => false,
                Some(None) => true,
                Some(Some(actions)) => action.is_some_and(|a| actions.contains(a)),
            },
        }
    }
}

/// One webhook source.
#[derive(Clone, Debug)]
pub struct Source {
    /// Its name: the `{source}` of `/webhooks/github/{source}`.
    pub name: SourceName,
    /// Any one of them verifies (several allow rotation).
    pub secrets: Secrets,
    /// `Some`: only these `X-GitHub-Hook-ID`s are accepted. The delivery
    /// and hook ids are not covered by GitHub's signature, so pinning stops
    /// a captured request from being replayed under another hook id.
    pub hook_ids: Option<BTreeSet<HookId>>,
    /// Which events it takes.
    pub events: EventFilter,
    /// Where its deliveries go: one leg each per destination that takes
    /// them. Never empty.
    pub destinations: Vec<Destination>,
    /// The GitHub hook it receives from, for the reconciler, as given: the
    /// worker validates it and reads its credentials
    /// ([`GithubSettings::load`]); ingest has no use for it.
    pub github: Option<GithubSettings>,
    /// Refuse a body seen before under another delivery id (a replayed
    /// capture), and answer one seen under the same delivery id and another
    /// hook id, unless pinned, as a copy; on unless the source turns it off.
    pub replay_guard: bool,
    /// Signed deliveries admitted per second, if limited.
    pub rate_limit: Option<RateLimit>,
}

/// A token bucket: `per_second` tokens are added each second, up to
/// `burst`; each signed delivery takes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    /// Sustained deliveries per second.
    pub per_second: NonZeroU32,
    /// Deliveries admitted at once after a quiet spell.
    pub burst: NonZeroU32,
}

impl RateLimit {
    /// The limit from its two settings, named in errors: a burst without a
    /// rate is refused; a rate alone bursts to itself.
    pub fn from_settings(
        (rate_field, per_second): (&str, Option<u32>),
        (burst_field, burst): (&str, Option<u32>),
    ) -> Result<Option<Self>, ConfigError> {
        let positive = |field: &str, n: u32| {
            NonZeroU32::new(n).ok_or_else(|| ConfigError::field(field, "must be at least 1"))
        };
        match (per_second, burst) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(ConfigError::field(
                burst_field,
                format!("is set without a rate; set {rate_field} too"),
            )),
            (Some(rate), burst) => {
                let per_second = positive(rate_field, rate)?;
                let burst = burst.map_or(Ok(per_second), |b| positive(burst_field, b))?;
                Ok(Some(Self { per_second, burst }))
            }
        }
    }
}

impl Source {
    /// Whether a hook id is accepted.
    pub fn accepts_hook(&self, hook_id: &HookId) -> bool {
        self.hook_ids
            .as_ref()
            .is_none_or(|ids| ids.contains(hook_id))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    sources: Vec<FileSource>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSource {
    name: String,
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    secret_files: Vec<PathBuf>,
    hook_ids: Option<Vec<HookIdValue>>,
    #[serde(default)]
    events: Vec<String>,
    handler: Option<FileHandler>,
    #[serde(default)]
    destinations: Vec<FileDestination>,
    github: Option<GithubSettings>,
    #[serde(default = "on")]
    replay_guard: bool,
    rate_limit: Option<FileRateLimit>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileRateLimit {
    pub(super) per_second: u32,
    pub(super) burst: Option<u32>,
}

fn on() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(untagged)]
enum HookIdValue {
    Number(u64),
    Text(String),
}

// Read once at start.
#[allow(clippy::large_enum_variant)]
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
enum FileHandler {
    Store,
    Forward {
        url: String,
        secret: Option<String>,
        secret_file: Option<PathBuf>,
        timeout_ms: Option<u64>,
        signature: Option<String>,
        headers: Option<BTreeMap<String, FileHeaderValue>>,
        allow_networks: Option<Vec<String>>,
        ca_file: Option<PathBuf>,
        client_cert_file: Option<PathBuf>,
        client_key_file: Option<PathBuf>,
    },
}

/// Loads every source from the TOML file at `path`. Every error names the
/// field (`sources[1].handler.url`, say).
pub fn from_file(path: &Path) -> Result<Vec<Source>, ConfigError> {
    from_toml(&read("HOOKINBOX_CONFIG", path)?)
}

/// Parses sources from TOML text (`secret_files` are read from disk).
pub fn from_toml(text: &str) -> Result<Vec<Source>, ConfigError> {
    // The parser's own text quotes the offending line, which may hold a
    // secret: report the line number and the message only.
    let file: File = toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        let at = line.map(|l| format!("line {l}: ")).unwrap_or_default();
        ConfigError::field("HOOKINBOX_CONFIG", format!("{at}{}", e.message()))
    })?;
    if file.sources.is_empty() {
        return Err(ConfigError::field(
            "HOOKINBOX_CONFIG",
            "defines no [[sources]]",
        ));
    }
    let mut names = BTreeSet::new();
    let mut sources = Vec::new();
    for (i, raw) in file.sources.into_iter().enumerate() {
        let at = |field: &str| format!("sources[{i}].{field}");
        let name = SourceName::parse(&raw.name)
            .map_err(|e| ConfigError::field(&at("name"), e.to_string()))?;
        if !names.insert(name.clone()) {
            return Err(ConfigError::field(
                &at("name"),
                format!("'{name}' is defined twice"),
            ));
        }
        let mut secrets = Vec::new();
        for (j, s) in raw.secrets.iter().enumerate() {
            secrets.push(inline_secret(&at(&format!("secrets[{j}]")), s)?);
        }
        for (j, file) in raw.secret_files.iter().enumerate() {
            let field = at(&format!("secret_files[{j}]"));
            let text = read(&field, file)?;
            secrets.extend(secrets_from_lines(&field, &text)?.into_vec());
        }
        if secrets.is_empty() {
            return Err(ConfigError::field(
                &at("secrets"),
                format!("source '{name}' has no secret (give secrets or secret_files)"),
            ));
        }
        let hook_ids = match raw.hook_ids {
            None => None,
            Some(ids) => {
                let mut set = BTreeSet::new();
                for (j, id) in ids.into_iter().enumerate() {
                    let text = match id {
                        HookIdValue::Number(n) => n.to_string(),
                        HookIdValue::Text(t) => t,
                    };
                    let hook = HookId::parse(Some(text.as_bytes())).map_err(|_| {
                        ConfigError::field(
                            &at(&format!("hook_ids[{j}]")),
                            format!("'{text}' is not 1 to 20 digits"),
                        )
                    })?;
                    set.insert(hook);
                }
                Some(set)
            }
        };
        let events = EventFilter::parse(&at("events"), raw.events.iter().map(String::as_str))?;
        let destinations = match (raw.handler, raw.destinations) {
            (Some(_), destinations) if !destinations.is_empty() => {
                return Err(ConfigError::field(
                    &at("handler"),
                    "give handler or [[sources.destinations]], not both",
                ));
            }
            (None, destinations) if destinations.is_empty() => {
                vec![Destination::of_kind(DestinationKind::Store)]
            }
            (None, destinations) => {
                let mut loaded = Vec::with_capacity(destinations.len());
                for (j, raw) in destinations.into_iter().enumerate() {
                    let field = |f: &str| at(&format!("destinations[{j}].{f}"));
                    loaded.push(raw.load(&field)?);
                }
                check_all(&at, &loaded)?;
                loaded
            }
            (Some(FileHandler::Store), _) => vec![Destination::of_kind(DestinationKind::Store)],
            (
                Some(FileHandler::Forward {
                    url,
                    secret,
                    secret_file,
                    timeout_ms,
                    signature,
                    headers,
                    allow_networks,
                    ca_file,
                    client_cert_file,
                    client_key_file,
                }),
                _,
            ) => {
                let field = |f: &str| at(&format!("handler.{f}"));
                vec![Destination::of_kind(DestinationKind::Forward(
                    forward_config(
                        &field,
                        &url,
                        ForwardFields {
                            secret,
                            secret_file,
                            timeout_ms,
                            signature,
                            headers,
                            allow_networks,
                            ca_file,
                            client_cert_file,
                            client_key_file,
                        },
                    )?,
                ))]
            }
        };
        let rate_limit = match raw.rate_limit {
            None => None,
            Some(limit) => RateLimit::from_settings(
                (&at("rate_limit.per_second"), Some(limit.per_second)),
                (&at("rate_limit.burst"), limit.burst),
            )?,
        };
        sources.push(Source {
            name,
            secrets: Secrets::new(secrets),
            hook_ids,
            events,
            destinations,
            github: raw.github,
            replay_guard: raw.replay_guard,
            rate_limit,
        });
    }
    Ok(sources)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ev(s: &str) -> EventName {
        EventName::parse(s.as_bytes()).expect("event")
    }

    #[test]
    fn event_filters_take_events_and_actions() {
        let f = EventFilter::parse("f", ["push", "pull_request.opened", "pull_request.closed"])
            .expect("valid");
        assert!(f.takes(&ev("push"), None));
        assert!(f.takes(&ev("push"), Some("x")));
        assert!(f.takes(&ev("pull_request"), Some("opened")));
        assert!(!f.takes(&ev("pull_request"), Some("labeled")));
        assert!(!f.takes(&ev("pull_request"), None));
        assert!(!f.takes(&ev("issues"), Some("opened")));
        assert!(f.takes_event(&ev("pull_request")));
        assert!(!f.takes_event(&ev("issues")));
        assert!(EventFilter::parse("f", ["pull_request.Opened"]).is_err());
        assert!(
            EventFilter::parse("f", Vec::<&str>::new())
                .expect("empty")
                .takes(&ev("x"), None)
        );
    }

    fn write(text: &str) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("hookinbox-src-{}.toml", uuid::Uuid::new_v4()));
        std::fs::write(&path, text).expect("write");
        path
    }

    #[test]
    fn the_example_file_uses_only_known_keys() {
        let text = include_str!("../../../config.example.toml");
        let file: File = toml::from_str(text).expect("config.example.toml parses");
        assert_eq!(file.sources.len(), 3);
        let limit = file.sources[0].rate_limit.as_ref().expect("a rate limit");
        assert_eq!((limit.per_second, limit.burst), (200, Some(400)));
    }

    #[test]
    fn a_full_file_parses() {
        let path = write(
            r#"
[[sources]]
name = "main"
secrets = ["new", "old"]
hook_ids = [123, "456"]
events = ["push", "pull_request.opened"]

[[sources]]
name = "relay"
secrets = ["other"]
handler = { kind = "forward", url = "http://127.0.0.1:9/hook", secret = "sign", timeout_ms = 500 }
"#,
        );
        let sources = from_file(&path).expect("valid");
        assert_eq!(sources.len(), 2);
        assert_eq!(sources[0].secrets.len(), 2);
        assert!(sources[0].accepts_hook(&HookId::parse(Some(b"456")).expect("id")));
        assert!(!sources[0].accepts_hook(&HookId::parse(Some(b"789")).expect("id")));
        assert!(matches!(
            sources[1].destinations[0].kind,
            DestinationKind::Forward(_)
        ));
        assert_eq!(sources[0].destinations[0].name.as_str(), "store");
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn destinations_parse_with_their_defaults() {
        let sources = from_toml(
            r#"
[[sources]]
name = "main"
secrets = ["s"]

[[sources.destinations]]
name = "ci"
kind = "forward"
url = "http://127.0.0.1:9/ci"
events = ["push", "pull_request.opened"]
repositories = ["acme/widgets", "acme/*"]
timeout_ms = 500
concurrency = 8
rate_limit = { per_second = 50, burst = 100 }
retry = ["5s", "1m"]
breaker = { failure_ratio = 0.25, probe_secs = 10 }
disable_after = "24h"

[[sources.destinations]]
name = "archive"
kind = "store"
ordering = "pull_request"

[[sources.destinations]]
name = "counter"
kind = "commit_counter"
breaker = true

[[sources.destinations]]
name = "quiet"
kind = "forward"
url = "https://example.com/hook"
breaker = false
fairness = false
"#,
        )
        .expect("valid");
        let d = &sources[0].destinations;
        assert_eq!(d.len(), 4);
        assert_eq!(d[0].name.as_str(), "ci");
        assert_eq!(d[0].concurrency.map(|c| c.get()), Some(8));
        assert_eq!(d[0].retry.as_ref().map(|r| r.max_attempts()), Some(3));
        let breaker = d[0].breaker.expect("on");
        assert_eq!(breaker.failure_ratio, 0.25);
        assert_eq!(breaker.min_requests, 10);
        assert_eq!(breaker.probe, Duration::from_secs(10));
        assert_eq!(d[0].disable_after, Duration::from_secs(24 * 3600));
        assert!(matches!(d[1].kind, DestinationKind::Store));
        assert!(d[1].breaker.is_none());
        assert_eq!(d[0].ordering, None);
        assert_eq!(d[1].ordering, Some(crate::config::Ordering::PullRequest));
        assert!(matches!(&d[2].kind, DestinationKind::Custom(k) if k == "commit_counter"));
        assert!(d[2].breaker.is_some());
        assert!(d[3].breaker.is_none());
        // Fairness is on unless turned off, and never for an ordered one.
        assert!(d[0].fairness && d[2].fairness);
        assert!(!d[1].fairness && !d[3].fairness);
    }

    #[test]
    fn every_bad_destination_field_is_named() {
        let head = "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\n[[sources.destinations]]\n";
        let cases = [
            (
                "name = \"Bad\"\nkind = \"store\"\n",
                "sources[0].destinations[0].name",
            ),
            (
                "name = \"x\"\nkind = \"forward\"\n",
                "sources[0].destinations[0].url",
            ),
            (
                "name = \"x\"\nkind = \"forward\"\nurl = \"ftp://h/\"\n",
                "sources[0].destinations[0].url",
            ),
            (
                "name = \"x\"\nkind = \"store\"\nurl = \"http://h/\"\n",
                "sources[0].destinations[0].url",
            ),
            (
                "name = \"x\"\nkind = \"Bad Kind\"\n",
                "sources[0].destinations[0].kind",
            ),
            (
                "name = \"x\"\nkind = \"store\"\nevents = [\"push.\"]\n",
                "sources[0].destinations[0].events",
            ),
            (
                "name = \"x\"\nkind = \"store\"\nrepositories = [\"acme\"]\n",
                "sources[0].destinations[0].repositories[0]",
            ),
            (
                "name = \"x\"\nkind = \"store\"\nconcurrency = 0\n",
                "sources[0].destinations[0].concurrency",
            ),
            (
                "name = \"x\"\nkind = \"store\"\nordering = \"event\"\n",
                "sources[0].destinations[0].ordering",
            ),
            (
                "name = \"x\"\nkind = \"store\"\nordering = \"repository\"\nfairness = true\n",
                "sources[0].destinations[0].fairness",
            ),
            (
                "name = \"x\"\nkind = \"store\"\nfairness = false\nper_key_concurrency = 2\n",
                "sources[0].destinations[0].per_key_concurrency",
            ),
            (
                "name = \"x\"\nkind = \"store\"\nfairness = true\nper_key_concurrency = 0\n",
                "sources[0].destinations[0].per_key_concurrency",
            ),
            (
                "name = \"x\"\nkind = \"store\"\nskip_stale = true\n",
                "sources[0].destinations[0].skip_stale",
            ),
            (
                "name = \"x\"\nkind = \"store\"\nordering = \"repository\"\nskip_stale = true\n",
                "sources[0].destinations[0].skip_stale",
            ),
            (
                "name = \"x\"\nkind = \"store\"\nretry = []\n",
                "sources[0].destinations[0].retry",
            ),
            (
                "name = \"x\"\nkind = \"store\"\nretry = [\"soon\"]\n",
                "sources[0].destinations[0].retry[0]",
            ),
            (
                "name = \"x\"\nkind = \"store\"\nretry = [\"0s\"]\n",
                "sources[0].destinations[0].retry[0]",
            ),
            (
                "name = \"x\"\nkind = \"store\"\nbreaker = { failure_ratio = 1.5 }\n",
                "sources[0].destinations[0].breaker.failure_ratio",
            ),
            (
                "name = \"x\"\nkind = \"store\"\nbreaker = { probe_secs = 0 }\n",
                "sources[0].destinations[0].breaker.probe_secs",
            ),
            (
                "name = \"x\"\nkind = \"store\"\ndisable_after = \"never\"\n",
                "sources[0].destinations[0].disable_after",
            ),
            (
                "name = \"x\"\nkind = \"store\"\nrate_limit = { per_second = 0 }\n",
                "sources[0].destinations[0].rate_limit.per_second",
            ),
            (
                "name = \"x\"\nkind = \"store\"\n[[sources.destinations]]\nname = \"x\"\nkind = \"store\"\n",
                "sources[0].destinations[1].name",
            ),
            (
                "name = \"x\"\nkind = \"store\"\n[[sources.destinations]]\nname = \"y\"\nkind = \"store\"\n",
                "sources[0].destinations[1].kind",
            ),
            ("name = \"x\"\nkind = \"store\"\ncolour = 1\n", "colour"),
        ];
        for (text, expected) in cases {
            let text = format!("{head}{text}");
            let err = from_toml(&text)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                err.contains(expected),
                "{text:?}: expected {expected:?} in {err:?}"
            );
        }
        let both = "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\nhandler = { kind = \"store\" }\n[[sources.destinations]]\nname = \"x\"\nkind = \"store\"\n";
        let err = from_toml(both)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("sources[0].handler"), "{err}");
    }

    #[test]
    fn every_bad_field_is_named() {
        let cases = [
            (
                "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\nhandler = { kind = \"shell\" }\n",
                "shell",
            ),
            (
                "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\nhandler = { kind = \"forward\", url = \"not a url\" }\n",
                "sources[0].handler.url",
            ),
            ("[[sources]]\nname = \"a\"\n", "sources[0].secrets"),
            (
                "[[sources]]\nname = \"a\"\nsecrets = [\"\"]\n",
                "sources[0].secrets[0]",
            ),
            (
                "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\n[[sources]]\nname = \"a\"\nsecrets = [\"t\"]\n",
                "sources[1].name",
            ),
            (
                "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\nhook_ids = [\"12x\"]\n",
                "sources[0].hook_ids[0]",
            ),
            (
                "[[sources]]\nname = \"Bad Name\"\nsecrets = [\"s\"]\n",
                "sources[0].name",
            ),
            (
                "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\nevents = [\"push.\"]\n",
                "sources[0].events",
            ),
            (
                "[[sources]]\nname = \"a\"\nsecrets = [\"s\"]\ncolour = 1\n",
                "colour",
            ),
            ("", "no [[sources]]"),
        ];
        for (text, expected) in cases {
            let path = write(text);
            let err = from_file(&path)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                err.contains(expected),
                "{text:?}: expected {expected:?} in {err:?}"
            );
            let _ = std::fs::remove_file(path);
        }
    }
}
