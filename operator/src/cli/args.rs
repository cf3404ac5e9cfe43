//! The filters the operator commands take, and how each value is checked:
//! a bad value is a usage error (exit 2) that names its flag. Every value
//! is bounded here, before it reaches a statement or a timer: an age past
//! [`MAX_AGE`] would put `now() - age` outside the times Postgres (and
//! `chrono`) can hold, and a rate near 0 a pause no timer can wait.

use std::collections::BTreeMap;
use std::time::Duration;

use hookinbox::deliveries::{ErrorClass, Filter, Order, State};
use hookinbox::key::{DeliveryId, DestinationName, EventName, SourceName};

use super::OpsError;
use crate::actor::Identity;
pub use crate::age::{MAX_AGE, MAX_AGE_TEXT, parse_age};

/// The fewest and the most replays per second `--rate` takes: a slower
/// rate would pause longer than a timer can wait, a faster one means
/// "no limit", which leaving the flag out says.
pub const RATE_RANGE: std::ops::RangeInclusive<f64> = 0.001..=10_000.0;

/// `--rate`: replays per second, within [`RATE_RANGE`].
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let rate: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of replays per second"))?;
    if !RATE_RANGE.contains(&rate) {
        return Err(format!(
            "replays per second, from {} to {}",
            RATE_RANGE.start(),
            RATE_RANGE.end()
        ));
    }
    Ok(rate)
}

/// A delivery id (`deliveries show`, `dlq replay ID…`): what ingest takes
/// in `X-GitHub-Delivery`, 1 to 128 visible ASCII characters.
pub fn parse_delivery_id(s: &str) -> Result<String, String> {
    DeliveryId::parse(s.as_bytes())
        .map(|id| id.as_str().to_owned())
        .map_err(|_| "a delivery id is 1 to 128 visible ASCII characters".to_owned())
}

/// A hook id (`deliveries replay --hook-id`): what ingest takes in
/// `X-GitHub-Hook-ID`, 1 to 20 digits.
pub fn parse_hook_id(s: &str) -> Result<String, String> {
    hookinbox::key::HookId::parse(Some(s.as_bytes()))
        .map(|id| id.as_str().to_owned())
        .map_err(|_| "a hook id is 1 to 20 digits".to_owned())
}

/// `--status`: a state's word ([`State`]: processing, completed,
/// retrying, waiting, dead, awaiting_redelivery, filtered), or `failed`,
/// which means retrying, waiting or dead. The console's `status=` takes the same words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusFilter {
    /// The states it names.
    pub states: Vec<State>,
    /// The word, as given.
    pub word: String,
}

impl std::str::FromStr for StatusFilter {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let word = s.to_owned();
        State::parse_filter(s)
            .map(|states| Self { states, word })
            .map_err(|_| {
                format!(
                    "status is one of {} (failed: retrying, waiting or dead)",
                    State::filter_words().join(", ")
                )
            })
    }
}

/// The longest name `--as` takes.
const MAX_ACTOR: usize = 64;

/// `--as`: who acts, 1 to 64 visible characters (no spaces).
pub fn parse_actor(s: &str) -> Result<String, String> {
    if s.is_empty()
        || s.len() > MAX_ACTOR
        || !s
            .chars()
            .all(|c| c.is_alphanumeric() || c.is_ascii_punctuation())
    {
        return Err(format!(
            "a name is 1 to {MAX_ACTOR} letters, digits or punctuation (no spaces), e.g. alice"
        ));
    }
    Ok(s.to_owned())
}

/// Who acts: the audit log and each job's lineage name them, as the
/// console names its tokens.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ActorArgs {
    /// Who acts, for the audit log and the jobs' lineage (default: the OS
    /// user: $USER, else `whoami`).
    #[arg(long = "as", value_name = "NAME", value_parser = parse_actor)]
    pub actor: Option<String>,
}

impl ActorArgs {
    /// The operator acting: `--as`, else the OS user. A usage error when
    /// neither gives a name.
    pub fn identity(&self) -> Result<Identity, OpsError> {
        let os_user = || {
            std::env::var("USER")
                .ok()
                .filter(|u| !u.is_empty())
                .or_else(|| {
                    let out = std::process::Command::new("whoami").output().ok()?;
                    let name = String::from_utf8(out.stdout).ok()?;
                    Some(name.trim().to_owned()).filter(|n| !n.is_empty())
                })
        };
        let name = self.actor.clone().or_else(os_user).ok_or_else(|| {
            OpsError::Usage("no OS user to name in the audit log: pass --as NAME".to_owned())
        })?;
        let name = parse_actor(&name).map_err(|e| OpsError::Usage(format!("--as: {e}")))?;
        Ok(Identity::operator(name))
    }
}

/// The longest `--action` ingest stores (longer ones are cut there).
const MAX_ACTION: usize = 64;
/// The longest `--repository` ingest stores: GitHub's owner (39), `/`,
/// name (100).
const MAX_REPOSITORY: usize = 140;

/// `--source`: a source's name, as sources are named.
fn parse_source(s: &str) -> Result<String, String> {
    SourceName::parse(s)
        .map(|n| n.as_str().to_owned())
        .map_err(|e| e.to_string())
}

/// `--destination`: a destination's name, as destinations are named.
fn parse_destination(s: &str) -> Result<String, String> {
    DestinationName::parse(s)
        .map(|n| n.as_str().to_owned())
        .map_err(|e| e.to_string())
}

/// `--event`: an event's name, as `X-GitHub-Event` gives it.
fn parse_event(s: &str) -> Result<String, String> {
    EventName::parse(s.as_bytes())
        .map(|n| n.as_str().to_owned())
        .map_err(|_| "an event is 1 to 64 characters of a-z, 0-9 and '_', e.g. push".to_owned())
}

/// `--action`: one word, as in the payload's `action` (`opened`,
/// `ready_for_review`, a `repository_dispatch` event type).
pub fn parse_action(s: &str) -> Result<String, String> {
    if s.is_empty()
        || s.len() > MAX_ACTION
        || s.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "an action is the payload's `action`: 1 to {MAX_ACTION} characters, no spaces \
             (e.g. opened)"
        ));
    }
    Ok(s.to_owned())
}

/// `--repository`: `OWNER/NAME`, the payload's `repository.full_name`.
pub fn parse_repository(s: &str) -> Result<String, String> {
    let part = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    match s.split_once('/') {
        Some((owner, name)) if part(owner) && part(name) && s.len() <= MAX_REPOSITORY => {
            Ok(s.to_owned())
        }
        _ => Err(
            "a repository is OWNER/NAME as GitHub spells it (letters, digits, '-', '_', '.'), \
             e.g. octo-org/octo-repo"
                .to_owned(),
        ),
    }
}

/// What a delivery is: the filters every command that selects deliveries
/// takes (`list`, `dlq replay`, `dlq purge`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct MatchArgs {
    /// Only this source.
    #[arg(long, value_parser = parse_source)]
    pub source: Option<String>,
    /// Only legs to this destination (its name; with --source when two
    /// sources have one of that name), e.g. ci.
    #[arg(long, value_name = "NAME", value_parser = parse_destination)]
    pub destination: Option<String>,
    /// Only this event, e.g. push.
    #[arg(long, value_parser = parse_event)]
    pub event: Option<String>,
    /// Only this action (the payload's `action`), e.g. opened.
    #[arg(long, value_name = "ACTION", value_parser = parse_action)]
    pub action: Option<String>,
    /// Only this repository (the payload's `repository.full_name`, as
    /// GitHub spells it), e.g. octo-org/octo-repo.
    #[arg(long, value_name = "OWNER/NAME", value_parser = parse_repository)]
    pub repository: Option<String>,
    /// Only this error class, e.g. permanent, poison, max_attempts, lost.
    #[arg(long)]
    pub error_class: Option<ErrorClass>,
}

impl MatchArgs {
    /// `filter` narrowed to these.
    pub fn narrow(&self, filter: Filter) -> Filter {
        Filter {
            source: self.source.clone(),
            destination: self.destination.clone(),
            event: self.event.clone(),
            action: self.action.clone(),
            repository: self.repository.clone(),
            error_class: self.error_class,
            ..filter
        }
    }

    /// The given ones by the console's names, for a job's audit row.
    pub fn given(&self) -> BTreeMap<String, String> {
        let mut given = BTreeMap::new();
        let fields = [
            ("source", self.source.clone()),
            ("destination", self.destination.clone()),
            ("event", self.event.clone()),
            ("action", self.action.clone()),
            ("repository", self.repository.clone()),
            (
                "error_class",
                self.error_class.map(|c| c.as_str().to_owned()),
            ),
        ];
        for (name, value) in fields {
            if let Some(value) = value {
                given.insert(name.to_owned(), value);
            }
        }
        given
    }

    /// Whether any is given.
    pub fn is_set(&self) -> bool {
        self.source.is_some()
            || self.destination.is_some()
            || self.event.is_some()
            || self.action.is_some()
            || self.repository.is_some()
            || self.error_class.is_some()
    }
}

/// Filters shared by the listing commands and `dlq replay`.
#[derive(clap::Args, Clone, Debug)]
pub struct FilterArgs {
    /// Only this state: processing, completed, retrying, waiting (held,
    /// deferred, ordered or fair: no attempt spent), dead,
    /// awaiting_redelivery (claims with no body and no job, which only a
    /// redelivery from GitHub can finish), filtered; or failed (retrying,
    /// waiting or dead).
    #[arg(long)]
    pub status: Option<StatusFilter>,
    /// What the deliveries are.
    #[command(flatten)]
    pub matching: MatchArgs,
    /// Only deliveries active within this long, e.g. 2h or 7d (at most
    /// 3650d).
    #[arg(long, value_parser = parse_age)]
    pub since: Option<Duration>,
    /// At most this many rows, newest first (0: no limit).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(0..))]
    pub limit: i64,
}

impl FilterArgs {
    /// The filter: dead letters only with `dead`; only `ids` when named.
    /// With `dead`, a `--status` other than dead matches nothing.
    pub fn filter(&self, dead: bool, ids: Option<Vec<String>>) -> Filter {
        let mut states = self.status.clone().map(|s| s.states).unwrap_or_default();
        let mut ids = ids;
        if dead {
            if !states.is_empty() && !states.contains(&State::Dead) {
                // A dead letter in another state: no row is in two states,
                // so no id matches.
                ids = Some(Vec::new());
            }
            states = vec![State::Dead];
        }
        self.matching.narrow(Filter {
            states,
            active_within: self.since,
            ids,
            limit: if self.limit == 0 {
                i64::MAX
            } else {
                self.limit
            },
            order: Order::RecentlyActive,
            ..Filter::default()
        })
    }

    /// Whether any filter is given.
    pub fn is_set(&self) -> bool {
        self.status.is_some() || self.matching.is_set() || self.since.is_some()
    }

    /// The given filters by the console's names, for a job's audit row:
    /// the state (`dead` with `dead`, as [`FilterArgs::filter`] makes it),
    /// `active_within` for `--since`, and the limit unless `all`.
    pub fn given(&self, dead: bool, all: bool) -> BTreeMap<String, String> {
        let mut given = self.matching.given();
        let word = self.status.as_ref().map(|s| s.word.clone());
        let status = match (word, dead) {
            (Some(word), false) => Some(word),
            (Some(word), true) if word != "dead" && word != "failed" => Some(word),
            (_, true) => Some("dead".to_owned()),
            (None, false) => None,
        };
        if let Some(status) = status {
            given.insert("status".to_owned(), status);
        }
        if let Some(since) = self.since {
            given.insert(
                "active_within".to_owned(),
                humantime::format_duration(since).to_string(),
            );
        }
        if !all && self.limit != 0 {
            given.insert("limit".to_owned(), self.limit.to_string());
        }
        given
    }
}

/// What the `list` commands take: the filters, and the output form.
#[derive(clap::Args, Clone, Debug)]
pub struct ListArgs {
    /// Filters.
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repository_is_owner_slash_name() {
        for good in ["octo-org/octo-repo", "a/b", "me_emu/x.y_z-1"] {
            assert_eq!(parse_repository(good).as_deref(), Ok(good));
        }
        for bad in [
            "", "octo", "/repo", "owner/", "a/b/c", "a b/c", "a/b c", "ö/x", "a//b",
        ] {
            assert!(parse_repository(bad).is_err(), "{bad:?}");
        }
        assert!(parse_repository(&format!("o/{}", "n".repeat(MAX_REPOSITORY))).is_err());
    }

    #[test]
    fn ages_and_rates_are_bounded() {
        assert_eq!(parse_age("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_age("3650d"), Ok(MAX_AGE));
        for bad in [
            "3651d",
            "1000000000d",
            "99999999999999999999999s",
            "-1d",
            "",
            "日本",
            &"9".repeat(MAX_AGE_TEXT + 1),
        ] {
            assert!(parse_age(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_rate("20"), Ok(20.0));
        for bad in ["0", "-1", "1e-300", "1e309", "NaN", "inf", "x", "10001"] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
        assert!(parse_delivery_id("72d3162e-cc78-11e3").is_ok());
        for bad in ["", "a b", "é", &"x".repeat(129)] {
            assert!(parse_delivery_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_action_is_one_word() {
        for good in ["opened", "ready_for_review", "deploy-prod"] {
            assert_eq!(parse_action(good).as_deref(), Ok(good));
        }
        for bad in ["", " ", "two words", "tab\there", "x\n"] {
            assert!(parse_action(bad).is_err(), "{bad:?}");
        }
        assert!(parse_action(&"a".repeat(MAX_ACTION + 1)).is_err());
    }
}
