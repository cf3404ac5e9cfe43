//! Group commit: many concurrent callers, one statement.
//!
//! Callers hand their item to one collector. While a batch is running, new
//! items queue up; when a slot frees, everything waiting (up to the batch
//! size) goes out as one call, and each caller gets its own answer. An idle
//! system therefore adds no delay (a lone item goes out at once), and a busy
//! one turns many commits, and their fsyncs, into one.
//!
//! At moderate rates that is not enough: a slot is nearly always free, so
//! each item goes out alone and the batches never form. A *linger* lets a
//! batch wait a little for company, but only while another batch is in
//! flight (so Postgres is busy anyway, and a lone item on an idle system
//! still goes out at once), only while items arrive often enough that
//! company is likely within the linger (their average gap under twice the
//! linger: at a hundred a second, with a gap of 10 ms between items, a
//! 3-ms linger would mostly only delay each item), and only until the
//! batch is full.
//!
//! The statements themselves belong to the state machine
//! (`deliveries::group_commit`); this is only the mechanism.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};

use super::DbError;

/// Batches running at once: enough to keep Postgres busy while the next
/// batch fills, few enough that batches stay large under load.
const BATCHES_IN_FLIGHT: usize = 4;

/// Why a batched call has no answer.
#[derive(Clone, Debug, thiserror::Error)]
pub enum BatchError {
    /// The collector is gone (the runtime is shutting down).
    #[error("the batch collector stopped")]
    Stopped,
    /// The batch was dropped before it answered.
    #[error("the batch was dropped before it answered")]
    Dropped,
    /// The batch answered another number of results than it was given
    /// items (a bug in its statement's caller).
    #[error("the batch answered {answered} results for {items} items")]
    WrongCount {
        /// Items sent.
        items: usize,
        /// Results received.
        answered: usize,
    },
    /// Postgres failed the batch's statement; every item of it shares the
    /// error. Whether it committed is unknown unless the error says so.
    #[error(transparent)]
    Failed(Arc<DbError>),
}

type Reply<O> = oneshot::Sender<Result<O, BatchError>>;

/// How a collector forms its batches.
#[derive(Clone, Copy, Debug)]
pub struct BatchShape {
    /// Items per statement at most (1: no batching).
    pub max_batch: usize,
    /// How long a batch may wait for more items while another batch is in
    /// flight (zero: never). Tokio's timers tick in milliseconds, so a
    /// linger under one rounds up to about one.
    pub linger: Duration,
    /// Called with the size of every batch as it goes out (a metric).
    pub observe: fn(usize),
}

/// Hands items to a collector that runs them in batches.
pub struct Batcher<I, O> {
    tx: mpsc::Sender<(I, Reply<O>)>,
}

impl<I, O> Clone for Batcher<I, O> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
        }
    }
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Starts the collector on the current runtime. `run` gets up to
    /// `shape.max_batch` items and must answer with one output per item, in
    /// order; an error fails every item of that batch.
    pub fn start<F, Fut>(shape: BatchShape, run: F) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<O>, DbError>> + Send + 'static,
    {
        let max_batch = shape.max_batch.max(1);
        let (tx, mut rx) = mpsc::channel::<(I, Reply<O>)>(max_batch * 64);
        let slots = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
        tokio::spawn(async move {
            let mut arrivals = Arrivals::new(shape.linger);
            while let Some(first) = rx.recv().await {
                arrivals.arrived(1);
                // Waiting for a slot is when the next batch fills up.
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let mut batch = vec![first];
                arrivals.arrived(take_waiting(&mut rx, &mut batch, max_batch));
                // Linger only while another batch holds a slot: Postgres is
                // busy then, and the wait costs a caller nothing it would
                // not have waited anyway. Alone, the item goes out now. And
                // only while items come often enough for company to be
                // likely: at a low rate the linger would only delay it.
                let others_in_flight = slots.available_permits() + 1 < BATCHES_IN_FLIGHT;
                if !shape.linger.is_zero()
                    && others_in_flight
                    && batch.len() < max_batch
                    && arrivals.company_likely()
                {
                    let until = tokio::time::Instant::now() + shape.linger;
                    while batch.len() < max_batch {
                        match tokio::time::timeout_at(until, rx.recv()).await {
                            Ok(Some(item)) => {
                                batch.push(item);
                                arrivals.arrived(1);
                                arrivals.arrived(take_waiting(&mut rx, &mut batch, max_batch));
                            }
                            Ok(None) | Err(_) => break,
                        }
                    }
                }
                (shape.observe)(batch.len());
                let (items, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
                let running = run(items);
                tokio::spawn(async move {
                    let _slot = slot;
                    match running.await {
                        Ok(answers) if answers.len() == replies.len() => {
                            for (reply, answer) in replies.into_iter().zip(answers) {
                                let _ = reply.send(Ok(answer));
                            }
                        }
                        Ok(answers) => {
                            let error = BatchError::WrongCount {
                                items: replies.len(),
                                answered: answers.len(),
                            };
                            for reply in replies {
                                let _ = reply.send(Err(error.clone()));
                            }
                        }
                        Err(error) => {
                            let error = BatchError::Failed(Arc::new(error));
                            for reply in replies {
                                let _ = reply.send(Err(error.clone()));
                            }
                        }
                    }
                });
            }
        });
        Self { tx }
    }

    /// Runs one item as part of the next batch.
    pub async fn submit(&self, item: I) -> Result<O, BatchError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((item, reply))
            .await
            .map_err(|_| BatchError::Stopped)?;
        answer.await.map_err(|_| BatchError::Dropped)?
    }
}

/// Moves what is already waiting into `batch`, up to `max_batch` items;
/// returns how many it moved.
fn take_waiting<T>(rx: &mut mpsc::Receiver<T>, batch: &mut Vec<T>, max_batch: usize) -> usize {
    let before = batch.len();
    while batch.len() < max_batch {
        match rx.try_recv() {
            Ok(item) => batch.push(item),
            Err(_) => break,
        }
    }
    batch.len() - before
}

/// The collector's view of how often items arrive: a moving average of
/// the gap between them, against the linger. Items found already waiting
/// count as arriving together (they queued: the rate is high).
struct Arrivals {
    linger: Duration,
    last: Option<tokio::time::Instant>,
    /// The average gap, in nanoseconds (each new gap weighs 1/8).
    gap_ns: u64,
}

impl Arrivals {
    fn new(linger: Duration) -> Self {
        Self {
            linger,
            last: None,
            // Until gaps are seen, company is assumed: the first items of
            // a burst batch as they always did.
            gap_ns: 0,
        }
    }

    /// Notes `n` items that arrived now.
    fn arrived(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let now = tokio::time::Instant::now();
        // A long idle time counts as ten lingers, so that when a burst
        // begins the average comes down within a few tens of items.
        let cap = u64::try_from(self.linger.as_nanos().saturating_mul(10)).unwrap_or(u64::MAX);
        let gap = self.last.map_or(0, |last| {
            u64::try_from(now.duration_since(last).as_nanos())
                .unwrap_or(u64::MAX)
                .min(cap)
        });
        self.last = Some(now);
        self.gap_ns = self.gap_ns - self.gap_ns / 8 + gap / 8;
        // The others arrived with it: gaps of zero.
        for _ in 1..n.min(64) {
            self.gap_ns -= self.gap_ns / 8;
        }
    }

    /// Whether company is likely enough within the linger to wait for it:
    /// the average gap is under twice the linger (at a gap of twice the
    /// linger, about two in five lingers find company). A linger under a
    /// millisecond counts as one: tokio's timers wait that long. Twice,
    /// not once: a rate spread over several processes (ingest replicas,
    /// workers) reaches each with longer gaps, and its batches formed
    /// before.
    fn company_likely(&self) -> bool {
        let linger = self.linger.max(Duration::from_millis(1));
        u128::from(self.gap_ns) < 2 * linger.as_nanos()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use tokio::sync::Semaphore;

    use super::*;

    /// Sizes of the batches that went out, in order.
    static SIZES: Mutex<Vec<usize>> = Mutex::new(Vec::new());

    /// A collector whose first batch holds its slot until `gate` opens; every
    /// item answers itself.
    fn gated(linger: Duration, gate: Arc<Semaphore>) -> Batcher<u32, u32> {
        let shape = BatchShape {
            max_batch: 2,
            linger,
            observe: |n| SIZES.lock().expect("sizes").push(n),
        };
        Batcher::start(shape, move |items: Vec<u32>| {
            let gate = gate.clone();
            async move {
                if items.contains(&0) {
                    let _open = gate.acquire().await;
                }
                Ok(items)
            }
        })
    }

    /// Sends item 0 (held in flight), then 1, then 2 a little later, and
    /// returns the batch sizes.
    async fn sizes_with(linger: Duration) -> Vec<usize> {
        SIZES.lock().expect("sizes").clear();
        let gate = Arc::new(Semaphore::new(0));
        let batcher = gated(linger, gate.clone());
        let first = tokio::spawn({
            let b = batcher.clone();
            async move { b.submit(0).await }
        });
        while SIZES.lock().expect("sizes").is_empty() {
            tokio::task::yield_now().await;
        }
        let second = tokio::spawn({
            let b = batcher.clone();
            async move { b.submit(1).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let third = batcher.submit(2).await.expect("answer");
        assert_eq!(third, 2);
        assert_eq!(second.await.expect("join").expect("answer"), 1);
        gate.add_permits(1);
        assert_eq!(first.await.expect("join").expect("answer"), 0);
        SIZES.lock().expect("sizes").clone()
    }

    // The clock is paused: sleeps and lingers advance it only when every
    // task waits, so the order of events is fixed and nothing waits for real.
    #[tokio::test(start_paused = true)]
    async fn a_linger_gathers_items_while_another_batch_is_in_flight_and_only_then() {
        // The sizes are a static: one test runs both cases in turn.
        assert_eq!(sizes_with(Duration::ZERO).await, vec![1, 1, 1]);
        // Item 1 waits (up to 10 s) for company while batch 0 is in flight;
        // item 2 fills the batch, which then goes out at once.
        assert_eq!(sizes_with(Duration::from_secs(10)).await, vec![1, 2]);

        // Alone, an item never waits for its linger.
        SIZES.lock().expect("sizes").clear();
        let gate = Arc::new(Semaphore::new(1));
        let lone = gated(Duration::from_secs(10), gate);
        let answered = tokio::time::timeout(Duration::from_secs(5), lone.submit(7)).await;
        assert_eq!(answered.expect("no wait").expect("answer"), 7);
    }
    /// Items 20 ms apart while another batch is in flight: with a 3-ms
    /// linger, company is unlikely, and once the collector has seen the
    /// gaps each item goes out at once instead of waiting its linger.
    #[tokio::test(start_paused = true)]
    async fn items_that_come_rarely_go_out_without_lingering() {
        let gate = Arc::new(Semaphore::new(0));
        let shape = BatchShape {
            max_batch: 8,
            linger: Duration::from_millis(3),
            observe: |_| {},
        };
        let batcher = Batcher::start(shape, move |items: Vec<u32>| {
            let gate = gate.clone();
            async move {
                if items.contains(&0) {
                    let _open = gate.acquire().await;
                }
                Ok(items)
            }
        });
        // Item 0 stays in flight throughout: every later batch may linger.
        let held = tokio::spawn({
            let b = batcher.clone();
            async move { b.submit(0).await }
        });
        let mut waited = Vec::new();
        for n in 1..=12 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let sent = tokio::time::Instant::now();
            assert_eq!(batcher.submit(n).await.expect("answer"), n);
            waited.push(sent.elapsed());
        }
        assert!(
            waited[4..].iter().all(|w| w.is_zero()),
            "rare items lingered: {waited:?}"
        );
        held.abort();
    }
}
