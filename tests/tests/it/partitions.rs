//! Day partitions of `github_events` and `destination_attempts`
//! (migration 0022): a redelivery across a day boundary still finds its
//! first claim and its one stored event, and retention drops whole days.

use chrono::{Days, NaiveDate, Utc};
use hookinbox::deliveries::partitions::{DESTINATION_ATTEMPTS, GITHUB_EVENTS};
use hookinbox_tests::{Hook, TestEnv, settle};

/// The partition `delivery_id`'s stored event is in.
async fn event_partition(env: &TestEnv, delivery_id: &str) -> Vec<String> {
    env.db
        .query(
            "select tableoid::regclass::text from github_events where delivery_id = $1",
            &[&delivery_id],
        )
        .await
        .expect("event partition")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

async fn exists(env: &TestEnv, table: &str) -> bool {
    env.db
        .query_one("select to_regclass($1) is not null", &[&table])
        .await
        .expect("to_regclass")
        .get(0)
}

fn days_ago(n: u64) -> NaiveDate {
    Utc::now().date_naive() - Days::new(n)
}

#[tokio::test]
async fn a_redelivery_across_a_day_boundary_finds_its_first_claim_and_its_one_stored_event() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let worker = env.store_worker().await;
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    let (yesterday, today) = (days_ago(1), days_ago(0));
    assert!(
        GITHUB_EVENTS
            .ensure(&client, yesterday)
            .await
            .expect("ensure")
            .count
            >= 2
    );

    let hook = Hook::fixture("push");
    let id = hook.delivery.clone().expect("a delivery id");
    assert_eq!(ingest.send(&hook).await.status, 202);
    settle(&env, &worker).await;
    assert_eq!(
        event_partition(&env, &id).await,
        [GITHUB_EVENTS.partition(today)]
    );

    // Claimed a second before midnight: its event moves to yesterday.
    env.db
        .execute(
            "with at as (select (current_date - 1)::timestamptz + interval '23:59:59' as t)
             update deliveries set created_at = (select t from at) where delivery_id = $1",
            &[&id],
        )
        .await
        .expect("age the claim");
    env.db
        .execute(
            "update github_events e set received_at = d.created_at
             from deliveries d where d.delivery_id = e.delivery_id and e.delivery_id = $1",
            &[&id],
        )
        .await
        .expect("age the event");
    assert_eq!(
        event_partition(&env, &id).await,
        [GITHUB_EVENTS.partition(yesterday)]
    );

    // GitHub's redelivery today: the claim table is whole, so it is found.
    let again = ingest.send(&hook).await;
    assert_eq!((again.status, again.kind()), (200, "duplicate"));
    settle(&env, &worker).await;

    assert_eq!(event_partition(&env, &id).await.len(), 1, "stored once");

    // Past the completed retention its claim and remembered body are
    // swept, and a request of it is claimed anew, today: it runs again,
    // as with every handler, and its event is stored under today.
    env.db
        .execute("delete from deliveries where delivery_id = $1", &[&id])
        .await
        .expect("sweep the claim");
    env.db
        .execute("delete from seen_bodies where delivery_id = $1", &[&id])
        .await
        .expect("sweep the remembered body");
    let anew = ingest.send(&hook).await;
    assert_eq!(
        (anew.status, anew.kind()),
        (202, "accepted"),
        "{:?}",
        anew.body
    );
    settle(&env, &worker).await;
    assert_eq!(
        env.count(&format!(
            "select count(*) from deliveries where delivery_id = '{id}' and status = 'completed' \
             and created_at::date = current_date"
        ))
        .await,
        1,
        "claimed anew today and completed"
    );
    let mut stored = event_partition(&env, &id).await;
    stored.sort();
    let mut expected = [
        GITHUB_EVENTS.partition(yesterday),
        GITHUB_EVENTS.partition(today),
    ];
    expected.sort();
    assert_eq!(stored, expected);
    // The console's payload: the body as received, kept by the new claim.
    let payload = hookinbox::deliveries::stored_payload(&client, &hook.leg())
        .await
        .expect("stored payload")
        .expect("one");
    assert_eq!(payload.raw.as_deref(), Some(&hook.body[..]));
    drop(client);
    env.cleanup().await;
}

#[tokio::test]
async fn retention_drops_whole_days_and_sweeps_the_default_partition_by_rows() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let worker = env.store_worker().await;
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    // Partitions for a week from 50 days ago, and for this week.
    let old = days_ago(50);
    for table in [GITHUB_EVENTS, DESTINATION_ATTEMPTS] {
        assert_eq!(
            table.ensure(&client, old).await.expect("ensure old").count,
            8
        );
        assert_eq!(
            table
                .ensure(&client, days_ago(0))
                .await
                .expect("ensure")
                .count,
            8
        );
    }
    // One event 50 days old (into its day's partition), one 40 (a day
    // without one: the default partition), one fresh; and the same ages
    // in the attempt log.
    hookinbox_tests::stored_events_aged(&env, &ingest, &worker, &[50, 40, 0]).await;
    env.db
        .batch_execute(
            "insert into destination_attempts
                 (at, provider, source, hook_id, delivery_id, destination, attempt, result,
                  duration_ms)
             select now() - make_interval(days => d), 'github', 'test', '', 'x' || d, 'ci', 1,
                    'ok', 1
             from unnest(array[50, 40, 0]) d",
        )
        .await
        .expect("age rows");
    assert_eq!(
        env.count(
            "select count(*) from github_events where tableoid = 'github_events_default'::regclass"
        )
        .await,
        1
    );

    let out = hookinbox_tests::worker_command(&env, &["sweep"], &[])
        .output()
        .expect("runs");
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    // 30 days for both: the old week's 8 partitions of each table go whole,
    // the 40-day-old rows one by one from the defaults.
    assert!(
        out.contains("1 stored events and 1 logged attempts; dropped 16 day partitions"),
        "{out}"
    );
    assert_eq!(env.events().await, 1);
    assert_eq!(
        env.count("select count(*) from destination_attempts").await,
        1
    );
    for table in [GITHUB_EVENTS, DESTINATION_ATTEMPTS] {
        assert!(!exists(&env, &table.partition(old)).await);
        assert!(exists(&env, &table.partition(days_ago(0))).await);
        assert!(exists(&env, &table.default_partition()).await);
        assert_eq!(table.days(&client).await.expect("days").len(), 8);
    }
    assert_eq!(env.deliveries().await, 3, "their deliveries are kept");
    drop(client);
    env.cleanup().await;
}

#[tokio::test]
async fn a_day_held_by_a_long_transaction_is_left_to_the_next_sweep() {
    let env = TestEnv::new().await;
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    let old = days_ago(50);
    assert_eq!(
        GITHUB_EVENTS
            .ensure(&client, old)
            .await
            .expect("ensure")
            .count,
        8
    );
    // A reader of the table, its transaction left open.
    let reader = hookinbox_tests::connect(&env.database_url).await;
    reader
        .batch_execute("begin; select count(*) from github_events")
        .await
        .expect("read");
    let sweep = || {
        let out = hookinbox_tests::worker_command(&env, &["sweep"], &[])
            .output()
            .expect("runs");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (out, err) = sweep();
    assert!(out.contains("dropped 0 day partitions"), "{out}");
    assert_eq!(err.matches("waited 1s for its lock").count(), 1, "{err}");
    assert!(exists(&env, &GITHUB_EVENTS.partition(old)).await);
    reader.batch_execute("commit").await.expect("commit");
    let (out, _) = sweep();
    assert!(out.contains("dropped 8 day partitions"), "{out}");
    assert!(!exists(&env, &GITHUB_EVENTS.partition(old)).await);
    drop(client);
    env.cleanup().await;
}

/// A database at the migration before day partitions (0021), with its
/// bookkeeping, as an earlier version left it: (name, url).
async fn database_before_day_partitions() -> (String, String) {
    use sha2::Digest;
    let name = format!("hookinbox_test_{}", uuid::Uuid::new_v4().simple());
    let admin =
        hookinbox_tests::connect(&format!("{}/postgres", hookinbox_tests::postgres_base())).await;
    admin
        .batch_execute(&format!("create database {name}"))
        .await
        .expect("create database");
    let url = format!("{}/{name}", hookinbox_tests::postgres_base());
    let db = hookinbox_tests::connect(&url).await;
    db.batch_execute(
        "create table hookinbox_migrations (version integer primary key, name text not null,
             checksum bytea not null, applied_at timestamptz not null default now())",
    )
    .await
    .expect("bookkeeping");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/migrations");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("migrations")
        .map(|e| e.expect("entry").file_name().into_string().expect("name"))
        .filter(|f| f.as_str() < "0022")
        .collect();
    files.sort();
    assert_eq!(files.len(), 21);
    for (i, file) in files.iter().enumerate() {
        let sql = std::fs::read_to_string(dir.join(file)).expect("read");
        db.batch_execute(&format!("begin; {sql}; commit"))
            .await
            .expect(file);
        let checksum = sha2::Sha256::digest(sql.as_bytes()).to_vec();
        db.execute(
            "insert into hookinbox_migrations (version, name, checksum) values ($1, $2, $3)",
            &[&(i as i32 + 1), file, &checksum],
        )
        .await
        .expect("record");
    }
    (name, url)
}

#[tokio::test]
async fn an_upgrade_keeps_the_old_rows_in_one_partition_until_they_are_past_retention() {
    let (name, url) = database_before_day_partitions().await;
    let db = hookinbox_tests::connect(&url).await;
    // Two stored events, 40 days and an hour old; an attempt 40 days old.
    db.batch_execute(
        "insert into github_events
             (provider, source, hook_id, delivery_id, event, payload, received_at)
         values ('github', 'github', '', 'old', 'push', '{}', now() - interval '40 days'),
                ('github', 'github', '', 'new', 'push', '{}', now() - interval '1 hour');
         insert into destination_attempts
             (at, provider, source, hook_id, delivery_id, destination, attempt, result,
              duration_ms)
         values (now() - interval '40 days', 'github', 'github', '', 'old', 'ci', 1, 'ok', 1)",
    )
    .await
    .expect("old rows");
    let pool = hookinbox::postgres::pool(&url, 1, hookinbox::postgres::DEFAULT_REQUEST_TIMEOUT)
        .expect("pool");
    assert_eq!(
        hookinbox::postgres::migrate(&pool).await.expect("migrate"),
        2,
        "0022, then 0023"
    );

    let tomorrow = days_ago(0) + Days::new(1);
    let old_part = format!("github_events_to_{}", tomorrow.format("%Y%m%d"));
    let count = |sql: String| {
        let db = &db;
        async move {
            db.query_one(&sql, &[])
                .await
                .expect("count")
                .get::<_, i64>(0)
        }
    };
    assert_eq!(count(format!("select count(*) from {old_part}")).await, 2);
    assert_eq!(count("select count(*) from github_events".into()).await, 2);

    // The sweep: today is the old rows' (no partition for it), the week
    // after gets partitions; the 40-day-old rows go by rows.
    let client = pool.get().await.expect("client");
    let kept = std::time::Duration::from_secs(30 * 86_400);
    let retention = hookinbox::deliveries::Retention {
        completed: kept,
        failed: kept,
        events: Some(kept),
        bodies: kept,
    };
    let swept = hookinbox::deliveries::sweep(&client, &retention, 500)
        .await
        .expect("sweep");
    assert_eq!(
        (
            swept.events,
            swept.attempts,
            swept.partitions,
            swept.created
        ),
        (1, 1, 0, 14)
    );
    assert_eq!(
        GITHUB_EVENTS.days(&client).await.expect("days").first(),
        Some(&tomorrow)
    );
    // A new row lands in its day's partition.
    db.batch_execute(
        "insert into github_events
             (provider, source, hook_id, delivery_id, event, payload, received_at)
         values ('github', 'github', '', 'later', 'push', '{}', now() + interval '1 day')",
    )
    .await
    .expect("a later row");
    assert_eq!(
        count(format!(
            "select count(*) from {}",
            GITHUB_EVENTS.partition(tomorrow)
        ))
        .await,
        1
    );
    // Once its last day is past retention, the old rows' partition goes
    // whole.
    let later = Utc::now() + chrono::Duration::days(31);
    let dropped = GITHUB_EVENTS
        .drop_expired(&client, later, kept)
        .await
        .expect("drop");
    assert_eq!(dropped.count, 1);
    assert!(!exists_in(&db, &old_part).await);
    assert_eq!(count("select count(*) from github_events".into()).await, 1);
    drop(client);
    drop(pool);
    hookinbox_tests::drop_database(&name).await;
}

async fn exists_in(db: &tokio_postgres::Client, table: &str) -> bool {
    db.query_one("select to_regclass($1) is not null", &[&table])
        .await
        .expect("to_regclass")
        .get(0)
}
