//! What every request of the console shares.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;

use super::config::Access;
use super::throttle::Throttle;
use crate::destinations::SecretValues;
use hookinbox::client::TrustedProxies;
use hookinbox::config::Route;

/// Shared by every request.
pub(crate) struct State {
    /// The console's Postgres pool.
    pub(crate) pool: Pool,
    /// Who may sign in.
    pub(crate) access: Access,
    /// Failed sign-ins by client.
    pub(crate) throttle: Throttle,
    /// Proxies whose forwarded headers are believed.
    pub(crate) trusted_proxies: TrustedProxies,
    /// Whether cookies are always `Secure`.
    pub(crate) secure_cookies: bool,
    /// How long a request's body may take.
    pub(crate) body_timeout: Duration,
    /// Signs the CSRF token of `--insecure-loopback`, which has no sessions.
    pub(crate) process_key: [u8; 32],
    /// Wakes the job runner when a job is created or cancelled.
    pub(crate) wake_runner: Arc<tokio::sync::Notify>,
    /// The configured destinations: their settings for display, and the
    /// ones a pause may register first.
    pub(crate) routes: Arc<Vec<Route>>,
    /// Their secret header values, masked wherever an answer is shown.
    pub(crate) secret_values: SecretValues,
}
