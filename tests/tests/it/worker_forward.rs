//! The `forward` handler against a local receiver.

use std::collections::HashSet;
use std::time::Duration;

use hookinbox::deliveries::ErrorClass;
use hookinbox_tests::receiver::{Receiver, Reply};
use hookinbox_tests::{Hook, SECRET, TestEnv, fixtures, settle, sign, wait_until};
use hookinbox_worker::{JobOutcome, Worker};

const FORWARD_SECRET: &str = "receiver-shared-secret";

async fn forward_worker(env: &TestEnv, url: &str, timeout_ms: u64) -> Worker {
    let mut args = env.worker_args();
    args.sources.handler = hookinbox::config::HandlerKind::Forward;
    args.forward_url = Some(url.to_owned());
    args.forward_secret = Some(FORWARD_SECRET.to_owned());
    args.forward_timeout_ms = timeout_ms;
    let config = args.validate().expect("valid");
    let handler =
        hookinbox_worker::from_config(&config.routes, &Default::default()).expect("client");
    env.worker_with(config, handler).await
}

#[tokio::test]
async fn every_fixture_is_forwarded_once_byte_identical_with_key_headers_and_signature() {
    let (env, ingest) = TestEnv::with_forward_ingest().await;
    let receiver = Receiver::ok().await;
    let worker = forward_worker(&env, &receiver.url, 5000).await;
    let mut sent = Vec::new();
    for fixture in fixtures::all().into_iter().filter(|f| f.event != "ping") {
        let hook = Hook::new(&fixture.event, fixture.body);
        assert_eq!(ingest.send(&hook).await.status, 202);
        sent.push(hook);
    }
    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes, vec![JobOutcome::Completed; sent.len()]);
    let received = receiver.received();
    assert_eq!(received.len(), sent.len(), "each forwarded exactly once");
    let mut keys = HashSet::new();
    for hook in &sent {
        let key = format!(
            "github:default:{}:{}:forward",
            hook.hook_id.as_deref().unwrap_or(""),
            hook.id()
        );
        let got = received
            .iter()
            .find(|r| r.header("idempotency-key") == Some(key.as_str()))
            .unwrap_or_else(|| panic!("{key} not forwarded"));
        assert!(keys.insert(key.clone()));
        assert_eq!(got.body, hook.body, "{key}: body byte-identical");
        assert_eq!(got.header("content-type"), Some("application/json"));
        assert_eq!(got.header("x-github-event"), hook.event.as_deref());
        assert_eq!(got.header("x-github-delivery"), Some(hook.id()));
        assert_eq!(got.header("x-github-hook-id"), hook.hook_id.as_deref());
        assert_eq!(
            got.header("x-hookinbox-signature-256"),
            Some(sign(FORWARD_SECRET, &got.body).as_str()),
            "the receiver verifies where it came from"
        );
        assert!(
            got.header("x-hub-signature-256").is_none(),
            "GitHub's signature is not passed on"
        );
    }
    env.cleanup().await;
}

#[tokio::test]
async fn the_variables_alone_forward_signed_the_github_way_with_the_destinations_secret() {
    // No HOOKINBOX_CONFIG: the worker binary reads the `default` source's
    // one destination from the variables, as deployed.
    let (env, ingest) = TestEnv::with_forward_ingest().await;
    let receiver = Receiver::ok().await;
    let _worker = env.spawn(
        "hookinbox-worker",
        &[
            ("HOOKINBOX_HANDLER", "forward"),
            ("HOOKINBOX_FORWARD_URL", &receiver.url),
            ("HOOKINBOX_FORWARD_SECRET", FORWARD_SECRET),
            ("HOOKINBOX_FORWARD_SIGNATURE", "github"),
        ],
    );
    let hook = Hook::fixture("pull_request");
    assert_eq!(ingest.send(&hook).await.status, 202);
    wait_until(
        "the forward to complete",
        Duration::from_secs(30),
        || async {
            env.count("select count(*) from deliveries where status = 'completed'")
                .await
                == 1
        },
    )
    .await;
    let received = receiver.received();
    assert_eq!(received.len(), 1);
    let got = &received[0];
    assert_eq!(got.body, hook.body);
    assert_eq!(
        got.header("x-hub-signature-256"),
        Some(sign(FORWARD_SECRET, &hook.body).as_str()),
        "signed as GitHub signs, with the destination's secret (an octokit app verifies it)"
    );
    assert_ne!(
        got.header("x-hub-signature-256"),
        hook.signature.as_deref(),
        "not GitHub's own signature, made with the source's secret"
    );
    assert!(got.header("x-hookinbox-signature-256").is_none());
    assert_eq!(got.header("user-agent"), Some("GitHub-Hookshot/test"));
    assert_eq!(got.header("x-github-delivery"), Some(hook.id()));
    receiver.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn each_answer_class_is_retried_or_dead_lettered_as_specified() {
    let env = TestEnv::new().await;
    let date_in_3s = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(3));
    // (scripted first answer, retried?)
    let cases: Vec<(Reply, bool)> = vec![
        (Reply::status(200), false),
        (Reply::status(204), false),
        (Reply::status(408), true),
        (
            Reply {
                headers: vec![("retry-after".into(), "2".into())],
                ..Reply::status(429)
            },
            true,
        ),
        (
            Reply {
                headers: vec![("retry-after".into(), date_in_3s)],
                ..Reply::status(429)
            },
            true,
        ),
        (Reply::status(500), true),
        (Reply::status(503), true),
        (Reply::status(400), false),
        (Reply::status(413), false),
        (Reply::status(422), false),
        (
            Reply {
                delay: Duration::from_secs(3),
                ..Reply::status(200)
            },
            true,
        ),
    ];
    let hooks: Vec<Hook> = cases.iter().map(|_| Hook::fixture("push")).collect();
    let script: Vec<(String, Reply)> = hooks
        .iter()
        .zip(&cases)
        .map(|(h, (reply, _))| (h.id().to_owned(), reply.clone()))
        .collect();
    // The scripted answer the first time; 200 on any retry.
    let receiver = Receiver::start(move |req, seen| {
        let id = req.header("x-github-delivery").unwrap_or("");
        match script.iter().find(|(k, _)| k == id) {
            Some((_, reply)) if seen == 0 => reply.clone(),
            _ => Reply::status(200),
        }
    })
    .await;
    // Without a breaker (half of these answers are failures, which would
    // open it), with a short first retry and a long enough longest wait
    // for the Retry-After cases.
    let config = env.config_file(&format!(
        r#"
[[sources]]
name = "default"
secrets = ["{SECRET}"]

[[sources.destinations]]
name = "receiver"
kind = "forward"
url = "{}"
timeout_ms = 1000
retry = ["100ms", "10s"]
breaker = false
"#,
        receiver.url
    ));
    let ingest = env.ingest_on(&config).await;
    let worker = env.worker_on(&config, Default::default()).await;
    for hook in &hooks {
        assert_eq!(ingest.send(hook).await.status, 202);
    }
    let outcomes = settle(&env, &worker).await;
    assert_eq!(
        outcomes.len(),
        cases.len() + cases.iter().filter(|(_, r)| *r).count()
    );

    for (hook, (reply, retried)) in hooks.iter().zip(&cases) {
        let row = env
            .db
            .query_one(
                "select status, attempts, last_error_class from deliveries where delivery_id = $1",
                &[&hook.id()],
            )
            .await
            .expect("row");
        let status: String = row.get(0);
        let attempts: i32 = row.get(1);
        let class: Option<String> = row.get(2);
        let name = format!(
            "{} {:?} delay {:?}",
            reply.status, reply.headers, reply.delay
        );
        let deferred = reply.status == 429 && !reply.headers.is_empty();
        if deferred {
            // A 429 with Retry-After defers the leg: due then, no
            // attempt spent.
            assert_eq!(
                (status.as_str(), attempts),
                ("completed", 1),
                "{name}: deferred, then done"
            );
            assert_eq!(class.as_deref(), Some("deferred"), "{name}");
        } else if *retried {
            assert_eq!(
                (status.as_str(), attempts),
                ("completed", 2),
                "{name}: retried, then done"
            );
            assert_eq!(class.as_deref(), Some("transient"), "{name}");
        } else if (200..300).contains(&reply.status) {
            assert_eq!((status.as_str(), attempts), ("completed", 1), "{name}");
        } else {
            assert_eq!(
                (status.as_str(), attempts),
                ("failed", 1),
                "{name}: dead-lettered"
            );
            assert_eq!(class.as_deref(), Some("permanent"), "{name}");
        }
    }
    // Retry-After was honoured in both forms: the next try came no earlier.
    let received = receiver.received();
    for (i, at_least) in [
        (3usize, Duration::from_secs(2)),
        (4, Duration::from_secs(1)),
    ] {
        let id = hooks[i].id();
        let times: Vec<_> = received
            .iter()
            .filter(|r| r.header("x-github-delivery") == Some(id))
            .map(|r| r.at)
            .collect();
        assert_eq!(times.len(), 2);
        assert!(
            times[1] - times[0] >= at_least,
            "case {i}: {:?}",
            times[1] - times[0]
        );
    }
    env.cleanup().await;
}

#[tokio::test]
async fn a_refused_connection_is_transient() {
    let (env, ingest) = TestEnv::with_forward_ingest().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "http://127.0.0.1:{}/hook",
        closed.local_addr().expect("addr").port()
    );
    drop(closed);
    let worker = forward_worker(&env, &url, 1000).await;
    assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    let report = worker.drain().await.expect("drain");
    assert_eq!(
        report.outcomes,
        vec![JobOutcome::Failed {
            class: ErrorClass::Transient,
            retryable: true
        }]
    );
    env.cleanup().await;
}
