//! The bulk jobs' tables: a job, its frozen items, their results, and a
//! delivery's lineage (the jobs that replayed or purged it).

use chrono::{DateTime, Utc};
use hookinbox::LegKey;
use hookinbox::deliveries::{Scope, State};
use hookinbox::postgres::DbError;
use hookinbox::postgres::sql::{self, Session};
use uuid::Uuid;

/// What a job does to each item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Replays a failed leg (retrying, waiting or dead) from its delivery's body.
    Replay,
    /// Replays any leg that is not in flight and not filtered, completed
    /// ones too, from its delivery's body (`deliveries replay`, the
    /// console's delivery page).
    ReplayAny,
    /// Deletes a dead letter.
    Purge,
}

impl Kind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Replay => "replay",
            Self::ReplayAny => "replay_any",
            Self::Purge => "purge",
        }
    }

    /// The states of the deliveries it acts on: a replay takes failed
    /// ones (retrying, waiting or dead) and those awaiting a redelivery (whose item
    /// then says that only GitHub has the body), a replay of any leg
    /// completed ones too, a purge dead letters.
    pub fn states(self) -> &'static [State] {
        match self {
            Self::Replay => &[
                State::Retrying,
                State::Waiting,
                State::Dead,
                State::AwaitingRedelivery,
            ],
            Self::ReplayAny => &[
                State::Completed,
                State::Retrying,
                State::Waiting,
                State::Dead,
                State::AwaitingRedelivery,
            ],
            Self::Purge => &[State::Dead],
        }
    }

    /// Which legs a replay of this kind may start.
    pub fn scope(self) -> Scope {
        match self {
            Self::ReplayAny => Scope::Ended,
            Self::Replay | Self::Purge => Scope::Failed,
        }
    }

    /// Whether it replays (rather than purges).
    pub fn replays(self) -> bool {
        self != Self::Purge
    }

    fn parse(s: &str) -> Self {
        match s {
            "purge" => Self::Purge,
            "replay_any" => Self::ReplayAny,
            _ => Self::Replay,
        }
    }
}

/// A job and its progress.
#[derive(Clone, Debug)]
pub struct Job {
    /// Its id.
    pub id: i64,
    /// Replay or purge.
    pub kind: Kind,
    /// Who started it.
    pub actor: String,
    /// The filter its selection was made with (none for a list of ids).
    pub filter: Option<serde_json::Value>,
    /// Items per second.
    pub per_second: f64,
    /// `running`, `cancelled` or `finished`.
    pub status: String,
    /// Items frozen.
    pub total: i32,
    /// Started.
    pub created_at: DateTime<Utc>,
    /// Finished or cancelled.
    pub finished_at: Option<DateTime<Utc>>,
    /// Who cancelled it.
    pub cancelled_by: Option<String>,
    /// Items done.
    pub done: i64,
    /// Items replayed.
    pub replayed: i64,
    /// Items purged.
    pub purged: i64,
    /// Items skipped: no longer eligible when their turn came.
    pub skipped: i64,
    /// Items failed (the publish failed).
    pub failed: i64,
}

const JOB_COLUMNS: &str = "j.id, j.kind, j.actor, j.filter, j.per_second, j.status, j.total,
       j.created_at, j.finished_at, j.cancelled_by,
       count(i.result), count(*) filter (where i.result = 'replayed'),
       count(*) filter (where i.result = 'purged'), count(*) filter (where i.result = 'skipped'),
       count(*) filter (where i.result = 'failed')";

fn job(r: &tokio_postgres::Row) -> Job {
    Job {
        id: r.get(0),
        kind: Kind::parse(r.get(1)),
        actor: r.get(2),
        filter: r.get(3),
        per_second: r.get(4),
        status: r.get(5),
        total: r.get(6),
        created_at: r.get(7),
        finished_at: r.get(8),
        cancelled_by: r.get(9),
        done: r.get(10),
        replayed: r.get(11),
        purged: r.get(12),
        skipped: r.get(13),
        failed: r.get(14),
    }
}

/// Creates a job over `keys`, in order. Run it in the transaction that
/// also writes the audit row.
pub async fn create(
    client: &impl Session,
    kind: Kind,
    actor: &str,
    filter: Option<&serde_json::Value>,
    per_second: f64,
    keys: &[LegKey],
) -> Result<i64, DbError> {
    let id: i64 = sql::query_one(
        client,
        "insert into admin_jobs (kind, actor, filter, per_second, total)
             values ($1, $2, $3, $4, $5) returning id",
        &[
            &kind.as_str(),
            &actor,
            &filter,
            &per_second,
            &(keys.len() as i32),
        ],
    )
    .await?
    .get(0);
    let column = |f: fn(&LegKey) -> &str| keys.iter().map(f).collect::<Vec<&str>>();
    sql::execute(
        client,
        "insert into admin_job_items
                 (job_id, position, provider, source, hook_id, delivery_id, destination)
             select $1, k.ord, k.p, k.s, k.h, k.d, k.n
             from unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
                  with ordinality as k(p, s, h, d, n, ord)",
        &[
            &id,
            &column(|k| k.provider.as_str()),
            &column(|k| k.source.as_str()),
            &column(|k| k.hook_id.as_str()),
            &column(|k| k.delivery_id.as_str()),
            &column(|k| k.destination.as_str()),
        ],
    )
    .await?;
    Ok(id)
}

/// One job and its progress.
pub async fn get(client: &impl Session, id: i64) -> Result<Option<Job>, DbError> {
    let text = format!(
        "select {JOB_COLUMNS} from admin_jobs j left join admin_job_items i on i.job_id = j.id
         where j.id = $1 group by j.id"
    );
    Ok(sql::query_opt(client, &text, &[&id])
        .await?
        .as_ref()
        .map(job))
}

/// The newest jobs.
pub async fn recent(client: &impl Session, limit: i64) -> Result<Vec<Job>, DbError> {
    let text = format!(
        "select {JOB_COLUMNS} from admin_jobs j left join admin_job_items i on i.job_id = j.id
         where j.id in (select id from admin_jobs order by id desc limit $1)
         group by j.id order by j.id desc"
    );
    Ok(sql::query(client, &text, &[&limit])
        .await?
        .iter()
        .map(job)
        .collect())
}

/// One item of a job.
#[derive(Clone, Debug)]
pub struct Item {
    /// Its place in the frozen selection, from 1.
    pub position: i32,
    /// The delivery it replays (`replay_of`) or purges.
    pub key: [String; 5],
    /// `replayed`, `purged`, `skipped`, `failed`, or none yet.
    pub result: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
    /// When it was done.
    pub done_at: Option<DateTime<Utc>>,
}

/// The first `limit` items of a job.
pub async fn items(client: &impl Session, job_id: i64, limit: i64) -> Result<Vec<Item>, DbError> {
    Ok(sql::query(
        client,
        "select position, provider, source, hook_id, delivery_id, destination, result, error,
                    done_at
             from admin_job_items where job_id = $1 order by position limit $2",
        &[&job_id, &limit],
    )
    .await?
    .iter()
    .map(|r| Item {
        position: r.get(0),
        key: [r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)],
        result: r.get(6),
        error: r.get(7),
        done_at: r.get(8),
    })
    .collect())
}

/// A job that acted on a delivery.
#[derive(Clone, Debug)]
pub struct Lineage {
    /// The job.
    pub job_id: i64,
    /// Replay or purge.
    pub kind: Kind,
    /// Who started it.
    pub actor: String,
    /// What it did to this delivery.
    pub result: String,
    /// Why it failed.
    pub error: Option<String>,
    /// When.
    pub at: DateTime<Utc>,
}

/// The jobs that acted on `key`, oldest first.
pub async fn lineage(client: &impl Session, key: &LegKey) -> Result<Vec<Lineage>, DbError> {
    Ok(sql::query(
        client,
        "select i.job_id, j.kind, j.actor, i.result, i.error, i.done_at
             from admin_job_items i join admin_jobs j on j.id = i.job_id
             where i.provider = $1 and i.source = $2 and i.hook_id = $3 and i.delivery_id = $4
               and i.destination = $5 and i.result is not null
             order by i.done_at",
        &[
            &key.provider,
            &key.source,
            &key.hook_id,
            &key.delivery_id,
            &key.destination,
        ],
    )
    .await?
    .iter()
    .map(|r| Lineage {
        job_id: r.get(0),
        kind: Kind::parse(r.get(1)),
        actor: r.get(2),
        result: r.get(3),
        error: r.get(4),
        at: r.get(5),
    })
    .collect())
}

/// What a cancel found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cancelled {
    /// The job was running and is cancelled now: no further item starts.
    Now,
    /// The job had already ended (`finished` or `cancelled`).
    AlreadyEnded(String),
    /// No such job.
    Unknown,
}

/// Cancels a running job. The runner locks the job's row for each item,
/// so this waits for the item in progress, and no item starts after it.
pub async fn cancel(client: &impl Session, id: i64, by: &str) -> Result<Cancelled, DbError> {
    let n = sql::execute(
        client,
        "update admin_jobs set status = 'cancelled', cancelled_by = $2, finished_at = now()
             where id = $1 and status = 'running'",
        &[&id, &by],
    )
    .await?;
    if n == 1 {
        return Ok(Cancelled::Now);
    }
    Ok(
        match sql::query_opt(
            client,
            "select status from admin_jobs where id = $1",
            &[&id],
        )
        .await?
        {
            Some(r) => Cancelled::AlreadyEnded(r.get(0)),
            None => Cancelled::Unknown,
        },
    )
}

/// How long a runner's hold on a job lasts: 30 s, or three items' time
/// for a slower job, so that a live runner renews it before it ends.
macro_rules! job_lease {
    () => {
        "now() + make_interval(secs => greatest(30, 3 / per_second))"
    };
}

/// Takes the oldest running job nobody holds (or whose runner's hold
/// lapsed) for `runner`.
pub async fn take(
    client: &impl Session,
    runner: Uuid,
) -> Result<Option<(i64, Kind, f64)>, DbError> {
    Ok(sql::query_opt(
        client,
        concat!(
            "update admin_jobs set runner = $1, lease_until = ",
            job_lease!(),
            "
             where id = (select id from admin_jobs
                         where status = 'running' and (runner is null or lease_until < now())
                         order by id limit 1 for update skip locked)
             returning id, kind, per_second"
        ),
        &[&runner],
    )
    .await?
    .map(|r| (r.get(0), Kind::parse(r.get(1)), r.get(2))))
}

/// Holds a new job for `runner` (in the transaction that created it), so
/// that no other runner takes it while `runner` runs it.
pub async fn hold_new(client: &impl Session, id: i64, runner: Uuid) -> Result<(), DbError> {
    sql::execute(
        client,
        concat!(
            "update admin_jobs set runner = $2, lease_until = ",
            job_lease!(),
            " where id = $1"
        ),
        &[&id, &runner],
    )
    .await?;
    Ok(())
}

/// Renews the runner's hold on a running job and locks its row for this
/// transaction, so that a cancel waits for the item in progress. False
/// when the job was cancelled or taken over.
pub async fn hold(client: &impl Session, id: i64, runner: Uuid) -> Result<bool, DbError> {
    Ok(sql::execute(
        client,
        concat!(
            "update admin_jobs set lease_until = ",
            job_lease!(),
            " where id = $1 and runner = $2 and status = 'running'"
        ),
        &[&id, &runner],
    )
    .await?
        == 1)
}

/// The next pending item: its position and key parts.
pub async fn next_item(
    client: &impl Session,
    id: i64,
) -> Result<Option<(i32, [String; 5])>, DbError> {
    Ok(sql::query_opt(
        client,
        "select position, provider, source, hook_id, delivery_id, destination
             from admin_job_items
             where job_id = $1 and result is null order by position limit 1",
        &[&id],
    )
    .await?
    .map(|r| (r.get(0), [r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)])))
}

/// Records an item's result.
pub async fn done(
    client: &impl Session,
    id: i64,
    position: i32,
    result: &str,
    error: Option<&str>,
) -> Result<(), DbError> {
    sql::execute(
        client,
        "update admin_job_items set result = $3, error = $4, done_at = now()
             where job_id = $1 and position = $2",
        &[&id, &position, &result, &error],
    )
    .await?;
    Ok(())
}

/// Marks a job finished (every item done).
pub async fn finish(client: &impl Session, id: i64) -> Result<(), DbError> {
    sql::execute(
        client,
        "update admin_jobs set status = 'finished', finished_at = now()
             where id = $1 and status = 'running'",
        &[&id],
    )
    .await?;
    Ok(())
}
