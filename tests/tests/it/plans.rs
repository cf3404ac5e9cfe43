//! The hot path's statements keep finding rows by key as the table grows,
//! even when Postgres has no statistics for it (autovacuum off, no ANALYZE).

use hookinbox::deliveries::{self, Claim, Completing, OwnedClaim, Take};
use hookinbox::key::{DeliveryId, DeliveryKey, HookId, SourceName};
use hookinbox_tests::TestEnv;

fn key(id: &str) -> DeliveryKey {
    DeliveryKey::github(
        SourceName::default_source(),
        HookId::parse(Some(b"1")).expect("digits"),
        DeliveryId::parse(id.as_bytes()).expect("ascii"),
    )
}

/// Tuples the session has read from `deliveries` by sequential scans, as
/// the cumulative statistics see them once its own counts are flushed.
async fn seq_tup_read(client: &deadpool_postgres::Object) -> i64 {
    // Forces this backend's pending counts out at the end of the statement,
    // and forgets any cached snapshot so the next read sees them.
    client
        .batch_execute("select pg_stat_force_next_flush()")
        .await
        .expect("flush");
    client
        .batch_execute("select pg_stat_clear_snapshot()")
        .await
        .expect("clear");
    client
        .query_one(
            "select seq_tup_read from pg_stat_user_tables where relname = 'deliveries'",
            &[],
        )
        .await
        .expect("stats")
        .get(0)
}

/// Claims, takes and completes one delivery through `client`'s prepared
/// statements.
async fn one_round(env: &TestEnv, client: &deadpool_postgres::Object, id: &str) {
    let policy = env.common().policy();
    let claims = deliveries::claim_batch(
        client,
        &policy,
        &[OwnedClaim {
            key: key(id),
            event: "push".to_owned(),
            action: None,
            body_sha256: [7; 32],
        }],
    )
    .await
    .expect("claim");
    let Some(Claim::Claimed { token, .. }) = claims.into_iter().next() else {
        panic!("a new key is claimed")
    };
    let takes = deliveries::take_batch(client, &policy, &[(key(id), token)])
        .await
        .expect("take");
    let Some(Some(Take::Taken { token, .. })) = takes.into_iter().next() else {
        panic!("a fresh claim is taken")
    };
    let done = deliveries::complete_batch(
        client,
        &[Completing {
            key: key(id),
            token,
            store: None,
        }],
    )
    .await
    .expect("complete");
    assert_eq!(done, vec![true]);
}

#[tokio::test]
async fn statements_planned_on_an_empty_table_do_not_scan_it_once_it_has_grown() {
    let env = TestEnv::new().await;
    // One session, so the statements it prepares while the table is nearly
    // empty are the ones it runs once the table is large. Postgres caches a
    // generic plan after the fifth execution.
    let pool = hookinbox::db::pool(&env.database_url, 1).expect("pool");
    let client = pool.get().await.expect("client");
    for i in 0..8 {
        one_round(&env, &client, &format!("early-{i}")).await;
    }
    // The table grows behind the cached plans, with no ANALYZE.
    let grown = 20_000;
    hookinbox_tests::connect(&env.database_url)
        .await
        .batch_execute(&format!(
            "insert into deliveries (provider, source, hook_id, delivery_id, event, body_sha256, \
             status, claim_token, completed_at) \
             select 'github', 'default', '1', 'bulk-' || g, 'push', '\\x00', 'completed', \
             gen_random_uuid(), now() from generate_series(1, {grown}) g"
        ))
        .await
        .expect("grow the table");
    let before = seq_tup_read(&client).await;
    let rounds = 10;
    for i in 0..rounds {
        one_round(&env, &client, &format!("late-{i}")).await;
    }
    let read = seq_tup_read(&client).await - before;
    // A plan that scans reads the whole table several times per round.
    assert!(
        read < grown,
        "{rounds} rounds read {read} tuples of a {grown}-row table by sequential scans"
    );
    drop(client);
    env.cleanup().await;
}
