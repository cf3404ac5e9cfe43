//! A Postgres failover: `DATABASE_URL` lists a private primary and its
//! synchronous streaming standby (standby first). The pool never writes
//! to the standby while it is one, a claim committed before the primary is
//! killed is there after the standby's promotion (its redelivery is a
//! duplicate), and the pool finds the promoted standby by itself.

use std::time::{Duration, Instant};

use hookinbox::deliveries::{self, LegRequest, Policy};
use hookinbox::key::DestinationName;
use hookinbox_tests::private_pg::PrivatePg;
use hookinbox_tests::{Hook, claim_request, claimed_token};

fn leg() -> LegRequest {
    LegRequest {
        destination: DestinationName::parse("app").expect("name"),
        filtered: None,
        order_key: None,
        fair: None,
        stale_clock: None,
    }
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

#[tokio::test]
async fn a_claim_committed_before_a_failover_survives_it_and_the_pool_finds_the_new_primary() {
    let root = std::env::temp_dir().join(format!("hookinbox-failover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let primary = PrivatePg::start_new(&root).expect("primary");
    let standby = PrivatePg::standby_of(&primary, &root).expect("standby");
    // Why synchronous: a commit returns only once the standby has it, so a
    // claim answered 202 survives the primary's loss.
    let admin = connect(&primary.url(primary.port, "postgres")).await;
    for statement in [
        "alter system set synchronous_standby_names = '*'",
        "select pg_reload_conf()",
    ] {
        admin
            .batch_execute(statement)
            .await
            .expect("synchronous standby");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while admin
        .query_opt(
            "select 1 from pg_stat_replication where sync_state = 'sync'",
            &[],
        )
        .await
        .expect("replication")
        .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "the standby never became synchronous"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?connect_timeout=2",
        standby.port, primary.port
    );
    let pool = hookinbox::postgres::pool(&url, 4, Duration::from_secs(5)).expect("pool");
    hookinbox::postgres::migrate(&pool)
        .await
        .expect("migrations through the standby-first URL reach the primary");
    let policy = Policy {
        lease: Duration::from_secs(60),
        max_attempts: 5,
        publish_timeout: Duration::from_secs(5),
    };
    let hook = Hook::fixture("push");
    let client = pool.get().await.expect("client");
    let first = deliveries::claim(&client, &policy, &claim_request(&hook, vec![leg()]))
        .await
        .expect("claim");
    assert!(claimed_token(&first).is_some(), "{first:?}");
    drop(client);

    primary.stop_immediate().expect("kill the primary");
    // With the primary gone and the standby not yet promoted, no write
    // goes anywhere: whatever the pool hands out (an idle connection to
    // the dead primary, until it is found dead) is never one to the
    // standby.
    for _ in 0..5 {
        if let Ok(client) = pool.get().await {
            let recovery = client.query_one("select pg_is_in_recovery()", &[]).await;
            assert!(
                !recovery.is_ok_and(|row| row.get::<_, bool>(0)),
                "a connection to the standby was handed out for writes"
            );
        }
    }

    standby.promote().expect("promote");
    let promoted = Instant::now();
    let client = loop {
        match pool.get().await {
            Ok(client) => break client,
            Err(e) => {
                assert!(
                    promoted.elapsed() < Duration::from_secs(30),
                    "the pool never found the promoted standby: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    eprintln!(
        "the pool wrote again {:?} after the promotion",
        promoted.elapsed()
    );
    let again = deliveries::claim(&client, &policy, &claim_request(&hook, vec![leg()]))
        .await
        .expect("claim after the failover");
    assert!(
        claimed_token(&again).is_none(),
        "the claim made before the failover was lost: {again:?}"
    );
    drop(client);
    drop(pool);
    drop(standby);
    drop(primary);
    let _ = std::fs::remove_dir_all(&root);
}
