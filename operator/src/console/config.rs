//! The console's settings: where it listens, who may sign in, which
//! proxies are believed, how its cookies are marked, and the loopback
//! escape hatch for a developer's machine.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hookinbox::config::{ConfigError, WorkerConfig};

use super::tokens::Tokens;
use hookinbox::client::TrustedProxies;

/// Where the console's metrics listener binds unless
/// `HOOKINBOX_METRICS_LISTEN` says otherwise: loopback, like the console.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9899";

/// The body timeout unless set.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Arguments of `hookinbox-worker admin`.
#[derive(clap::Args, Clone, Debug)]
pub struct AdminArgs {
    /// Address the console and its API listen on.
    #[arg(
        long,
        env = "HOOKINBOX_ADMIN_LISTEN",
        value_name = "HOOKINBOX_ADMIN_LISTEN",
        default_value = "127.0.0.1:9900"
    )]
    pub listen: SocketAddr,

    /// File of named tokens, one `NAME ROLE SECRET` per line (role `viewer`
    /// or `operator`; `#` comments and blank lines allowed).
    #[arg(
        long,
        env = "HOOKINBOX_ADMIN_TOKENS_FILE",
        value_name = "HOOKINBOX_ADMIN_TOKENS_FILE"
    )]
    pub tokens_file: Option<PathBuf>,

    /// Serve without tokens, every caller an operator. Only on a loopback
    /// address, for a developer's machine; answers only to a loopback
    /// `Host` (localhost, 127.x.y.z, [::1]).
    #[arg(long)]
    pub insecure_loopback: bool,

    /// Proxies whose `X-Forwarded-For` (the client, for the sign-in
    /// throttle) and `X-Forwarded-Proto` (https, for the cookies' `Secure`)
    /// are believed: a comma list of addresses and CIDRs. Empty: none; the
    /// client is the peer.
    #[arg(
        long,
        env = "HOOKINBOX_ADMIN_TRUSTED_PROXIES",
        value_name = "HOOKINBOX_ADMIN_TRUSTED_PROXIES",
        default_value = ""
    )]
    pub trusted_proxies: String,

    /// The console's address as browsers reach it, e.g.
    /// https://admin.example.com. With https, its cookies are `Secure`.
    #[arg(
        long,
        env = "HOOKINBOX_ADMIN_PUBLIC_URL",
        value_name = "HOOKINBOX_ADMIN_PUBLIC_URL"
    )]
    pub public_url: Option<String>,

    /// Milliseconds a request's body may take to arrive.
    #[arg(
        long,
        env = "HOOKINBOX_ADMIN_BODY_TIMEOUT_MS",
        value_name = "HOOKINBOX_ADMIN_BODY_TIMEOUT_MS",
        default_value_t = 10_000,
        value_parser = clap::value_parser!(u64).range(1..=600_000)
    )]
    pub body_timeout_ms: u64,
}

/// How callers are known.
#[derive(Clone, Debug)]
pub enum Access {
    /// By their tokens.
    Tokens(Tokens),
    /// Nobody signs in: every caller is the operator `loopback`
    /// (`--insecure-loopback` on a loopback address).
    InsecureLoopback,
}

/// The console's validated settings.
#[derive(Clone)]
pub struct AdminConfig {
    /// The worker's settings: database, broker, queue prefix, policy, and
    /// the metrics listener.
    pub worker: WorkerConfig,
    /// Where to listen.
    pub listen: SocketAddr,
    /// Who may sign in.
    pub access: Access,
    /// Proxies whose forwarded headers are believed.
    pub trusted_proxies: TrustedProxies,
    /// Whether cookies are always `Secure` (the public URL is https).
    pub secure_cookies: bool,
    /// How long a request's body may take to arrive.
    pub body_timeout: Duration,
}

impl AdminConfig {
    /// The settings with `access`, and every other console setting at its
    /// default.
    pub fn new(worker: WorkerConfig, listen: SocketAddr, access: Access) -> Self {
        Self {
            worker,
            listen,
            access,
            trusted_proxies: TrustedProxies::default(),
            secure_cookies: false,
            body_timeout: DEFAULT_BODY_TIMEOUT,
        }
    }
}

/// Whether cookies must be `Secure`: the public URL is https. Anything
/// but an http or https URL is refused.
fn secure_from(public_url: Option<&str>) -> Result<bool, ConfigError> {
    let Some(url) = public_url.map(str::trim).filter(|u| !u.is_empty()) else {
        return Ok(false);
    };
    let lower = url.to_ascii_lowercase();
    match lower.split_once("://") {
        Some(("https", rest)) if !rest.is_empty() => Ok(true),
        Some(("http", rest)) if !rest.is_empty() => Ok(false),
        _ => Err(ConfigError::field(
            "HOOKINBOX_ADMIN_PUBLIC_URL",
            "must be an http:// or https:// URL, e.g. https://admin.example.com",
        )),
    }
}

impl AdminArgs {
    /// Checks the settings: refuses to start without tokens unless bound to
    /// loopback with `--insecure-loopback`, and on a bad tokens file, naming
    /// the setting and the line (never a secret). Unless
    /// `HOOKINBOX_METRICS_LISTEN` was given (`metrics_listen_given`), the
    /// console's metrics listen on [`DEFAULT_METRICS_LISTEN`], not on the
    /// worker's every-address default.
    pub fn validate(
        self,
        mut worker: WorkerConfig,
        metrics_listen_given: bool,
    ) -> Result<AdminConfig, ConfigError> {
        if !metrics_listen_given {
            worker.metrics_listen = DEFAULT_METRICS_LISTEN
                .parse()
                .expect("the default is an address");
        }
        let trusted_proxies = self
            .trusted_proxies
            .parse()
            .map_err(|problem| ConfigError::field("HOOKINBOX_ADMIN_TRUSTED_PROXIES", problem))?;
        let secure_cookies = secure_from(self.public_url.as_deref())?;
        let access = match (&self.tokens_file, self.insecure_loopback) {
            (Some(_), true) => {
                return Err(ConfigError::field(
                    "HOOKINBOX_ADMIN_TOKENS_FILE",
                    "is set together with --insecure-loopback; choose one",
                ));
            }
            (Some(path), false) => Access::Tokens(Tokens::from_file(path)?),
            (None, true) if self.listen.ip().is_loopback() => Access::InsecureLoopback,
            (None, true) => {
                return Err(ConfigError::field(
                    "HOOKINBOX_ADMIN_LISTEN",
                    format!(
                        "--insecure-loopback serves without tokens, so only on a loopback \
                         address, not {}",
                        self.listen.ip()
                    ),
                ));
            }
            (None, false) => {
                return Err(ConfigError::field(
                    "HOOKINBOX_ADMIN_TOKENS_FILE",
                    "is required (or --insecure-loopback on a loopback address)",
                ));
            }
        };
        Ok(AdminConfig {
            worker,
            listen: self.listen,
            access,
            trusted_proxies,
            secure_cookies,
            body_timeout: Duration::from_millis(self.body_timeout_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_https_public_url_makes_cookies_secure() {
        assert!(!secure_from(None).expect("ok"));
        assert!(!secure_from(Some("")).expect("ok"));
        assert!(secure_from(Some("https://admin.example.com")).expect("ok"));
        assert!(secure_from(Some("HTTPS://admin.example.com/")).expect("ok"));
        assert!(!secure_from(Some("http://127.0.0.1:9900")).expect("ok"));
        for bad in ["admin.example.com", "ftp://x", "https://", "https:/x"] {
            let e = secure_from(Some(bad)).expect_err(bad).to_string();
            assert!(e.starts_with("HOOKINBOX_ADMIN_PUBLIC_URL"), "{e}");
        }
    }
}
