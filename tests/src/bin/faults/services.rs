//! The private services the suite starts itself, so that restarting or
//! killing them disturbs nothing else: a Postgres, a RabbitMQ node and, with
//! `HOOKINBOX_FAULT_PGBOUNCER`, a PgBouncer in front of that Postgres.
//! Each stops when dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::bail;
use hookinbox_tests::free_port;
pub use hookinbox_tests::private_pg::PrivatePg;

/// A private RabbitMQ node: its own name, ports and data directory.
pub struct PrivateRabbit {
    dir: PathBuf,
    node: String,
    /// The AMQP port, on 127.0.0.1.
    pub port: u16,
}

impl PrivateRabbit {
    /// Lays out `root/rabbit` and boots a node named after this process.
    pub fn start_new(root: &Path) -> anyhow::Result<Self> {
        let dir = root.join("rabbit");
        std::fs::create_dir_all(dir.join("mnesia"))?;
        std::fs::create_dir_all(dir.join("log"))?;
        std::fs::write(dir.join("enabled_plugins"), "[].\n")?;
        let port = free_port();
        std::fs::write(
            dir.join("rabbitmq.conf"),
            format!("listeners.tcp.local = 127.0.0.1:{port}\nloopback_users = none\n"),
        )?;
        std::process::Command::new("chown")
            .args(["-R", "rabbitmq:rabbitmq"])
            .arg(&dir)
            .status()?;
        let rabbit = Self {
            dir,
            node: format!("hookinbox-faults-{}@localhost", std::process::id()),
            port,
        };
        rabbit.boot()?;
        Ok(rabbit)
    }

    fn boot(&self) -> anyhow::Result<()> {
        let d = self.dir.to_string_lossy();
        let status = std::process::Command::new("rabbitmq-server")
            .arg("-detached")
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", free_port().to_string())
            .env("RABBITMQ_MNESIA_BASE", format!("{d}/mnesia"))
            .env("RABBITMQ_LOG_BASE", format!("{d}/log"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                format!("{d}/enabled_plugins"),
            )
            .env("RABBITMQ_CONFIG_FILE", format!("{d}/rabbitmq.conf"))
            .env("RABBITMQ_PID_FILE", format!("{d}/pid"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if !status.success() {
            bail!("rabbitmq-server failed");
        }
        self.await_up()
    }

    fn ctl(&self, args: &[&str]) -> bool {
        std::process::Command::new("rabbitmqctl")
            .args(["-q", "-n", &self.node])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    fn await_up(&self) -> anyhow::Result<()> {
        for _ in 0..120 {
            if self.ctl(&["await_startup", "--timeout", "5"]) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        bail!("private RabbitMQ did not start")
    }

    /// `rabbitmqctl stop_app`, then `start_app`, and waits for it.
    pub fn restart_app(&self) -> anyhow::Result<()> {
        if !self.ctl(&["stop_app"]) || !self.ctl(&["start_app"]) {
            bail!("stop_app/start_app failed");
        }
        self.await_up()
    }

    /// `kill -9` of the node, then boots it again on the same data.
    pub fn kill9_and_boot(&self) -> anyhow::Result<()> {
        let pid = std::fs::read_to_string(self.dir.join("pid"))?
            .trim()
            .to_owned();
        std::process::Command::new("kill")
            .args(["-9", &pid])
            .status()?;
        for _ in 0..100 {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.boot()
    }

    /// The AMQP URL through `port` (its own or a proxy's), with a 2-s
    /// heartbeat.
    pub fn url(&self, port: u16) -> String {
        format!("amqp://guest:guest@127.0.0.1:{port}/%2f?heartbeat=2")
    }
}

impl Drop for PrivateRabbit {
    /// Stops the node and waits until its process has exited.
    fn drop(&mut self) {
        let pid_file = self.dir.join("pid");
        let _ = self.ctl(&["stop", &pid_file.to_string_lossy()]);
    }
}

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
