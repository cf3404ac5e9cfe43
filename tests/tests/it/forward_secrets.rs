//! A destination's secrets (its signing secret, and extra headers read
//! from files) reach its receiver and nowhere else: not the logs (at
//! `RUST_LOG=debug`), not `/metrics`, not the console's pages (the
//! Destinations page and a delivery's legs and attempt log among them),
//! not the API's answers, not `hookinbox-worker destinations` (table or
//! `--json`), not the attempt log even when a receiver echoes the secret
//! header it was sent. The binaries run as child processes, as deployed.

use std::time::Duration;

use hookinbox_tests::admin::{OPERATOR, sign_in_at};
use hookinbox_tests::receiver::{Receiver, Reply};
use hookinbox_tests::{Hook, SECRET, TestEnv, sign, wait_until, worker_command};

const APP_SECRET: &str = "app-secret-Zq7w1xPvN3";
const RELAY_SECRET: &str = "relay-secret-Hm4kT9sRb2";
const TOKEN: &str = "Bearer ci-token-Yc8uQ2dLe5";
const API_KEY: &str = "api-key-Wr6nJ1fGa0";

#[tokio::test]
async fn destination_secrets_and_secret_headers_appear_only_on_the_wire() {
    let env = TestEnv::new().await;
    let dir = std::env::temp_dir().join(format!("{}-secrets", env.prefix));
    std::fs::create_dir_all(&dir).expect("dir");
    let write = |name: &str, value: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("{value}\n")).expect("write");
        path
    };
    let app_secret = write("app-secret", APP_SECRET);
    let token = write("ci-token", TOKEN);
    let api_key = write("api-key", API_KEY);
    // The app refuses the first request (its breaker opens and a probe
    // follows), so that a failure is logged and recorded too; its refusal
    // echoes the credentials it was sent, as some receivers do.
    let app = Receiver::start(|request, seen| {
        if seen == 0 {
            Reply {
                body: format!(
                    "bad credentials: {}",
                    request.header("authorization").unwrap_or("")
                )
                .into_bytes(),
                ..Reply::status(401)
            }
        } else {
            Reply::status(200)
        }
    })
    .await;
    let relay = Receiver::ok().await;
    let config = env.config_file(&format!(
        r#"
[[sources]]
name = "default"
secrets = ["{SECRET}"]

[[sources.destinations]]
name = "app"
kind = "forward"
url = "{app}"
signature = "github"
secret_file = "{app_secret}"
headers = {{ Authorization = {{ file = "{token}" }}, X-Team = "ci" }}
breaker = {{ probe_secs = 1 }}

# A second leg of each delivery to the source: the page of a delivery
# shows each leg and each one's attempt log.
[[sources.destinations]]
name = "archive"
kind = "store"

[[sources]]
name = "relay"
secrets = ["{SECRET}"]

[[sources.destinations]]
name = "relay"
kind = "forward"
url = "{relay}"
secret = "{RELAY_SECRET}"
headers = {{ X-Api-Key = {{ file = "{api_key}" }} }}
"#,
        app = app.url,
        relay = relay.url,
        app_secret = app_secret.display(),
        token = token.display(),
        api_key = api_key.display(),
    ));
    let path = config.to_string_lossy().into_owned();
    let vars = [("HOOKINBOX_CONFIG", path.as_str()), ("RUST_LOG", "debug")];
    let ingest = env.spawn("hookinbox-ingest", &vars);
    ingest.wait_ready().await;
    let worker = env.spawn("hookinbox-worker", &vars);
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{}", ingest.port);
    let hook = Hook::fixture("pull_request");
    assert_eq!(hook.post(&http, &base).await.status, 202);
    let mut relayed_hook = Hook::fixture("push");
    relayed_hook.path = "/webhooks/github/relay".into();
    assert_eq!(relayed_hook.post(&http, &base).await.status, 202);
    wait_until("every leg completed", Duration::from_secs(60), || async {
        env.count("select count(*) from deliveries where status = 'completed'")
            .await
            == 3
    })
    .await;

    // On the wire: each receiver got what it needs.
    let got = app.received();
    assert_eq!(got.len(), 2, "refused once, then the probe");
    for request in &got {
        assert_eq!(request.header("authorization"), Some(TOKEN));
        assert_eq!(request.header("x-team"), Some("ci"));
        assert_eq!(
            request.header("x-hub-signature-256"),
            Some(sign(APP_SECRET, &hook.body).as_str()),
            "signed with the app's own secret, not the source's"
        );
        assert_eq!(request.header("user-agent"), Some("GitHub-Hookshot/test"));
        assert_eq!(request.header("x-github-delivery"), Some(hook.id()));
        assert_eq!(request.header("x-github-event"), Some("pull_request"));
        assert!(request.header("x-hookinbox-signature-256").is_none());
        assert_eq!(request.body, hook.body);
    }
    let relayed = relay.received();
    assert_eq!(relayed.len(), 1);
    assert_eq!(relayed[0].header("x-api-key"), Some(API_KEY));
    assert_eq!(
        relayed[0].header("x-hookinbox-signature-256"),
        Some(sign(RELAY_SECRET, &relayed_hook.body).as_str())
    );
    assert!(relayed[0].header("x-hub-signature-256").is_none());
    assert!(relayed[0].header("authorization").is_none());

    // Everywhere else: nothing.
    let console = env
        .spawn_admin(
            &[],
            &[("HOOKINBOX_CONFIG", path.as_str()), ("RUST_LOG", "debug")],
        )
        .await;
    let cookie = sign_in_at(&console.base, OPERATOR).await;
    let mut places: Vec<(String, String)> = Vec::new();
    let detail = format!("/deliveries/default/{}", hook.id());
    let relay_detail = format!("/deliveries/relay/{}", relayed_hook.id());
    // Each page of the console (signed in), then each API answer (a
    // bearer token), for the same paths.
    for (path, api) in [
        ("/", false),
        ("/overview", true),
        ("/deliveries", false),
        ("/deliveries", true),
        (detail.as_str(), false),
        (detail.as_str(), true),
        (relay_detail.as_str(), false),
        (relay_detail.as_str(), true),
        ("/audit", false),
        ("/audit", true),
        ("/jobs", false),
        ("/jobs", true),
        ("/destinations", false),
        ("/destinations", true),
    ] {
        let (place, request) = if api {
            let place = format!("API /api/v1{path}");
            let url = format!("{}/api/v1{path}", console.base);
            (place, http.get(url).bearer_auth(OPERATOR))
        } else {
            let url = format!("{}{path}", console.base);
            (
                format!("console {path}"),
                http.get(url).header("cookie", &cookie),
            )
        };
        let answer = request.send().await.expect("answers");
        let status = answer.status();
        let text = answer.text().await.unwrap_or_default();
        assert_eq!(status, 200, "{place}: {text}");
        places.push((place, text));
    }
    // The app's refusal was kept, the echoed credentials masked.
    let detail_api: serde_json::Value = http
        .get(format!("{}/api/v1{detail}", console.base))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .expect("answers")
        .json()
        .await
        .expect("JSON");
    let app_leg = detail_api["legs"]
        .as_array()
        .and_then(|legs| legs.iter().find(|l| l["destination"] == "app"))
        .expect("the app's leg");
    let refusal = app_leg["attempt_log"]
        .as_array()
        .and_then(|log| log.iter().find(|a| a["status_code"] == 401))
        .expect("the refused attempt");
    assert_eq!(
        refusal["response_excerpt"], "bad credentials: [redacted]",
        "{refusal}"
    );
    for args in [&["destinations", "--json"][..], &["destinations"][..]] {
        let out = worker_command(&env, args, &[("HOOKINBOX_CONFIG", path.as_str())])
            .output()
            .expect("runs");
        assert!(out.status.success(), "{args:?}: {out:?}");
        places.push((
            format!("hookinbox-worker {}", args.join(" ")),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ));
    }
    places.push(("ingest /metrics".into(), ingest.scrape("/metrics").await.1));
    places.push(("worker /metrics".into(), worker.scrape("/metrics").await.1));
    let attempts: Vec<String> = env
        .db
        .query(
            "select coalesce(error, '') || encode(coalesce(response_excerpt, ''), 'escape') \
             from destination_attempts",
            &[],
        )
        .await
        .expect("the attempt log")
        .iter()
        .map(|r| r.get(0))
        .collect();
    places.push(("destination_attempts".into(), attempts.join("\n")));
    places.push(("ingest log (debug)".into(), ingest.logs()));
    places.push(("worker log (debug)".into(), worker.logs()));
    places.push(("console log (debug)".into(), console.logs()));

    let needles = [
        (
            "the Authorization header's value",
            TOKEN.trim_start_matches("Bearer "),
        ),
        ("the X-Api-Key header's value", API_KEY),
        ("app's secret", APP_SECRET),
        ("relay's secret", RELAY_SECRET),
        ("the source's secret", SECRET),
    ];
    println!("\n| where | bytes | hits |");
    println!("|---|---|---|");
    let mut hits = Vec::new();
    for (place, text) in &places {
        let found: Vec<&str> = needles
            .iter()
            .filter(|(_, needle)| text.contains(needle))
            .map(|(what, _)| *what)
            .collect();
        println!("| {place} | {} | {} |", text.len(), found.len());
        if !found.is_empty() {
            hits.push(format!("{place}: {found:?}"));
        }
    }
    assert!(
        places.iter().all(|(_, text)| !text.is_empty()),
        "every place answered"
    );
    assert!(
        places
            .iter()
            .any(|(p, t)| p.starts_with("worker log") && t.contains("DEBUG")),
        "the worker logged at debug"
    );
    assert!(hits.is_empty(), "secrets found: {hits:#?}");
    console.stop().await;
    env.cleanup().await;
    let _ = std::fs::remove_dir_all(dir);
}
