//! GitHub's REST API for one hook's delivery log: list it (newest first,
//! paged by the `link` header's cursor), read one delivery, and ask for a
//! redelivery. Authenticates with a token, or as a GitHub App (a JWT, and
//! for repository and organization hooks an installation token minted with
//! it). Rate limits (`retry-after`, `x-ratelimit-reset`) are waited out up
//! to a bound; a longer wait is an error.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use hookinbox::config::{GithubAuth, HookKind};
use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;
use tokio::sync::Mutex;

use crate::resolve::HostsFileResolver;

/// The API version the requests ask for.
const API_VERSION: &str = "2022-11-28";
/// Deliveries per page: GitHub's maximum.
pub(crate) const PER_PAGE: u32 = 100;
/// An installation token is minted again this long before it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(300);

/// One attempt in a hook's delivery log (GitHub's "simple webhook
/// delivery").
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct LoggedDelivery {
    /// Grows over time; what a redelivery is asked for.
    pub(crate) id: i64,
    /// `X-GitHub-Delivery`, shared by an attempt and its redeliveries.
    pub(crate) guid: String,
    pub(crate) delivered_at: DateTime<Utc>,
    /// The receiver's HTTP status; 0 when there was no answer. (GitHub
    /// also logs `status`, `OK` on success, and whether the attempt was a
    /// `redelivery`.)
    #[serde(default)]
    pub(crate) status_code: i64,
    pub(crate) event: String,
    #[serde(default)]
    pub(crate) action: Option<String>,
    /// When GitHub held the delivery back for the hook's rate of
    /// deliveries; `None` when it did not.
    #[serde(default)]
    pub(crate) throttled_at: Option<DateTime<Utc>>,
}

impl LoggedDelivery {
    /// Whether hookinbox answered 2xx to this attempt.
    pub(crate) fn succeeded(&self) -> bool {
        (200..300).contains(&self.status_code)
    }
}

/// One page of the log, and the cursor of the next, older one.
pub(crate) struct Page {
    pub(crate) deliveries: Vec<LoggedDelivery>,
    pub(crate) next: Option<String>,
}

/// The request GitHub sent for one delivery (`GET …/deliveries/{id}`).
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct SentRequest {
    /// Header names as GitHub sent them.
    #[serde(default)]
    pub(crate) headers: Option<HashMap<String, serde_json::Value>>,
}

impl SentRequest {
    /// A header's value, by a case-insensitive name.
    pub(crate) fn header(&self, name: &str) -> Option<String> {
        self.headers
            .as_ref()?
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| match v {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
    }
}

#[derive(Deserialize)]
struct Detail {
    #[serde(default)]
    request: Option<SentRequest>,
}

/// What GitHub said to a redelivery request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Redelivery {
    /// 202: GitHub sends the delivery again, with the same GUID.
    Accepted,
    /// 422: validation failed, or the endpoint was spammed. Recorded, not
    /// retried in this pass.
    Refused(String),
}

/// Why a request to GitHub failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 401, or a 403 that is not a rate limit.
    #[error("GitHub refused the credentials for {hook} ({status}): {message}")]
    Auth {
        /// The hook.
        hook: String,
        /// The status.
        status: u16,
        /// GitHub's message.
        message: String,
    },
    /// 404: no such hook, or the credentials cannot see it.
    #[error("GitHub knows no hook {0} (404): check the hook setting and the credentials' access")]
    NotFound(String),
    /// A rate limit whose wait is longer than allowed.
    #[error("GitHub's rate limit asks to wait {0:?}, longer than the wait allowed (--max-wait)")]
    RateLimited(Duration),
    /// No answer.
    #[error("GitHub is unreachable: {0}")]
    Unreachable(String),
    /// Any other answer.
    #[error("GitHub answered {status}: {message}")]
    Unexpected {
        /// The status.
        status: u16,
        /// GitHub's message.
        message: String,
    },
    /// The App's JWT could not be made.
    #[error("cannot sign the App's JWT: {0}")]
    Jwt(String),
}

/// A client for one hook's log.
pub(crate) struct Api {
    http: reqwest::Client,
    base: Url,
    hook: HookKind,
    auth: GithubAuth,
    /// The `source` label of the rate-limit gauge.
    source: String,
    /// The longest single wait for a rate limit.
    max_wait: Duration,
    /// An installation token and when to mint the next.
    installation: Mutex<Option<(String, Instant)>>,
    /// Requests sent to GitHub (each try after a rate-limit wait too).
    requests: std::sync::atomic::AtomicU64,
}

impl Api {
    /// A client of the API at `base` for `hook`, waiting out a rate limit
    /// at most `max_wait`; `hosts_file` is consulted before DNS
    /// (`HOOKINBOX_GITHUB_API_HOSTS_FILE`).
    pub(crate) fn new(
        base: Url,
        hook: HookKind,
        auth: GithubAuth,
        source: &str,
        max_wait: Duration,
        hosts_file: Option<PathBuf>,
    ) -> Result<Self, ApiError> {
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(30))
            .user_agent(concat!("hookinbox/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = hosts_file {
            builder = builder.dns_resolver(Arc::new(HostsFileResolver::new(path)));
        }
        let http = builder
            .build()
            .map_err(|e| ApiError::Unreachable(e.to_string()))?;
        Ok(Self {
            http,
            base,
            hook,
            auth,
            source: source.to_owned(),
            max_wait,
            installation: Mutex::new(None),
            requests: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn url(&self, path: &str) -> Result<Url, ApiError> {
        let joined = format!("{}{path}", self.base.as_str().trim_end_matches('/'));
        Url::parse(&joined).map_err(|e| ApiError::Unreachable(format!("bad URL {joined}: {e}")))
    }

    /// Requests sent to GitHub so far.
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A page of the log, newest first; `failures_only`: only the
    /// deliveries GitHub saw fail (`status=failure`).
    pub(crate) async fn list(
        &self,
        cursor: Option<&str>,
        failures_only: bool,
    ) -> Result<Page, ApiError> {
        let mut url = self.url(&self.hook.deliveries_path())?;
        url.query_pairs_mut()
            .append_pair("per_page", &PER_PAGE.to_string());
        if failures_only {
            url.query_pairs_mut().append_pair("status", "failure");
        }
        if let Some(cursor) = cursor {
            url.query_pairs_mut().append_pair("cursor", cursor);
        }
        let response = self.send(Method::GET, url).await?;
        let next = next_cursor(response.headers());
        let deliveries =
            response
                .json::<Vec<LoggedDelivery>>()
                .await
                .map_err(|e| ApiError::Unexpected {
                    status: 200,
                    message: format!("the delivery list does not parse: {e}"),
                })?;
        Ok(Page { deliveries, next })
    }

    /// The request GitHub sent for one delivery.
    pub(crate) async fn request_of(&self, id: i64) -> Result<SentRequest, ApiError> {
        let url = self.url(&format!("{}/{id}", self.hook.deliveries_path()))?;
        let response = self.send(Method::GET, url).await?;
        let detail: Detail = response.json().await.map_err(|e| ApiError::Unexpected {
            status: 200,
            message: format!("the delivery does not parse: {e}"),
        })?;
        Ok(detail.request.unwrap_or_default())
    }

    /// Asks GitHub to send the delivery `id` again.
    pub(crate) async fn redeliver(&self, id: i64) -> Result<Redelivery, ApiError> {
        let url = self.url(&format!("{}/{id}/attempts", self.hook.deliveries_path()))?;
        match self.send(Method::POST, url).await {
            Ok(_) => Ok(Redelivery::Accepted),
            Err(ApiError::Unexpected {
                status: 422,
                message,
            }) => Ok(Redelivery::Refused(message)),
            Err(e) => Err(e),
        }
    }

    /// Sends a request with the right credentials, waiting out rate limits
    /// up to `max_wait` each.
    async fn send(&self, method: Method, url: Url) -> Result<reqwest::Response, ApiError> {
        loop {
            let bearer = self.bearer().await?;
            self.requests
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let response = self
                .http
                .request(method.clone(), url.clone())
                .header("accept", "application/vnd.github+json")
                .header("x-github-api-version", API_VERSION)
                .bearer_auth(&bearer)
                .send()
                .await
                .map_err(|e| ApiError::Unreachable(without_url(&e)))?;
            let headers = response.headers().clone();
            if let Some(remaining) = header_u64(&headers, "x-ratelimit-remaining") {
                metrics::gauge!(hookinbox::metrics::GITHUB_RATE_LIMIT_REMAINING, "source" => self.source.clone())
                    .set(remaining as f64);
            }
            let status = response.status();
            if status.is_success() {
                return Ok(response);
            }
            if let Some(wait) = rate_limit_wait(status, &headers) {
                if wait > self.max_wait {
                    return Err(ApiError::RateLimited(wait));
                }
                tracing::warn!(
                    wait_ms = wait.as_millis() as u64,
                    status = status.as_u16(),
                    "GitHub rate limit: waiting"
                );
                tokio::time::sleep(wait).await;
                continue;
            }
            let message = message_of(response).await;
            return Err(match status {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ApiError::Auth {
                    hook: self.hook.to_string(),
                    status: status.as_u16(),
                    message,
                },
                StatusCode::NOT_FOUND => ApiError::NotFound(self.hook.to_string()),
                other => ApiError::Unexpected {
                    status: other.as_u16(),
                    message,
                },
            });
        }
    }

    /// The bearer for this hook: the token, the App's JWT (App hooks), or
    /// an installation token (repository and organization hooks as an App).
    async fn bearer(&self) -> Result<String, ApiError> {
        match &self.auth {
            GithubAuth::Token(token) => Ok(token.clone()),
            GithubAuth::App {
                app_id, key_pem, ..
            } if self.hook == HookKind::App => jwt(app_id, key_pem),
            GithubAuth::App {
                app_id,
                key_pem,
                installation_id,
            } => {
                let mut cached = self.installation.lock().await;
                if let Some((token, until)) = cached.as_ref()
                    && Instant::now() < *until
                {
                    return Ok(token.clone());
                }
                let id = installation_id.ok_or_else(|| ApiError::Auth {
                    hook: self.hook.to_string(),
                    status: 0,
                    message: "no installation id for an App reading this hook".to_owned(),
                })?;
                let (token, lifetime) = self.mint(app_id, key_pem, id).await?;
                *cached = Some((
                    token.clone(),
                    Instant::now() + lifetime.saturating_sub(TOKEN_MARGIN),
                ));
                Ok(token)
            }
        }
    }

    /// `POST /app/installations/{id}/access_tokens` with the App's JWT.
    async fn mint(
        &self,
        app_id: &str,
        key_pem: &[u8],
        installation: u64,
    ) -> Result<(String, Duration), ApiError> {
        #[derive(Deserialize)]
        struct Minted {
            token: String,
            expires_at: DateTime<Utc>,
        }
        let url = self.url(&format!("/app/installations/{installation}/access_tokens"))?;
        let response = self
            .http
            .post(url)
            .header("accept", "application/vnd.github+json")
            .header("x-github-api-version", API_VERSION)
            .bearer_auth(jwt(app_id, key_pem)?)
            .send()
            .await
            .map_err(|e| ApiError::Unreachable(without_url(&e)))?;
        let status = response.status();
        if !status.is_success() {
            return Err(ApiError::Auth {
                hook: self.hook.to_string(),
                status: status.as_u16(),
                message: format!(
                    "minting an installation token: {}",
                    message_of(response).await
                ),
            });
        }
        let minted: Minted = response.json().await.map_err(|e| ApiError::Unexpected {
            status: status.as_u16(),
            message: format!("the installation token does not parse: {e}"),
        })?;
        let lifetime = (minted.expires_at - Utc::now())
            .to_std()
            .unwrap_or(Duration::ZERO);
        Ok((minted.token, lifetime))
    }
}

/// A GitHub App's JWT: RS256, issued 60 s in the past (clock drift), valid
/// for 9 minutes (GitHub allows at most 10).
fn jwt(app_id: &str, key_pem: &[u8]) -> Result<String, ApiError> {
    #[derive(serde::Serialize)]
    struct Claims<'a> {
        iat: i64,
        exp: i64,
        iss: &'a str,
    }
    let now = Utc::now().timestamp();
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(key_pem)
        .map_err(|e| ApiError::Jwt(e.to_string()))?;
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
        &Claims {
            iat: now - 60,
            exp: now + 540,
            iss: app_id,
        },
        &key,
    )
    .map_err(|e| ApiError::Jwt(e.to_string()))
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// How long a 403 or 429 asks to wait: `retry-after` (seconds), else, with
/// no requests left, until `x-ratelimit-reset` (epoch seconds). `None`: not
/// a rate limit.
pub(crate) fn rate_limit_wait(status: StatusCode, headers: &HeaderMap) -> Option<Duration> {
    if status != StatusCode::FORBIDDEN && status != StatusCode::TOO_MANY_REQUESTS {
        return None;
    }
    if let Some(secs) = header_u64(headers, "retry-after") {
        return Some(Duration::from_secs(secs.max(1)));
    }
    if header_u64(headers, "x-ratelimit-remaining") == Some(0) {
        let reset = header_u64(headers, "x-ratelimit-reset")?;
        let now = Utc::now().timestamp().max(0) as u64;
        return Some(Duration::from_secs(reset.saturating_sub(now) + 1));
    }
    // A 429 without either header still means "slow down".
    (status == StatusCode::TOO_MANY_REQUESTS).then_some(Duration::from_secs(60))
}

/// The cursor of the `rel="next"` link, if any.
pub(crate) fn next_cursor(headers: &HeaderMap) -> Option<String> {
    let link = headers
        .get("link")
        .and_then(|v: &HeaderValue| v.to_str().ok())?;
    link.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        let is_next = params.split(';').any(|p| {
            let p = p.trim();
            p == "rel=\"next\"" || p == "rel=next"
        });
        if !is_next {
            return None;
        }
        let target = target.trim().trim_start_matches('<').trim_end_matches('>');
        let url = Url::parse(target).ok()?;
        url.query_pairs()
            .find(|(k, _)| k == "cursor")
            .map(|(_, v)| v.into_owned())
    })
}

/// GitHub's `message`, shortened; never the request's credentials.
async fn message_of(response: reqwest::Response) -> String {
    #[derive(Deserialize)]
    struct Message {
        message: Option<String>,
    }
    let text = response.text().await.unwrap_or_default();
    let message = serde_json::from_str::<Message>(&text)
        .ok()
        .and_then(|m| m.message)
        .unwrap_or(text);
    hookinbox::deliveries::redact(&message)
}

/// A transport error's text without the URL it may quote.
fn without_url(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    };
    kind.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("value"));
        }
        h
    }

    #[test]
    fn paths_join_the_api_base_of_github_ghe_com_and_enterprise_server() {
        let hook = HookKind::parse("repo:acme/widgets/7").expect("hook");
        for (base, want) in [
            (
                "https://api.github.com",
                "https://api.github.com/repos/acme/widgets/hooks/7/deliveries",
            ),
            (
                "https://api.octo-corp.ghe.com",
                "https://api.octo-corp.ghe.com/repos/acme/widgets/hooks/7/deliveries",
            ),
            (
                "https://ghes.example.com/api/v3/",
                "https://ghes.example.com/api/v3/repos/acme/widgets/hooks/7/deliveries",
            ),
        ] {
            let api = Api::new(
                Url::parse(base).expect("url"),
                hook.clone(),
                GithubAuth::Token("t".to_owned()),
                "default",
                Duration::from_secs(1),
                None,
            )
            .expect("client");
            let url = api.url(&hook.deliveries_path()).expect("joins");
            assert_eq!(url.as_str(), want);
        }
    }

    #[test]
    fn the_next_cursor_comes_from_the_link_header() {
        let h = headers(&[(
            "link",
            "<https://api.github.com/repos/o/r/hooks/1/deliveries?per_page=2&cursor=v1_12>; rel=\"next\", <https://api.github.com/repos/o/r/hooks/1/deliveries?per_page=2&cursor=v1_99>; rel=\"prev\"",
        )]);
        assert_eq!(next_cursor(&h).as_deref(), Some("v1_12"));
        let last = headers(&[(
            "link",
            "<https://api.github.com/x?per_page=2&cursor=v1_99>; rel=\"prev\"",
        )]);
        assert_eq!(next_cursor(&last), None);
        assert_eq!(next_cursor(&HeaderMap::new()), None);
    }

    #[test]
    fn rate_limits_say_how_long_to_wait() {
        let retry = headers(&[("retry-after", "7")]);
        assert_eq!(
            rate_limit_wait(StatusCode::TOO_MANY_REQUESTS, &retry),
            Some(Duration::from_secs(7))
        );
        let reset = (Utc::now().timestamp() + 5).to_string();
        let exhausted = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &reset),
        ]);
        let wait = rate_limit_wait(StatusCode::FORBIDDEN, &exhausted).expect("a wait");
        assert!(
            wait >= Duration::from_secs(4) && wait <= Duration::from_secs(7),
            "{wait:?}"
        );
        let forbidden = headers(&[("x-ratelimit-remaining", "4000")]);
        assert_eq!(rate_limit_wait(StatusCode::FORBIDDEN, &forbidden), None);
        assert_eq!(
            rate_limit_wait(StatusCode::UNPROCESSABLE_ENTITY, &retry),
            None
        );
    }
}
