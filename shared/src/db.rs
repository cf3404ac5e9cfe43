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
    /// A batched statement (group commit) failed; whether it committed is
    /// unknown.
    #[error("batched Postgres statement failed: {0}")]
    Batch(String),
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
    // Every statement hookinbox runs finds its rows through an index (the
    // key, or a partial index for the sweeps and gauges). A pooled
    // connection keeps the generic plan it made for a prepared statement
    // after five executions, and when that happened while `deliveries` was
    // small (a new deployment, autovacuum off, no ANALYZE yet) the plan is
    // a sequential scan joined by hash: every take and claim then reads the
    // whole table, and the pipeline slows as the table grows. Scans are
    // therefore ruled out for our sessions, which makes the generic plan an
    // index plan whatever the statistics say, and that plan is used from
    // the first execution: planning each execution anew, the other way out,
    // cost more CPU than running the statements.
    const PLANNER: &str = "-c enable_seqscan=off -c plan_cache_mode=force_generic_plan";
    let options = match config.get_options() {
        Some(own) => format!("{own} {PLANNER}"),
        None => PLANNER.to_owned(),
    };
    config.options(options);
    Ok(config)
}

/// How long a Postgres request may go unanswered by default before its
/// connection is given up (see [`pool_with_timeout`]).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Builds a bounded pool with [`DEFAULT_REQUEST_TIMEOUT`].
pub fn pool(url: &str, max_size: usize) -> Result<Pool, DbError> {
    pool_with_timeout(url, max_size, DEFAULT_REQUEST_TIMEOUT)
}

/// Builds a bounded pool. Waiting for a connection and creating one are both
/// bounded, so a request fails with 503 instead of queueing without end.
///
/// Every TCP connection also carries a watchdog: a request that gets no byte
/// of answer within `request_timeout` fails the connection. Keepalives
/// cannot find a half-open connection whose far end still acknowledges
/// packets (a stuck proxy, a frozen peer), and without the watchdog a query
/// on it would wait forever while holding a pool slot and a job.
pub fn pool_with_timeout(
    url: &str,
    max_size: usize,
    request_timeout: Duration,
) -> Result<Pool, DbError> {
    let config = parse_url(url)?;
    let manager = Manager::from_connect(
        config,
        watchdog::Connect { request_timeout },
        ManagerConfig {
            // Fast recycling skips a round trip per checkout; a broken
            // connection shows up as an error on first use instead, and a
            // closed one (the watchdog fired) is never handed out again.
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

mod watchdog {
    //! A TCP stream for tokio-postgres that fails once a request has gone
    //! unanswered for too long.

    use std::future::Future;
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use futures::future::BoxFuture;
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio::net::TcpStream;
    use tokio::time::{Instant, Sleep};
    use tokio_postgres::NoTls;
    use tokio_postgres::config::Host;

    /// Connects through a [`Watchdog`] stream.
    pub(super) struct Connect {
        pub(super) request_timeout: Duration,
    }

    impl deadpool_postgres::Connect for Connect {
        fn connect(
            &self,
            config: &tokio_postgres::Config,
        ) -> BoxFuture<
            '_,
            Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
        > {
            let config = config.clone();
            let request_timeout = self.request_timeout;
            Box::pin(async move {
                let (client, connection) = match tcp(&config).await {
                    Some(stream) => {
                        config
                            .connect_raw(Watchdog::new(stream, request_timeout), NoTls)
                            .await?
                    }
                    // A Unix socket cannot be half-open across a network, and
                    // a failed TCP connect is best reported by tokio-postgres
                    // itself (its errors cannot be built outside it).
                    None => {
                        let (client, connection) = config.connect(NoTls).await?;
                        return Ok((client, spawn(connection)));
                    }
                };
                Ok((client, spawn(connection)))
            })
        }
    }

    fn spawn<F>(connection: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = Result<(), tokio_postgres::Error>> + Send + 'static,
    {
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "Postgres connection ended");
            }
        })
    }

    /// The first TCP host of `config` that accepts a connection in time.
    async fn tcp(config: &tokio_postgres::Config) -> Option<TcpStream> {
        let ports = config.get_ports();
        let timeout = config
            .get_connect_timeout()
            .copied()
            .unwrap_or(Duration::from_secs(5));
        for (i, host) in config.get_hosts().iter().enumerate() {
            let Host::Tcp(name) = host else {
                return None;
            };
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            if let Ok(Ok(stream)) =
                tokio::time::timeout(timeout, TcpStream::connect((name.as_str(), port))).await
            {
                let _ = stream.set_nodelay(true);
                let keepalive = socket2::TcpKeepalive::new().with_time(Duration::from_secs(30));
                let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
                return Some(stream);
            }
        }
        None
    }

    /// Fails reads once a write has had no byte of answer for `timeout`.
    /// An idle connection (nothing written since the last answer) never
    /// times out.
    struct Watchdog {
        inner: TcpStream,
        timeout: Duration,
        timer: Pin<Box<Sleep>>,
        waiting: bool,
    }

    impl Watchdog {
        fn new(inner: TcpStream, timeout: Duration) -> Self {
            Self {
                inner,
                timeout,
                timer: Box::pin(tokio::time::sleep(timeout)),
                waiting: false,
            }
        }
    }

    impl AsyncRead for Watchdog {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let before = buf.filled().len();
            match Pin::new(&mut self.inner).poll_read(cx, buf) {
                Poll::Ready(Ok(())) => {
                    if buf.filled().len() > before {
                        self.waiting = false;
                    }
                    Poll::Ready(Ok(()))
                }
                Poll::Pending if self.waiting && self.timer.as_mut().poll(cx).is_ready() => {
                    Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "Postgres did not answer in time",
                    )))
                }
                other => other,
            }
        }
    }

    impl AsyncWrite for Watchdog {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let written = Pin::new(&mut self.inner).poll_write(cx, buf);
            if matches!(written, Poll::Ready(Ok(n)) if n > 0) && !self.waiting {
                // The clock starts at the first unanswered write.
                self.waiting = true;
                let at = Instant::now() + self.timeout;
                self.timer.as_mut().reset(at);
                // Registers this task with the timer, so that a read
                // pending with no traffic still wakes at the deadline.
                let _ = self.timer.as_mut().poll(cx);
            }
            written
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }
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
    Migration {
        version: 3,
        name: "0003_lz4_payloads.sql",
        sql: include_str!("../migrations/0003_lz4_payloads.sql"),
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
