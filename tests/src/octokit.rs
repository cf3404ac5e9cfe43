//! The real downstream: the unmodified `@octokit/webhooks` app in
//! `tests/octokit-app` (its dependencies pinned by its lock file and
//! installed with `npm ci` from the npm registry), run with Node.js as a
//! child process on `127.0.0.1:<port>`, killed when dropped.
//!
//! The app appends one line per event to its record file: `handled <id>
//! <event>` from a `webhooks.on(...)` handler, `signature-failure <id>` or
//! `error <id>` from `webhooks.onError`, and, from the server around the
//! middleware, `received <X-GitHub-Delivery> <Idempotency-Key>` for every
//! POST. The file outlives a stop and a start, as a real app's side
//! effects would.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::wait_until;

/// The app's folder.
pub fn app_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("octokit-app")
}

/// `node --version`, or why there is no Node.js.
pub fn node_version() -> Result<String, String> {
    let out = std::process::Command::new("node")
        .arg("--version")
        .output()
        .map_err(|e| format!("node cannot be run: {e}"))?;
    if !out.status.success() {
        return Err(format!("node --version failed: {}", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Installs the app's dependencies from its lock file (`npm ci`) unless
/// they are there. Panics when npm fails: the lock file names what to
/// install, and the registry is reachable.
pub fn install() {
    let dir = app_dir();
    if dir
        .join("node_modules/@octokit/webhooks/package.json")
        .exists()
    {
        return;
    }
    let status = std::process::Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(&dir)
        .status()
        .expect("npm runs (it comes with Node.js; .ci/run installs both)");
    assert!(status.success(), "npm ci in {}: {status}", dir.display());
}

/// What the app recorded.
#[derive(Debug, Default)]
pub struct Record {
    /// How many times a handler ran for each delivery id.
    pub handled: BTreeMap<String, usize>,
    /// Deliveries `webhooks.onError` saw refused for their signature.
    pub signature_failures: usize,
    /// Other errors `webhooks.onError` saw.
    pub errors: usize,
    /// The `Idempotency-Key` of every POST, by its `X-GitHub-Delivery`
    /// (`-` for a header that was absent), in arrival order.
    pub received: BTreeMap<String, Vec<String>>,
}

impl Record {
    /// Handler runs in all.
    pub fn runs(&self) -> usize {
        self.handled.values().sum()
    }

    /// Runs past the first, over all deliveries.
    pub fn duplicates(&self) -> usize {
        self.handled.values().map(|n| n - 1).sum()
    }

    /// The delivery ids whose handler ran more than once.
    pub fn duplicated_ids(&self) -> std::collections::BTreeSet<String> {
        self.handled
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// The app, running or stopped.
pub struct OctokitApp {
    port: u16,
    secret: String,
    record: PathBuf,
    log: PathBuf,
    child: Option<tokio::process::Child>,
}

impl OctokitApp {
    /// An app (not started) that will listen on `port` with `secret`,
    /// recording into a fresh file named after `name`.
    pub fn new(name: &str, port: u16, secret: &str) -> Self {
        let record = std::env::temp_dir().join(format!("{name}-octokit-record.txt"));
        let _ = std::fs::remove_file(&record);
        Self {
            port,
            secret: secret.to_owned(),
            log: std::env::temp_dir().join(format!("{name}-octokit.log")),
            record,
            child: None,
        }
    }

    /// Its webhook URL (`createNodeMiddleware`'s default path).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/api/github/webhooks", self.port)
    }

    /// Starts it and waits until it answers.
    pub async fn start(&mut self) {
        assert!(self.child.is_none(), "already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the app's log");
        let child = tokio::process::Command::new("node")
            .arg("server.mjs")
            .current_dir(app_dir())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("OCTOKIT_APP_SECRET", &self.secret)
            .env("PORT", self.port.to_string())
            .env("RECORD_FILE", &self.record)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("node starts");
        self.child = Some(child);
        let ready = format!("http://127.0.0.1:{}/ready", self.port);
        wait_until(
            "the octokit app to listen",
            Duration::from_secs(30),
            || async { reqwest::get(&ready).await.is_ok_and(|r| r.status() == 200) },
        )
        .await;
    }

    /// Kills it (as a crash or a deploy would) and waits for it to exit.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// What it recorded so far.
    pub fn record(&self) -> Record {
        let text = std::fs::read_to_string(&self.record).unwrap_or_default();
        let mut record = Record::default();
        for line in text.lines() {
            let mut fields = line.split_whitespace();
            match (fields.next(), fields.next()) {
                (Some("handled"), Some(id)) => {
                    *record.handled.entry(id.to_owned()).or_default() += 1;
                }
                (Some("signature-failure"), _) => record.signature_failures += 1,
                (Some("error"), _) => record.errors += 1,
                (Some("received"), Some(id)) => {
                    record
                        .received
                        .entry(id.to_owned())
                        .or_default()
                        .push(fields.next().unwrap_or("-").to_owned());
                }
                _ => {}
            }
        }
        record
    }

    /// Its standard error so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for OctokitApp {
    fn drop(&mut self) {
        // kill_on_drop ends the process; the files go with a passing test
        // (a failing one leaves them for inspection).
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.record);
            let _ = std::fs::remove_file(&self.log);
        }
    }
}
