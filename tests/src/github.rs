//! A local fake of GitHub's webhook-delivery API, for the reconciler's
//! tests and the fault suite. It is the only third-party server the tests
//! fake, and it follows GitHub's documented shapes:
//!
//! - it sends deliveries to ingest as GitHub does (signed body,
//!   `X-GitHub-Event`, `X-GitHub-Delivery`, `X-GitHub-Hook-ID`, a 10-second
//!   limit) and logs each attempt with the answer's status;
//! - `GET /repos/{owner}/{repo}/hooks/{id}/deliveries`,
//!   `GET /orgs/{org}/hooks/{id}/deliveries` and `GET /app/hook/deliveries`
//!   list the log newest first, `per_page` (at most 100), the next page's
//!   `cursor` in the `link` header, only the failed deliveries with
//!   `status=failure` (only the successful with `status=success`), each
//!   with `throttled_at` (null unless [`FakeGithub::throttle`]);
//! - `GET …/deliveries/{id}` returns one attempt with its request;
//! - `POST …/deliveries/{id}/attempts` answers 202 and really sends the
//!   logged request to ingest again (same GUID, the signature computed
//!   again), logging the new attempt as a redelivery;
//! - the repository and organization paths take `Authorization: Bearer`
//!   with the configured token (or an installation token it minted); the
//!   App's path takes only a JWT, checked with the App's public key
//!   (RS256, `iss` the App's id, at most ten minutes), which also mints
//!   installation tokens at `POST /app/installations/{id}/access_tokens`;
//! - rate limits (403 with `x-ratelimit-remaining: 0`, 429 with
//!   `retry-after`) and 422s can be injected, and deliveries can appear in
//!   the log late;
//! - each API request's `Host` is kept ([`FakeGithub::api_hosts`]), so a
//!   test can serve it under another name (a GHE.com API's) and check the
//!   client asked for that name.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use chrono::{DateTime, Utc};
use serde_json::json;

use crate::sign;

/// Where a hook lives in the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookPath {
    /// A repository's hook.
    Repo {
        /// Owner.
        owner: String,
        /// Repository.
        repo: String,
        /// Hook id.
        id: u64,
    },
    /// An organization's hook.
    Org {
        /// Organization.
        org: String,
        /// Hook id.
        id: u64,
    },
    /// A GitHub App's hook.
    App,
}

impl HookPath {
    fn deliveries(&self) -> String {
        match self {
            Self::Repo { owner, repo, id } => {
                format!("/repos/{owner}/{repo}/hooks/{id}/deliveries")
            }
            Self::Org { org, id } => format!("/orgs/{org}/hooks/{id}/deliveries"),
            Self::App => "/app/hook/deliveries".to_owned(),
        }
    }
}

/// A hook the fake delivers for.
#[derive(Clone, Debug)]
pub struct Hook {
    /// Where it lives in the API.
    pub path: HookPath,
    /// The `X-GitHub-Hook-ID` its deliveries carry.
    pub hook_id: String,
    /// Where it POSTs (ingest's route).
    pub target: String,
    /// Its webhook secret.
    pub secret: String,
}

/// An answer the next API request gets instead of its own.
#[derive(Clone, Debug)]
pub enum Fault {
    /// 403, `x-ratelimit-remaining: 0`, reset this many seconds from now.
    RateLimited403 {
        /// Seconds until the reset.
        reset_in_secs: u64,
    },
    /// 429 with `retry-after`.
    TooMany429 {
        /// Seconds.
        retry_after_secs: u64,
    },
    /// 500.
    ServerError,
}

/// One logged attempt.
#[derive(Clone, Debug)]
pub struct Logged {
    /// Grows over time.
    pub id: i64,
    hook: usize,
    /// `X-GitHub-Delivery`.
    pub guid: String,
    /// When it was sent.
    pub delivered_at: DateTime<Utc>,
    /// Whether it was a redelivery.
    pub redelivery: bool,
    /// `OK`, or what went wrong.
    pub status: String,
    /// The answer's status, 0 without one.
    pub status_code: u16,
    /// `X-GitHub-Event`.
    pub event: String,
    action: Option<String>,
    body: Vec<u8>,
    /// Hidden from the log until [`FakeGithub::reveal`] (a delivery that
    /// appears late).
    visible: bool,
    /// When GitHub held it back for the hook's rate of deliveries.
    pub throttled_at: Option<DateTime<Utc>>,
}

#[derive(Default)]
struct State {
    hooks: Vec<Hook>,
    log: Vec<Logged>,
    next_id: i64,
    token: String,
    app: Option<(String, Vec<u8>, u64)>,
    minted: HashSet<String>,
    faults: VecDeque<Fault>,
    refuse: HashSet<String>,
    /// Redelivery requests per GUID.
    attempts: HashMap<String, u32>,
    list_requests: u32,
    /// Every API request answered (lists, reads, redeliveries, tokens).
    api_requests: u32,
    /// The `Host` header of each API request, in order.
    api_hosts: Vec<String>,
    /// After this many redelivery requests, the next ones never answer (a
    /// reconciler killed mid-pass).
    hang_after: Option<u32>,
    redeliveries_asked: u32,
}

/// The fake, running on a local port.
#[derive(Clone)]
pub struct FakeGithub {
    /// `http://127.0.0.1:<port>`: the API base URL.
    pub base: String,
    state: Arc<Mutex<State>>,
    http: reqwest::Client,
}

/// The throwaway App key pair of `tests/fixtures/github-app/`.
pub fn app_keys() -> (Vec<u8>, Vec<u8>) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/github-app");
    (
        std::fs::read(dir.join("app-private-key.pem")).expect("private key"),
        std::fs::read(dir.join("app-public-key.pem")).expect("public key"),
    )
}

impl FakeGithub {
    /// Starts the fake; `token` is the bearer its repository and
    /// organization paths accept.
    pub fn start(token: &str) -> Self {
        let state = Arc::new(Mutex::new(State {
            token: token.to_owned(),
            next_id: 1000,
            ..State::default()
        }));
        // No pooled connections: the fake sends from the test's runtime and
        // from its own server threads, and a connection kept for one
        // runtime would stall when used from another.
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(0)
            .build()
            .expect("client");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let fake = Self {
            base: format!("http://127.0.0.1:{port}"),
            state,
            http,
        };
        let data = web::Data::new(fake.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .default_service(web::to(route))
        })
        .workers(2)
        .disable_signals()
        .listen(listener)
        .expect("listen")
        .run();
        tokio::spawn(server);
        fake
    }

    /// Accepts JWTs of the App `app_id` (checked with `public_pem`) and
    /// mints tokens for its installation `installation`.
    pub fn with_app(self, app_id: &str, public_pem: &[u8], installation: u64) -> Self {
        self.lock().app = Some((app_id.to_owned(), public_pem.to_vec(), installation));
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("fake state")
    }

    /// Adds a hook; returns its index for [`FakeGithub::deliver`].
    pub fn add_hook(&self, hook: Hook) -> usize {
        let mut s = self.lock();
        s.hooks.push(hook);
        s.hooks.len() - 1
    }

    /// Sends a new delivery of `event` through hook `hook` and logs the
    /// attempt; returns its GUID and the answer's status (0 without one).
    pub async fn deliver(&self, hook: usize, event: &str, body: &[u8]) -> (String, u16) {
        let guid = uuid::Uuid::new_v4().to_string();
        let status = self.send(hook, &guid, event, body, false).await;
        (guid, status)
    }

    /// Sends `guid` (new, or again as GitHub's redelivery does) and logs
    /// the attempt.
    pub async fn send(
        &self,
        hook: usize,
        guid: &str,
        event: &str,
        body: &[u8],
        redelivery: bool,
    ) -> u16 {
        let h = self.lock().hooks[hook].clone();
        let answer = self
            .http
            .post(&h.target)
            .header("content-type", "application/json")
            .header("user-agent", "GitHub-Hookshot/fake")
            .header("x-github-event", event)
            .header("x-github-delivery", guid)
            .header("x-github-hook-id", &h.hook_id)
            .header("x-hub-signature-256", sign(&h.secret, body))
            .body(body.to_vec())
            .send()
            .await;
        let (status_code, status) = match &answer {
            Ok(r) if r.status().is_success() => (r.status().as_u16(), "OK".to_owned()),
            Ok(r) => (
                r.status().as_u16(),
                format!("Invalid HTTP Response: {}", r.status().as_u16()),
            ),
            Err(e) if e.is_timeout() => (0, "timed out".to_owned()),
            Err(_) => (0, "failed to connect to host".to_owned()),
        };
        self.record(
            hook,
            guid,
            event,
            body,
            status_code,
            &status,
            redelivery,
            Utc::now(),
            true,
        );
        status_code
    }

    /// Adds the repository hook 123456 of `acme/widgets`, sending to
    /// `target` signed with [`crate::SECRET`]; returns its index.
    pub fn add_acme_widgets_hook(&self, target: String) -> usize {
        self.add_hook(Hook {
            path: HookPath::Repo {
                owner: "acme".into(),
                repo: "widgets".into(),
                id: 123456,
            },
            hook_id: "123456".into(),
            target,
            secret: crate::SECRET.to_owned(),
        })
    }

    /// Logs a push through `hook` that got no answer ten minutes ago (what
    /// the reconciler brings back) under a new guid; returns the guid.
    pub fn record_unanswered_push(&self, hook: usize) -> String {
        let guid = uuid::Uuid::new_v4().to_string();
        self.record(
            hook,
            &guid,
            "push",
            &crate::fixtures::unique(&crate::fixtures::own("push")),
            0,
            "failed to connect to host",
            false,
            Utc::now() - chrono::Duration::minutes(10),
            true,
        );
        guid
    }

    /// Logs an attempt without sending anything: what GitHub's log would
    /// show. `status_code` 0 means no answer.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        hook: usize,
        guid: &str,
        event: &str,
        body: &[u8],
        status_code: u16,
        status: &str,
        redelivery: bool,
        delivered_at: DateTime<Utc>,
        visible: bool,
    ) -> i64 {
        let action = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["action"].as_str().map(str::to_owned));
        let mut s = self.lock();
        s.next_id += 1;
        let id = s.next_id;
        s.log.push(Logged {
            id,
            hook,
            guid: guid.to_owned(),
            delivered_at,
            redelivery,
            status: status.to_owned(),
            status_code,
            event: event.to_owned(),
            action,
            body: body.to_vec(),
            visible,
            throttled_at: None,
        });
        id
    }

    /// Marks each logged attempt of `guid` throttled at its delivery time.
    pub fn throttle(&self, guid: &str) {
        for d in self.lock().log.iter_mut().filter(|d| d.guid == guid) {
            d.throttled_at = Some(d.delivered_at);
        }
    }

    /// API requests answered in all.
    pub fn api_requests(&self) -> u32 {
        self.lock().api_requests
    }

    /// The `Host` header each API request carried, in order (empty for a
    /// request without one): the name the client asked for, whatever
    /// address it reached.
    pub fn api_hosts(&self) -> Vec<String> {
        self.lock().api_hosts.clone()
    }

    /// Marks a logged attempt as failed, as if ingest answered after
    /// GitHub's 10-second limit.
    pub fn mark_timed_out(&self, guid: &str) {
        for d in self.lock().log.iter_mut().filter(|d| d.guid == guid) {
            d.status_code = 0;
            d.status = "timed out".to_owned();
        }
    }

    /// Shows every attempt logged hidden.
    pub fn reveal(&self) {
        for d in self.lock().log.iter_mut() {
            d.visible = true;
        }
    }

    /// The next API request gets `fault` instead of its answer.
    pub fn push_fault(&self, fault: Fault) {
        self.lock().faults.push_back(fault);
    }

    /// Redelivery requests for `guid` get 422.
    pub fn refuse(&self, guid: &str) {
        self.lock().refuse.insert(guid.to_owned());
    }

    /// Redelivery requests after the next `n` never answer.
    pub fn hang_after(&self, n: u32) {
        let mut s = self.lock();
        s.hang_after = Some(s.redeliveries_asked + n);
    }

    /// Lets every redelivery request answer again.
    pub fn unhang(&self) {
        self.lock().hang_after = None;
    }

    /// Redelivery requests GitHub got for `guid`.
    pub fn redeliveries_asked(&self, guid: &str) -> u32 {
        self.lock().attempts.get(guid).copied().unwrap_or(0)
    }

    /// Times GitHub really sent `guid` again (its logged redeliveries).
    pub fn resent(&self, guid: &str) -> usize {
        self.lock()
            .log
            .iter()
            .filter(|d| d.guid == guid && d.redelivery)
            .count()
    }

    /// Redelivery requests GitHub got in all.
    pub fn redeliveries_total(&self) -> u32 {
        self.lock().redeliveries_asked
    }

    /// List requests GitHub got.
    pub fn list_requests(&self) -> u32 {
        self.lock().list_requests
    }

    /// Every GUID the log holds, each with whether any attempt got a 2xx.
    pub fn guids(&self) -> BTreeMap<String, bool> {
        let mut out = BTreeMap::new();
        for d in &self.lock().log {
            *out.entry(d.guid.clone()).or_insert(false) |= (200..300).contains(&d.status_code);
        }
        out
    }

    /// Every logged attempt.
    pub fn log(&self) -> Vec<Logged> {
        self.lock().log.clone()
    }

    /// Whether `request` carries credentials for `hook`'s path.
    fn authorized(&self, req: &HttpRequest, app_path: bool) -> bool {
        let Some(bearer) = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("token "))
            })
        else {
            return false;
        };
        let s = self.lock();
        if app_path {
            return s
                .app
                .as_ref()
                .is_some_and(|(id, public, _)| jwt_valid(bearer, id, public));
        }
        bearer == s.token || s.minted.contains(bearer)
    }
}

/// A JWT signed RS256 by the App's key, issued by `app_id`, living at most
/// ten minutes (plus a minute of clock drift).
fn jwt_valid(token: &str, app_id: &str, public_pem: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Claims {
        iat: i64,
        exp: i64,
        iss: serde_json::Value,
    }
    let Ok(key) = jsonwebtoken::DecodingKey::from_rsa_pem(public_pem) else {
        return false;
    };
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    validation.set_required_spec_claims(&["exp", "iat", "iss"]);
    let Ok(data) = jsonwebtoken::decode::<Claims>(token, &key, &validation) else {
        return false;
    };
    let c = data.claims;
    let iss = match &c.iss {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    iss == app_id && c.exp - c.iat <= 660 && c.iat <= Utc::now().timestamp() + 60
}

fn github_error(status: StatusCode, message: &str) -> HttpResponse {
    HttpResponse::build(status).json(json!({
        "message": message,
        "documentation_url": "https://docs.github.com/rest",
    }))
}

fn item(d: &Logged) -> serde_json::Value {
    json!({
        "id": d.id,
        "guid": d.guid,
        "delivered_at": d.delivered_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "redelivery": d.redelivery,
        "duration": 0.05,
        "status": d.status,
        "status_code": d.status_code,
        "event": d.event,
        "action": d.action,
        "installation_id": null,
        "repository_id": 1296269,
        "throttled_at": d.throttled_at.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
    })
}

/// Every API request.
async fn route(req: HttpRequest, fake: web::Data<FakeGithub>) -> HttpResponse {
    let fake = fake.get_ref().clone();
    let host = req
        .headers()
        .get("host")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    {
        let mut s = fake.lock();
        s.api_requests += 1;
        s.api_hosts.push(host);
    }
    if let Some(fault) = fake.lock().faults.pop_front() {
        return match fault {
            Fault::RateLimited403 { reset_in_secs } => HttpResponse::Forbidden()
                .insert_header(("x-ratelimit-limit", "5000"))
                .insert_header(("x-ratelimit-remaining", "0"))
                .insert_header((
                    "x-ratelimit-reset",
                    (Utc::now().timestamp() as u64 + reset_in_secs).to_string(),
                ))
                .json(json!({"message": "API rate limit exceeded"})),
            Fault::TooMany429 { retry_after_secs } => HttpResponse::TooManyRequests()
                .insert_header(("retry-after", retry_after_secs.to_string()))
                .json(json!({"message": "You have exceeded a secondary rate limit"})),
            Fault::ServerError => github_error(StatusCode::INTERNAL_SERVER_ERROR, "Server Error"),
        };
    }
    let path = req.path().to_owned();
    let method = req.method().clone();

    // POST /app/installations/{id}/access_tokens: JWT in, token out.
    if let Some(rest) = path.strip_prefix("/app/installations/")
        && let Some(id) = rest.strip_suffix("/access_tokens")
        && method == actix_web::http::Method::POST
    {
        if !fake.authorized(&req, true) {
            return github_error(
                StatusCode::UNAUTHORIZED,
                "A JSON web token could not be decoded",
            );
        }
        let mut s = fake.lock();
        if s.app.as_ref().map(|a| a.2.to_string()) != Some(id.to_owned()) {
            return github_error(StatusCode::NOT_FOUND, "Not Found");
        }
        let token = format!("ghs_{}", uuid::Uuid::new_v4().simple());
        s.minted.insert(token.clone());
        return HttpResponse::Created().json(json!({
            "token": token,
            "expires_at": (Utc::now() + chrono::Duration::hours(1)).to_rfc3339(),
        }));
    }

    let hooks: Vec<(usize, String, bool)> = fake
        .lock()
        .hooks
        .iter()
        .enumerate()
        .map(|(i, h)| (i, h.path.deliveries(), h.path == HookPath::App))
        .collect();
    let Some((hook, base, app)) = hooks
        .into_iter()
        .find(|(_, base, _)| path == *base || path.starts_with(&format!("{base}/")))
    else {
        return github_error(StatusCode::NOT_FOUND, "Not Found");
    };
    if !fake.authorized(&req, app) {
        return github_error(StatusCode::UNAUTHORIZED, "Bad credentials");
    }
    let rest = path[base.len()..].trim_start_matches('/').to_owned();
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    match (method.as_str(), parts.as_slice()) {
        ("GET", []) => list(&fake, &req, hook, &base),
        ("GET", [id]) => one(&fake, hook, id),
        ("POST", [id, "attempts"]) => redeliver(&fake, hook, id).await,
        _ => github_error(StatusCode::NOT_FOUND, "Not Found"),
    }
}

fn list(fake: &FakeGithub, req: &HttpRequest, hook: usize, base: &str) -> HttpResponse {
    let query: HashMap<String, String> = form_urlencoded::parse(req.query_string().as_bytes())
        .into_owned()
        .collect();
    let per_page = query
        .get("per_page")
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(30)
        .clamp(1, 100);
    let before = match query.get("cursor") {
        None => i64::MAX,
        Some(c) => match c.strip_prefix("v1_").and_then(|n| n.parse().ok()) {
            Some(n) => n,
            None => return github_error(StatusCode::BAD_REQUEST, "Invalid cursor"),
        },
    };
    let succeeded = |d: &Logged| (200..300).contains(&d.status_code);
    let status: Option<bool> = match query.get("status").map(String::as_str) {
        None => None,
        Some("success") => Some(true),
        Some("failure") => Some(false),
        Some(_) => {
            return github_error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Validation Failed: status must be success or failure",
            );
        }
    };
    let mut s = fake.lock();
    s.list_requests += 1;
    let mut newest_first: Vec<&Logged> = s
        .log
        .iter()
        .filter(|d| d.hook == hook && d.visible && d.id < before)
        .filter(|d| status.is_none_or(|ok| succeeded(d) == ok))
        .collect();
    newest_first.sort_by_key(|d| std::cmp::Reverse(d.id));
    let page: Vec<serde_json::Value> = newest_first
        .iter()
        .take(per_page)
        .map(|d| item(d))
        .collect();
    let mut response = HttpResponse::Ok();
    if newest_first.len() > per_page
        && let Some(last) = newest_first.get(per_page - 1)
    {
        response.insert_header((
            "link",
            format!(
                "<{}{base}?per_page={per_page}{}&cursor=v1_{}>; rel=\"next\"",
                fake.base,
                query
                    .get("status")
                    .map(|s| format!("&status={s}"))
                    .unwrap_or_default(),
                last.id
            ),
        ));
    }
    response
        .insert_header(("x-ratelimit-remaining", "4999"))
        .json(page)
}

fn one(fake: &FakeGithub, hook: usize, id: &str) -> HttpResponse {
    let s = fake.lock();
    let Some(d) = id
        .parse::<i64>()
        .ok()
        .and_then(|id| s.log.iter().find(|d| d.id == id && d.hook == hook))
    else {
        return github_error(StatusCode::NOT_FOUND, "Not Found");
    };
    let h = &s.hooks[hook];
    let mut body = item(d);
    body["url"] = json!(format!("{}{}/{}", fake.base, h.path.deliveries(), d.id));
    body["request"] = json!({
        "headers": {
            "Accept": "*/*",
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/fake",
            "X-GitHub-Delivery": d.guid,
            "X-GitHub-Event": d.event,
            "X-GitHub-Hook-ID": h.hook_id,
            "X-Hub-Signature-256": sign(&h.secret, &d.body),
        },
        "payload": serde_json::from_slice::<serde_json::Value>(&d.body).unwrap_or(json!(null)),
    });
    body["response"] = json!({"headers": {}, "payload": null});
    HttpResponse::Ok().json(body)
}

async fn redeliver(fake: &FakeGithub, hook: usize, id: &str) -> HttpResponse {
    let (found, hang) = {
        let mut s = fake.lock();
        let found = id
            .parse::<i64>()
            .ok()
            .and_then(|id| s.log.iter().find(|d| d.id == id && d.hook == hook).cloned());
        let Some(d) = found else {
            return github_error(StatusCode::NOT_FOUND, "Not Found");
        };
        s.redeliveries_asked += 1;
        *s.attempts.entry(d.guid.clone()).or_insert(0) += 1;
        if s.refuse.contains(&d.guid) {
            return github_error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Validation Failed: the endpoint has been spammed",
            );
        }
        let hang = s.hang_after.is_some_and(|n| s.redeliveries_asked > n);
        (d, hang)
    };
    if hang {
        // Never answers: the reconciler asking it is killed.
        std::future::pending::<()>().await;
    }
    fake.send(hook, &found.guid, &found.event, &found.body, true)
        .await;
    HttpResponse::Accepted().json(json!({}))
}
