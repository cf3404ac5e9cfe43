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
//!   one round trip) with the parameter types learned once per process
//!   over a direct connection: a statement prepared through the pooler to
//!   learn them would be left behind on a server connection that other
//!   processes share, where its name would clash with theirs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use futures::{StreamExt, pin_mut};
use tokio_postgres::GenericClient as _;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Error, Row};

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
static DIRECT: OnceLock<deadpool_postgres::Pool> = OnceLock::new();

/// From now on, this process sends unnamed statements (see the module
/// docs), learning their parameter types over `direct`, a pool that does
/// not go through the pooler. Set once at start, before any statement
/// runs; later calls keep the first pool.
pub fn use_unnamed_statements(direct: deadpool_postgres::Pool) {
    let _ = DIRECT.set(direct);
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

/// The parameter types Postgres infers for `sql`: asked once per process
/// over the direct connection (a prepare, whose statement is closed at
/// once), then remembered.
async fn param_types(session: &impl Session, sql: &str) -> Result<Arc<[Type]>, Error> {
    if let Some(types) = types_cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(sql)
    {
        return Ok(types.clone());
    }
    let types: Arc<[Type]> = match DIRECT.get().map(|pool| pool.get()) {
        Some(direct) => match direct.await {
            Ok(client) => client.prepare(sql).await?.params().into(),
            // The direct connection is down: learn them where we are (the
            // statement may be left on a pooled server connection).
            Err(_) => session.prepare(sql).await?.params().into(),
        },
        None => session.prepare(sql).await?.params().into(),
    };
    types_cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(sql.to_owned(), types.clone());
    Ok(types)
}

type Param<'a> = &'a (dyn ToSql + Sync);

/// `params` with their types, for an unnamed statement.
async fn typed<'a>(
    session: &impl Session,
    sql: &str,
    params: &[Param<'a>],
) -> Result<Vec<(Param<'a>, Type)>, Error> {
    let types = param_types(session, sql).await?;
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
) -> Result<Vec<Row>, Error> {
    if unnamed_statements() {
        let params = typed(session, sql, params).await?;
        session.pg().query_typed(sql, &params).await
    } else {
        let statement = session.prepare_cached(sql).await?;
        session.query(&statement, params).await
    }
}

/// Runs `sql`, which returns at most one row.
pub async fn query_opt(
    session: &impl Session,
    sql: &str,
    params: &[Param<'_>],
) -> Result<Option<Row>, Error> {
    if unnamed_statements() {
        let params = typed(session, sql, params).await?;
        session.pg().query_typed_opt(sql, &params).await
    } else {
        let statement = session.prepare_cached(sql).await?;
        session.query_opt(&statement, params).await
    }
}

/// Runs `sql`, which returns exactly one row.
pub async fn query_one(
    session: &impl Session,
    sql: &str,
    params: &[Param<'_>],
) -> Result<Row, Error> {
    if unnamed_statements() {
        let params = typed(session, sql, params).await?;
        session.pg().query_typed_one(sql, &params).await
    } else {
        let statement = session.prepare_cached(sql).await?;
        session.query_one(&statement, params).await
    }
}

/// Runs `sql` and returns how many rows it changed.
pub async fn execute(
    session: &impl Session,
    sql: &str,
    params: &[Param<'_>],
) -> Result<u64, Error> {
    if unnamed_statements() {
        let params = typed(session, sql, params).await?;
        let rows = session.pg().query_typed_raw(sql, params).await?;
        pin_mut!(rows);
        while let Some(row) = rows.next().await {
            row?;
        }
        Ok(rows.rows_affected().unwrap_or(0))
    } else {
        let statement = session.prepare_cached(sql).await?;
        session.execute(&statement, params).await
    }
}
