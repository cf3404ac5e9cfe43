//! Running statements: every statement hookinbox sends goes through here,
//! in one of two ways chosen once per process ([`use_unnamed_statements`]):
//!
//! - **Prepared** (the default): each statement is prepared once per
//!   connection and cached there, then executed by name: one round trip,
//!   no parse, a cached plan.
//! - **Unnamed**, for a connection pooler in transaction mode (PgBouncer
//!   before 1.21): the pooler hands each transaction to any server
//!   connection, where a statement prepared on another one does not
//!   exist. Each statement is then sent whole (parse, bind and execute in
//!   one round trip) with the parameter types learned once per process:
//!   prepared and closed again inside one transaction, on a connection of
//!   its own, so that the pooler keeps both on the same server connection
//!   and no named statement is left behind there (where its name would
//!   clash with another process's).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use futures::{StreamExt, pin_mut};
use tokio_postgres::GenericClient as _;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Error, Row};

use super::DbError;

/// A connection, or a transaction on one: where statements run.
pub trait Session: deadpool_postgres::GenericClient + Sync {
    /// The same, as `tokio-postgres` sees it (for unnamed statements).
    type Pg: tokio_postgres::GenericClient + Sync;
    /// The `tokio-postgres` side.
    fn pg(&self) -> &Self::Pg;
}

impl Session for deadpool_postgres::Client {
    type Pg = tokio_postgres::Client;
    fn pg(&self) -> &tokio_postgres::Client {
        self
    }
}

impl<'a> Session for deadpool_postgres::Transaction<'a> {
    type Pg = tokio_postgres::Transaction<'a>;
    fn pg(&self) -> &tokio_postgres::Transaction<'a> {
        self
    }
}

static UNNAMED: AtomicBool = AtomicBool::new(false);

/// Where parameter types are learned in the unnamed mode.
static LEARN: RwLock<Option<deadpool_postgres::Pool>> = RwLock::new(None);

/// From now on, this process sends unnamed statements (see the module
/// docs), learning their parameter types on `learn`, a pool of one
/// connection of their own (through the pooler, like the others). Set at
/// start, before any statement runs; a later call replaces the pool.
pub fn use_unnamed_statements(learn: deadpool_postgres::Pool) {
    *LEARN.write().unwrap_or_else(|p| p.into_inner()) = Some(learn);
    UNNAMED.store(true, Ordering::Relaxed);
}

/// Whether this process sends unnamed statements.
pub fn unnamed_statements() -> bool {
    UNNAMED.load(Ordering::Relaxed)
}

/// The parameter types of each statement text, learned once per process.
fn types_cache() -> &'static Mutex<HashMap<String, Arc<[Type]>>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<[Type]>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The parameter types Postgres infers for `sql`: asked once per process,
/// then remembered.
async fn param_types(sql: &str) -> Result<Arc<[Type]>, DbError> {
    if let Some(types) = types_cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(sql)
    {
        return Ok(types.clone());
    }
    let types = learn(sql).await?;
    types_cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(sql.to_owned(), types.clone());
    Ok(types)
}

/// Prepares `sql` on the learning connection and closes it again, in one
/// transaction: the prepare, the close and the commit reach the same
/// server connection, whatever the pooler does between transactions.
async fn learn(sql: &str) -> Result<Arc<[Type]>, DbError> {
    let pool = LEARN.read().unwrap_or_else(|p| p.into_inner()).clone();
    let Some(pool) = pool else {
        unreachable!("unnamed statements are switched on with their learning pool")
    };
    let client = pool.get().await?;
    Ok(prepare_and_close(&client, sql).await?)
}

async fn prepare_and_close(
    client: &tokio_postgres::Client,
    sql: &str,
) -> Result<Arc<[Type]>, Error> {
    client.batch_execute("begin").await?;
    let types = match client.prepare(sql).await {
        // Dropping the statement sends its close before the commit below.
        Ok(statement) => Ok(statement.params().into()),
        Err(e) => Err(e),
    };
    let ended = client.batch_execute("commit").await;
    let types = types?;
    ended?;
    Ok(types)
}

type Param<'a> = &'a (dyn ToSql + Sync);

/// `params` with their types, for an unnamed statement.
async fn typed<'a>(sql: &str, params: &[Param<'a>]) -> Result<Vec<(Param<'a>, Type)>, DbError> {
    let types = param_types(sql).await?;
    Ok(params
        .iter()
        .zip(types.iter())
        .map(|(p, t)| (*p, t.clone()))
        .collect())
}

/// Runs `sql` and returns its rows.
pub async fn query(
    session: &impl Session,
    sql: &str,
    params: &[Param<'_>],
) -> Result<Vec<Row>, DbError> {
    if unnamed_statements() {
        let params = typed(sql, params).await?;
        Ok(session.pg().query_typed(sql, &params).await?)
    } else {
        let statement = session.prepare_cached(sql).await?;
        Ok(session.query(&statement, params).await?)
    }
}

/// Runs `sql`, which takes no parameters, planned afresh each time: as an
/// unnamed statement, never by a plan cached on the connection. For a
/// pass over a whole set of rows that grows and shrinks by orders of
/// magnitude (the legs waiting for fairness): a statement without
/// parameters keeps the plan of its first run for the connection's life
/// until an `ANALYZE` of its tables, and one planned on an empty table
/// went from 10 ms to seconds a pass as 10,000 legs came to wait, on a
/// server that ran no `ANALYZE` meanwhile. A plan costs about a
/// millisecond; such a pass runs about once a second.
pub async fn query_replanned(session: &impl Session, sql: &str) -> Result<Vec<Row>, DbError> {
    Ok(session.pg().query_typed(sql, &[]).await?)
}

/// Runs `sql` and returns its rows, planned for these parameters each time
/// (an unnamed statement, its parameter types those of the statement this
/// connection prepared once), never by a generic plan cached on the
/// connection. For the batched claim and completion: their arrays' lengths
/// change every run, and a generic plan made while the table was small
/// (a few rows, say, at a deployment's start) stays for the connection's
/// life; one read the whole primary key of `deliveries` for every batch
/// of completions (10,000 rows to find 10), and that grows with the table.
/// A plan costs about 1.6 ms (the completion's) to 2.4 ms (the take's)
/// on the 2-core benchmark machine under a flood (medians of their binds
/// in Postgres's log), shared by the batch's rows.
pub async fn query_planned(
    session: &impl Session,
    sql: &str,
    params: &[Param<'_>],
) -> Result<Vec<Row>, DbError> {
    let types: Arc<[Type]> = if unnamed_statements() {
        param_types(sql).await?
    } else {
        session.prepare_cached(sql).await?.params().into()
    };
    let params: Vec<(Param<'_>, Type)> = params
        .iter()
        .zip(types.iter())
        .map(|(p, t)| (*p, t.clone()))
        .collect();
    Ok(session.pg().query_typed(sql, &params).await?)
}

/// Runs `sql`, which returns at most one row.
pub async fn query_opt(
    session: &impl Session,
    sql: &str,
    params: &[Param<'_>],
) -> Result<Option<Row>, DbError> {
    if unnamed_statements() {
        let params = typed(sql, params).await?;
        Ok(session.pg().query_typed_opt(sql, &params).await?)
    } else {
        let statement = session.prepare_cached(sql).await?;
        Ok(session.query_opt(&statement, params).await?)
    }
}

/// Runs `sql`, which returns exactly one row.
pub async fn query_one(
    session: &impl Session,
    sql: &str,
    params: &[Param<'_>],
) -> Result<Row, DbError> {
    if unnamed_statements() {
        let params = typed(sql, params).await?;
        Ok(session.pg().query_typed_one(sql, &params).await?)
    } else {
        let statement = session.prepare_cached(sql).await?;
        Ok(session.query_one(&statement, params).await?)
    }
}

/// Runs `sql` and returns how many rows it changed.
pub async fn execute(
    session: &impl Session,
    sql: &str,
    params: &[Param<'_>],
) -> Result<u64, DbError> {
    if unnamed_statements() {
        let params = typed(sql, params).await?;
        let rows = session.pg().query_typed_raw(sql, params).await?;
        pin_mut!(rows);
        while let Some(row) = rows.next().await {
            row?;
        }
        Ok(rows.rows_affected().unwrap_or(0))
    } else {
        let statement = session.prepare_cached(sql).await?;
        Ok(session.execute(&statement, params).await?)
    }
}
