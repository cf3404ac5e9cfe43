//! Support for the admin console's tests: a console on a free port with
//! named tokens, an API client that checks every answer against
//! `docs/admin-openapi.json`, and rows seeded straight into the test's
//! database (the console reads what the state machine writes; seeding by
//! SQL makes a thousand dead letters in one statement).

use std::sync::OnceLock;

use hookinbox_operator::console::{Access, AdminApp, AdminConfig, AdminHandle, Tokens};
use serde_json::Value;

use crate::{TestEnv, free_port, wait_until};

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
    /// The console's settings for this test: a free port, [`TOKENS`], the
    /// rest at their defaults.
    pub fn admin_config(&self) -> AdminConfig {
        let mut args = self.worker_args();
        args.metrics_listen = "127.0.0.1:0".parse().expect("address");
        let worker = args.validate().expect("valid settings");
        AdminConfig::new(
            worker,
            "127.0.0.1:0".parse().expect("address"),
            Access::Tokens(Tokens::parse(TOKENS).expect("valid tokens")),
        )
    }

    /// [`TestEnv::admin_config`] on the sources of a config file (its
    /// destinations' settings shown, its secrets masked).
    pub fn admin_config_on(&self, config: &std::path::Path) -> AdminConfig {
        let mut args = self.worker_args();
        args.sources.config = Some(config.to_owned());
        args.metrics_listen = "127.0.0.1:0".parse().expect("address");
        let worker = args.validate().expect("valid settings");
        AdminConfig::new(
            worker,
            "127.0.0.1:0".parse().expect("address"),
            Access::Tokens(Tokens::parse(TOKENS).expect("valid tokens")),
        )
    }

    /// Starts the admin console on a free port with [`TOKENS`].
    pub async fn admin(&self) -> TestAdmin {
        self.admin_with(self.admin_config()).await
    }

    /// Starts the admin console with `config`.
    pub async fn admin_with(&self, config: AdminConfig) -> TestAdmin {
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

    /// Opens the sign-in form as a browser would: its cookie
    /// (`name=value`) and the CSRF token its hidden field repeats.
    pub async fn login_form(&self) -> (String, String) {
        let resp = self
            .http
            .get(format!("{}/login", self.base))
            .send()
            .await
            .expect("answers");
        assert_eq!(resp.status().as_u16(), 200, "the sign-in form");
        let cookie = set_cookie(&resp, "hookinbox_login").expect("the sign-in form's cookie");
        let html = resp.text().await.expect("html");
        (cookie, csrf_of(&html))
    }

    /// Posts the sign-in form with `token` from a form this console
    /// served; returns the answer.
    pub async fn post_login(&self, token: &str) -> reqwest::Response {
        let (cookie, csrf) = self.login_form().await;
        self.http
            .post(format!("{}/login", self.base))
            .header("cookie", cookie)
            .form(&[("token", token), ("csrf", csrf.as_str())])
            .send()
            .await
            .expect("answers")
    }

    /// Signs in through the form; returns the session cookie (`name=value`).
    pub async fn sign_in(&self, token: &str) -> String {
        sign_in_at(&self.base, token).await
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

/// Signs in through the form of the console at `base`, as a browser
/// would (the form's cookie and CSRF token); returns the session cookie
/// (`name=value`).
pub async fn sign_in_at(base: &str, token: &str) -> String {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let resp = http
        .get(format!("{base}/login"))
        .send()
        .await
        .expect("answers");
    let form_cookie = set_cookie(&resp, "hookinbox_login").expect("the sign-in form's cookie");
    let csrf = csrf_of(&resp.text().await.expect("html"));
    let resp = http
        .post(format!("{base}/login"))
        .header("cookie", form_cookie)
        .form(&[("token", token), ("csrf", csrf.as_str())])
        .send()
        .await
        .expect("answers");
    assert_eq!(resp.status().as_u16(), 303, "signed in");
    let full = set_cookie_header(&resp, "hookinbox_admin").expect("a session cookie");
    assert!(full.contains("HttpOnly"), "{full}");
    assert!(full.contains("SameSite=Strict"), "{full}");
    full.split(';').next().expect("name=value").to_owned()
}

/// The `name=value` of the cookie `name` an answer sets.
pub fn set_cookie(resp: &reqwest::Response, name: &str) -> Option<String> {
    let header = set_cookie_header(resp, name)?;
    header.split(';').next().map(str::to_owned)
}

/// The whole `Set-Cookie` header of the cookie `name`, attributes too.
pub fn set_cookie_header(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with(&format!("{name}=")))
        .map(str::to_owned)
}

/// `hookinbox-worker admin` as a child process, its standard error in a
/// file (where a panic's message would land).
pub struct SpawnedAdmin {
    /// The process and its log.
    pub process: crate::Spawned,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// Its port.
    pub port: u16,
    /// Its tokens file, if it has one.
    pub tokens_file: Option<std::path::PathBuf>,
}

impl SpawnedAdmin {
    /// Everything it wrote to standard error so far.
    pub fn logs(&self) -> String {
        self.process.logs()
    }

    /// Stops it and removes its files.
    pub async fn stop(mut self) {
        let _ = self.process.child.kill().await;
        let _ = std::fs::remove_file(&self.process.log);
        if let Some(t) = &self.tokens_file {
            let _ = std::fs::remove_file(t);
        }
    }
}

impl TestEnv {
    /// Runs `hookinbox-worker admin ARGS` against this test's database,
    /// with [`TOKENS`] unless `--insecure-loopback` is among `args`, and
    /// `extra` variables; waits until it answers `/readyz`.
    pub async fn spawn_admin(&self, args: &[&str], extra: &[(&str, &str)]) -> SpawnedAdmin {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let tokens_file = (!args.contains(&"--insecure-loopback")).then(|| {
            let path = std::env::temp_dir().join(format!("{}-admin-{port}.tokens", self.prefix));
            std::fs::write(&path, TOKENS).expect("tokens file");
            path
        });
        let tokens = tokens_file
            .as_ref()
            .map(|t| t.to_string_lossy().into_owned());
        let mut env: Vec<(&str, &str)> = vec![("HOOKINBOX_ADMIN_LISTEN", &listen)];
        if let Some(t) = &tokens {
            env.push(("HOOKINBOX_ADMIN_TOKENS_FILE", t));
        }
        env.extend_from_slice(extra);
        let args: Vec<&str> = ["admin"].into_iter().chain(args.iter().copied()).collect();
        let process = self.spawn_with_args("hookinbox-worker", &args, &env);
        let base = format!("http://{listen}");
        let ready = format!("{base}/readyz");
        wait_until(
            "the console to answer",
            std::time::Duration::from_secs(30),
            || async { reqwest::get(&ready).await.is_ok_and(|r| r.status() == 200) },
        )
        .await;
        SpawnedAdmin {
            process,
            base,
            port,
            tokens_file,
        }
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
                    "insert into bodies (provider, source, hook_id, delivery_id, received_at,
                                         content_type, headers, size, encoding, body)
                     select 'github', $1, $2, $3, d.created_at, 'application/json',
                            jsonb_build_array(jsonb_build_array('x-github-event', $4::text),
                                              jsonb_build_array('x-github-delivery', $3::text)),
                            length(convert_to($5, 'UTF8')), 'identity', convert_to($5, 'UTF8')
                     from deliveries d
                     where d.source = $1 and d.hook_id = $2 and d.delivery_id = $3
                     limit 1",
                    &[&r.source, &r.hook_id, &r.id, &r.event, &r.body],
                )
                .await
                .expect("seed its body");
        }
    }
}

/// `n` dead letters `bulk-1` … `bulk-n` of source `default`, each with a
/// JSON body kept, in one statement each.
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
             insert into bodies (provider, source, hook_id, delivery_id, received_at, content_type,
                                 headers, size, encoding, body)
             select provider, source, hook_id, delivery_id, created_at, 'application/json',
                 '[]'::jsonb, length(convert_to('{{\"n\":' || g || '}}', 'UTF8')), 'identity',
                 convert_to('{{\"n\":' || g || '}}', 'UTF8')
             from generate_series(1, {n}) g
             join deliveries on source = 'default' and hook_id = '1' and delivery_id = 'bulk-' || g;"
        ))
        .await
        .expect("seed dead letters");
}

/// Sends `request` (raw bytes: a head, maybe part of a body) to
/// 127.0.0.1:`port`, then waits up to `wait` for the answer's first line
/// (`HTTP/1.1 421 Misdirected Request`), or `None` if none came.
pub async fn raw_status_line(
    port: u16,
    request: &[u8],
    wait: std::time::Duration,
) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connects");
    stream.write_all(request).await.expect("writes");
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    if answer.windows(2).any(|w| w == b"\r\n") {
                        break;
                    }
                }
            }
        }
    };
    let _ = tokio::time::timeout(wait, read).await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    text.split("\r\n")
        .next()
        .filter(|l| l.starts_with("HTTP/"))
        .map(str::to_owned)
}
