//! The versioned migrations: the plain SQL files in `shared/migrations/`,
//! embedded in the binaries. They are applied in version order, each in
//! its own transaction, under a session advisory lock so that several
//! replicas starting at once apply each file exactly once.

use deadpool_postgres::Pool;
use sha2::{Digest, Sha256};

use super::{Client, DbError, advisory};

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
        sql: include_str!("../../migrations/0001_deliveries.sql"),
    },
    Migration {
        version: 2,
        name: "0002_parked_bodies.sql",
        sql: include_str!("../../migrations/0002_parked_bodies.sql"),
    },
    Migration {
        version: 3,
        name: "0003_lz4_payloads.sql",
        sql: include_str!("../../migrations/0003_lz4_payloads.sql"),
    },
    Migration {
        version: 4,
        name: "0004_reconcile.sql",
        sql: include_str!("../../migrations/0004_reconcile.sql"),
    },
    Migration {
        version: 5,
        name: "0005_admin.sql",
        sql: include_str!("../../migrations/0005_admin.sql"),
    },
    Migration {
        version: 6,
        name: "0006_guards.sql",
        sql: include_str!("../../migrations/0006_guards.sql"),
    },
    Migration {
        version: 7,
        name: "0007_admin_sessions.sql",
        sql: include_str!("../../migrations/0007_admin_sessions.sql"),
    },
    Migration {
        version: 8,
        name: "0008_destinations.sql",
        sql: include_str!("../../migrations/0008_destinations.sql"),
    },
    Migration {
        version: 9,
        name: "0009_copied_events.sql",
        sql: include_str!("../../migrations/0009_copied_events.sql"),
    },
    Migration {
        version: 10,
        name: "0010_repository_nocase.sql",
        sql: include_str!("../../migrations/0010_repository_nocase.sql"),
    },
    Migration {
        version: 11,
        name: "0011_traceparent.sql",
        sql: include_str!("../../migrations/0011_traceparent.sql"),
    },
    Migration {
        version: 12,
        name: "0012_reconcile_failures_walk.sql",
        sql: include_str!("../../migrations/0012_reconcile_failures_walk.sql"),
    },
    Migration {
        version: 13,
        name: "0013_github_tenant.sql",
        sql: include_str!("../../migrations/0013_github_tenant.sql"),
    },
    Migration {
        version: 14,
        name: "0014_reconcile_traceparent.sql",
        sql: include_str!("../../migrations/0014_reconcile_traceparent.sql"),
    },
    Migration {
        version: 15,
        name: "0015_deferred.sql",
        sql: include_str!("../../migrations/0015_deferred.sql"),
    },
    Migration {
        version: 16,
        name: "0016_ordering.sql",
        sql: include_str!("../../migrations/0016_ordering.sql"),
    },
    Migration {
        version: 17,
        name: "0017_fairness.sql",
        sql: include_str!("../../migrations/0017_fairness.sql"),
    },
    Migration {
        version: 18,
        name: "0018_fair_hold.sql",
        sql: include_str!("../../migrations/0018_fair_hold.sql"),
    },
    Migration {
        version: 19,
        name: "0019_skip_stale.sql",
        sql: include_str!("../../migrations/0019_skip_stale.sql"),
    },
    Migration {
        version: 20,
        name: "0020_fair_rate.sql",
        sql: include_str!("../../migrations/0020_fair_rate.sql"),
    },
    Migration {
        version: 21,
        name: "0021_fair_keys.sql",
        sql: include_str!("../../migrations/0021_fair_keys.sql"),
    },
    Migration {
        version: 22,
        name: "0022_day_partitions.sql",
        sql: include_str!("../../migrations/0022_day_partitions.sql"),
    },
    Migration {
        version: 23,
        name: "0023_bodies.sql",
        sql: include_str!("../../migrations/0023_bodies.sql"),
    },
];

/// Applies every pending migration and returns how many it applied.
pub async fn migrate(pool: &Pool) -> Result<usize, DbError> {
    let mut client = pool.get().await?;
    // A session lock is released if this connection dies half way, so a
    // crashed replica never blocks the others.
    advisory::lock(&client, advisory::MIGRATION).await?;
    let result = apply_pending(&mut client).await;
    let unlock = advisory::unlock(&client, advisory::MIGRATION).await;
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
