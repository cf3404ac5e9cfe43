//! What every request of the console shares.

use std::sync::Arc;

use deadpool_postgres::Pool;
use hookinbox::config::WorkerConfig;

use super::config::Access;
use super::lockout::Lockout;

/// Shared by every request.
pub(crate) struct State {
    /// The console's Postgres pool.
    pub(crate) pool: Pool,
    /// The worker's settings: the broker, the queue prefix, the policy.
    pub(crate) worker: WorkerConfig,
    /// Who may sign in.
    pub(crate) access: Access,
    /// Failed sign-ins by address.
    pub(crate) lockout: Lockout,
    /// Signs the CSRF token of `--insecure-loopback`, which has no sessions.
    pub(crate) process_key: [u8; 32],
    /// Wakes the job runner when a job is created or cancelled.
    pub(crate) wake_runner: Arc<tokio::sync::Notify>,
}
