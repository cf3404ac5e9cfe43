//! The console's settings: where it listens, who may sign in, and the
//! loopback escape hatch for a developer's machine.

use std::net::SocketAddr;
use std::path::PathBuf;

use hookinbox::config::{ConfigError, WorkerConfig};

use super::tokens::Tokens;

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
    /// address, for a developer's machine.
    #[arg(long)]
    pub insecure_loopback: bool,
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
    /// The worker's settings: database, broker, queue prefix, policy.
    pub worker: WorkerConfig,
    /// Where to listen.
    pub listen: SocketAddr,
    /// Who may sign in.
    pub access: Access,
}

impl AdminArgs {
    /// Checks the settings: refuses to start without tokens unless bound to
    /// loopback with `--insecure-loopback`, and on a bad tokens file, naming
    /// the setting and the line (never a secret).
    pub fn validate(self, worker: WorkerConfig) -> Result<AdminConfig, ConfigError> {
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
        })
    }
}
