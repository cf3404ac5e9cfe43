//! Filters from a query string (`?status=dead&source=…`) or a JSON body
//! (`{"filter": {…}}`), checked field by field: a bad value is a 400 that
//! names its field. Empty values (an HTML form's blank fields) are unset.
//! Every value is bounded before it is used: a time between 1970 and
//! 9999, an age of at most ten years (the CLI's own rule, `age::parse_age`),
//! a limit from 1 to [`MAX_LIMIT`], texts by length, a cursor by
//! `Cursor::decode`'s checks. The checked values are kept, normalized, so
//! that a view can link to itself and a job can record what it was made
//! from.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDateTime, Utc};
use hookinbox::deliveries::{Cursor, ErrorClass, Filter, State};
use hookinbox::key::{DeliveryId, SourceName};

use super::error::AdminError;
use crate::age::{MAX_AGE_TEXT, parse_age};

/// The filter's fields, in the order a form shows them.
pub const FILTER_FIELDS: [&str; 11] = [
    "status",
    "source",
    "destination",
    "event",
    "action",
    "repository",
    "error_class",
    "since",
    "until",
    "delivery_id",
    "hook_id",
];

/// Rows per page unless asked: the default and the most.
pub const DEFAULT_LIMIT: i64 = 50;
/// The most rows a page may ask for.
pub const MAX_LIMIT: i64 = 500;

/// A checked filter, with the values it was made from.
#[derive(Clone, Debug, Default)]
pub struct Checked {
    /// The filter.
    pub filter: Filter,
    /// Where a page starts.
    pub cursor: Option<Cursor>,
    /// The filter's fields as given (normalized, unset ones left out).
    pub given: BTreeMap<String, String>,
}

impl Checked {
    /// The given fields as a query string (without limit and cursor).
    pub fn query(&self) -> String {
        form_urlencoded::Serializer::new(String::new())
            .extend_pairs(self.given.iter())
            .finish()
    }

    /// The given fields as JSON, for a job's record and the audit log.
    pub fn json(&self) -> serde_json::Value {
        serde_json::to_value(&self.given).unwrap_or_default()
    }
}

/// The earliest and the latest time a filter takes.
fn time_range() -> std::ops::RangeInclusive<DateTime<Utc>> {
    DateTime::UNIX_EPOCH
        ..=DateTime::from_timestamp(253_402_300_799, 0).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A time (RFC 3339, or an HTML datetime-local read as UTC) or an age
/// before now, within [`time_range`].
fn time(field: &str, value: &str) -> Result<DateTime<Utc>, AdminError> {
    let refused = || {
        AdminError::field(
            field,
            format!(
                "'{value}' is neither a time from 1970 to 9999 (RFC 3339, e.g. \
                 2026-01-31T12:00:00Z) nor an age of at most 3650d (e.g. 2h, 7d)"
            ),
        )
    };
    if value.len() > MAX_AGE_TEXT {
        return Err(AdminError::field(
            field,
            format!("a time or an age is at most {MAX_AGE_TEXT} characters"),
        ));
    }
    let parsed = DateTime::parse_from_rfc3339(value)
        .map(|t| t.with_timezone(&Utc))
        .ok()
        .or_else(|| {
            // An HTML datetime-local input: no zone, read as UTC.
            ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"]
                .iter()
                .find_map(|f| NaiveDateTime::parse_from_str(value, f).ok())
                .map(|t| t.and_utc())
        })
        .or_else(|| {
            let ago = chrono::Duration::from_std(parse_age(value).ok()?).ok()?;
            Utc::now().checked_sub_signed(ago)
        });
    parsed
        .filter(|t| time_range().contains(t))
        .ok_or_else(refused)
}

fn bounded(field: &str, value: &str, max: usize) -> Result<String, AdminError> {
    if value.len() > max || value.chars().any(char::is_control) {
        return Err(AdminError::field(
            field,
            format!("at most {max} printable characters"),
        ));
    }
    Ok(value.to_owned())
}

/// A delivery's source and id from a path, checked by ingest's own rules
/// before they reach a statement.
pub fn delivery_path(source: &str, delivery_id: &str) -> Result<(), AdminError> {
    if SourceName::parse(source).is_err() {
        return Err(AdminError::field(
            "source",
            "a source name: 1 to 64 characters of a-z, 0-9, '-' and '_'",
        ));
    }
    if DeliveryId::parse(delivery_id.as_bytes()).is_err() {
        return Err(AdminError::field(
            "delivery_id",
            "a delivery id: 1 to 128 visible ASCII characters",
        ));
    }
    Ok(())
}

/// A hook id: 1 to 20 digits, or empty for a delivery that had none.
pub fn hook_id(field: &str, value: &str) -> Result<String, AdminError> {
    if value.len() > 20 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AdminError::field(field, "1 to 20 digits"));
    }
    Ok(value.to_owned())
}

/// A destination's name, by the rules of its configuration (`a-z`, `0-9`,
/// `-`, `_`, 1 to 64 characters).
pub fn destination(field: &str, value: &str) -> Result<String, AdminError> {
    hookinbox::DestinationName::parse(value)
        .map(|d| d.as_str().to_owned())
        .map_err(|_| {
            AdminError::field(
                field,
                "a destination name: 1 to 64 characters of a-z, 0-9, '-' and '_'",
            )
        })
}

/// A whole number from 0 up (a job's or a session's id, a cursor).
pub fn id(field: &str, value: &str) -> Result<i64, AdminError> {
    value
        .parse::<i64>()
        .ok()
        .filter(|n| *n >= 0)
        .ok_or_else(|| AdminError::field(field, "a whole number from 0 up"))
}

/// Applies one field to `out`; `prefix` names fields of a JSON body
/// (`filter.`).
fn apply(out: &mut Checked, prefix: &str, name: &str, value: &str) -> Result<(), AdminError> {
    let field = format!("{prefix}{name}");
    let f = &mut out.filter;
    match name {
        "status" => {
            f.states = State::parse_filter(value).map_err(|_| {
                AdminError::field(
                    &field,
                    format!(
                        "'{value}' is not one of {}",
                        State::filter_words().join(", ")
                    ),
                )
            })?
        }
        "source" => f.source = Some(bounded(&field, value, 64)?),
        "destination" => f.destination = Some(bounded(&field, value, 64)?),
        "event" => f.event = Some(bounded(&field, value, 100)?),
        "action" => f.action = Some(bounded(&field, value, 64)?),
        "repository" => f.repository = Some(bounded(&field, value, 140)?),
        "error_class" => {
            f.error_class = Some(
                value
                    .parse::<ErrorClass>()
                    .map_err(|e| AdminError::field(&field, e.to_string()))?,
            )
        }
        "since" => f.created_since = Some(time(&field, value)?),
        "until" => f.created_until = Some(time(&field, value)?),
        "delivery_id" => {
            if value.len() > 128 || !value.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(AdminError::field(
                    field,
                    "a delivery id or its prefix: 1 to 128 visible ASCII characters",
                ));
            }
            f.id_prefix = Some(value.to_owned());
        }
        "hook_id" => f.hook_id = Some(hook_id(&field, value)?),
        "limit" => {
            let n: i64 = value
                .parse()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| {
                    AdminError::field(&field, format!("a whole number from 1 to {MAX_LIMIT}"))
                })?;
            f.limit = n;
            return Ok(());
        }
        "cursor" => {
            out.cursor =
                Some(Cursor::decode(value).map_err(|e| AdminError::field(&field, e.to_string()))?);
            return Ok(());
        }
        _ => {
            return Err(AdminError::field(
                field,
                format!(
                    "not a filter (filters: {}, limit, cursor)",
                    FILTER_FIELDS.join(", ")
                ),
            ));
        }
    }
    if out
        .given
        .insert(name.to_owned(), value.to_owned())
        .is_some()
    {
        return Err(AdminError::field(format!("{prefix}{name}"), "given twice"));
    }
    Ok(())
}

/// Checks a query string's filter, limit and cursor.
pub fn from_query(query: &str) -> Result<Checked, AdminError> {
    let mut out = Checked::default();
    out.filter.limit = DEFAULT_LIMIT;
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        if value.is_empty() {
            continue;
        }
        apply(&mut out, "", &name, &value)?;
    }
    Ok(out)
}

/// Checks the `filter` object of a JSON body (no limit or cursor there).
pub fn from_json(value: &serde_json::Value) -> Result<Checked, AdminError> {
    let object = value
        .as_object()
        .ok_or_else(|| AdminError::field("filter", "must be an object"))?;
    let mut out = Checked::default();
    for (name, v) in object {
        if name == "limit" || name == "cursor" {
            return Err(AdminError::field(
                format!("filter.{name}"),
                "not part of a selection",
            ));
        }
        let text = match v {
            serde_json::Value::Null => continue,
            serde_json::Value::String(s) if s.is_empty() => continue,
            serde_json::Value::String(s) => s.clone(),
            _ => {
                return Err(AdminError::field(
                    format!("filter.{name}"),
                    "must be a string",
                ));
            }
        };
        apply(&mut out, "filter.", name, &text)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(e: AdminError) -> String {
        match e {
            AdminError::BadField { field, .. } => field,
            other => panic!("{other}"),
        }
    }

    #[test]
    fn each_bad_value_names_its_field() {
        for (q, field) in [
            ("status=gone", "status"),
            ("error_class=oops", "error_class"),
            ("since=yesterday-ish", "since"),
            ("until=x", "until"),
            ("limit=0", "limit"),
            ("limit=501", "limit"),
            ("cursor=zz", "cursor"),
            ("delivery_id=a%20b", "delivery_id"),
            ("hook_id=12x", "hook_id"),
            ("since=1000000000d", "since"),
            ("until=3651d", "until"),
            ("since=-2h", "since"),
            ("since=+275760-09-13T00:00:00Z", "since"),
            ("since=1969-12-31T23:59:59Z", "since"),
            ("limit=99999999999999999999999", "limit"),
            ("limit=-1", "limit"),
            ("colour=red", "colour"),
            ("event=push&event=issues", "event"),
        ] {
            assert_eq!(field_of(from_query(q).expect_err(q)), field, "{q}");
        }
    }

    #[test]
    fn blank_fields_are_unset_and_the_rest_kept() {
        let c = from_query("status=dead&source=&event=push&since=2h&limit=10").expect("valid");
        assert_eq!(c.filter.states, [State::Dead]);
        assert_eq!(c.filter.source, None);
        assert_eq!(c.filter.event.as_deref(), Some("push"));
        assert!(c.filter.created_since.is_some());
        assert_eq!(c.filter.limit, 10);
        assert_eq!(c.query(), "event=push&since=2h&status=dead");
    }

    #[test]
    fn a_json_filter_names_fields_under_filter() {
        let e = from_json(&serde_json::json!({"status": 3})).expect_err("number");
        assert_eq!(field_of(e), "filter.status");
        let c = from_json(&serde_json::json!({"status": "dead", "source": null})).expect("ok");
        assert_eq!(c.filter.states, [State::Dead]);
    }
}
