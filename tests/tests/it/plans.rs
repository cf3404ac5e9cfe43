//! The hot path's statements keep finding rows by key as the table grows,
//! even when Postgres has no statistics for it (autovacuum off, no ANALYZE).

use hookinbox::deliveries::{self, Completing, Take};
use hookinbox::key::{DeliveryId, DeliveryKey, HookId, SourceName};
use hookinbox_tests::TestEnv;

fn key(id: &str) -> DeliveryKey {
    DeliveryKey::github(
        SourceName::default_source(),
        HookId::parse(Some(b"1")).expect("digits"),
        DeliveryId::parse(id.as_bytes()).expect("ascii"),
    )
}

/// Tuples the session has read from `deliveries`: by sequential scans and
/// through every index, the primary key too (a lookup by key reads one
/// entry; a plan that hashes the whole key index reads all of them).
/// Counted as the cumulative statistics see them once the session's counts
/// are flushed.
async fn read_tuples(client: &deadpool_postgres::Object) -> i64 {
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
            "select t.seq_tup_read + coalesce(sum(i.idx_tup_read), 0)::int8 \
             from pg_stat_user_tables t \
             left join pg_stat_user_indexes i \
               on i.relid = t.relid \
             where t.relname = 'deliveries' group by t.seq_tup_read",
            &[],
        )
        .await
        .expect("stats")
        .get(0)
}

/// Claims the new delivery `id` (a store leg, through the batched claim):
/// its token.
async fn claim_new(
    client: &deadpool_postgres::Object,
    policy: &deliveries::Policy,
    id: &str,
) -> hookinbox::ClaimToken {
    // The suite's claim request, on this file's key (hook id 1).
    let mut hook = hookinbox_tests::Hook::new("push", b"{}".to_vec());
    hook.hook_id = Some("1".to_owned());
    hook.delivery = Some(id.to_owned());
    let request = hookinbox_tests::claim_request(&hook, vec![hookinbox_tests::store_leg()]);
    assert_eq!(request.key, key(id));
    let claims = deliveries::claim_batch(client, policy, &[request])
        .await
        .expect("claim");
    let Some(token) = claims.first().and_then(hookinbox_tests::claimed_token) else {
        panic!("a new key is claimed")
    };
    token
}

/// Claims, takes, renews, fences and completes one delivery through
/// `client`'s prepared statements.
async fn one_round(env: &TestEnv, client: &deadpool_postgres::Object, id: &str) {
    let policy = env.policy();
    let token = claim_new(client, &policy, id).await;
    let leg = key(id).leg(hookinbox_tests::store_destination());
    let takes = deliveries::take_batch(
        client,
        &policy,
        &[deliveries::Taking {
            key: leg.clone(),
            presented: token,
            max_attempts: policy.max_attempts,
        }],
    )
    .await
    .expect("take");
    let Some(Some(Take::Taken { token, .. })) = takes.into_iter().next() else {
        panic!("a fresh claim is taken")
    };
    // The single-row statements of a running job: renewal and fence.
    assert!(
        deliveries::renew(client, &policy, &leg, token)
            .await
            .expect("renew")
    );
    assert!(deliveries::fence(client, &leg, token).await.expect("fence"));
    let done = deliveries::complete_batch(
        client,
        &[Completing {
            key: leg,
            token,
            take: None,
            max_attempts: 3,
            store: None,
        }],
    )
    .await
    .expect("complete");
    assert!(done[0].is_some(), "completed");
    // The one-statement path: a claim completed by the statement that is
    // also its take (the order and fairness gates in it).
    let fused = format!("{id}-fused");
    let token = claim_new(client, &policy, &fused).await;
    let done = deliveries::complete_batch(
        client,
        &[Completing {
            key: key(&fused).leg(hookinbox_tests::store_destination()),
            token,
            take: Some(0),
            max_attempts: policy.max_attempts,
            store: None,
        }],
    )
    .await
    .expect("complete as the take");
    assert!(done[0].is_some(), "completed as the take");
}

#[tokio::test]
async fn statements_planned_on_an_empty_table_do_not_scan_it_once_it_has_grown() {
    let env = TestEnv::new().await;
    // One session, so the statements it prepares while the table is nearly
    // empty are the ones it runs once the table is large. Postgres caches a
    // generic plan after the fifth execution.
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    for i in 0..8 {
        one_round(&env, &client, &format!("early-{i}")).await;
    }
    // The table grows behind the cached plans, with no ANALYZE: rows that
    // were processing and have completed, as the worker leaves them (their
    // old versions stay in the indexes of processing rows until a vacuum,
    // their leases run out: what a claim's takeover looks for).
    let grown = 20_000;
    let bulk = hookinbox_tests::connect(&env.database_url).await;
    bulk.batch_execute(&format!(
        "insert into deliveries (provider, source, hook_id, delivery_id, event, body_sha256, \
             status, claim_token, lease_until) \
             select 'github', 'default', '1', 'bulk-' || g, 'push', '\\x00', 'processing', \
             gen_random_uuid(), now() - interval '1 minute' from generate_series(1, {grown}) g; \
             update deliveries set status = 'completed', completed_at = now() \
             where delivery_id like 'bulk-%'"
    ))
    .await
    .expect("grow the table");
    // Its own reads are counted before the baseline.
    bulk.batch_execute("select pg_stat_force_next_flush()")
        .await
        .expect("flush");
    bulk.batch_execute("select 1").await.expect("flushed");
    let before = read_tuples(&client).await;
    let rounds = 10;
    for i in 0..rounds {
        one_round(&env, &client, &format!("late-{i}")).await;
    }
    let read = read_tuples(&client).await - before;
    // A plan that scans reads the whole table, its key index or every row
    // that was ever processing at least once per round; lookups by key read
    // a few entries a statement.
    assert!(
        read < grown,
        "{rounds} rounds read {read} tuples of a {grown}-row table"
    );
    drop(client);
    env.cleanup().await;
}
