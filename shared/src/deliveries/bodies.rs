//! The record: one body per delivery, written by the claim in its own
//! statement (docs/architecture.md, "The record: bodies in Postgres").
//!
//! A body is stored as ingest received it (LZ4-compressed by ingest, so
//! that Postgres spends nothing on it), with its `Content-Type` and the
//! headers a destination or an operator needs. Each read addresses it by
//! the delivery's key and `received_at`, its legs' `created_at`, so that
//! it reads one day's partition. This file holds the body's two forms (as
//! written, [`Encoded`]; as read, [`Stored`]), the batched read of the
//! one-statement path ([`fetch_batch`]), the operators' read ([`read`]),
//! and retention ([`retire`]): a day's partition past its retention is
//! dropped whole, once the bodies of deliveries with a leg not yet ended
//! have moved to the DEFAULT partition, where they stay until those legs
//! end.

use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use deadpool_postgres::Client;

use super::partitions::{self, DayPartitioned};
use super::row::KeyColumns;
use crate::job::{Body, BodyCopy};
use crate::key::{DeliveryKey, LegKey};
use crate::postgres::DbError;
use crate::postgres::sql::{self, Session};

/// The bodies, by the day of their delivery's first claim.
/// Each day's partition keeps a body of up to about 8 KB (compressed) in
/// its row rather than in the TOAST table (migration 23).
pub const BODIES: DayPartitioned = DayPartitioned {
    table: "bodies",
    column: "received_at",
    options: Some("toast_tuple_target = 8160"),
};

/// How the stored bytes are encoded.
const LZ4: &str = "lz4";
/// The bytes as received (bodies moved from `parked_bodies`).
const IDENTITY: &str = "identity";

/// A body as the claim writes it: compressed, its headers as stored.
#[derive(Clone, Debug)]
pub struct Encoded {
    /// The original `Content-Type`.
    pub content_type: String,
    /// The carried headers, as stored: a JSON array of `[name, value]`.
    pub headers: serde_json::Value,
    /// The body's length as received.
    pub size: i32,
    /// `lz4` or `identity`.
    pub encoding: &'static str,
    /// The stored bytes.
    pub bytes: Bytes,
}

impl Encoded {
    /// Compresses `body` for the claim (LZ4 block; its length is `size`).
    /// A body over `i32::MAX` bytes cannot be one ingest accepted; it is
    /// kept as it is rather than refused here.
    pub fn of(body: &Body) -> Self {
        let size = i32::try_from(body.bytes.len()).unwrap_or(i32::MAX);
        let (encoding, bytes) = if usize::try_from(size).is_ok_and(|s| s == body.bytes.len()) {
            (LZ4, lz4_flex::block::compress(&body.bytes))
        } else {
            (IDENTITY, body.bytes.to_vec())
        };
        Self {
            content_type: body.content_type.clone(),
            headers: headers_json(&body.github_headers),
            size,
            encoding,
            bytes: Bytes::from(bytes),
        }
    }

    /// The copy of this body a new `store` leg's first message carries
    /// ([`BodyCopy`]): the same packed bytes, shared, not copied.
    pub fn copy(&self) -> BodyCopy {
        BodyCopy {
            content_type: self.content_type.clone(),
            headers: self.headers.to_string(),
            size: self.size,
            encoding: self.encoding.to_owned(),
            bytes: self.bytes.clone(),
        }
    }
}

/// A body as a statement read it back, not yet decompressed: the worker
/// decodes it ([`Stored::decode`]), and a body it cannot decode fails its
/// leg rather than the statement that read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// The original `Content-Type`.
    pub content_type: String,
    /// The carried headers, as stored.
    pub headers: serde_json::Value,
    /// The body's length as received.
    pub size: i32,
    /// `lz4` or `identity`.
    pub encoding: String,
    /// The stored bytes.
    pub bytes: Vec<u8>,
}

/// A stored body that does not decode (a row edited by hand, or written
/// by a newer version).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the stored body cannot be read: {0}")]
pub struct Undecodable(String);

impl Stored {
    /// The body as it was received.
    pub fn decode(self) -> Result<Body, Undecodable> {
        let bytes = match self.encoding.as_str() {
            LZ4 => {
                let size = usize::try_from(self.size)
                    .map_err(|_| Undecodable(format!("a size of {}", self.size)))?;
                lz4_flex::block::decompress(&self.bytes, size)
                    .map_err(|e| Undecodable(e.to_string()))?
            }
            IDENTITY => self.bytes,
            other => return Err(Undecodable(format!("an encoding '{other}'"))),
        };
        if bytes.len() != usize::try_from(self.size).unwrap_or(usize::MAX) {
            return Err(Undecodable(format!(
                "{} bytes where {} were stored",
                bytes.len(),
                self.size
            )));
        }
        Ok(Body {
            content_type: self.content_type,
            github_headers: headers_from_json(&self.headers),
            bytes: Bytes::from(bytes),
        })
    }

    /// The body a message's copy holds, as if read from Postgres; `None`
    /// when its headers are not JSON (the worker reads the body instead).
    pub fn from_copy(copy: BodyCopy) -> Option<Self> {
        Some(Self {
            content_type: copy.content_type,
            headers: serde_json::from_str(&copy.headers).ok()?,
            size: copy.size,
            encoding: copy.encoding,
            bytes: copy.bytes.into(),
        })
    }

    /// The five columns `content_type, headers, size, encoding, body`
    /// of `row`, from the column named `content_type` on; `None` when the
    /// delivery has no body (a left join found none).
    pub(super) fn from_row(row: &tokio_postgres::Row) -> Option<Self> {
        let content_type: Option<String> = row.get("content_type");
        Some(Self {
            content_type: content_type?,
            headers: row.get("headers"),
            size: row.get("size"),
            encoding: row.get("encoding"),
            bytes: row.get("body"),
        })
    }
}

/// The headers as stored: a JSON array of `[name, value]` pairs.
pub fn headers_json(headers: &[(String, String)]) -> serde_json::Value {
    serde_json::Value::Array(
        headers
            .iter()
            .map(|(k, v)| serde_json::json!([k, v]))
            .collect(),
    )
}

/// Reads stored headers back; a pair that is not two strings is dropped.
pub fn headers_from_json(value: &serde_json::Value) -> Vec<(String, String)> {
    value
        .as_array()
        .map(|pairs| {
            pairs
                .iter()
                .filter_map(|p| {
                    Some((
                        p.get(0)?.as_str()?.to_owned(),
                        p.get(1)?.as_str()?.to_owned(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The body of each leg of `$1`–`$5` (by its position, `ix`) with the
/// leg's replays so far, through the leg's row: `received_at` is its
/// `created_at`, so each lookup reads one partition.
const FETCH: &str = "
select i.ix, d.replays, b.content_type, b.headers, b.size, b.encoding, b.body
from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
         with ordinality as i(provider, source, hook_id, delivery_id, destination, ix)
join deliveries d using (provider, source, hook_id, delivery_id, destination)
join bodies b
  on b.provider = d.provider and b.source = d.source and b.hook_id = d.hook_id
 and b.delivery_id = d.delivery_id and b.received_at = d.created_at";

/// What [`fetch_batch`] found of one leg: its delivery's body, and the
/// leg's replays so far.
pub type Fetched = (Stored, i32);

/// The bodies of many legs' deliveries, in one statement: for the
/// one-statement path, whose handler needs the body before the completion
/// that takes it. `None` where the leg or its body is not there (the full
/// path then takes it and finds out which).
pub async fn fetch_batch(
    client: &impl Session,
    legs: &[LegKey],
) -> Result<Vec<Option<Fetched>>, DbError> {
    let keys = KeyColumns::of(legs.iter());
    let rows = sql::query_planned(client, FETCH, &keys.params(&[])).await?;
    let mut found: Vec<Option<Fetched>> = vec![None; legs.len()];
    for row in &rows {
        let ix: i64 = row.get(0);
        let replays: i32 = row.get(1);
        if let (Some(slot), Some(stored)) = (
            usize::try_from(ix - 1).ok().and_then(|i| found.get_mut(i)),
            Stored::from_row(row),
        ) {
            *slot = Some((stored, replays));
        }
    }
    Ok(found)
}

/// Writes the body a message from before bodies lived in Postgres carries
/// (`$6`–`$10`: content type, headers, size, encoding, bytes) for the leg
/// `$1`–`$5`'s delivery, unless Postgres holds one: `received_at` is the
/// leg's `created_at`, as a claim would have written it.
const KEEP_CARRIED: &str = concat!(
    "
insert into bodies (provider, source, hook_id, delivery_id, received_at, content_type, headers,
                    size, encoding, body)
select d.provider, d.source, d.hook_id, d.delivery_id, d.created_at, $6, $7, $8, $9, $10
from deliveries d
where ",
    key!("d"),
    "
on conflict do nothing"
);

/// Keeps the body a message published before bodies lived in Postgres
/// carries, before the worker changes its leg's state: whatever the leg
/// comes to (held, waiting, deferred, retried, dead), Postgres has its
/// body from then on, as it has every body a claim wrote since. A no-op
/// when Postgres holds one already or the leg is gone.
pub async fn keep_carried(client: &impl Session, key: &LegKey, body: &Body) -> Result<(), DbError> {
    let encoded = Encoded::of(body);
    super::execute(
        client,
        KEEP_CARRIED,
        key,
        &[
            &encoded.content_type,
            &encoded.headers,
            &encoded.size,
            &encoded.encoding,
            &&encoded.bytes[..],
        ],
    )
    .await?;
    Ok(())
}

/// A delivery's body, by the delivery's key: through any of its legs'
/// rows (they share `created_at`), so that it reads one partition.
const READ: &str = concat!(
    "
select b.content_type, b.headers, b.size, b.encoding, b.body, b.received_at
from bodies b
where ",
    delivery_key!("b"),
    "
  and b.received_at = (select d.created_at from deliveries d where ",
    delivery_key!("d"),
    " limit 1)"
);

/// A delivery's body as operators see it.
#[derive(Clone, Debug)]
pub struct Kept {
    /// The body, or why it cannot be read.
    pub body: Result<Body, Undecodable>,
    /// When ingest first claimed the delivery.
    pub received_at: DateTime<Utc>,
}

/// The body of a delivery, for operators (`deliveries show`, the
/// console): `None` once retention dropped it, or for a delivery claimed
/// before bodies were kept whose legs never waited.
pub async fn read(client: &impl Session, key: &DeliveryKey) -> Result<Option<Kept>, DbError> {
    let row = sql::query_opt(
        client,
        READ,
        &[&key.provider, &key.source, &key.hook_id, &key.delivery_id],
    )
    .await?;
    Ok(row.and_then(|row| {
        let received_at = row.get("received_at");
        Stored::from_row(&row).map(|stored| Kept {
            body: stored.decode(),
            received_at,
        })
    }))
}

/// A leg that has not ended: processing, retrying, waiting, or a dead
/// letter an operator may still replay. Its delivery keeps its body. A
/// boolean expression over the alias `$t` of `deliveries`.
macro_rules! leg_open {
    ($t:literal) => {
        concat!($t, ".status in ('processing', 'failed')")
    };
}

/// The statement that puts back, through the parent, the bodies of the
/// detached day partition `name` (the day `[day, next)`) whose delivery has
/// a leg not yet ended: their day has no partition any more, so they go to
/// the DEFAULT one. Led by those legs (`deliveries_status_created`), each
/// body found by its key in the day's own index, not by a read of the
/// whole day. Its bounds are written in (it runs in a script of DDL).
fn keep_open(name: &str, day: chrono::NaiveDate, next: chrono::NaiveDate) -> String {
    let bound =
        |d: chrono::NaiveDate| format!("'{} 00:00:00+00'::timestamptz", d.format("%Y-%m-%d"));
    format!(
        "insert into bodies
         select b.* from (
             select distinct d.provider, d.source, d.hook_id, d.delivery_id, d.created_at
             from deliveries d
             where {open} and d.created_at >= {from} and d.created_at < {to}) o
         join \"{name}\" b
           on b.provider = o.provider and b.source = o.source and b.hook_id = o.hook_id
          and b.delivery_id = o.delivery_id and b.received_at = o.created_at",
        open = leg_open!("d"),
        from = bound(day),
        to = bound(next),
    )
}

/// The DEFAULT partition's bodies older than `$1` seconds whose delivery
/// has no leg that has not ended, `$2` at most, locked (`skip locked`: one
/// a replay holds is left for a later sweep); their addresses as text.
const SWEEP_DEFAULT_PICK: &str = concat!(
    "
select b.ctid::text from bodies_default b
where b.received_at < now() - make_interval(secs => $1)
  and not exists (select 1 from deliveries d
                  where d.provider = b.provider and d.source = b.source
                    and d.hook_id = b.hook_id and d.delivery_id = b.delivery_id
                    and ",
    leg_open!("d"),
    ")
limit $2
for update of b skip locked"
);

/// Deletes the bodies picked by [`SWEEP_DEFAULT_PICK`] (`$1`, their
/// addresses) whose delivery still has no leg that has not ended, looked at
/// again in this statement's own snapshot: a replay that reopened a leg
/// after the pick's, and committed before this statement began, keeps its
/// body.
const SWEEP_DEFAULT_DELETE: &str = concat!(
    "
delete from bodies_default b
where b.ctid = any($1::text[]::tid[])
  and not exists (select 1 from deliveries d
                  where d.provider = b.provider and d.source = b.source
                    and d.hook_id = b.hook_id and d.delivery_id = b.delivery_id
                    and ",
    leg_open!("d"),
    ")"
);

/// Deletes, `batch` at a time, the DEFAULT partition's bodies older than
/// `keep` whose legs have all ended: each batch picked and locked by one
/// statement and deleted by a second that looks at the legs again, in one
/// transaction (see [`SWEEP_DEFAULT_PICK`]; a replay locks the body it
/// starts from). Returns how many.
async fn sweep_default(client: &Client, keep: Duration, batch: i64) -> Result<u64, DbError> {
    let mut deleted = 0;
    loop {
        client.batch_execute("begin").await?;
        let swept = async {
            let picked: Vec<String> =
                sql::query(client, SWEEP_DEFAULT_PICK, &[&keep.as_secs_f64(), &batch])
                    .await?
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
            let n = if picked.is_empty() {
                0
            } else {
                sql::execute(client, SWEEP_DEFAULT_DELETE, &[&picked]).await?
            };
            Ok::<_, DbError>((picked.len(), n))
        }
        .await;
        match swept {
            Ok((picked, n)) => {
                client.batch_execute("commit").await?;
                deleted += n;
                if picked < usize::try_from(batch).unwrap_or(usize::MAX) {
                    return Ok(deleted);
                }
            }
            Err(e) => {
                // Whatever failed, the session goes back clean.
                let _ = client.batch_execute("rollback").await;
                return Err(e);
            }
        }
    }
}

/// What [`retire`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retired {
    /// Day partitions dropped whole.
    pub days: u64,
    /// Bodies deleted by rows from the DEFAULT partition.
    pub deleted: u64,
    /// Day partitions created ahead.
    pub created: u64,
    /// A long transaction held the table: the rest is left to the next
    /// sweep.
    pub held: bool,
}

/// Retention of bodies, `keep` after their delivery's first claim: makes
/// the days ahead, then drops each day wholly past `keep`, in one
/// transaction that first detaches it and moves the bodies of its
/// deliveries with a leg not yet ended into the DEFAULT partition (so that
/// a leg that waits, retries or is a dead letter keeps its body whatever
/// its age, and a replay of it finds it); and deletes, `batch` at a time,
/// the DEFAULT partition's bodies past `keep` whose legs have all ended.
pub async fn retire(
    client: &Client,
    now: DateTime<Utc>,
    keep: Duration,
    batch: i64,
) -> Result<Retired, DbError> {
    let mut retired = Retired::default();
    // A partition change that fails (a partition made by hand that
    // overlaps, say) leaves the rest of retention to run, as for the other
    // tables: the drops wait for the next sweep.
    let created = match BODIES.ensure(client, now.date_naive()).await {
        Ok(created) => created,
        Err(e) => {
            tracing::warn!(table = BODIES.table, error = %e, "creating day partitions failed");
            super::partitions::Changed {
                count: 0,
                held: true,
            }
        }
    };
    retired.created = created.count;
    retired.held = created.held;
    if !retired.held {
        for (day, name) in BODIES.expired_days(client, now, keep).await? {
            let Some(next) = day.succ_opt() else { continue };
            // Detached first: while it is attached, a row put back
            // through the parent would go back to it. The lock on the
            // parent is held to the commit, so no claim, take or replay
            // reads the day half moved.
            let script = format!(
                "alter table bodies detach partition \"{name}\"; {}; drop table \"{name}\"",
                keep_open(&name, day, next)
            );
            match partitions::run_ddl(client, &script).await {
                Ok(()) => retired.days += 1,
                Err(e) if partitions::waited_too_long(&e) => {
                    retired.held = true;
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    retired.deleted = sweep_default(client, keep, batch).await?;
    Ok(retired)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(bytes: &'static [u8]) -> Body {
        Body {
            content_type: "application/json".to_owned(),
            github_headers: vec![
                ("x-github-event".to_owned(), "push".to_owned()),
                ("user-agent".to_owned(), "GitHub-Hookshot/abc".to_owned()),
            ],
            bytes: Bytes::from_static(bytes),
        }
    }

    fn stored(encoded: Encoded) -> Stored {
        Stored {
            content_type: encoded.content_type,
            headers: encoded.headers,
            size: encoded.size,
            encoding: encoded.encoding.to_owned(),
            bytes: encoded.bytes.to_vec(),
        }
    }

    #[test]
    fn a_body_reads_back_as_it_was_received() {
        for raw in [
            &b""[..],
            b"{}",
            br#"{"action":"opened","zen":"Keep it logically awesome. Keep it logically awesome."}"#,
        ] {
            let original = body(raw);
            let encoded = Encoded::of(&original);
            assert_eq!(encoded.encoding, "lz4");
            assert_eq!(encoded.size as usize, raw.len());
            assert_eq!(stored(encoded).decode(), Ok(original));
        }
    }

    #[test]
    fn a_body_that_does_not_decode_says_so() {
        let mut s = stored(Encoded::of(&body(b"{\"zen\":\"zen zen zen zen zen\"}")));
        s.size += 5;
        assert!(s.clone().decode().is_err(), "a wrong size");
        s.encoding = "zstd".to_owned();
        assert!(s.clone().decode().is_err(), "an unknown encoding");
        let mut truncated = stored(Encoded::of(&body(b"{\"zen\":\"zen zen zen zen zen\"}")));
        truncated.bytes.truncate(3);
        assert!(truncated.decode().is_err(), "cut short");
        let identity = Stored {
            encoding: "identity".to_owned(),
            size: 2,
            bytes: b"{}".to_vec(),
            ..stored(Encoded::of(&body(b"{}")))
        };
        assert_eq!(
            identity.decode().map(|b| b.bytes),
            Ok(Bytes::from_static(b"{}"))
        );
    }
}
