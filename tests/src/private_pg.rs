//! A private Postgres for a test or tool that stops, kills or promotes
//! it: its own data directory and port, run as the `postgres` user, so
//! that nothing else sees it go. Optionally a streaming standby of another
//! (`pg_basebackup -R`), for a failover. Each stops when dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::bail;

use crate::free_port;

/// A private Postgres: its own data directory and port.
pub struct PrivatePg {
    dir: PathBuf,
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
}

fn as_postgres(args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new("runuser");
    cmd.args(["-u", "postgres", "--"]).args(args);
    cmd
}

/// Runs one of Postgres's programs (`initdb`, `pg_basebackup`) as the
/// `postgres` user on a folder under `root`: `root` itself is given to it
/// (to create the folder in), and the folder with what it holds.
///
/// Why not `root` with all it holds: other services' folders beside it
/// (a RabbitMQ node's, which runs as `rabbitmq`) must keep their owners.
fn run_on(root: &Path, program: &str, args: &[&str]) -> anyhow::Result<()> {
    std::fs::create_dir_all(root)?;
    std::process::Command::new("chown")
        .arg("postgres:postgres")
        .arg(root)
        .status()?;
    let bin = PrivatePg::bin(program);
    let mut all = vec![bin.as_str()];
    all.extend_from_slice(args);
    if !as_postgres(&all).stdout(Stdio::null()).status()?.success() {
        bail!("{program} failed");
    }
    Ok(())
}

impl PrivatePg {
    fn bin(name: &str) -> String {
        format!("/usr/lib/postgresql/15/bin/{name}")
    }

    /// Creates a cluster in `root/pg` (`initdb`) and starts it.
    pub fn start_new(root: &Path) -> anyhow::Result<Self> {
        let dir = root.join("pg");
        std::fs::create_dir_all(&dir)?;
        std::process::Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&dir)
            .status()?;
        let port = free_port();
        let path = dir.to_str().unwrap_or("");
        run_on(
            root,
            "initdb",
            &["-D", path, "--auth=trust", "-U", "postgres"],
        )?;
        let pg = Self { dir, port };
        pg.start()?;
        Ok(pg)
    }

    fn ctl(&self, args: &[&str]) -> anyhow::Result<()> {
        let dir = self.dir.to_string_lossy().into_owned();
        let options = format!("-p {} -k {dir} -c listen_addresses=127.0.0.1", self.port);
        let mut all = vec![
            Self::bin("pg_ctl"),
            "-D".into(),
            dir.clone(),
            "-o".into(),
            options,
            "-l".into(),
            format!("{dir}/log"),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        let ok = as_postgres(&refs)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?
            .success();
        if !ok {
            bail!("pg_ctl {args:?} failed");
        }
        Ok(())
    }

    /// Starts it and waits until it accepts connections.
    pub fn start(&self) -> anyhow::Result<()> {
        self.ctl(&["start", "-w"])
    }

    /// Stops it at once, as a crash would (`pg_ctl stop -m immediate`).
    pub fn stop_immediate(&self) -> anyhow::Result<()> {
        self.ctl(&["stop", "-m", "immediate", "-w"])
    }

    /// The URL of database `db` through `port` (its own, a proxy's or
    /// PgBouncer's).
    pub fn url(&self, port: u16, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/{db}")
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let _ = self.ctl(&["stop", "-m", "fast", "-w"]);
    }
}

impl PrivatePg {
    /// Creates a streaming standby of `primary` in `root/standby`
    /// (`pg_basebackup -R`: it follows the primary until promoted) and
    /// starts it.
    pub fn standby_of(primary: &PrivatePg, root: &Path) -> anyhow::Result<Self> {
        let dir = root.join("standby");
        let port = primary.port.to_string();
        let path = dir.to_str().unwrap_or("");
        run_on(
            root,
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                path,
                "-R",
                "-X",
                "stream",
            ],
        )?;
        let standby = Self {
            dir,
            port: free_port(),
        };
        standby.start()?;
        Ok(standby)
    }

    /// Promotes a standby to a primary and waits until it takes writes.
    pub fn promote(&self) -> anyhow::Result<()> {
        self.ctl(&["promote", "-w"])
    }
}
