//! The Postgres pool and the versioned migrations.
//!
//! Migrations are the plain SQL files in `shared/migrations/`, embedded in
//! the binaries. They are applied in version order, each in its own
//! transaction, under a session advisory lock so that several replicas
//! starting at once apply each file exactly once.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use sha2::{Digest, Sha256};
use tokio_postgres::NoTls;

/// A pooled Postgres client.
pub type Client = deadpool_postgres::Object;

/// Errors of the database layer.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// `DATABASE_URL` does not parse.
    #[error("DATABASE_URL is not a valid Postgres URL: {0}")]
    BadUrl(#[source] tokio_postgres::Error),
    /// No connection could be had from the pool.
    #[error("Postgres unavailable: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// A statement failed.
    #[error("Postgres error: {0}")]
    Query(#[from] tokio_postgres::Error),
    /// The pool could not be built.
    #[error("cannot build the Postgres pool: {0}")]
    Build(#[from] deadpool_postgres::BuildError),
    /// A stored row no longer parses (edited by hand?).
    #[error("a stored delivery has an invalid {0}")]
    BadRow(&'static str),
    /// A migration already applied has been edited since.
    #[error("migration {version} ({name}) was changed after it was applied")]
    MigrationChanged {
        /// Its version number.
        version: i32,
        /// Its file name.
        name: &'static str,
    },
}

/// Parses `DATABASE_URL`, adding a connect timeout when the URL has none so
/// that an unreachable database fails fast instead of hanging a request.
pub fn parse_url(url: &str) -> Result<tokio_postgres::Config, DbError> {
    let mut config = tokio_postgres::Config::from_str(url).map_err(DbError::BadUrl)?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    // Keepalives find a half-open connection instead of waiting forever.
    config.keepalives(true);
    config.keepalives_idle(Duration::from_secs(30));
    Ok(config)
}

/// Builds a bounded pool. Waiting for a connection and creating one are both
/// bounded, so a request fails with 503 instead of queueing without end.
pub fn pool(url: &str, max_size: usize) -> Result<Pool, DbError> {
    let config = parse_url(url)?;
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            // Fast recycling skips a round trip per checkout; a broken
            // connection shows up as an error on first use instead.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Ok(Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(5)))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .build()?)
}

/// One embedded migration file.
struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

/// Every migration, in version order. Add new files at the end; never edit
/// one that has shipped (its checksum is verified).
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_deliveries.sql",
        sql: include_str!("../migrations/0001_deliveries.sql"),
    },
    Migration {
        version: 2,
        name: "0002_parked_bodies.sql",
        sql: include_str!("../migrations/0002_parked_bodies.sql"),
    },
];

/// Arbitrary constant naming hookinbox's migration lock.
const MIGRATION_LOCK: i64 = 0x686f_6f6b_696e_6278; // "hookinbx"

/// Applies every pending migration and returns how many it applied.
pub async fn migrate(pool: &Pool) -> Result<usize, DbError> {
    let mut client = pool.get().await?;
    // A session lock is released if this connection dies half way, so a
    // crashed replica never blocks the others.
    client
        .execute("select pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    let result = apply_pending(&mut client).await;
    let unlock = client
        .execute("select pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    let applied = result?;
    unlock?;
    Ok(applied)
}

async fn apply_pending(client: &mut Client) -> Result<usize, DbError> {
    client
        .batch_execute(
            "create table if not exists hookinbox_migrations (
                version    integer primary key,
                name       text not null,
                checksum   bytea not null,
                applied_at timestamptz not null default now()
            )",
        )
        .await?;
    let mut applied = 0;
    for migration in MIGRATIONS {
        let checksum = Sha256::digest(migration.sql.as_bytes()).to_vec();
        let row = client
            .query_opt(
                "select checksum from hookinbox_migrations where version = $1",
                &[&migration.version],
            )
            .await?;
        if let Some(row) = row {
            let stored: Vec<u8> = row.get(0);
            if stored != checksum {
                return Err(DbError::MigrationChanged {
                    version: migration.version,
                    name: migration.name,
                });
            }
            continue;
        }
        let tx = client.transaction().await?;
        tx.batch_execute(migration.sql).await?;
        tx.execute(
            "insert into hookinbox_migrations (version, name, checksum) values ($1, $2, $3)",
            &[&migration.version, &migration.name, &checksum],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(
            version = migration.version,
            name = migration.name,
            "applied migration"
        );
        applied += 1;
    }
    Ok(applied)
}

/// True when a query can run now (used by `/readyz`).
pub async fn ping(pool: &Pool) -> bool {
    match pool.get().await {
        Ok(client) => client.simple_query("select 1").await.is_ok(),
        Err(_) => false,
    }
}
