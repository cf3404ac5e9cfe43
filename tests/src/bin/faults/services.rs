//! The private services the suite starts itself, so that restarting or
//! killing them disturbs nothing else: a Postgres, a RabbitMQ node (or,
//! with `HOOKINBOX_FAULT_CLUSTER`, three clustered nodes) and, with
//! `HOOKINBOX_FAULT_PGBOUNCER`, a PgBouncer in front of that Postgres.
//! Each stops when dropped.

use std::path::Path;
use std::process::Stdio;

use anyhow::bail;
use hookinbox_tests::free_port;
pub use hookinbox_tests::private_pg::PrivatePg;
pub use hookinbox_tests::private_rabbit::PrivateRabbit;

/// A private PgBouncer in front of the private Postgres
/// (`scripts/pgbouncer.sh`).
pub struct PrivatePgbouncer {
    /// Its port, on 127.0.0.1.
    pub port: u16,
}

impl PrivatePgbouncer {
    /// Starts it, its port written to `root/pgbouncer.port` (where
    /// `scripts/faults.sh` finds it if the suite is interrupted).
    pub fn start(root: &Path, pg_port: u16) -> anyhow::Result<Self> {
        let port = free_port();
        std::fs::write(root.join("pgbouncer.port"), port.to_string())?;
        let ok = std::process::Command::new("bash")
            .args(["scripts/pgbouncer.sh", "start"])
            .arg(port.to_string())
            .arg(pg_port.to_string())
            .stdout(Stdio::null())
            .status()?
            .success();
        if !ok {
            bail!("PgBouncer did not start");
        }
        Ok(Self { port })
    }
}

impl Drop for PrivatePgbouncer {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .args(["scripts/pgbouncer.sh", "stop"])
            .arg(self.port.to_string())
            .status();
    }
}
