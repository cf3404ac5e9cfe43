//! How the operator commands print deliveries: a table, `key: value`
//! lines, or JSON.

use std::io::Write;
use std::time::Duration;

use hookinbox::deliveries::{Delivery, ErrorClass, State};

use crate::view::DeliveryView;

fn age(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    let Some(t) = t else { return "-".to_owned() };
    let secs = (chrono::Utc::now() - t).num_seconds().max(0) as u64;
    humantime::format_duration(Duration::from_secs(secs))
        .to_string()
        .split(' ')
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The one JSON of a delivery ([`DeliveryView`]).
pub(super) fn to_json(d: &Delivery) -> serde_json::Value {
    DeliveryView::json(d)
}

pub(super) fn print_table(out: &mut impl Write, rows: &[Delivery]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<38} {:<10} {:<12} {:<24} {:<10} {:>3} {:>3} {:<12} {:<9} ERROR",
        "DELIVERY_ID", "SOURCE", "HOOK_ID", "EVENT.ACTION", "STATUS", "ATT", "REP", "CLASS", "AGE"
    )?;
    for d in rows {
        let event = match &d.action {
            Some(a) => format!("{}.{a}", d.event),
            None => d.event.clone(),
        };
        let when = d.failed_at.or(d.completed_at).or(Some(d.created_at));
        writeln!(
            out,
            "{:<38} {:<10} {:<12} {:<24} {:<10} {:>3} {:>3} {:<12} {:<9} {}",
            d.key.delivery_id.as_str(),
            d.key.source.as_str(),
            d.key.hook_id.as_str(),
            event,
            State::of(d).as_str(),
            d.attempts,
            d.replays,
            d.last_error_class.map_or("-", ErrorClass::as_str),
            age(when),
            d.last_error.as_deref().unwrap_or(""),
        )?;
    }
    Ok(())
}

pub(super) fn print_rows(
    out: &mut impl Write,
    rows: &[Delivery],
    json: bool,
) -> std::io::Result<()> {
    if json {
        let list: Vec<_> = rows.iter().map(to_json).collect();
        writeln!(out, "{}", serde_json::Value::Array(list))
    } else {
        print_table(out, rows)
    }
}

/// One `key: value` line per field, a blank line between deliveries.
pub(super) fn print_fields(out: &mut impl Write, rows: &[Delivery]) -> std::io::Result<()> {
    for d in rows {
        for (k, v) in to_json(d).as_object().into_iter().flatten() {
            writeln!(
                out,
                "{k:>16}: {}",
                v.as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| v.to_string())
            )?;
        }
        writeln!(out)?;
    }
    Ok(())
}
