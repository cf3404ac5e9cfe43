//! Support for the admin console's tests: a console on a free port with
//! named tokens, an API client that checks every answer against
//! `docs/admin-openapi.json`, and rows seeded straight into the test's
//! database (the console reads what the state machine writes; seeding by
//! SQL makes a thousand dead letters in one statement).

use std::sync::OnceLock;

use hookinbox_worker::admin::{Access, AdminApp, AdminConfig, AdminHandle, Tokens};
use serde_json::Value;

use crate::TestEnv;

/// An operator's token line.
pub const OPERATOR: &str = "olivia-operator-secret-0001";
/// A viewer's token line.
pub const VIEWER: &str = "victor-viewer-secret-00002";
/// The tokens file the tests use.
pub const TOKENS: &str = "# test tokens\nolivia operator olivia-operator-secret-0001\nvictor viewer victor-viewer-secret-00002\n";

/// A running console.
pub struct TestAdmin {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// Its port.
    pub port: u16,
    /// A client that keeps no cookies and follows no redirects.
    pub http: reqwest::Client,
    /// Stops it.
    pub handle: AdminHandle,
}

impl TestEnv {
    /// Starts the admin console on a free port with [`TOKENS`].
    pub async fn admin(&self) -> TestAdmin {
        let mut args = self.worker_args();
        args.metrics_listen = "127.0.0.1:0".parse().expect("address");
        let worker = args.validate().expect("valid settings");
        let config = AdminConfig {
            worker,
            listen: "127.0.0.1:0".parse().expect("address"),
            access: Access::Tokens(Tokens::parse(TOKENS).expect("valid tokens")),
        };
        let app = AdminApp::build(config).await.expect("admin starts");
        let port = app.port();
        let handle = app.handle();
        tokio::spawn(app.run_until_stopped());
        TestAdmin {
            base: format!("http://127.0.0.1:{port}"),
            port,
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("client"),
            handle,
        }
    }
}

/// An answer of the API.
#[derive(Debug)]
pub struct ApiAnswer {
    /// The status.
    pub status: u16,
    /// The JSON body.
    pub body: Value,
    /// The raw text.
    pub text: String,
}

impl TestAdmin {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> ApiAnswer {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.expect("console answers");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        openapi_check(method.as_str(), path, status, &body);
        ApiAnswer { status, body, text }
    }

    /// `GET` an API path with a token; the answer is checked against the
    /// OpenAPI document.
    pub async fn get(&self, path: &str, token: Option<&str>) -> ApiAnswer {
        self.call(reqwest::Method::GET, path, token, None).await
    }

    /// `POST` a JSON body.
    pub async fn post(&self, path: &str, token: Option<&str>, body: &Value) -> ApiAnswer {
        self.call(reqwest::Method::POST, path, token, Some(body))
            .await
    }

    /// `DELETE`.
    pub async fn delete(&self, path: &str, token: Option<&str>) -> ApiAnswer {
        self.call(reqwest::Method::DELETE, path, token, None).await
    }

    /// Signs in through the form; returns the session cookie (`name=value`).
    pub async fn sign_in(&self, token: &str) -> String {
        let resp = self
            .http
            .post(format!("{}/login", self.base))
            .form(&[("token", token)])
            .send()
            .await
            .expect("answers");
        assert_eq!(resp.status().as_u16(), 303, "signed in");
        let cookie = resp
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .expect("a session cookie")
            .to_owned();
        assert!(cookie.contains("HttpOnly"), "{cookie}");
        assert!(cookie.contains("SameSite=Strict"), "{cookie}");
        cookie.split(';').next().expect("name=value").to_owned()
    }

    /// `GET` a page with a session cookie: status and HTML.
    pub async fn page(&self, path: &str, cookie: &str) -> (u16, String) {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .header("cookie", cookie)
            .send()
            .await
            .expect("answers");
        (
            resp.status().as_u16(),
            resp.text().await.unwrap_or_default(),
        )
    }

    /// `POST` a form with a session cookie: status and `Location`.
    pub async fn submit(&self, path: &str, cookie: &str, form: &[(&str, &str)]) -> (u16, String) {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .header("cookie", cookie)
            .form(form)
            .send()
            .await
            .expect("answers");
        let location = resp
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        (resp.status().as_u16(), location)
    }

    /// Stops the console.
    pub async fn stop(&self) {
        self.handle.stop(false).await;
    }
}

/// The CSRF token in a page's forms.
pub fn csrf_of(html: &str) -> String {
    let at = html
        .find("name=\"csrf\" value=\"")
        .expect("a form with a CSRF token");
    let rest = &html[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').expect("closing quote")].to_owned()
}

fn openapi() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/admin-openapi.json");
        let text = std::fs::read_to_string(path).expect("docs/admin-openapi.json");
        serde_json::from_str(&text).expect("the OpenAPI document is JSON")
    })
}

fn template_matches(template: &str, path: &str) -> bool {
    let t: Vec<&str> = template.split('/').collect();
    let p: Vec<&str> = path.split('/').collect();
    t.len() == p.len()
        && t.iter()
            .zip(&p)
            .all(|(t, p)| (t.starts_with('{') && !p.is_empty()) || t == p)
}

/// Resolves a local `$ref` (`#/components/...`) once.
fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => doc
            .pointer(r.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("{r} is not in the document")),
        None => v,
    }
}

/// Checks an answer against the OpenAPI document: the path and method are
/// described, the status is one of the operation's, and the body matches
/// its schema. Panics with every error otherwise.
pub fn openapi_check(method: &str, path_and_query: &str, status: u16, body: &Value) {
    let doc = openapi();
    let path = path_and_query.split('?').next().unwrap_or(path_and_query);
    // A literal path wins over a template (`/deliveries/count`).
    let paths = doc["paths"].as_object().expect("paths");
    let (template, item) = paths
        .get_key_value(path)
        .or_else(|| paths.iter().find(|(t, _)| template_matches(t, path)))
        .unwrap_or_else(|| panic!("{path} is not in docs/admin-openapi.json"));
    let op = &item[method.to_ascii_lowercase()];
    assert!(
        op.is_object(),
        "{method} {template} is not in docs/admin-openapi.json"
    );
    let response = op["responses"].get(status.to_string()).unwrap_or_else(|| {
        panic!("{method} {template} answered {status}, not in the document: {body}")
    });
    let response = resolve(doc, response);
    let schema = &response["content"]["application/json"]["schema"];
    let mut root = serde_json::json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "components": doc["components"],
    });
    if let Some(r) = schema.get("$ref") {
        root["$ref"] = r.clone();
    } else if let Some(object) = schema.as_object() {
        for (k, v) in object {
            root[k] = v.clone();
        }
    }
    let validator = jsonschema::validator_for(&root).expect("a valid schema");
    let errors: Vec<String> = validator
        .iter_errors(body)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{method} {path} {status} does not match docs/admin-openapi.json:\n{}\n{body}",
        errors.join("\n")
    );
}

/// A row to seed.
#[derive(Clone, Debug)]
pub struct Seed {
    /// X-GitHub-Delivery.
    pub id: String,
    /// The source.
    pub source: String,
    /// X-GitHub-Hook-ID.
    pub hook_id: String,
    /// The event.
    pub event: String,
    /// The action.
    pub action: Option<String>,
    /// The repository.
    pub repository: Option<String>,
    /// `completed`, `failed`, `processing`.
    pub status: String,
    /// For `failed`.
    pub retryable: bool,
    /// The error class of a failed row.
    pub class: Option<String>,
    /// How long ago it was created, in seconds.
    pub age_secs: i64,
    /// The raw body parked with a failed row.
    pub body: String,
}

impl Seed {
    /// A dead letter of `event`, created `age_secs` ago.
    pub fn dead(id: &str, event: &str, age_secs: i64) -> Self {
        Self {
            id: id.to_owned(),
            source: "default".to_owned(),
            hook_id: "1".to_owned(),
            event: event.to_owned(),
            action: None,
            repository: None,
            status: "failed".to_owned(),
            retryable: false,
            class: Some("permanent".to_owned()),
            age_secs,
            body: format!("{{\"zen\":\"seeded {id}\"}}"),
        }
    }
}

/// Inserts rows as the state machine leaves them (failed rows with a
/// parked body, completed rows with their `github_events` row).
pub async fn seed(env: &TestEnv, rows: &[Seed]) {
    for r in rows {
        let failed = r.status == "failed";
        env.db
            .execute(
                "insert into deliveries (provider, source, hook_id, delivery_id, event, action,
                     repository, body_sha256, status, retryable, claim_token, lease_until,
                     attempts, created_at, claimed_at, completed_at, failed_at, first_failed_at,
                     last_error_class, last_error, next_attempt_at, dead_lettered_at)
                 select 'github', $1, $2, $3, $4, $5, $6, sha256($7::text::bytea), $8, $9,
                     gen_random_uuid(),
                     case when $8 = 'processing' then now() + interval '1 minute' end,
                     1, t, t,
                     case when $8 = 'completed' then t + interval '1 second' end,
                     case when $10::text is not null then t + interval '1 second' end,
                     case when $10::text is not null then t + interval '1 second' end,
                     $10, case when $10::text is not null then 'seeded failure' end,
                     case when $9 then now() + interval '1 hour' end,
                     case when $8 = 'failed' and not $9 then t + interval '2 seconds' end
                 from (select now() - make_interval(secs => $11) as t) at",
                &[
                    &r.source,
                    &r.hook_id,
                    &r.id,
                    &r.event,
                    &r.action,
                    &r.repository,
                    &r.body,
                    &r.status,
                    &r.retryable,
                    &r.class,
                    &(r.age_secs as f64),
                ],
            )
            .await
            .expect("seed delivery");
        if failed {
            env.db
                .execute(
                    "insert into parked_bodies (provider, source, hook_id, delivery_id, content_type, headers, body)
                     values ('github', $1, $2, $3, 'application/json',
                             jsonb_build_array(jsonb_build_array('x-github-event', $4::text),
                                               jsonb_build_array('x-github-delivery', $3::text)),
                             convert_to($5, 'UTF8'))",
                    &[&r.source, &r.hook_id, &r.id, &r.event, &r.body],
                )
                .await
                .expect("seed parked body");
        }
    }
}

/// `n` dead letters `bulk-1` … `bulk-n` of source `default`, each with a
/// parked JSON body, in one statement each.
pub async fn seed_dead_letters(env: &TestEnv, n: i64) {
    env.db
        .batch_execute(&format!(
            "insert into deliveries (provider, source, hook_id, delivery_id, event, body_sha256,
                 status, retryable, claim_token, attempts, created_at, failed_at, first_failed_at,
                 last_error_class, last_error, dead_lettered_at)
             select 'github', 'default', '1', 'bulk-' || g, 'push', sha256(('{{\"n\":' || g || '}}')::bytea),
                 'failed', false, gen_random_uuid(), 1, now() - make_interval(secs => g),
                 now(), now(), 'permanent', 'seeded', now()
             from generate_series(1, {n}) g;
             insert into parked_bodies (provider, source, hook_id, delivery_id, content_type, headers, body)
             select 'github', 'default', '1', 'bulk-' || g, 'application/json', '[]'::jsonb,
                 convert_to('{{\"n\":' || g || '}}', 'UTF8')
             from generate_series(1, {n}) g;"
        ))
        .await
        .expect("seed dead letters");
}
