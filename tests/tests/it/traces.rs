//! Traces: one trace per delivery from ingest's request through the
//! worker's job to the destination (whose request carries the trace's
//! `traceparent`), exported over OTLP/HTTP to a local receiver that
//! decodes the protobuf; a retry and a replay of a dead letter start
//! traces of their own that link back to the first; a redelivery the
//! reconciler asked GitHub for (the fake GitHub sends it to ingest) links
//! to the reconciler's request, and to the first request when the delivery
//! was stored before; with no endpoint, no trace context anywhere.

use std::time::Duration;

use hookinbox_tests::github::FakeGithub;
use hookinbox_tests::otlp::{Collector, Span, render};
use hookinbox_tests::receiver::{Receiver, Reply};
use hookinbox_tests::{Hook, SECRET, Spawned, TestEnv, fixtures, wait_until, worker_command};

/// ingest and a forwarding worker, both exporting to `collector` (when
/// given) in batches every 100 ms.
fn spawn_pair(
    env: &TestEnv,
    receiver: &Receiver,
    collector: Option<&Collector>,
) -> (Spawned, Spawned) {
    let mut common = vec![("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned())];
    if let Some(c) = collector {
        common.push(("OTEL_EXPORTER_OTLP_ENDPOINT", c.endpoint.clone()));
    }
    let mut ingest_env = common.clone();
    ingest_env.extend([
        ("HOOKINBOX_GITHUB_SECRET", SECRET.to_owned()),
        ("HOOKINBOX_HANDLER", "forward".to_owned()),
    ]);
    let mut worker_env = common;
    worker_env.extend([
        ("HOOKINBOX_HANDLER", "forward".to_owned()),
        ("HOOKINBOX_FORWARD_URL", receiver.url.clone()),
        ("HOOKINBOX_RETRY_BASE_MS", "100".to_owned()),
        ("HOOKINBOX_RETRY_MAX_MS", "200".to_owned()),
        ("HOOKINBOX_SCHEDULER_INTERVAL_MS", "50".to_owned()),
    ]);
    (
        env.spawn("hookinbox-ingest", &borrow(&ingest_env)),
        env.spawn("hookinbox-worker", &borrow(&worker_env)),
    )
}

fn borrow<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    v.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// The trace id and parent span id of a `traceparent`.
fn parse_traceparent(value: &str) -> (String, String) {
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "{value}");
    assert_eq!(parts[0], "00", "{value}");
    (parts[1].to_owned(), parts[2].to_owned())
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn one<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "one {name} in\n{}", render(spans));
    found[0]
}

/// Whether `child` descends from `ancestor` within `spans`.
fn descends(spans: &[Span], child: &Span, ancestor: &Span) -> bool {
    let mut at = child;
    while let Some(parent) = spans.iter().find(|s| s.span_id == at.parent_span_id) {
        if parent.span_id == ancestor.span_id {
            return true;
        }
        at = parent;
    }
    false
}

/// [`spawn_pair`], once ingest is ready and the worker consumes; and
/// ingest's base URL.
async fn start_pair(
    env: &TestEnv,
    receiver: &Receiver,
    collector: Option<&Collector>,
) -> (Spawned, Spawned, String) {
    let (ingest, worker) = spawn_pair(env, receiver, collector);
    ingest.wait_ready().await;
    consuming(&worker).await;
    let base = format!("http://127.0.0.1:{}", ingest.port);
    (ingest, worker, base)
}

/// Waits until a spawned worker consumes.
async fn consuming(worker: &Spawned) {
    wait_until("the worker to consume", Duration::from_secs(30), || async {
        worker.logs().contains("\"consuming\"")
    })
    .await;
}

/// Waits until the collector holds the spans named in `names` for
/// `trace_id` (the exporters send in batches).
async fn wait_for_spans(collector: &Collector, trace_id: &str, names: &[&str]) -> Vec<Span> {
    wait_until("the trace's spans", Duration::from_secs(30), || async {
        let spans = collector.trace(trace_id);
        names.iter().all(|n| spans.iter().any(|s| s.name == *n))
    })
    .await;
    collector.trace(trace_id)
}

#[tokio::test]
async fn one_trace_per_delivery_spans_ingest_worker_and_destination() {
    let env = TestEnv::new().await;
    let collector = Collector::start().await;
    let receiver = Receiver::ok().await;
    let (ingest, worker, base) = start_pair(&env, &receiver, Some(&collector)).await;
    let hook = Hook::fixture("push");
    assert_eq!(hook.post(&reqwest::Client::new(), &base).await.status, 202);
    wait_until("the forward", Duration::from_secs(30), || async {
        receiver.received().len() == 1
    })
    .await;

    // The destination's request carries the trace.
    let forwarded = receiver.received().remove(0);
    let traceparent = forwarded.header("traceparent").expect("a traceparent");
    let (trace_id, forward_span) = parse_traceparent(traceparent);
    let spans = wait_for_spans(
        &collector,
        &trace_id,
        &[
            "ingest.request",
            "ingest.read_and_verify",
            "ingest.claim",
            "ingest.publish_or_park",
            "ingest.answer",
            "worker.job",
            "worker.take",
            "worker.handler",
            "forward.attempt",
            "worker.complete",
        ],
    )
    .await;
    println!(
        "one delivery's trace, as the OTLP receiver got it:\n{}  destination (tests/src/receiver.rs) got traceparent: {traceparent}\n",
        render(&spans)
    );

    // One trace across both services, rooted at ingest's request.
    let request = one(&spans, "ingest.request");
    assert_eq!(request.service, "hookinbox-ingest");
    assert!(request.parent_span_id.is_empty(), "the root");
    assert_eq!(request.kind, "SPAN_KIND_SERVER");
    assert_eq!(request.attribute("delivery_id"), Some(hook.id()));
    assert_eq!(
        request.attribute("delivery_key"),
        Some(format!("github:default:123456:{}", hook.id()).as_str())
    );
    assert_eq!(request.attribute("event"), Some("push"));
    assert_eq!(request.attribute("outcome"), Some("accepted"));
    assert_eq!(request.attribute("http.response.status_code"), Some("202"));
    for step in [
        "ingest.read_and_verify",
        "ingest.claim",
        "ingest.publish_or_park",
        "ingest.answer",
    ] {
        assert_eq!(one(&spans, step).parent_span_id, request.span_id, "{step}");
    }
    let job = one(&spans, "worker.job");
    assert_eq!(job.service, "hookinbox-worker");
    assert_eq!(job.kind, "SPAN_KIND_CONSUMER");
    assert_eq!(
        job.parent_span_id,
        one(&spans, "ingest.publish_or_park").span_id,
        "the job continues ingest's trace through the message's traceparent"
    );
    assert_eq!(job.attribute("outcome"), Some("completed"));
    let handler = one(&spans, "worker.handler");
    assert_eq!(handler.parent_span_id, job.span_id);
    let attempt = one(&spans, "forward.attempt");
    assert_eq!(attempt.parent_span_id, handler.span_id);
    assert_eq!(attempt.kind, "SPAN_KIND_CLIENT");
    assert_eq!(attempt.attribute("http.response.status_code"), Some("200"));
    assert_eq!(
        attempt.span_id, forward_span,
        "the destination's parent is the attempt's span"
    );
    for span in &spans {
        assert!(descends(&spans, span, request) || span.span_id == request.span_id);
    }

    // Never the payload, a secret or a signature: short values, none of
    // them the secret or the signature, no attribute named for them.
    let signature = hook.signature.clone().expect("signed");
    for span in collector.spans() {
        for (k, v) in &span.attributes {
            assert!(v.len() < 120, "{k}: {v}");
            assert!(!v.contains(SECRET) && !v.contains(&signature[7..]), "{k}");
            for word in ["payload", "body", "secret", "signature"] {
                assert!(!k.contains(word), "{k}");
            }
        }
    }

    // Log lines carry the trace and span ids.
    let logs = worker.logs();
    let done = logs
        .lines()
        .find(|l| l.contains("job done"))
        .expect("the job's log line");
    assert!(
        done.contains(&format!("\"trace_id\":\"{trace_id}\"")),
        "{done}"
    );
    assert!(
        done.contains(&format!("\"span_id\":\"{}\"", job.span_id)),
        "{done}"
    );
    let answered = ingest.logs();
    let answered = answered
        .lines()
        .find(|l| l.contains("webhook answered"))
        .expect("ingest's log line");
    assert!(
        answered.contains(&format!("\"trace_id\":\"{trace_id}\"")),
        "{answered}"
    );

    // The row keeps the first trace, for retries and replays to link to.
    let stored: String = env
        .pool(1)
        .get()
        .await
        .expect("client")
        .query_one("select traceparent from deliveries", &[])
        .await
        .expect("row")
        .get(0);
    assert_eq!(
        parse_traceparent(&stored),
        (trace_id, request.span_id.clone())
    );
    assert_eq!(collector.bad_requests(), 0);
    collector.stop().await;
    receiver.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_retry_and_a_replayed_dead_letter_link_back_to_the_first_trace() {
    let env = TestEnv::new().await;
    let collector = Collector::start().await;
    // 503 (retried), then 422 (dead-lettered), then 200 once replayed.
    let receiver = Receiver::start(|_, seen| match seen {
        0 => Reply::status(503),
        1 => Reply::status(422),
        _ => Reply::status(200),
    })
    .await;
    let (_ingest, _worker, base) = start_pair(&env, &receiver, Some(&collector)).await;
    let hook = Hook::fixture("push");
    assert_eq!(hook.post(&reqwest::Client::new(), &base).await.status, 202);
    wait_until("the dead letter", Duration::from_secs(30), || async {
        env.count("select count(*) from deliveries where status = 'failed' and not retryable")
            .await
            == 1
    })
    .await;
    let out = worker_command(
        &env,
        &["dlq", "replay", hook.id()],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str())],
    )
    .output()
    .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    wait_until("the replayed forward", Duration::from_secs(30), || async {
        receiver.received().len() == 3
    })
    .await;

    let traces: Vec<(String, String)> = receiver
        .received()
        .iter()
        .map(|r| parse_traceparent(r.header("traceparent").expect("a traceparent")))
        .collect();
    let first = &traces[0].0;
    let first_spans = wait_for_spans(&collector, first, &["ingest.request", "worker.job"]).await;
    let request = one(&first_spans, "ingest.request");
    for (i, (trace_id, _)) in traces.iter().enumerate().skip(1) {
        assert_ne!(trace_id, first, "attempt {i} is a trace of its own");
        let spans = wait_for_spans(&collector, trace_id, &["worker.job", "forward.attempt"]).await;
        let what = if i == 1 { "the retry" } else { "the replay" };
        println!("{what}'s trace:\n{}", render(&spans));
        let job = one(&spans, "worker.job");
        assert!(job.parent_span_id.is_empty(), "{what}: a root");
        assert_eq!(
            job.links,
            vec![(first.clone(), request.span_id.clone())],
            "{what} links to the first trace's request"
        );
        assert!(named(&spans, "ingest.request").is_empty());
    }
    collector.stop().await;
    receiver.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_reconciler_redelivery_links_to_the_reconcilers_request_and_to_the_stored_trace() {
    let env = TestEnv::new().await;
    let collector = Collector::start().await;
    let ingest = env.spawn(
        "hookinbox-ingest",
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.endpoint),
            ("HOOKINBOX_GITHUB_SECRET", SECRET),
        ],
    );
    ingest.wait_ready().await;
    let token = "ghp_traces_test_token";
    let fake = FakeGithub::start(token);
    let hook =
        fake.add_acme_widgets_hook(format!("http://127.0.0.1:{}/webhooks/github", ingest.port));
    // `never`: GitHub got no answer and hookinbox holds nothing of it.
    let never = fake.record_unanswered_push(hook);
    // `stored`: ingest claimed it (traced), GitHub timed out, and the
    // claim's ingest died before its job was taken; its body is not kept
    // (a claim of the version before the claim wrote bodies): only a
    // redelivery finishes it.
    let (stored, status) = fake
        .deliver(hook, "push", &fixtures::unique(&fixtures::own("push")))
        .await;
    assert_eq!(status, 202);
    fake.mark_timed_out(&stored);
    env.db
        .execute(
            "update deliveries set lease_until = now() - interval '1 second' \
             where delivery_id = $1",
            &[&stored],
        )
        .await
        .expect("the claim's lease runs out");
    env.db
        .execute("delete from bodies where delivery_id = $1", &[&stored])
        .await
        .expect("no body kept");

    let token_file = std::env::temp_dir().join(format!("{}-traces-token", env.prefix));
    std::fs::write(&token_file, format!("{token}\n")).expect("token");
    let token_file = token_file.to_string_lossy().into_owned();
    let out = tokio::process::Command::from(worker_command(
        &env,
        &["reconcile", "--json"],
        &[
            ("HOOKINBOX_RECONCILE_HOOK", "repo:acme/widgets/123456"),
            ("HOOKINBOX_GITHUB_API_URL", &fake.base),
            ("HOOKINBOX_GITHUB_TOKEN_FILE", &token_file),
            ("HOOKINBOX_RECONCILE_MIN_AGE_SECS", "0"),
            ("HOOKINBOX_RECONCILE_PER_SECOND", "200"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.endpoint),
        ],
    ))
    .output()
    .await
    .expect("runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!((fake.resent(&never), fake.resent(&stored)), (1, 1));

    // The spans of a delivery: the reconciler's ask, and ingest's requests.
    let of = |spans: &[Span], name: &str, id: &str| -> Vec<Span> {
        spans
            .iter()
            .filter(|s| s.name == name && s.attribute("delivery_id") == Some(id))
            .cloned()
            .collect()
    };
    wait_until("the spans of both", Duration::from_secs(30), || async {
        let spans = collector.spans();
        of(&spans, "reconcile.redeliver", &never).len() == 1
            && of(&spans, "reconcile.redeliver", &stored).len() == 1
            && of(&spans, "ingest.request", &never).len() == 1
            && of(&spans, "ingest.request", &stored).len() == 2
    })
    .await;
    let spans = collector.spans();
    let asked_never = &of(&spans, "reconcile.redeliver", &never)[0];
    let asked_stored = &of(&spans, "reconcile.redeliver", &stored)[0];
    println!(
        "the reconciler's pass:\n{}",
        render(&collector.trace(&asked_never.trace_id))
    );
    for asked in [asked_never, asked_stored] {
        assert_eq!(asked.service, "hookinbox-worker");
        assert_eq!(asked.kind, "SPAN_KIND_CLIENT");
        assert_eq!(asked.attribute("result"), Some("accepted"));
        let pass = spans
            .iter()
            .find(|s| s.span_id == asked.parent_span_id)
            .expect("its parent");
        assert_eq!(pass.name, "reconcile.pass");
        assert_eq!(pass.attribute("outcome"), Some("complete"));
    }
    let link = |s: &Span| (s.trace_id.clone(), s.span_id.clone());

    // Never stored: the redelivered request is a trace of its own, linked
    // to the reconciler's ask.
    let redelivered = &of(&spans, "ingest.request", &never)[0];
    println!(
        "the redelivered request:\n{}",
        render(&collector.trace(&redelivered.trace_id))
    );
    assert!(redelivered.parent_span_id.is_empty(), "a root");
    assert_ne!(redelivered.trace_id, asked_never.trace_id);
    assert_eq!(redelivered.attribute("outcome"), Some("accepted"));
    assert_eq!(redelivered.links, vec![link(asked_never)]);

    // Stored before: linked to the ask and to the first request's trace.
    let mut requests = of(&spans, "ingest.request", &stored);
    requests.sort_by_key(|s| !s.links.is_empty());
    let (first, again) = (&requests[0], &requests[1]);
    assert!(first.links.is_empty(), "GitHub's first send links nowhere");
    assert_eq!(again.attribute("outcome"), Some("accepted"));
    assert_eq!(again.links, vec![link(asked_stored), link(first)]);
    println!(
        "the stored delivery's redelivered request links to {:?}",
        again.links
    );
    assert_eq!(collector.bad_requests(), 0);
    let _ = std::fs::remove_file(&token_file);
    collector.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn with_no_endpoint_nothing_carries_a_trace() {
    let env = TestEnv::new().await;
    let receiver = Receiver::ok().await;
    let (ingest, worker, base) = start_pair(&env, &receiver, None).await;
    assert_eq!(
        Hook::fixture("push")
            .post(&reqwest::Client::new(), &base)
            .await
            .status,
        202
    );
    wait_until("the forward", Duration::from_secs(30), || async {
        receiver.received().len() == 1
    })
    .await;
    assert_eq!(receiver.received()[0].header("traceparent"), None);
    assert_eq!(
        env.count("select count(*) from deliveries where traceparent is not null")
            .await,
        0
    );
    assert!(!worker.logs().contains("trace_id"));
    assert!(!ingest.logs().contains("trace_id"));
    receiver.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_traces_setting_that_cannot_be_used_is_named_at_start() {
    let env = TestEnv::new().await;
    for (var, value) in [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_TRACES_SAMPLER", "jaeger_remote"),
        ("OTEL_TRACES_SAMPLER_ARG", "2"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
    ] {
        let mut extra = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")];
        extra.push((var, value));
        if var == "OTEL_TRACES_SAMPLER_ARG" {
            extra.push(("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"));
        }
        let out = worker_command(&env, &["migrate"], &extra)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{var}: {stderr}");
        assert!(stderr.contains(var), "{var}: {stderr}");
    }
    env.cleanup().await;
}
