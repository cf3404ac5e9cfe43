//! The audit log: one row per change an operator makes (who, what, the
//! filter or ids, how many, the result, when), listed on a page and
//! logged as it is written. A bulk job's row is written when the job is
//! started and its result updated when the job ends.

use chrono::{DateTime, Utc};
use hookinbox::postgres::DbError;
use hookinbox::postgres::sql::{self, Session};

use crate::actor::Identity;

/// One audit row.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Its id (also the list's cursor).
    pub id: i64,
    /// When.
    pub at: DateTime<Utc>,
    /// The token's name.
    pub actor: String,
    /// Its role then.
    pub role: String,
    /// What: `replay`, `purge`, `cancel`.
    pub action: String,
    /// The filter, the ids or the delivery it applied to.
    pub target: serde_json::Value,
    /// How many deliveries.
    pub count: i64,
    /// What came of it.
    pub result: String,
    /// The bulk job it started or cancelled.
    pub job_id: Option<i64>,
}

const RECORD: &str = "
insert into admin_audit (actor, role, action, target, count, result, job_id)
values ($1, $2, $3, $4, $5, $6, $7)
returning id";

/// Writes one audit row and logs it (the target names deliveries and
/// filters, never a payload or a token).
#[allow(clippy::too_many_arguments)]
pub async fn record(
    client: &impl Session,
    who: &Identity,
    action: &str,
    target: &serde_json::Value,
    count: i64,
    result: &str,
    job_id: Option<i64>,
) -> Result<i64, DbError> {
    let row = sql::query_one(
        client,
        RECORD,
        &[
            &who.name,
            &who.role.as_str(),
            &action,
            target,
            &count,
            &result,
            &job_id,
        ],
    )
    .await?;
    let id: i64 = row.get(0);
    tracing::info!(
        audit_id = id,
        actor = %who.name,
        role = who.role.as_str(),
        action,
        target = %target,
        count,
        result,
        job_id,
        "admin audit"
    );
    Ok(id)
}

/// Sets the result of a job's starting row once the job has ended.
pub async fn job_ended(client: &impl Session, job_id: i64, result: &str) -> Result<(), DbError> {
    sql::execute(
        client,
        "update admin_audit set result = $2 where job_id = $1 and action in ('replay', 'purge')",
        &[&job_id, &result],
    )
    .await?;
    tracing::info!(job_id, result, "admin job ended");
    Ok(())
}

const LIST: &str = "
select id, at, actor, role, action, target, count, result, job_id from admin_audit
where ($1::int8 is null or id < $1)
order by id desc
limit $2";

/// Audit rows, newest first, before the id `before` (a page's cursor).
pub async fn list(
    client: &impl Session,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<Entry>, DbError> {
    Ok(sql::query(client, LIST, &[&before, &limit])
        .await?
        .iter()
        .map(|r| Entry {
            id: r.get(0),
            at: r.get(1),
            actor: r.get(2),
            role: r.get(3),
            action: r.get(4),
            target: r.get(5),
            count: r.get(6),
            result: r.get(7),
            job_id: r.get(8),
        })
        .collect())
}
