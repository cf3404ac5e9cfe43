//! A private RabbitMQ node (or a cluster of them) for a test or tool that
//! kills, restarts or wipes it: its own name, ports and data directory,
//! run as the `rabbitmq` user, so that nothing else sees it go. Each node
//! stops when dropped. The fault suite (`tests/src/bin/faults/`) and the
//! tests of a broker that loses its data use it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::bail;

use crate::free_port;

/// A private RabbitMQ node: its own name, ports and data directory.
pub struct PrivateRabbit {
    dir: PathBuf,
    /// Its Erlang node name (`name@localhost`).
    pub node: String,
    /// The AMQP port, on 127.0.0.1.
    pub port: u16,
    /// Its Erlang distribution port, the same at every boot: a clustered
    /// node's peers know it by it.
    dist_port: u16,
}

impl PrivateRabbit {
    /// Lays out `root/rabbit` and boots a node named after this process.
    pub fn start_new(root: &Path) -> anyhow::Result<Self> {
        let rabbit = Self::lay_out(
            root.join("rabbit"),
            format!("hookinbox-faults-{}@localhost", std::process::id()),
        )?;
        rabbit.boot()?;
        Ok(rabbit)
    }

    /// `kill -9` of the node, then its data folder (its queues and their
    /// messages, its definitions) deleted, as a node whose disk was lost;
    /// then boots it again, empty, under the same name and ports.
    pub fn wipe_and_boot(&self) -> anyhow::Result<()> {
        self.kill9()?;
        let data = self.dir.join("mnesia");
        std::fs::remove_dir_all(&data)?;
        std::fs::create_dir_all(&data)?;
        std::process::Command::new("chown")
            .args(["-R", "rabbitmq:rabbitmq"])
            .arg(&data)
            .status()?;
        self.boot()
    }

    /// Lays out `root/rabbit-0` .. `root/rabbit-{n-1}`, boots each, and
    /// joins the others to the first (`rabbitmqctl join_cluster`). Queue
    /// leaders are placed on the node with the fewest
    /// (`queue_leader_locator = balanced`).
    pub fn start_cluster(root: &Path, n: usize) -> anyhow::Result<Vec<Self>> {
        let mut nodes = Vec::with_capacity(n);
        for i in 0..n {
            let node = Self::lay_out(
                root.join(format!("rabbit-{i}")),
                format!("hookinbox-faults-{}-{i}@localhost", std::process::id()),
            )?;
            node.boot()?;
            if let Some(first) = nodes.first() {
                let first: &Self = first;
                if !node.ctl(&["stop_app"])
                    || !node.ctl(&["join_cluster", &first.node])
                    || !node.ctl(&["start_app"])
                {
                    bail!("{} did not join {}", node.node, first.node);
                }
                node.await_up()?;
            }
            nodes.push(node);
        }
        Ok(nodes)
    }

    /// Writes a node's folder: its configuration and enabled plugins (none),
    /// and its node name in `dir/node` (where `scripts/faults.sh` finds it
    /// if the suite is interrupted).
    fn lay_out(dir: PathBuf, node: String) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir.join("mnesia"))?;
        std::fs::create_dir_all(dir.join("log"))?;
        std::fs::write(dir.join("enabled_plugins"), "[].\n")?;
        std::fs::write(dir.join("node"), &node)?;
        let port = free_port();
        std::fs::write(
            dir.join("rabbitmq.conf"),
            format!(
                "listeners.tcp.local = 127.0.0.1:{port}\nloopback_users = none\n\
                 queue_leader_locator = balanced\n"
            ),
        )?;
        std::process::Command::new("chown")
            .args(["-R", "rabbitmq:rabbitmq"])
            .arg(&dir)
            .status()?;
        Ok(Self {
            dir,
            node,
            port,
            dist_port: free_port(),
        })
    }

    /// Boots the node on its data (first, or again after [`Self::kill9`])
    /// and waits until it is up.
    pub fn boot(&self) -> anyhow::Result<()> {
        let d = self.dir.to_string_lossy();
        let status = std::process::Command::new("rabbitmq-server")
            .arg("-detached")
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
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
        bail!(
            "private RabbitMQ {} did not start; the end of its log:\n{}",
            self.node,
            self.log_tail()
        )
    }

    /// The last lines of the node's logs, for a failure's message.
    fn log_tail(&self) -> String {
        let mut tail = String::new();
        if let Ok(entries) = std::fs::read_dir(self.dir.join("log")) {
            for entry in entries.flatten() {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                tail.push_str(&format!("== {}\n", entry.path().display()));
                for line in &lines[lines.len().saturating_sub(30)..] {
                    tail.push_str(line);
                    tail.push('\n');
                }
            }
        }
        tail
    }

    /// Each queue's leader node and member nodes (`rabbitmqctl list_queues
    /// name leader members`), as this node sees them.
    pub fn queues(&self) -> anyhow::Result<Vec<QueuePlacement>> {
        let mut tries = 0;
        let out = loop {
            let out = std::process::Command::new("rabbitmqctl")
                .args(["-q", "-n", &self.node, "list_queues"])
                .args(["name", "leader", "members", "--formatter", "json"])
                .output()?;
            tries += 1;
            if out.status.success() {
                break out;
            }
            if tries == 5 {
                bail!(
                    "list_queues on {} failed: {}{}",
                    self.node,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_secs(1));
        };
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)?;
        Ok(rows
            .iter()
            .map(|r| QueuePlacement {
                leader: r["leader"].as_str().unwrap_or_default().to_owned(),
                members: r["members"]
                    .as_array()
                    .map(|m| {
                        m.iter()
                            .filter_map(|n| n.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default(),
            })
            .collect())
    }

    /// Each queue's messages (ready and unacknowledged), as this node sees
    /// them (`rabbitmqctl list_queues name messages`).
    pub fn depths(&self) -> anyhow::Result<Vec<(String, u64)>> {
        let out = std::process::Command::new("rabbitmqctl")
            .args(["-q", "-n", &self.node, "list_queues"])
            .args(["name", "messages", "--formatter", "json"])
            .output()?;
        if !out.status.success() {
            bail!(
                "list_queues on {} failed: {}",
                self.node,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r["name"].as_str().unwrap_or_default().to_owned(),
                    r["messages"].as_u64().unwrap_or(0),
                )
            })
            .collect())
    }

    /// `rabbitmqctl stop_app`, then `start_app`, and waits for it.
    pub fn restart_app(&self) -> anyhow::Result<()> {
        if !self.ctl(&["stop_app"]) || !self.ctl(&["start_app"]) {
            bail!("stop_app/start_app failed");
        }
        self.await_up()
    }

    /// `rabbitmq-queues rebalance quorum`: spreads the quorum queues'
    /// leaders over the running nodes again.
    pub fn rebalance(&self) -> anyhow::Result<()> {
        let ok = std::process::Command::new("rabbitmq-queues")
            .args(["-q", "-n", &self.node, "rebalance", "quorum"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?
            .success();
        if !ok {
            bail!("rabbitmq-queues rebalance on {} failed", self.node);
        }
        Ok(())
    }

    /// `kill -9` of the node, then boots it again on the same data.
    pub fn kill9_and_boot(&self) -> anyhow::Result<()> {
        self.kill9()?;
        self.boot()
    }

    /// `kill -9` of the node; returns once its process has exited.
    pub fn kill9(&self) -> anyhow::Result<()> {
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
        Ok(())
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

/// Where a queue lives in the cluster.
pub struct QueuePlacement {
    /// The node that leads it.
    pub leader: String,
    /// The nodes that hold a replica of it, the leader among them.
    pub members: Vec<String>,
}
