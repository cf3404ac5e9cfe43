//! The GitHub webhook a source receives from, named so that the reconciler
//! can read GitHub's delivery log and redeliver what hookinbox never took.
//!
//! The default source takes these from the environment
//! (`HOOKINBOX_RECONCILE_HOOK`, `HOOKINBOX_GITHUB_TOKEN_FILE`, …); a TOML
//! source from its `[sources.github]` table, by the same names in lower case
//! without `hookinbox_` (`reconcile_hook`, `github_token_file`, …), each of
//! which may also drop its `github_` or `reconcile_` prefix (`hook`,
//! `token_file`, …). Credentials come from files only, and are read by the
//! worker alone: ingest never needs them.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use super::secrets::read;

/// GitHub's REST API.
pub const DEFAULT_API_URL: &str = "https://api.github.com";
/// Seconds between reconciler passes of one source.
pub const DEFAULT_INTERVAL_SECS: u64 = 300;
/// Redeliveries asked for one GUID across all passes.
pub const DEFAULT_MAX_REDELIVERIES: u32 = 3;
/// A delivery younger than this may still be in flight: it is not judged.
pub const DEFAULT_MIN_AGE_SECS: u64 = 300;
/// How often a reconciler pass walks the whole log (successes too) rather
/// than GitHub's failed deliveries only, by default.
pub const DEFAULT_FULL_EVERY_SECS: u64 = 3600;
/// Redeliveries asked per second.
pub const DEFAULT_PER_SECOND: f64 = 1.0;
/// The most redeliveries per second a setting may ask for.
pub const MAX_PER_SECOND: f64 = 1000.0;

/// Which webhook: one of a repository, one of an organization, or a GitHub
/// App's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookKind {
    /// `repo:OWNER/REPO/HOOK_ID`.
    Repo {
        /// The repository's owner.
        owner: String,
        /// The repository.
        repo: String,
        /// The hook's id (its `X-GitHub-Hook-ID`).
        hook_id: u64,
    },
    /// `org:ORG/HOOK_ID`.
    Org {
        /// The organization.
        org: String,
        /// The hook's id.
        hook_id: u64,
    },
    /// `app`: the webhook of the GitHub App the credentials belong to.
    App,
}

/// GitHub's rule for owner, repository and organization names: letters,
/// digits, `-`, `_` and `.` (no path separators, nothing to escape).
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 100
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s != "."
        && s != ".."
}

impl HookKind {
    /// Parses `repo:OWNER/REPO/HOOK_ID`, `org:ORG/HOOK_ID` or `app`.
    pub fn parse(value: &str) -> Result<Self, String> {
        let bad = || format!("'{value}' is not repo:OWNER/REPO/HOOK_ID, org:ORG/HOOK_ID or app");
        let id = |s: &str| s.parse::<u64>().ok().filter(|n| *n > 0);
        match value.trim().split_once(':') {
            None if value.trim() == "app" => Ok(Self::App),
            Some(("repo", rest)) => match rest.split('/').collect::<Vec<_>>()[..] {
                [owner, repo, hook] if is_name(owner) && is_name(repo) => Ok(Self::Repo {
                    owner: owner.to_owned(),
                    repo: repo.to_owned(),
                    hook_id: id(hook).ok_or_else(bad)?,
                }),
                _ => Err(bad()),
            },
            Some(("org", rest)) => match rest.split('/').collect::<Vec<_>>()[..] {
                [org, hook] if is_name(org) => Ok(Self::Org {
                    org: org.to_owned(),
                    hook_id: id(hook).ok_or_else(bad)?,
                }),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }

    /// The path of its delivery log under the API's base URL.
    pub fn deliveries_path(&self) -> String {
        match self {
            Self::Repo {
                owner,
                repo,
                hook_id,
            } => format!("/repos/{owner}/{repo}/hooks/{hook_id}/deliveries"),
            Self::Org { org, hook_id } => format!("/orgs/{org}/hooks/{hook_id}/deliveries"),
            Self::App => "/app/hook/deliveries".to_owned(),
        }
    }

    /// The hook's id, when the setting names it (an App's hook id is
    /// learned from its deliveries).
    pub fn hook_id(&self) -> Option<u64> {
        match self {
            Self::Repo { hook_id, .. } | Self::Org { hook_id, .. } => Some(*hook_id),
            Self::App => None,
        }
    }
}

impl fmt::Display for HookKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Repo {
                owner,
                repo,
                hook_id,
            } => write!(f, "repo:{owner}/{repo}/{hook_id}"),
            Self::Org { org, hook_id } => write!(f, "org:{org}/{hook_id}"),
            Self::App => f.write_str("app"),
        }
    }
}

/// How the reconciler authenticates to GitHub. `Debug` never prints a
/// token or a key.
#[derive(Clone)]
pub enum GithubAuth {
    /// A token (fine-grained or classic, or an installation token minted
    /// elsewhere), sent as `Authorization: Bearer`.
    Token(String),
    /// A GitHub App: JWTs signed with its private key, and for repository
    /// and organization hooks an installation token minted with them.
    App {
        /// The App's id (or client id): the JWT's `iss`.
        app_id: String,
        /// The private key, PEM.
        key_pem: Vec<u8>,
        /// The installation whose token reads repository or organization
        /// hooks.
        installation_id: Option<u64>,
    },
}

impl fmt::Debug for GithubAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Token(_) => f.write_str("Token(..)"),
            Self::App {
                app_id,
                installation_id,
                ..
            } => write!(
                f,
                "App {{ app_id: {app_id}, installation_id: {installation_id:?}, key: .. }}"
            ),
        }
    }
}

/// The reconciler's validated settings for one source.
#[derive(Clone, Debug)]
pub struct Reconcile {
    /// The webhook whose delivery log is read.
    pub hook: HookKind,
    /// The API's base URL (GitHub Enterprise Server and tests set another).
    pub api_url: reqwest::Url,
    /// Credentials.
    pub auth: GithubAuth,
    /// Between passes, inside workers.
    pub interval: Duration,
    /// Redeliveries asked for one GUID across all passes.
    pub max_redeliveries: u32,
    /// A delivery younger than this is not judged yet.
    pub min_age: Duration,
    /// Redeliveries asked per second at most.
    pub per_second: f64,
    /// How often a pass walks the whole log, successes too (to find
    /// deliveries GitHub saw succeed and hookinbox holds no row of); the
    /// passes between ask GitHub for failed deliveries only. Zero: every
    /// pass walks the whole log.
    pub full_every: Duration,
}

/// An id that may be written as a number or as text.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum IdValue {
    /// `12345`.
    Number(u64),
    /// `"12345"`, or an App's client id `"Iv1.abc"`.
    Text(String),
}

impl IdValue {
    fn text(&self) -> String {
        match self {
            Self::Number(n) => n.to_string(),
            Self::Text(t) => t.trim().to_owned(),
        }
    }
}

/// The settings as given, before any file is read: a TOML source's
/// `[sources.github]` table, or the default source's variables.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GithubSettings {
    /// `repo:OWNER/REPO/HOOK_ID`, `org:ORG/HOOK_ID` or `app`.
    #[serde(default, alias = "hook")]
    pub reconcile_hook: Option<String>,
    /// The API's base URL.
    #[serde(default, alias = "api_url")]
    pub github_api_url: Option<String>,
    /// A file holding a token.
    #[serde(default, alias = "token_file")]
    pub github_token_file: Option<PathBuf>,
    /// A GitHub App's id.
    #[serde(default, alias = "app_id")]
    pub github_app_id: Option<IdValue>,
    /// The App's private key, a PEM file.
    #[serde(default, alias = "app_key_file")]
    pub github_app_key_file: Option<PathBuf>,
    /// The App's installation, for repository and organization hooks.
    #[serde(default, alias = "installation_id")]
    pub github_installation_id: Option<IdValue>,
    /// Seconds between passes.
    #[serde(default, alias = "interval_secs")]
    pub reconcile_interval_secs: Option<u64>,
    /// Redeliveries per GUID across passes.
    #[serde(default, alias = "max_redeliveries")]
    pub reconcile_max_redeliveries: Option<u32>,
    /// Seconds a delivery must be old before it is judged.
    #[serde(default, alias = "min_age_secs")]
    pub reconcile_min_age_secs: Option<u64>,
    /// Redeliveries asked per second.
    #[serde(default, alias = "per_second")]
    pub reconcile_per_second: Option<f64>,
    /// Seconds between passes that walk the whole log.
    #[serde(default, alias = "full_every_secs")]
    pub reconcile_full_every_secs: Option<u64>,
}

impl GithubSettings {
    /// Whether any setting is given.
    pub fn is_empty(&self) -> bool {
        self.reconcile_hook.is_none()
            && self.github_api_url.is_none()
            && self.github_token_file.is_none()
            && self.github_app_id.is_none()
            && self.github_app_key_file.is_none()
            && self.github_installation_id.is_none()
            && self.reconcile_interval_secs.is_none()
            && self.reconcile_max_redeliveries.is_none()
            && self.reconcile_min_age_secs.is_none()
            && self.reconcile_per_second.is_none()
            && self.reconcile_full_every_secs.is_none()
    }

    /// Validates the settings and reads the credential files. `name` turns
    /// a setting's key (`reconcile_hook`) into the name errors give it
    /// (`HOOKINBOX_RECONCILE_HOOK`, `sources[1].github.reconcile_hook`).
    /// `None` when no hook is named (and nothing else is set).
    pub fn load(&self, name: &dyn Fn(&str) -> String) -> Result<Option<Reconcile>, ConfigError> {
        let field = |key: &str, problem: String| ConfigError::field(&name(key), problem);
        let Some(raw) = &self.reconcile_hook else {
            if self.is_empty() {
                return Ok(None);
            }
            return Err(field(
                "reconcile_hook",
                "is required with the other GitHub settings".to_owned(),
            ));
        };
        let hook = HookKind::parse(raw).map_err(|e| field("reconcile_hook", e))?;
        let api_raw = self.github_api_url.as_deref().unwrap_or(DEFAULT_API_URL);
        let api_url = reqwest::Url::parse(api_raw)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .ok_or_else(|| {
                field(
                    "github_api_url",
                    "must be an http:// or https:// URL with a host".to_owned(),
                )
            })?;
        let auth = match (
            &self.github_token_file,
            &self.github_app_id,
            &self.github_app_key_file,
        ) {
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
                return Err(field(
                    "github_token_file",
                    "give a token file or an App (id and key file), not both".to_owned(),
                ));
            }
            (Some(path), None, None) => {
                let key = "github_token_file";
                let text = read(&name(key), path)?;
                let token = text.trim();
                if token.is_empty() || token.contains(char::is_whitespace) {
                    return Err(field(
                        key,
                        "holds no token (one line, no spaces)".to_owned(),
                    ));
                }
                GithubAuth::Token(token.to_owned())
            }
            (None, Some(id), Some(path)) => {
                let app_id = id.text();
                if app_id.is_empty() {
                    return Err(field("github_app_id", "is empty".to_owned()));
                }
                let key = "github_app_key_file";
                let pem = read(&name(key), path)?.into_bytes();
                jsonwebtoken::EncodingKey::from_rsa_pem(&pem).map_err(|_| {
                    field(
                        key,
                        "is not an RSA private key in PEM (the App's .pem file)".to_owned(),
                    )
                })?;
                let installation_id = match &self.github_installation_id {
                    None => None,
                    Some(v) => Some(v.text().parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(
                        || field("github_installation_id", "must be a number".to_owned()),
                    )?),
                };
                GithubAuth::App {
                    app_id,
                    key_pem: pem,
                    installation_id,
                }
            }
            (None, Some(_), None) => {
                return Err(field(
                    "github_app_key_file",
                    "is required with github_app_id".to_owned(),
                ));
            }
            (None, None, Some(_)) => {
                return Err(field(
                    "github_app_id",
                    "is required with github_app_key_file".to_owned(),
                ));
            }
            (None, None, None) => {
                return Err(field(
                    "github_token_file",
                    "is required (or github_app_id with github_app_key_file) to read the hook's deliveries"
                        .to_owned(),
                ));
            }
        };
        match (&hook, &auth) {
            (HookKind::App, GithubAuth::Token(_)) => {
                return Err(field(
                    "reconcile_hook",
                    "an app hook is read with the App's own credentials (github_app_id and github_app_key_file), not a token"
                        .to_owned(),
                ));
            }
            (
                HookKind::Repo { .. } | HookKind::Org { .. },
                GithubAuth::App {
                    installation_id: None,
                    ..
                },
            ) => {
                return Err(field(
                    "github_installation_id",
                    "is required to read a repository or organization hook as an App".to_owned(),
                ));
            }
            _ => {}
        }
        let per_second = self.reconcile_per_second.unwrap_or(DEFAULT_PER_SECOND);
        if !(per_second > 0.0 && per_second <= MAX_PER_SECOND) {
            return Err(field(
                "reconcile_per_second",
                format!("must be above 0 and at most {MAX_PER_SECOND}"),
            ));
        }
        let interval = self
            .reconcile_interval_secs
            .unwrap_or(DEFAULT_INTERVAL_SECS);
        if interval == 0 {
            return Err(field(
                "reconcile_interval_secs",
                "must be at least 1".to_owned(),
            ));
        }
        let max_redeliveries = self
            .reconcile_max_redeliveries
            .unwrap_or(DEFAULT_MAX_REDELIVERIES);
        if max_redeliveries == 0 {
            return Err(field(
                "reconcile_max_redeliveries",
                "must be at least 1".to_owned(),
            ));
        }
        Ok(Some(Reconcile {
            hook,
            api_url,
            auth,
            interval: Duration::from_secs(interval),
            max_redeliveries,
            min_age: Duration::from_secs(
                self.reconcile_min_age_secs.unwrap_or(DEFAULT_MIN_AGE_SECS),
            ),
            per_second,
            full_every: Duration::from_secs(
                self.reconcile_full_every_secs
                    .unwrap_or(DEFAULT_FULL_EVERY_SECS),
            ),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_kinds_parse_and_print() {
        for text in ["repo:acme/widgets/123", "org:acme/7", "app"] {
            let hook = HookKind::parse(text).expect(text);
            assert_eq!(hook.to_string(), text);
        }
        assert_eq!(
            HookKind::parse("repo:acme/widgets/123")
                .expect("repo")
                .deliveries_path(),
            "/repos/acme/widgets/hooks/123/deliveries"
        );
        for bad in [
            "",
            "repo:acme/123",
            "repo:acme/w/x",
            "repo:acme/w/0",
            "org:acme",
            "user:x/1",
            "repo:../w/1",
            "repo:a b/w/1",
            "apps",
        ] {
            assert!(HookKind::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn credentials_are_never_printed() {
        let auth = GithubAuth::Token("ghp_secret".to_owned());
        assert!(!format!("{auth:?}").contains("ghp_secret"));
        let app = GithubAuth::App {
            app_id: "1".to_owned(),
            key_pem: b"-----BEGIN RSA PRIVATE KEY-----".to_vec(),
            installation_id: None,
        };
        assert!(!format!("{app:?}").contains("BEGIN"));
    }
}
