//! The destination faults, each one function: the `fanout` source's
//! `flaky` destination (a [`Sink`]) answers slowly, with 5xx, with 404,
//! refuses connections, cuts them mid-answer, and, once a run, stays down
//! longer than its whole retry schedule, while its neighbours `store` and
//! `steady` carry on. Each fault ends by waiting (polled, with a deadline)
//! until `flaky` is back to normal: its breaker closed and none of its
//! legs waiting.

use std::time::{Duration, Instant};

use crate::sink::{Mode, Sink};
use crate::stack::Suite;

/// The source with destinations.
pub const SOURCE: &str = "fanout";

/// Each destination of [`SOURCE`]: `store`, and two `forward`s.
pub const LEGS: [&str; 3] = ["store", "steady", "flaky"];

/// How long the short faults last.
const SHORT: Duration = Duration::from_secs(4);

/// How late the slow destination answers (within its `timeout_ms`).
const SLOW: Duration = Duration::from_secs(3);

/// The breaker's pause between probes (`probe_secs`).
pub const PROBE_SECS: u64 = 2;

/// The forward destinations' policy: a retry schedule of 21 attempts over
/// about 13 s (shorter than the long outage, so only the breaker keeps
/// its legs alive through it), and a breaker over a 5-s window.
pub const POLICY: &str = r#"timeout_ms = 5000
allow_networks = ["127.0.0.0/8"]
retry = ["200ms", "300ms", "500ms", "700ms", "700ms", "700ms", "700ms", "700ms", "700ms", "700ms", "700ms", "700ms", "700ms", "700ms", "700ms", "700ms", "700ms", "700ms", "700ms", "700ms"]
breaker = { failure_ratio = 0.5, min_requests = 10, window_secs = 5, probe_secs = 2 }
"#;

/// The receivers of the two `forward` destinations.
pub struct Receivers {
    /// `steady`: always answers 200 at once.
    pub steady: Sink,
    /// `flaky`: the faults hit it.
    pub flaky: Sink,
    /// Each fault injected, in order.
    pub faults: Vec<Injected>,
}

/// One destination fault and what the suite saw of `flaky` meanwhile.
pub struct Injected {
    /// What it was.
    pub what: &'static str,
    /// When it began.
    pub begin: Instant,
    /// When `flaky` was set right again.
    pub end: Instant,
    /// When its breaker was first seen not closed, if it was.
    pub opened: Option<Instant>,
    /// Most legs waiting at once (failed, retryable), and of them held.
    pub waiting: (i64, i64),
    /// When it was back to normal (breaker closed, nothing waiting), if
    /// it was within a minute.
    pub recovered: Option<Instant>,
}

impl Receivers {
    /// Starts both receivers.
    pub async fn start() -> anyhow::Result<Self> {
        Ok(Self {
            steady: Sink::start().await?,
            flaky: Sink::start().await?,
            faults: Vec::new(),
        })
    }
}

/// Every destination fault once; the long outage (`outage`) only when
/// `long` (the first cycle).
pub async fn faults(suite: &mut Suite, long: Option<Duration>) -> anyhow::Result<()> {
    let db = hookinbox_tests::connect(&suite.database_url()).await;
    slow(suite, &db).await?;
    server_errors(suite, &db).await?;
    not_found(suite, &db).await?;
    refused(suite, &db).await?;
    reset(suite, &db).await?;
    if let Some(outage) = long {
        down(suite, &db, outage).await?;
    }
    Ok(())
}

/// Answers after [`SLOW`], within the destination's timeout.
async fn slow(suite: &mut Suite, db: &tokio_postgres::Client) -> anyhow::Result<()> {
    inject(
        suite,
        db,
        "destination slow (200 after 3 s) for 4 s",
        Mode::Slow(SLOW),
        Until::Elapsed(SHORT),
    )
    .await
}

/// Answers 503: worth retrying.
async fn server_errors(suite: &mut Suite, db: &tokio_postgres::Client) -> anyhow::Result<()> {
    inject(
        suite,
        db,
        "destination 503 for 4 s",
        Mode::Status(503),
        Until::Elapsed(SHORT),
    )
    .await
}

/// Answers 404 (a route renamed downstream): the breaker opens at the
/// first answer; the answer stays 404 for a probe more, then is fixed.
async fn not_found(suite: &mut Suite, db: &tokio_postgres::Client) -> anyhow::Result<()> {
    inject(
        suite,
        db,
        "destination 404 until its breaker opened, then a probe more",
        Mode::Status(404),
        Until::Opened(Duration::from_secs(PROBE_SECS + 1)),
    )
    .await
}

/// Refuses connections (the receiver stopped).
async fn refused(suite: &mut Suite, db: &tokio_postgres::Client) -> anyhow::Result<()> {
    inject(
        suite,
        db,
        "destination refusing connections for 4 s",
        Mode::Down,
        Until::Elapsed(SHORT),
    )
    .await
}

/// Reads each request, then resets the connection, before or in the
/// middle of the answer.
async fn reset(suite: &mut Suite, db: &tokio_postgres::Client) -> anyhow::Result<()> {
    inject(
        suite,
        db,
        "destination resetting connections mid-answer for 4 s",
        Mode::Reset,
        Until::Elapsed(SHORT),
    )
    .await
}

/// Down (connections refused) for `outage`: longer than the retry
/// schedule, so only the breaker's holding keeps legs from the dead
/// letters.
async fn down(
    suite: &mut Suite,
    db: &tokio_postgres::Client,
    outage: Duration,
) -> anyhow::Result<()> {
    inject(
        suite,
        db,
        "destination down (the long outage)",
        Mode::Down,
        Until::Elapsed(outage),
    )
    .await
}

/// When a fault ends.
enum Until {
    /// After this long.
    Elapsed(Duration),
    /// This long after the breaker was first seen open (at most 10 s
    /// after the start).
    Opened(Duration),
}

/// Sets `flaky` to `mode` until `until`, watching its breaker and its
/// waiting legs, sets it right, and waits until it is back to normal.
async fn inject(
    suite: &mut Suite,
    db: &tokio_postgres::Client,
    what: &'static str,
    mode: Mode,
    until: Until,
) -> anyhow::Result<()> {
    let begin = Instant::now();
    let mut deadline = match until {
        Until::Elapsed(d) => begin + d,
        Until::Opened(_) => begin + Duration::from_secs(10),
    };
    suite.receivers.flaky.set(mode);
    let mut opened = None;
    let mut waiting = (0, 0);
    while Instant::now() < deadline {
        let seen = look(db).await?;
        if opened.is_none() && seen.state != "closed" {
            opened = Some(Instant::now());
            if let Until::Opened(more) = until {
                deadline = Instant::now() + more;
            }
        }
        waiting = (waiting.0.max(seen.waiting), waiting.1.max(seen.held));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    suite.receivers.flaky.set(Mode::Ok);
    let end = Instant::now();
    let recovered = recover(db, Duration::from_secs(60)).await?;
    if recovered.is_none() {
        eprintln!("faults: `flaky` not back to normal a minute after: {what}");
    }
    suite.count(what);
    suite.receivers.faults.push(Injected {
        what,
        begin,
        end,
        opened,
        waiting,
        recovered,
    });
    Ok(())
}

/// What the database says of `flaky` now.
struct Seen {
    state: String,
    waiting: i64,
    held: i64,
}

/// Legs waiting for something else than the destination (the reaper's
/// `lost` claims wait for the reconciler, ingest's `publish` failures for
/// the scheduler) are not counted.
async fn look(db: &tokio_postgres::Client) -> anyhow::Result<Seen> {
    let row = db
        .query_one(
            "select (select state from destinations where source = $1 and name = 'flaky'),
                    count(*),
                    count(*) filter (where last_error_class = 'held')
             from deliveries
             where source = $1 and destination = 'flaky' and status = 'failed' and retryable
               and last_error_class not in ('lost', 'publish')",
            &[&SOURCE],
        )
        .await?;
    Ok(Seen {
        state: row.get::<_, Option<String>>(0).unwrap_or_default(),
        waiting: row.get(1),
        held: row.get(2),
    })
}

/// Polls until `flaky`'s breaker is closed and none of its legs waits, at
/// most `limit`; when it was.
async fn recover(db: &tokio_postgres::Client, limit: Duration) -> anyhow::Result<Option<Instant>> {
    let deadline = Instant::now() + limit;
    loop {
        let seen = look(db).await?;
        if seen.state == "closed" && seen.waiting == 0 {
            return Ok(Some(Instant::now()));
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Receivers {
    /// Whether a destination fault did not do what it must: the breaker
    /// opens on a 404.
    pub fn failure(&self) -> Option<String> {
        let missed: Vec<&str> = self
            .faults
            .iter()
            .filter(|f| f.what.contains("404") && f.opened.is_none())
            .map(|f| f.what)
            .collect();
        (!missed.is_empty()).then(|| format!("the breaker did not open: {missed:?}"))
    }
}
