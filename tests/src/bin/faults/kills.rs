//! The kills: a worker killed at one of its kill points, ingest killed
//! between its claim and its publish, and a lease stolen from a stopped
//! worker. Each restarts the process it killed, unarmed.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::Child;

use crate::stack::Suite;

impl Suite {
    /// Restarts worker `i` armed at `point`, waits for it to kill itself
    /// there, and starts it again unarmed.
    pub async fn worker_kill(&mut self, i: usize, point: &'static str) -> anyhow::Result<()> {
        if let Some(mut old) = self.workers[i].take() {
            let _ = old.kill().await;
        }
        self.spawn_worker(i, Some(&format!("{point}=1*return")))?;
        let child = self.workers[i].as_mut().context("worker")?;
        match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
            Ok(_) => self.count(point),
            Err(_) => {
                let _ = child.kill().await;
                self.count("worker kill -9 from outside (point not reached)");
            }
        }
        self.spawn_worker(i, None)
    }

    /// Restarts ingest armed between its claim and its publish, waits for
    /// it to kill itself there, and starts it again unarmed.
    pub async fn ingest_kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut old) = self.ingest.take() {
            let _ = old.kill().await;
        }
        self.spawn_ingest(Some("ingest.after_claim=1*return"))?;
        let child = self.ingest.as_mut().context("ingest")?;
        match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
            Ok(_) => self.count("ingest.after_claim"),
            Err(_) => {
                let _ = child.kill().await;
                self.count("ingest kill -9 from outside (point not reached)");
            }
        }
        self.spawn_ingest(None)
    }

    /// Worker `i` stops (SIGSTOP) in the middle of a job, stays stopped past
    /// its lease and the AMQP heartbeat timeout, so the broker requeues its
    /// messages and another worker takes the delivery over; then it wakes
    /// (SIGCONT) and its completion must be fenced.
    pub async fn lease_steal(&mut self, i: usize) -> anyhow::Result<()> {
        if let Some(mut old) = self.workers[i].take() {
            let _ = old.kill().await;
        }
        let marker = format!("hookinbox-steal-{}", uuid::Uuid::new_v4().simple());
        // The first take prints the marker; the first effect after it (of
        // that job or another) stalls 3 s, so the stop falls mid-job.
        self.spawn_worker(
            i,
            Some(&format!(
                "worker.after_take=1*print({marker});worker.mid_effect=1*sleep(3000)"
            )),
        )?;
        let log = self.root.join(format!("worker-{i}.log"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(&marker)
        {
            if Instant::now() > deadline {
                self.count("lease steal skipped (no job reached the worker)");
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let pid = self.workers[i]
            .as_ref()
            .and_then(Child::id)
            .context("worker pid")?
            .to_string();
        signal("-STOP", &pid)?;
        tokio::time::sleep(Duration::from_secs(9)).await;
        signal("-CONT", &pid)?;
        // Awake, its jobs find their leases taken and are fenced (on the
        // one-statement path, their completions find the claims taken).
        // The worker is restarted unarmed once they are done: the fault
        // ends here.
        tokio::time::sleep(Duration::from_secs(4)).await;
        if let Some(mut woken) = self.workers[i].take() {
            let _ = woken.kill().await;
        }
        self.spawn_worker(i, None)?;
        self.count("lease steal (SIGSTOP mid-job past the lease, SIGCONT)");
        Ok(())
    }
}

/// Sends `sig` (`-STOP`, `-CONT`) to `pid`.
fn signal(sig: &str, pid: &str) -> anyhow::Result<()> {
    if !std::process::Command::new("kill")
        .args([sig, pid])
        .status()?
        .success()
    {
        bail!("kill {sig} {pid} failed");
    }
    Ok(())
}
