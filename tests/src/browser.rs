//! A real headless Chromium for the console's tests: Debian's `chromium`
//! driven through its `chromedriver` (WebDriver) with `fantoccini`. Each
//! test starts its own chromedriver on a free port and a browser with a
//! fresh profile; both are stopped when the [`Browser`] is dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;

use crate::{free_port, wait_until};

/// Chromium's flags for a headless run on this machine.
const FLAGS: [&str; 9] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
];

/// A chromedriver and a browser session.
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    driver: Child,
    profile: PathBuf,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium with a fresh profile.
    pub async fn start() -> Self {
        let driver_bin = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("chromedriver is installed (apt-get install chromium chromium-driver; .ci/run does)");
        let port = free_port();
        let driver = Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let url = format!("http://127.0.0.1:{port}");
        let status = format!("{url}/status");
        wait_until(
            "chromedriver to answer",
            Duration::from_secs(20),
            || async {
                reqwest::get(&status)
                    .await
                    .is_ok_and(|r| r.status().is_success())
            },
        )
        .await;
        let profile =
            std::env::temp_dir().join(format!("hookinbox-chromium-{}", uuid::Uuid::new_v4()));
        let mut args: Vec<String> = FLAGS.iter().map(|f| (*f).to_owned()).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".to_owned(),
            serde_json::json!({"args": args, "binary": "/usr/bin/chromium"}),
        );
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(caps)
            .connect(&url)
            .await
            .expect("a browser session");
        Self {
            client,
            driver,
            profile,
        }
    }

    /// Saves a screenshot as `target/admin-screenshots/<name>.png`; returns
    /// its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("screenshot");
        let dir = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/admin-screenshots"
        ));
        std::fs::create_dir_all(&dir).expect("screenshot folder");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        path
    }

    /// Ends the session and stops chromedriver.
    pub async fn close(self) {
        let _ = self.client.clone().close().await;
        // Drop stops what is left.
    }
}

impl Drop for Browser {
    /// Stops the browser's processes (found by their profile folder: a
    /// chromedriver killed without ending its session leaves Chromium
    /// running), then chromedriver, and removes the profile.
    fn drop(&mut self) {
        let flag = format!("--user-data-dir={}", self.profile.display());
        let pids = std::fs::read_dir("/proc").into_iter().flatten().flatten();
        for entry in pids {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let ours = cmdline.split(|b| *b == 0).any(|arg| arg == flag.as_bytes());
            if ours {
                let _ = Command::new("kill")
                    .arg("-9")
                    .arg(entry.file_name())
                    .status();
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
