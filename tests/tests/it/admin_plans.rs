//! Every list and count of the admin console (and of the CLI's filters)
//! reads `deliveries` through an index: `EXPLAIN EXECUTE` of each
//! statement, prepared in a session with hookinbox's own planner settings
//! (generic plans, sequential scans off), finds no sequential scan of the
//! table, and each single-field filter counts through the index led by its
//! column.

use chrono::Utc;
use hookinbox::deliveries::{
    EXACT_COMPLETED_UP_TO, ErrorClass, Filter, GAUGES_STATEMENT, OVERVIEW_STATEMENTS, State,
    statements_for_explain,
};
use hookinbox_tests::TestEnv;
use serde_json::Value;

/// Every `(node type, relation or index)` of a JSON plan.
fn nodes(plan: &Value, out: &mut Vec<(String, String)>) {
    let kind = plan["Node Type"].as_str().unwrap_or("").to_owned();
    let on = plan["Index Name"]
        .as_str()
        .or(plan["Relation Name"].as_str())
        .unwrap_or("")
        .to_owned();
    out.push((kind, on));
    for child in plan["Plans"].as_array().into_iter().flatten() {
        nodes(child, out);
    }
}

async fn explain(
    client: &deadpool_postgres::Object,
    sql: &str,
    params: &[String],
) -> Vec<(String, String)> {
    client
        .batch_execute("deallocate all")
        .await
        .expect("deallocate");
    client
        .batch_execute(&format!("prepare q as {sql}"))
        .await
        .unwrap_or_else(|e| panic!("prepare {sql}: {e}"));
    let execute = if params.is_empty() {
        "execute q".to_owned()
    } else {
        format!("execute q({})", params.join(", "))
    };
    let row = client
        .query_one(&format!("explain (format json) {execute}"), &[])
        .await
        .unwrap_or_else(|e| panic!("explain {sql}: {e}"));
    let plan: Value = row.get(0);
    let mut out = Vec::new();
    nodes(&plan[0]["Plan"], &mut out);
    out
}

#[tokio::test]
async fn every_console_list_and_count_reads_deliveries_through_an_index() {
    let env = TestEnv::new().await;
    // A table with some history: settled rows of several sources, events
    // and repositories, a few failures, a few in flight; then statistics.
    env.db
        .batch_execute(
            "insert into deliveries (provider, source, hook_id, delivery_id, event, action, repository,
                 body_sha256, status, retryable, claim_token, lease_until, created_at,
                 completed_at, failed_at, last_error_class)
             select 'github', 'src' || (g % 5), '1', md5(g::text), 'ev' || (g % 40), 'act' || (g % 7),
                 'owner/repo' || (g % 300), '\\x00',
                 case when g % 100 = 0 then 'failed' when g % 250 = 1 then 'processing' else 'completed' end,
                 g % 200 = 0, gen_random_uuid(),
                 case when g % 250 = 1 then now() + interval '1 minute' end,
                 now() - make_interval(secs => g),
                 case when g % 100 <> 0 and g % 250 <> 1 then now() - make_interval(secs => g) end,
                 case when g % 100 = 0 then now() - make_interval(secs => g) end,
                 case when g % 100 = 0 then (array['permanent','poison','transient'])[1 + g % 3] end
             from generate_series(1, 30000) g;
             analyze deliveries;",
        )
        .await
        .expect("grow the table");
    // The console's own session settings (hookinbox's pool).
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    let hour_ago = Utc::now() - chrono::Duration::hours(1);
    let cases: Vec<(&str, Filter, Option<&str>)> = vec![
        (
            "everything",
            Filter::default(),
            Some("deliveries_settled_created"),
        ),
        (
            "status",
            Filter {
                states: vec![State::Completed],
                ..Filter::default()
            },
            None,
        ),
        (
            "processing",
            Filter {
                states: vec![State::Processing],
                ..Filter::default()
            },
            None,
        ),
        (
            "dead",
            Filter {
                states: vec![State::Dead],
                ..Filter::default()
            },
            None,
        ),
        (
            "retrying",
            Filter {
                states: vec![State::Retrying],
                ..Filter::default()
            },
            None,
        ),
        (
            "waiting",
            Filter {
                states: vec![State::Waiting],
                ..Filter::default()
            },
            None,
        ),
        (
            "source",
            Filter {
                source: Some("src1".into()),
                ..Filter::default()
            },
            Some("deliveries_settled_source"),
        ),
        (
            "event",
            Filter {
                event: Some("ev3".into()),
                ..Filter::default()
            },
            Some("deliveries_settled_event"),
        ),
        (
            "event and action",
            Filter {
                event: Some("ev3".into()),
                action: Some("act3".into()),
                ..Filter::default()
            },
            Some("deliveries_settled_event"),
        ),
        (
            "action",
            Filter {
                action: Some("act3".into()),
                ..Filter::default()
            },
            None,
        ),
        (
            "repository",
            Filter {
                repository: Some("Owner/Repo7".into()),
                ..Filter::default()
            },
            Some("deliveries_settled_repository_nocase"),
        ),
        (
            "error class",
            Filter {
                error_class: Some(ErrorClass::Poison),
                ..Filter::default()
            },
            Some("deliveries_settled_error_class"),
        ),
        (
            "dead by class",
            Filter {
                states: vec![State::Dead],
                error_class: Some(ErrorClass::Permanent),
                ..Filter::default()
            },
            None,
        ),
        (
            "since",
            Filter {
                created_since: Some(hour_ago),
                ..Filter::default()
            },
            Some("deliveries_settled_created"),
        ),
        (
            "until",
            Filter {
                created_until: Some(hour_ago),
                ..Filter::default()
            },
            None,
        ),
        (
            "id prefix",
            Filter {
                id_prefix: Some("abc".into()),
                ..Filter::default()
            },
            Some("deliveries_settled_delivery_id"),
        ),
        (
            "ids",
            Filter {
                ids: Some(vec!["abc".into()]),
                ..Filter::default()
            },
            Some("deliveries_settled_delivery_id"),
        ),
        (
            "one delivery",
            Filter {
                source: Some("src1".into()),
                ids: Some(vec!["abc".into()]),
                hook_id: Some("1".into()),
                ..Filter::default()
            },
            None,
        ),
        (
            // No index leads with the destination (each would cost the hot
            // path an entry per leg): a list reads the newest rows in order
            // and filters them; a source narrows it through its index.
            "destination",
            Filter {
                destination: Some("ci".into()),
                ..Filter::default()
            },
            None,
        ),
        (
            "dead legs of a destination",
            Filter {
                states: vec![State::Dead],
                source: Some("src1".into()),
                destination: Some("ci".into()),
                ..Filter::default()
            },
            None,
        ),
        (
            "dead of a source since",
            Filter {
                states: vec![State::Dead],
                source: Some("src2".into()),
                created_since: Some(hour_ago),
                ..Filter::default()
            },
            None,
        ),
    ];
    let mut report = Vec::new();
    for (name, filter, index) in &cases {
        for (i, (sql, params)) in statements_for_explain(filter).iter().enumerate() {
            let what = ["list", "next page", "count"][i];
            let plan = explain(&client, sql, params).await;
            let scans: Vec<_> = plan
                .iter()
                .filter(|(k, on)| k == "Seq Scan" && on == "deliveries")
                .collect();
            assert!(
                scans.is_empty(),
                "{name} ({what}) scans deliveries: {plan:?}\n{sql}"
            );
            let reads_deliveries = plan
                .iter()
                .any(|(k, on)| k.contains("Index") && on.starts_with("deliveries"));
            assert!(
                reads_deliveries,
                "{name} ({what}) uses no index of deliveries: {plan:?}"
            );
            // A count reads every match, so it must use the filter's own
            // index; a list may rather read the newest rows in order and
            // filter them, when the planner finds the filter unselective.
            if let (Some(index), "count") = (index, what) {
                assert!(
                    plan.iter().any(|(_, on)| on == index),
                    "{name} ({what}) does not use {index}: {plan:?}"
                );
            }
            report.push(format!(
                "{name} ({what}): {:?}",
                plan.iter()
                    .filter(|(k, _)| k.contains("Index"))
                    .collect::<Vec<_>>()
            ));
        }
    }
    for sql in OVERVIEW_STATEMENTS {
        let plan = explain(&client, sql, &[]).await;
        assert!(
            !plan
                .iter()
                .any(|(k, on)| k == "Seq Scan" && on == "deliveries"),
            "the overview scans deliveries: {plan:?}\n{sql}"
        );
    }
    // The state gauges, sampled every ten seconds: through indexes too,
    // completed rows by a bounded index-only count.
    let plan = explain(
        &client,
        GAUGES_STATEMENT,
        &[format!("{EXACT_COMPLETED_UP_TO}::int8")],
    )
    .await;
    assert!(
        !plan
            .iter()
            .any(|(k, on)| k == "Seq Scan" && on == "deliveries"),
        "the gauges scan deliveries: {plan:?}"
    );
    assert!(
        plan.iter()
            .any(|(k, on)| k == "Index Only Scan" && on == "deliveries_completed"),
        "completed rows are counted from their index: {plan:?}"
    );
    println!("{}", report.join("\n"));
    drop(client);
    env.cleanup().await;
}
