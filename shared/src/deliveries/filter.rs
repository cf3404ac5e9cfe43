//! The one filter of the operator CLI and the admin console, and the
//! statements it builds: a list (newest first, keyset-paginated), a count,
//! and the purge of the dead letters it matches.
//!
//! A statement holds only the predicates that are set, so each shape of
//! filter gets a plan of its own that uses the index led by its most
//! selective column (hookinbox's sessions plan generically: a
//! `$1 is null or …` predicate would leave the planner nothing to choose).
//! The console's indexes are partial on `status <> 'processing'`
//! (`0005_admin.sql` says why), so a filter that does not name a state is
//! two branches, processing and settled, each ordered by its own index and
//! merged: a union for a list, a sum for a count.

use std::time::Duration;

use crate::postgres::sql::{self, Session};
use chrono::{DateTime, Utc};
use tokio_postgres::types::ToSql;

use super::delivery::{Delivery, delivery};
use super::state::State;
use super::{ErrorClass, Status, secs};
use crate::key::{DeliveryId, DestinationName, HookId, SourceName};
use crate::postgres::DbError;

/// Which deliveries an operator asks for. Every field left unset matches
/// everything.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only rows in one of these states (none: any state). Each state's
    /// rule is [`State::predicate`].
    pub states: Vec<State>,
    /// Only this source.
    pub source: Option<String>,
    /// Only legs to this destination.
    pub destination: Option<String>,
    /// Only this event.
    pub event: Option<String>,
    /// Only this action.
    pub action: Option<String>,
    /// Only this repository (`owner/name`), in any case, as GitHub's
    /// names are.
    pub repository: Option<String>,
    /// Only this error class.
    pub error_class: Option<ErrorClass>,
    /// Only rows created at or after this time.
    pub created_since: Option<DateTime<Utc>>,
    /// Only rows created before this time.
    pub created_until: Option<DateTime<Utc>>,
    /// Only rows active (created, failed or completed) within this long
    /// (the CLI's `--since`).
    pub active_within: Option<Duration>,
    /// Only these delivery ids.
    pub ids: Option<Vec<String>>,
    /// Only delivery ids that start with this.
    pub id_prefix: Option<String>,
    /// Only this hook id.
    pub hook_id: Option<String>,
    /// Only rows that failed more than this long ago.
    pub failed_before: Option<Duration>,
    /// At most this many rows.
    pub limit: i64,
    /// The order of a list.
    pub order: Order,
}

/// The order of a list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Order {
    /// Newest first (`created_at`, then the key): stable, so pages can be
    /// followed with a [`Cursor`], and served by the indexes.
    #[default]
    Newest,
    /// Most recently active first (created, failed or completed): the
    /// CLI's order. Not paginated.
    RecentlyActive,
}

/// Where a page ended: the last row's `created_at` and key. The next page
/// starts strictly after it, so rows arriving meanwhile never shift a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// The last row's `created_at`.
    pub created_at: DateTime<Utc>,
    /// The last row's key, as stored.
    pub key: [String; 5],
}

/// The longest cursor text: a time and a key of the longest parts,
/// hex-encoded, with room to spare.
const MAX_CURSOR_LEN: usize = 1024;

/// The latest time a cursor may hold: 9999-12-31T23:59:59Z, in
/// microseconds (rows are stamped by `now()`; Postgres stores far less
/// than an `i64` of microseconds can say).
const MAX_CURSOR_MICROS: i64 = 253_402_300_799_000_000;

/// A cursor that is not one this code wrote.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a cursor this API gave out")]
pub struct CursorError;

impl Cursor {
    /// The cursor of `d`: the next page starts after it.
    pub fn after(d: &Delivery) -> Self {
        Self {
            created_at: d.created_at,
            key: [
                d.key.provider.clone(),
                d.key.source.as_str().to_owned(),
                d.key.hook_id.as_str().to_owned(),
                d.key.delivery_id.as_str().to_owned(),
                d.key.destination.as_str().to_owned(),
            ],
        }
    }

    /// An opaque text for URLs: hex of a JSON array.
    pub fn encode(&self) -> String {
        let [p, s, h, d, n] = &self.key;
        let value = serde_json::json!([self.created_at.timestamp_micros(), p, s, h, d, n]);
        hex::encode(value.to_string())
    }

    /// Reads what [`Cursor::encode`] wrote, and refuses anything a row
    /// could not have written: a cursor comes from the caller, and its
    /// values are bound into the list statement, so each is checked here
    /// against the rules its column's values were built by (a time
    /// Postgres can store, the key's parts as `key` validates them).
    /// Nothing unchecked reaches SQL, and no Postgres error can be provoked
    /// through it.
    pub fn decode(text: &str) -> Result<Self, CursorError> {
        if text.len() > MAX_CURSOR_LEN {
            return Err(CursorError);
        }
        let bytes = hex::decode(text).map_err(|_| CursorError)?;
        let (micros, provider, source, hook_id, delivery_id, destination): (
            i64,
            String,
            String,
            String,
            String,
            String,
        ) = serde_json::from_slice(&bytes).map_err(|_| CursorError)?;
        if !(0..=MAX_CURSOR_MICROS).contains(&micros) {
            return Err(CursorError);
        }
        let created_at = DateTime::from_timestamp_micros(micros).ok_or(CursorError)?;
        let provider_ok = !provider.is_empty()
            && provider.len() <= 32
            && provider
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        let hook_ok = hook_id.is_empty() || HookId::parse(Some(hook_id.as_bytes())).is_ok();
        if !provider_ok
            || !hook_ok
            || SourceName::parse(&source).is_err()
            || DeliveryId::parse(delivery_id.as_bytes()).is_err()
            || DestinationName::stored(&destination).is_err()
        {
            return Err(CursorError);
        }
        Ok(Self {
            created_at,
            key: [provider, source, hook_id, delivery_id, destination],
        })
    }
}

/// One page of a list.
#[derive(Clone, Debug)]
pub struct Page {
    /// The rows, newest first.
    pub items: Vec<Delivery>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<Cursor>,
}

type Boxed = Box<dyn ToSql + Sync + Send>;

/// A parameter's value as an SQL literal, so that a test can `EXPLAIN
/// EXECUTE` the statement with the plan the console gets (PostgreSQL 15
/// has no `EXPLAIN (GENERIC_PLAN)`).
trait Literal {
    fn literal(&self) -> String;
}

fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

impl Literal for String {
    fn literal(&self) -> String {
        quoted(self)
    }
}

impl Literal for DateTime<Utc> {
    fn literal(&self) -> String {
        format!("{}::timestamptz", quoted(&self.to_rfc3339()))
    }
}

impl Literal for Vec<String> {
    fn literal(&self) -> String {
        let items: Vec<String> = self.iter().map(|s| quoted(s)).collect();
        format!("array[{}]::text[]", items.join(", "))
    }
}

impl Literal for f64 {
    fn literal(&self) -> String {
        format!("{self}::float8")
    }
}

impl Literal for i64 {
    fn literal(&self) -> String {
        format!("{self}::int8")
    }
}

/// A statement's text and its parameters, numbered as they are bound.
#[derive(Default)]
struct Statement {
    params: Vec<Boxed>,
    literals: Vec<String>,
}

impl Statement {
    /// Binds `value` and returns its placeholder.
    fn bind(&mut self, value: impl ToSql + Literal + Sync + Send + 'static) -> String {
        self.literals.push(value.literal());
        self.params.push(Box::new(value));
        format!("${}", self.params.len())
    }

    fn refs(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params
            .iter()
            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }
}

/// The first id after every id that starts with `prefix`, byte-wise (the
/// order of `text_pattern_ops`); `None` when it has no such bound.
fn prefix_end(prefix: &str) -> Option<String> {
    let last = prefix.chars().last()?;
    if !last.is_ascii() || last == '\u{7f}' {
        return None;
    }
    let mut end = prefix[..prefix.len() - 1].to_owned();
    end.push(char::from(last as u8 + 1));
    Some(end)
}

/// The predicates of `f` that are set, joined by `and` (`true` if none).
/// Statuses and classes are written as literals: they come from enums, and
/// a literal lets the planner prove a partial index's predicate.
fn predicates(f: &Filter, st: &mut Statement) -> String {
    let mut p: Vec<String> = Vec::new();
    if !f.states.is_empty() {
        let states: Vec<&str> = f.states.iter().map(|s| s.predicate()).collect();
        p.push(format!("({})", states.join(" or ")));
    }
    if let Some(v) = &f.source {
        p.push(format!("source = {}", st.bind(v.clone())));
    }
    if let Some(v) = &f.destination {
        p.push(format!("destination = {}", st.bind(v.clone())));
    }
    if let Some(v) = &f.event {
        p.push(format!("event = {}", st.bind(v.clone())));
    }
    if let Some(v) = &f.action {
        p.push(format!("action = {}", st.bind(v.clone())));
    }
    if let Some(v) = &f.repository {
        // GitHub's repository names ignore case; the index is on
        // `lower(repository)` (0010_repository_nocase.sql).
        p.push(format!("lower(repository) = lower({})", st.bind(v.clone())));
    }
    if let Some(class) = f.error_class {
        p.push(format!("last_error_class = '{}'", class.as_str()));
    }
    if let Some(t) = f.created_since {
        p.push(format!("created_at >= {}", st.bind(t)));
    }
    if let Some(t) = f.created_until {
        p.push(format!("created_at < {}", st.bind(t)));
    }
    if let Some(d) = f.active_within {
        p.push(format!(
            "greatest(created_at, failed_at, completed_at) >= now() - make_interval(secs => {})",
            st.bind(secs(d))
        ));
    }
    if let Some(ids) = &f.ids {
        p.push(format!("delivery_id = any({})", st.bind(ids.clone())));
    }
    if let Some(prefix) = &f.id_prefix {
        let from = st.bind(prefix.clone());
        match prefix_end(prefix) {
            Some(end) => p.push(format!(
                "delivery_id ~>=~ {from} and delivery_id ~<~ {}",
                st.bind(end)
            )),
            None => p.push(format!("starts_with(delivery_id, {from})")),
        }
    }
    if let Some(v) = &f.hook_id {
        p.push(format!("hook_id = {}", st.bind(v.clone())));
    }
    if let Some(d) = f.failed_before {
        p.push(format!(
            "failed_at < now() - make_interval(secs => {})",
            st.bind(secs(d))
        ));
    }
    if p.is_empty() {
        "true".to_owned()
    } else {
        p.join(" and ")
    }
}

const PROCESSING: &str = "status = 'processing'";
const SETTLED: &str = "status <> 'processing'";

/// The branches a filter needs: processing rows (through
/// `deliveries_status_created`), settled rows (through the console's
/// partial indexes), or both.
fn branches(f: &Filter) -> &'static [&'static str] {
    let statuses = f.states.iter().flat_map(|s| s.statuses());
    let (mut processing, mut settled) = (false, false);
    for status in statuses {
        if *status == Status::Processing {
            processing = true;
        } else {
            settled = true;
        }
    }
    match (processing, settled) {
        _ if f.failed_before.is_some() => &[SETTLED],
        (true, false) => &[PROCESSING],
        (false, true) => &[SETTLED],
        _ => &[PROCESSING, SETTLED],
    }
}

const NEWEST: &str =
    "created_at desc, provider desc, source desc, hook_id desc, delivery_id desc, destination desc";
const RECENTLY_ACTIVE: &str = "greatest(created_at, failed_at, completed_at) desc";

/// The list statement: each branch ordered and limited on its own (so
/// each reads only its index's first rows), then merged.
fn list_statement(f: &Filter, after: Option<&Cursor>, limit: i64) -> (String, Statement) {
    let mut st = Statement::default();
    let mut pred = predicates(f, &mut st);
    if let Some(c) = after {
        let at = st.bind(c.created_at);
        let [p, s, h, d, n] = c.key.clone();
        let (p, s, h, d, n) = (st.bind(p), st.bind(s), st.bind(h), st.bind(d), st.bind(n));
        // The first comparison bounds the index range; the row comparison
        // breaks ties on the key.
        pred.push_str(&format!(
            " and created_at <= {at} and \
             (created_at, provider, source, hook_id, delivery_id, destination) \
             < ({at}, {p}, {s}, {h}, {d}, {n})"
        ));
    }
    let order = match f.order {
        Order::Newest => NEWEST,
        Order::RecentlyActive => RECENTLY_ACTIVE,
    };
    let limit = st.bind(limit);
    let columns = delivery_columns!();
    let parts: Vec<String> = branches(f)
        .iter()
        .map(|branch| {
            format!(
                "(select {columns} from deliveries where {branch} and {pred} \
                 order by {order} limit {limit})"
            )
        })
        .collect();
    let sql = if parts.len() == 1 {
        parts.concat()
    } else {
        format!(
            "select * from ({}) d order by {order} limit {limit}",
            parts.join(" union all ")
        )
    };
    (sql, st)
}

async fn run_list(
    client: &impl Session,
    f: &Filter,
    after: Option<&Cursor>,
    limit: i64,
) -> Result<Vec<Delivery>, DbError> {
    let (text, st) = list_statement(f, after, limit);
    let rows = sql::query(client, &text, &st.refs()).await?;
    rows.iter().map(delivery).collect()
}

/// Lists deliveries matching `filter`, at most `filter.limit`, in
/// `filter.order`.
pub async fn list(client: &impl Session, filter: &Filter) -> Result<Vec<Delivery>, DbError> {
    run_list(client, filter, None, filter.limit).await
}

/// One page of deliveries matching `filter`, newest first: `filter.limit`
/// rows after `after` (from the start without one), and the cursor of the
/// next page. Reads one row more than it returns, to know whether a next
/// page exists.
pub async fn list_page(
    client: &impl Session,
    filter: &Filter,
    after: Option<&Cursor>,
) -> Result<Page, DbError> {
    let newest = Filter {
        order: Order::Newest,
        ..filter.clone()
    };
    let want = filter.limit.max(1);
    let mut items = run_list(client, &newest, after, want.saturating_add(1)).await?;
    let next = if items.len() as i64 > want {
        items.truncate(want as usize);
        items.last().map(Cursor::after)
    } else {
        None
    };
    Ok(Page { items, next })
}

/// The count statement: the branches' counts, summed.
fn count_statement(f: &Filter) -> (String, Statement) {
    let mut st = Statement::default();
    let pred = predicates(f, &mut st);
    let parts: Vec<String> = branches(f)
        .iter()
        .map(|branch| format!("(select count(*) from deliveries where {branch} and {pred})"))
        .collect();
    (format!("select {}", parts.join(" + ")), st)
}

/// How many deliveries match `filter` (its limit and order aside).
pub async fn count(client: &impl Session, filter: &Filter) -> Result<i64, DbError> {
    let (text, st) = count_statement(filter);
    Ok(sql::query_one(client, &text, &st.refs()).await?.get(0))
}

/// Deletes the dead letters matching `filter` (its limit and order aside),
/// in one statement; returns how many (their bodies go with retention). Only dead
/// letters are deleted, whatever the filter says of the state; the CLI's
/// `dlq purge` counts with the same filter for its dry run.
pub async fn purge_dead(client: &impl Session, filter: &Filter) -> Result<u64, DbError> {
    let dead = Filter {
        states: vec![State::Dead],
        ..filter.clone()
    };
    let mut st = Statement::default();
    let pred = predicates(&dead, &mut st);
    let text = format!("delete from deliveries where {SETTLED} and {pred}");
    sql::execute(client, &text, &st.refs()).await
}

/// The statements a filter runs, for `EXPLAIN` in tests: the list's first
/// page, the list's next page, and the count, each with its parameters as
/// SQL literals (for `PREPARE` and `EXPLAIN EXECUTE`).
#[doc(hidden)]
pub fn statements_for_explain(f: &Filter) -> Vec<(String, Vec<String>)> {
    let (list, l) = list_statement(f, None, 51);
    let cursor = Cursor {
        created_at: Utc::now(),
        key: [
            "github".into(),
            "default".into(),
            "1".into(),
            "x".into(),
            "store".into(),
        ],
    };
    let (next, n) = list_statement(f, Some(&cursor), 51);
    let (count, c) = count_statement(f);
    vec![(list, l.literals), (next, n.literals), (count, c.literals)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_anything_else() {
        let c = Cursor {
            created_at: DateTime::from_timestamp_micros(1_700_000_000_123_456).expect("time"),
            key: [
                "github".into(),
                "default".into(),
                "".into(),
                "abc".into(),
                "ci".into(),
            ],
        };
        assert_eq!(Cursor::decode(&c.encode()), Ok(c));
        assert_eq!(Cursor::decode("zz"), Err(CursorError));
        assert_eq!(Cursor::decode(&hex::encode("[1,2]")), Err(CursorError));
    }

    #[test]
    fn a_cursor_with_a_value_no_row_holds_is_refused() {
        let forged = |v: serde_json::Value| Cursor::decode(&hex::encode(v.to_string()));
        for v in [
            // Times Postgres cannot store, or no row was stamped with.
            serde_json::json!([i64::MIN, "github", "default", "1", "x", "ci"]),
            serde_json::json!([-1, "github", "default", "1", "x", "ci"]),
            serde_json::json!([i64::MAX, "github", "default", "1", "x", "ci"]),
            // Key parts outside their rules: a NUL, unicode, too long.
            serde_json::json!([1, "github", "default", "1", "a\u{0}b", "ci"]),
            serde_json::json!([1, "github", "déf", "1", "x", "ci"]),
            serde_json::json!([1, "github", "default", "12a", "x", "ci"]),
            serde_json::json!([1, "github", "default", "1", "x".repeat(129), "ci"]),
            serde_json::json!([1, "", "default", "1", "x", "ci"]),
            serde_json::json!([1, "github", "default", "1", "x", "Bad Name"]),
            // A cursor of the four-part shape from before destinations.
            serde_json::json!([1, "github", "default", "1", "x"]),
        ] {
            assert_eq!(forged(v.clone()), Err(CursorError), "{v}");
        }
        assert_eq!(
            Cursor::decode(&"0".repeat(MAX_CURSOR_LEN + 2)),
            Err(CursorError)
        );
        let fine = forged(serde_json::json!([1, "github", "default", "", "x", ""]));
        assert!(fine.is_ok(), "an empty hook id is a real one");
    }

    #[test]
    fn a_prefix_ends_at_its_last_byte_plus_one() {
        assert_eq!(prefix_end("abc").as_deref(), Some("abd"));
        assert_eq!(prefix_end("a~").as_deref(), Some("a\u{7f}"));
        assert_eq!(prefix_end(""), None);
    }

    #[test]
    fn a_filter_without_a_state_reads_both_branches() {
        let (sql, _) = count_statement(&Filter::default());
        assert!(sql.contains(PROCESSING) && sql.contains(SETTLED), "{sql}");
        let dead = Filter {
            states: vec![State::Dead],
            ..Filter::default()
        };
        let (sql, _) = count_statement(&dead);
        assert!(!sql.contains(PROCESSING), "{sql}");
    }
}
