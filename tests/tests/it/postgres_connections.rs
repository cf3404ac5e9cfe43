//! hookinbox's Postgres sessions: idle pooled connections are checked before
//! use, and a session left idle inside a transaction is ended by Postgres.

use std::time::{Duration, Instant};

use hookinbox::postgres::{CHECK_IDLE_AFTER, PoolOptions, pool_with};
use hookinbox_tests::TestEnv;
use hookinbox_tests::proxy::Proxy;

#[tokio::test]
async fn a_half_open_idle_connection_is_found_by_its_check_and_replaced_before_use() {
    let env = TestEnv::new().await;
    let proxy = Proxy::start("127.0.0.1:5432").await;
    // A long watchdog: without the check, a query on the dead connection
    // would wait all of it.
    let pool = pool_with(
        &env.database_url_via(proxy.port()),
        &PoolOptions {
            request_timeout: Duration::from_secs(30),
            ..PoolOptions::new(1)
        },
    )
    .expect("pool");
    {
        let client = pool.get().await.expect("connection");
        client.simple_query("select 1").await.expect("first query");
    }
    // The pooled connection goes half-open (its far end keeps reading and
    // never answers); new connections get through.
    proxy.stall();
    // The check is for connections idle longer than this (time in which
    // the proxy's connections also see the stall).
    tokio::time::sleep(CHECK_IDLE_AFTER + Duration::from_millis(200)).await;
    proxy.open();

    let started = Instant::now();
    let client = pool.get().await.expect("a live connection");
    let answered = tokio::time::timeout(Duration::from_secs(10), client.simple_query("select 1"))
        .await
        .expect("answered long before the watchdog")
        .is_ok();
    assert!(answered, "the query ran on a new connection");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the dead connection was given up after its 2-second check: {:?}",
        started.elapsed()
    );
    env.cleanup().await;
}

#[tokio::test]
async fn a_session_left_idle_in_a_transaction_is_ended_and_its_locks_released() {
    let env = TestEnv::new().await;
    let short = pool_with(
        &env.database_url,
        &PoolOptions {
            idle_in_transaction: Duration::from_millis(300),
            ..PoolOptions::new(1)
        },
    )
    .expect("pool");
    let mut client = short.get().await.expect("connection");
    let shown = client
        .query_one("show idle_in_transaction_session_timeout", &[])
        .await
        .expect("show")
        .get::<_, String>(0);
    assert_eq!(shown, "300ms");
    let tx = client.transaction().await.expect("begin");
    tx.batch_execute("lock table github_events in access exclusive mode")
        .await
        .expect("lock");
    // Frozen mid-transaction: Postgres ends the session and its lock goes.
    let other = hookinbox_tests::connect(&env.database_url).await;
    let waited = Instant::now();
    tokio::time::timeout(
        Duration::from_secs(10),
        other.query_one("select count(*) from github_events", &[]),
    )
    .await
    .expect("the lock was released")
    .expect("count");
    assert!(waited.elapsed() >= Duration::from_millis(200));
    let ended = tx.batch_execute("select 1").await;
    assert!(ended.is_err(), "the idle session was ended");

    // The default: a minute.
    let default = pool_with(&env.database_url, &PoolOptions::new(1)).expect("pool");
    let shown = default
        .get()
        .await
        .expect("connection")
        .query_one("show idle_in_transaction_session_timeout", &[])
        .await
        .expect("show")
        .get::<_, String>(0);
    assert_eq!(shown, "1min");
    env.cleanup().await;
}
