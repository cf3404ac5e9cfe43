//! The egress policy of `forward`: hostile destination URLs refused and
//! counted before anything is sent (their legs held, their breakers open,
//! nothing dead-lettered), an allow-listed loopback destination working,
//! and a name that changes what it resolves to between attempts caught at
//! the attempt after the change.
//!
//! Traffic goes only to loopback. The loopback disguises point at a live
//! receiver, which must see nothing; the private, link-local and metadata
//! addresses appear only as addresses refused before any connection.
//! Names resolve through `HOOKINBOX_FORWARD_HOSTS_FILE`, the resolver's
//! seam: the same filter checks its answers as DNS's.

use std::path::Path;
use std::time::Duration;

use hookinbox::config::WorkerConfig;
use hookinbox_tests::receiver::{Receiver, Reply};
use hookinbox_tests::{Hook, SECRET, TestEnv, counter, settle};
use hookinbox_worker::{JobOutcome, Worker};

const BLOCKED: &str = "hookinbox_destination_blocked_total";

/// The hosts file of these tests: names standing for what a hostile DNS
/// answer could say.
fn hosts_file(env: &TestEnv, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("{}.hosts", env.prefix));
    std::fs::write(&path, text).expect("write the hosts file");
    path
}

/// The port of a local receiver's URL (`http://127.0.0.1:<port>/hook`).
fn port_of(url: &str) -> &str {
    url.rsplit(':')
        .next()
        .and_then(|p| p.split('/').next())
        .expect("a port")
}

/// A worker on `config` with no network allowed but the destinations'
/// own, resolving through `hosts`.
async fn guarded_worker(env: &TestEnv, config: &Path, hosts: &Path) -> Worker {
    let mut args = env.worker_args();
    args.forward_allow_networks = None;
    args.forward_hosts_file = Some(hosts.to_owned());
    args.sources.config = Some(config.to_owned());
    let config: WorkerConfig = args.validate().expect("valid settings");
    let handler =
        hookinbox_worker::from_config(&config.routes, &Default::default()).expect("the handlers");
    env.worker_with(config, handler).await
}

#[tokio::test]
async fn hostile_destination_urls_are_refused_before_anything_is_sent_and_counted() {
    let env = TestEnv::new().await;
    // Every loopback disguise points here: a leak would land in its log.
    let trap = Receiver::ok().await;
    let port = port_of(&trap.url);
    // A destination that is allowed, and answers with a redirect to the
    // metadata endpoint: not followed.
    let redirecting = Receiver::start(|_, _| Reply {
        headers: vec![(
            "location".into(),
            "http://169.254.169.254/latest/meta-data/".into(),
        )],
        ..Reply::status(302)
    })
    .await;
    let hosts = hosts_file(
        &env,
        "127.0.0.1 loopback.test\n\
         ::1 v6-loopback.test\n\
         ::ffff:127.0.0.1 mapped.test\n\
         10.0.0.1 private.test\n\
         169.254.169.254 metadata.test\n\
         10.0.0.2 mixed.test\n\
         192.168.1.1 mixed.test\n\
         fd00:ec2::254 v6-metadata.test\n",
    );
    let p = port;
    // (URL, the reason it is refused for)
    let cases: Vec<(String, &str)> = vec![
        (format!("http://127.0.0.1:{p}/hook"), "loopback"),
        (format!("http://127.0.0.2:{p}/hook"), "loopback"),
        (format!("http://127.255.255.254:{p}/hook"), "loopback"),
        (format!("http://0x7f000001:{p}/hook"), "loopback"),
        (format!("http://2130706433:{p}/hook"), "loopback"),
        (format!("http://017700000001:{p}/hook"), "loopback"),
        (format!("http://127.1:{p}/hook"), "loopback"),
        (format!("http://0177.0.0.1:{p}/hook"), "loopback"),
        (format!("http://0x7f.0.0.1:{p}/hook"), "loopback"),
        (format!("http://[::1]:{p}/hook"), "loopback"),
        (format!("http://[::ffff:127.0.0.1]:{p}/hook"), "loopback"),
        (format!("http://[::ffff:7f00:1]:{p}/hook"), "loopback"),
        (format!("http://[::127.0.0.1]:{p}/hook"), "loopback"),
        (format!("http://[64:ff9b::7f00:1]:{p}/hook"), "loopback"),
        (format!("http://localhost:{p}/hook"), "loopback"),
        (format!("http://loopback.test:{p}/hook"), "loopback"),
        (format!("http://v6-loopback.test:{p}/hook"), "loopback"),
        (format!("http://mapped.test:{p}/hook"), "loopback"),
        (format!("http://0.0.0.0:{p}/hook"), "unspecified"),
        (format!("http://0:{p}/hook"), "unspecified"),
        (format!("http://[::]:{p}/hook"), "unspecified"),
        ("http://10.0.0.1/hook".into(), "private"),
        ("http://172.16.0.1/hook".into(), "private"),
        ("http://192.168.1.1/hook".into(), "private"),
        ("http://0xa000001/hook".into(), "private"),
        ("http://3232235777/hook".into(), "private"),
        ("http://[::ffff:10.0.0.1]/hook".into(), "private"),
        ("http://[::10.0.0.1]/hook".into(), "private"),
        ("http://[2002:a00:1::1]/hook".into(), "private"),
        ("http://private.test/hook".into(), "private"),
        ("http://mixed.test/hook".into(), "private"),
        (
            "http://169.254.169.254/latest/meta-data/".into(),
            "metadata",
        ),
        ("http://[fd00:ec2::254]/".into(), "metadata"),
        ("http://[::ffff:169.254.169.254]/".into(), "metadata"),
        ("http://metadata.test/".into(), "metadata"),
        ("http://v6-metadata.test/".into(), "metadata"),
        ("http://100.100.100.200/".into(), "metadata"),
        ("http://169.254.10.10/hook".into(), "link_local"),
        ("http://[fe80::1]/hook".into(), "link_local"),
        ("http://100.64.0.1/hook".into(), "cgnat"),
        ("http://[fc00::1]/hook".into(), "unique_local"),
        ("http://[fd12:3456::1]/hook".into(), "unique_local"),
        ("http://224.0.0.1/hook".into(), "multicast"),
        ("http://[ff02::1]/hook".into(), "multicast"),
        ("http://255.255.255.255/hook".into(), "broadcast"),
        ("http://240.0.0.1/hook".into(), "reserved"),
        (redirecting.url.clone(), "redirect"),
    ];
    let mut toml = format!("[[sources]]\nname = \"default\"\nsecrets = [\"{SECRET}\"]\n");
    for (i, (url, reason)) in cases.iter().enumerate() {
        toml.push_str(&format!(
            "\n[[sources.destinations]]\nname = \"d{i:02}\"\nkind = \"forward\"\nurl = \"{url}\"\ntimeout_ms = 2000\n"
        ));
        if *reason == "redirect" {
            // Allowed, so that its answer is what is refused.
            toml.push_str("allow_networks = [\"127.0.0.1/32\"]\n");
        }
    }
    let config = env.config_file(&toml);
    let ingest = env.ingest_on(&config).await;
    let worker = guarded_worker(&env, &config, &hosts).await;
    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);
    let report = worker.drain().await.expect("drain");
    assert_eq!(report.outcomes.len(), cases.len(), "one attempt per leg");

    let scrape = hookinbox::metrics::install().render();
    println!("\n| # | destination URL | refused as | counted | leg | breaker |");
    println!("|---|---|---|---|---|---|");
    let mut failures = Vec::new();
    for (i, (url, reason)) in cases.iter().enumerate() {
        let name = format!("d{i:02}");
        let counted = counter(
            &scrape,
            BLOCKED,
            &[
                ("source", "default"),
                ("destination", &name),
                ("reason", reason),
            ],
        )
        .unwrap_or(0.0);
        let leg = env
            .db
            .query_one(
                "select status, coalesce(last_error_class, ''), attempts, retryable \
                 from deliveries where destination = $1",
                &[&name],
            )
            .await
            .expect("the leg");
        let (status, class, attempts, retryable): (String, String, i32, bool) =
            (leg.get(0), leg.get(1), leg.get(2), leg.get(3));
        let breaker: String = env
            .db
            .query_one(
                "select state from destinations where source = 'default' and name = $1",
                &[&name],
            )
            .await
            .expect("the destination")
            .get(0);
        println!(
            "| {i} | `{url}` | {reason} | {counted} | {status} {class} (attempts {attempts}) | {breaker} |"
        );
        if counted != 1.0
            || status != "failed"
            || class != "held"
            || !retryable
            || breaker != "open"
        {
            failures.push(format!(
                "{url}: counted {counted}, leg {status} {class} retryable {retryable}, breaker {breaker}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "not refused as expected:\n{}",
        failures.join("\n")
    );
    assert!(cases.len() >= 30);
    assert!(trap.received().is_empty(), "nothing reached the trap");
    assert_eq!(
        redirecting.received().len(),
        1,
        "the redirect, not followed"
    );
    assert_eq!(env.dead_depth().await, 0, "nothing dead-lettered");
    let dead = env
        .count("select count(*) from deliveries where status = 'failed' and not retryable")
        .await;
    assert_eq!(dead, 0);
    // The refusals are logged as attempts of their own kind.
    let blocked_attempts = env
        .count("select count(*) from destination_attempts where result = 'blocked'")
        .await;
    assert_eq!(blocked_attempts as usize, cases.len() - 1);
    env.cleanup().await;
    let _ = std::fs::remove_file(hosts);
}

#[tokio::test]
async fn an_allow_listed_loopback_destination_is_delivered_in_any_spelling() {
    let env = TestEnv::new().await;
    let receiver = Receiver::ok().await;
    let port = port_of(&receiver.url);
    let hosts = hosts_file(&env, "127.0.0.1 app.test\n");
    let urls = [
        receiver.url.clone(),
        format!("http://0x7f000001:{port}/hook"),
        format!("http://127.1:{port}/hook"),
        format!("http://[::ffff:127.0.0.1]:{port}/hook"),
        format!("http://app.test:{port}/hook"),
        format!("http://localhost:{port}/hook"),
    ];
    let mut toml = format!("[[sources]]\nname = \"default\"\nsecrets = [\"{SECRET}\"]\n");
    for (i, url) in urls.iter().enumerate() {
        toml.push_str(&format!(
            "\n[[sources.destinations]]\nname = \"ok{i}\"\nkind = \"forward\"\nurl = \"{url}\"\nallow_networks = [\"127.0.0.0/8\"]\n"
        ));
    }
    let config = env.config_file(&toml);
    let ingest = env.ingest_on(&config).await;
    let worker = guarded_worker(&env, &config, &hosts).await;
    assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes, vec![JobOutcome::Completed; urls.len()]);
    assert_eq!(receiver.received().len(), urls.len());
    let scrape = hookinbox::metrics::install().render();
    assert_eq!(counter(&scrape, BLOCKED, &[]), None, "nothing refused");
    println!(
        "allow_networks = [\"127.0.0.0/8\"]: {} of {} delivered",
        receiver.received().len(),
        urls.len()
    );
    env.cleanup().await;
    let _ = std::fs::remove_file(hosts);
}

/// Runs the next retry of the one failed leg once it is due: waits for the
/// scheduler to publish it, then drains.
async fn next_attempt(worker: &Worker) -> Vec<JobOutcome> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while worker.schedule_once().await.expect("scheduler") == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no retry came due");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.drain().await.expect("drain").outcomes
}

#[tokio::test]
async fn a_name_that_changes_what_it_resolves_to_is_checked_again_at_each_attempt() {
    let env = TestEnv::new().await;
    // Answers 503 the first time, closing the connection so that the
    // next attempt connects (and resolves) again; 200 after.
    let receiver = Receiver::start(|_, seen| {
        if seen == 0 {
            Reply {
                headers: vec![("connection".into(), "close".into())],
                ..Reply::status(503)
            }
        } else {
            Reply::status(200)
        }
    })
    .await;
    let port = port_of(&receiver.url);
    let hosts = hosts_file(&env, "127.0.0.1 rebind.test\n");
    let config = env.config_file(&format!(
        r#"
[[sources]]
name = "default"
secrets = ["{SECRET}"]

[[sources.destinations]]
name = "app"
kind = "forward"
url = "http://rebind.test:{port}/hook"
allow_networks = ["127.0.0.1/32"]
retry = ["100ms", "100ms", "100ms", "100ms"]
breaker = false
"#
    ));
    let ingest = env.ingest_on(&config).await;
    let worker = guarded_worker(&env, &config, &hosts).await;
    assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    let transient = JobOutcome::Failed {
        class: hookinbox::deliveries::ErrorClass::Transient,
        retryable: true,
    };
    // 1: the allowed address; the receiver answers 503.
    assert_eq!(
        worker.drain().await.expect("drain").outcomes,
        vec![transient]
    );
    assert_eq!(receiver.received().len(), 1);
    let blocked = |reason: &'static str| async move {
        let scrape = hookinbox::metrics::install().render();
        counter(
            &scrape,
            BLOCKED,
            &[("destination", "app"), ("reason", reason)],
        )
        .unwrap_or(0.0)
    };
    // 2: the name now says 127.0.0.2, loopback outside the allowed /32.
    hosts_file(&env, "127.0.0.2 rebind.test\n");
    assert_eq!(next_attempt(&worker).await, vec![transient]);
    assert_eq!(blocked("loopback").await, 1.0);
    // 3: now a private address.
    hosts_file(&env, "10.0.0.1 rebind.test\n");
    assert_eq!(next_attempt(&worker).await, vec![transient]);
    assert_eq!(blocked("private").await, 1.0);
    assert_eq!(receiver.received().len(), 1, "nothing sent while refused");
    // 4: back to the allowed address: delivered.
    hosts_file(&env, "127.0.0.1 rebind.test\n");
    assert_eq!(next_attempt(&worker).await, vec![JobOutcome::Completed]);
    assert_eq!(receiver.received().len(), 2);
    let errors: Vec<String> = env
        .db
        .query(
            "select coalesce(error, '') from destination_attempts order by attempt",
            &[],
        )
        .await
        .expect("the attempt log")
        .iter()
        .map(|r| r.get(0))
        .collect();
    println!("attempts of rebind.test: {errors:#?}");
    assert!(
        errors[1].contains("127.0.0.2") && errors[2].contains("10.0.0.1"),
        "{errors:?}"
    );
    env.cleanup().await;
    let _ = std::fs::remove_file(hosts);
}
