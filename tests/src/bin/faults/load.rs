//! The load: a steady stream of signed deliveries sent by the fake GitHub,
//! one in ten a redelivery of an earlier one, over the three sources, and
//! the ledger of what was
//! sent and what each send was answered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookinbox_tests::fixtures;
use hookinbox_tests::github::FakeGithub;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::destinations::SOURCE;

/// Deliveries a second.
pub const RATE: u32 = 40;

/// The fake GitHub and its three hooks.
#[derive(Clone)]
pub struct Github {
    /// The fake itself.
    pub fake: FakeGithub,
    /// The `store` source's hook.
    pub store: usize,
    /// The `relay` source's hook.
    pub relay: usize,
    /// The `fanout` source's hook.
    pub fanout: usize,
}

impl Github {
    fn hook(&self, source: &str) -> usize {
        match source {
            "relay" => self.relay,
            SOURCE => self.fanout,
            _ => self.store,
        }
    }
}

/// What the suite sent and what it was told.
#[derive(Clone)]
pub struct Sent {
    /// The source it was sent to.
    pub source: &'static str,
    /// Its event.
    pub event: String,
    /// Its body.
    pub body: Vec<u8>,
    /// Whether any attempt at it got a 2xx.
    pub ok: bool,
    /// Attempts at it that got an answer (or failed).
    pub answers: u32,
    /// Requests for it that got no 2xx (connection cut, ingest killed,
    /// 503): its effect may still have happened, which is allowed.
    pub failures: u32,
    /// When it was first sent.
    pub at: Instant,
}

/// Everything sent, in order.
#[derive(Default)]
pub struct Ledger {
    /// By delivery id.
    pub sent: HashMap<String, Sent>,
    /// Delivery ids in the order they were first sent.
    pub order: Vec<String>,
    /// Redeliveries sent.
    pub redeliveries: u64,
    /// Every request: when it was sent and whether it got a 2xx.
    pub requests: Vec<(Instant, bool)>,
}

/// The running stream.
pub struct Load {
    /// What it sent.
    pub ledger: Arc<Mutex<Ledger>>,
    /// When it started.
    pub started: Instant,
    /// When it started, by the wall clock (the effect log's times are
    /// Postgres's).
    pub started_wall: std::time::SystemTime,
    stop: CancellationToken,
    stream: tokio::task::JoinHandle<()>,
    /// The sends in flight.
    sends: TaskTracker,
}

impl Load {
    /// Starts sending at `rate` deliveries a second through `github`.
    pub fn start(github: Github, rate: u32) -> Self {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let stop = CancellationToken::new();
        let sends = TaskTracker::new();
        let stream = tokio::spawn(traffic(
            github,
            ledger.clone(),
            stop.clone(),
            rate,
            sends.clone(),
        ));
        Self {
            ledger,
            started: Instant::now(),
            started_wall: std::time::SystemTime::now(),
            stop,
            stream,
            sends,
        }
    }

    /// Stops sending, and waits (at most 30 s) until the requests in
    /// flight are answered.
    pub async fn stop(&mut self) {
        self.stop.cancel();
        let _ = (&mut self.stream).await;
        self.sends.close();
        if tokio::time::timeout(Duration::from_secs(30), self.sends.wait())
            .await
            .is_err()
        {
            eprintln!("faults: some sends were still in flight 30 s after the load stopped");
        }
    }
}

/// GitHub sends one delivery (or redelivers it) and logs the attempt; the
/// suite records the answer.
async fn deliver(
    github: &Github,
    ledger: &Mutex<Ledger>,
    source: &'static str,
    id: &str,
    event: &str,
    body: &[u8],
    redelivery: bool,
) {
    let sent = Instant::now();
    let status = github
        .fake
        .send(github.hook(source), id, event, body, redelivery)
        .await;
    let ok = (200..300).contains(&status);
    let mut ledger = ledger.lock().expect("ledger");
    ledger.requests.push((sent, ok));
    let entry = ledger.sent.entry(id.to_owned()).or_insert_with(|| Sent {
        source,
        event: event.to_owned(),
        body: body.to_vec(),
        ok: false,
        answers: 0,
        failures: 0,
        at: Instant::now(),
    });
    entry.ok |= ok;
    entry.answers += 1;
    if !ok {
        entry.failures += 1;
    }
}

/// The steady stream: new deliveries at `rate` per second, one in ten a
/// redelivery of an earlier one; a third to the `relay` source, a sixth to
/// `fanout` (three legs each), the rest to `store`.
async fn traffic(
    github: Github,
    ledger: Arc<Mutex<Ledger>>,
    stop: CancellationToken,
    rate: u32,
    sends: TaskTracker,
) {
    let payloads: Vec<_> = fixtures::all()
        .into_iter()
        .filter(|f| f.event != "ping")
        .collect();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
    let mut n: u64 = 0;
    while !stop.is_cancelled() {
        tick.tick().await;
        n += 1;
        let again = if n.is_multiple_of(10) {
            let l = ledger.lock().expect("ledger");
            l.order
                .get((n as usize * 7919) % l.order.len().max(1))
                .cloned()
        } else {
            None
        };
        let redelivery = again.and_then(|id| {
            let mut l = ledger.lock().expect("ledger");
            let s = l.sent.get(&id).cloned()?;
            l.redeliveries += 1;
            Some((id, s.source, s.event, s.body))
        });
        let again = redelivery.is_some();
        let (id, source, event, body) = match redelivery {
            Some(found) => found,
            None => {
                let f = &payloads[n as usize % payloads.len()];
                let id = format!("fault-{n}-{}", uuid::Uuid::new_v4().simple());
                let source = match n % 6 {
                    0 | 3 => "relay",
                    1 => SOURCE,
                    _ => "store",
                };
                // Each delivery its own body, as GitHub's are: ingest's
                // replay guard refuses a body seen under another id.
                let body = fixtures::unique(&f.body);
                let mut l = ledger.lock().expect("ledger");
                l.order.push(id.clone());
                l.sent.insert(
                    id.clone(),
                    Sent {
                        source,
                        event: f.event.clone(),
                        body: body.clone(),
                        ok: false,
                        answers: 0,
                        failures: 0,
                        at: Instant::now(),
                    },
                );
                (id, source, f.event.clone(), body)
            }
        };
        let (github, ledger) = (github.clone(), ledger.clone());
        sends.spawn(
            async move { deliver(&github, &ledger, source, &id, &event, &body, again).await },
        );
    }
}
