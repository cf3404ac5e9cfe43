//! Acks in step with the broker, fewer of them. Every job of a consuming
//! channel settles its message through one collector, which acks the
//! longest run of finished messages, from the oldest still unsettled, with
//! one `basic.ack` (`multiple`), instead of one ack each: the broker then
//! settles them in one command too (a quorum queue appends one entry to
//! its log instead of one per message). Jobs whose completions share a
//! statement finish together, so such runs form by themselves.
//!
//! `multiple` acks every unsettled message up to its tag, so a run stops at
//! the first message that is not acked yet (still running, or left
//! unacked on purpose). The finished messages behind it wait for it at
//! most [`HOLD`] from the first of them, however busy the channel is, then
//! are acked one by one, so a long job, such as a deferred copy waiting out
//! another worker's lease, never holds back the others' acks (and the
//! prefetch window with them). Nacks go out at once, one by one. Every ack
//! is still sent only after its job's outcome is committed: a job hands its
//! message here only then.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use lapin::acker::Acker;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How long an acked message waits for the unsettled ones before it to
/// join a run, before it is acked on its own.
const HOLD: Duration = Duration::from_millis(2);

/// How the collector settles one message: lapin's [`Acker`] on the
/// channel; the collector's timing is also tested on its own, in virtual
/// time, with a recorder.
trait Settler: Send + 'static {
    /// `basic.ack`, with `multiple` for every unsettled tag up to this one.
    fn ack(self, multiple: bool) -> impl Future<Output = Result<(), lapin::Error>> + Send;
    /// `basic.nack` of this message alone.
    fn nack(self, requeue: bool) -> impl Future<Output = Result<(), lapin::Error>> + Send;
}

impl Settler for Acker {
    async fn ack(self, multiple: bool) -> Result<(), lapin::Error> {
        Acker::ack(&self, BasicAckOptions { multiple }).await
    }

    async fn nack(self, requeue: bool) -> Result<(), lapin::Error> {
        Acker::nack(&self, nack_options(requeue)).await
    }
}

/// What the collector hears, in the order it happened on the channel.
enum Event<A> {
    /// The consumer received this delivery tag; its job runs.
    Received(u64),
    /// The job's outcome is recorded: ack.
    Ack(u64, A),
    /// Give the message back (`requeue`) or dead-letter it (not).
    Nack(u64, A, bool),
}

/// The collector of one consuming channel.
#[derive(Clone)]
pub(super) struct Acks {
    tx: mpsc::UnboundedSender<Event<Acker>>,
}

impl Acks {
    /// Starts the collector; it ends, having sent every ack it was given,
    /// once every handle is dropped. Await the handle before closing the
    /// channel.
    pub(super) fn start() -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx }, tokio::spawn(collect(rx)))
    }

    /// A delivery arrived: call before its job starts, so its tag is known
    /// to be unsettled before any later tag is acked.
    pub(super) fn received(&self, tag: u64) {
        let _ = self.tx.send(Event::Received(tag));
    }

    /// The job of `tag` recorded its outcome: ack it, with the run it
    /// completes or on its own.
    pub(super) fn ack(&self, tag: u64, acker: Acker) {
        let _ = self.tx.send(Event::Ack(tag, acker));
    }

    /// The job of `tag` gives its message back (`requeue`) or dead-letters
    /// it: at once, and before any later `multiple` ack.
    pub(super) fn nack(&self, tag: u64, acker: Acker, requeue: bool) {
        let _ = self.tx.send(Event::Nack(tag, acker, requeue));
    }
}

/// How a job settles its message.
pub(super) enum Settle {
    /// On its own (the drain, which gets one message at a time).
    Alone(Acker),
    /// Through the channel's collector.
    Collected {
        /// The message's delivery tag.
        tag: u64,
        /// Its acker.
        acker: Acker,
        /// The collector.
        acks: Acks,
    },
}

impl Settle {
    /// Acks the message.
    pub(super) async fn ack(self) -> Result<(), lapin::Error> {
        match self {
            Self::Alone(acker) => Settler::ack(acker, false).await,
            Self::Collected { tag, acker, acks } => {
                acks.ack(tag, acker);
                Ok(())
            }
        }
    }

    /// Nacks the message: back to the queue (`requeue`), or to the work
    /// queue's dead-letter exchange.
    pub(super) async fn nack(self, requeue: bool) -> Result<(), lapin::Error> {
        match self {
            Self::Alone(acker) => Settler::nack(acker, requeue).await,
            Self::Collected { tag, acker, acks } => {
                acks.nack(tag, acker, requeue);
                Ok(())
            }
        }
    }
}

/// A nack of one message, back to the queue or not.
fn nack_options(requeue: bool) -> BasicNackOptions {
    BasicNackOptions {
        requeue,
        ..Default::default()
    }
}

/// Unsettled tags in order: `None` while the job runs (or its message was
/// left unacked), `Some` once acked by its job and not yet sent.
type Unsettled<A> = BTreeMap<u64, Option<A>>;

/// Whether an acked message waits behind an unsettled one.
fn waiting<A>(unsettled: &Unsettled<A>) -> bool {
    unsettled.values().any(Option::is_some)
}

async fn collect<A: Settler>(mut rx: mpsc::UnboundedReceiver<Event<A>>) {
    let mut unsettled = Unsettled::new();
    // When the acked messages waiting behind an unsettled one go alone: set
    // when the first of them starts waiting, and not moved by what happens
    // after (on a busy channel something always does).
    let mut release: Option<Instant> = None;
    loop {
        let event = match release {
            Some(at) => tokio::select! {
                // The deadline first: a channel that always has an event
                // ready must not starve it.
                biased;
                () = tokio::time::sleep_until(at) => {
                    ack_each(&mut unsettled).await;
                    release = None;
                    continue;
                }
                event = rx.recv() => event,
            },
            None => rx.recv().await,
        };
        let Some(event) = event else { break };
        apply(event, &mut unsettled).await;
        // Jobs that finished with this one (one completion statement) are
        // about to hand theirs over: give them one turn (a best effort: a
        // late one joins the next run), then take all there is.
        tokio::task::yield_now().await;
        while let Ok(event) = rx.try_recv() {
            apply(event, &mut unsettled).await;
        }
        ack_run(&mut unsettled).await;
        if !waiting(&unsettled) {
            release = None;
        } else if release.is_none() {
            release = Some(Instant::now() + HOLD);
        }
    }
    ack_run(&mut unsettled).await;
    ack_each(&mut unsettled).await;
}

/// Records one event; a nack goes out at once.
async fn apply<A: Settler>(event: Event<A>, unsettled: &mut Unsettled<A>) {
    match event {
        Event::Received(tag) => {
            unsettled.insert(tag, None);
        }
        Event::Ack(tag, acker) => {
            unsettled.insert(tag, Some(acker));
        }
        Event::Nack(tag, acker, requeue) => {
            // Out of the way first, so no later `multiple` ack covers it.
            unsettled.remove(&tag);
            if let Err(e) = acker.nack(requeue).await {
                failed("nack", &e);
            }
        }
    }
}

/// Sends the run of acked messages from the oldest unsettled one as one
/// `multiple` ack.
async fn ack_run<A: Settler>(unsettled: &mut Unsettled<A>) {
    let mut last = None;
    while let Some(entry) = unsettled.first_entry() {
        if entry.get().is_none() {
            break;
        }
        last = entry.remove();
    }
    if let Some(acker) = last
        && let Err(e) = acker.ack(true).await
    {
        failed("ack", &e);
    }
}

/// Acks every acked message still waiting, one by one.
async fn ack_each<A: Settler>(unsettled: &mut Unsettled<A>) {
    let behind: Vec<u64> = unsettled
        .iter()
        .filter(|(_, acker)| acker.is_some())
        .map(|(tag, _)| *tag)
        .collect();
    for tag in behind {
        if let Some(Some(acker)) = unsettled.remove(&tag)
            && let Err(e) = acker.ack(false).await
        {
            failed("ack", &e);
        }
    }
}

/// A settle that did not reach the broker: the channel died. The broker
/// redelivers those messages, and their takes find the deliveries resolved,
/// so nothing is lost. Once lapin has marked the channel closed, every
/// settle still queued fails with `InvalidChannelState`: those are not a
/// warning each (the ones that failed as the connection broke are, at
/// most a prefetch window of them).
fn failed(what: &'static str, error: &lapin::Error) {
    if matches!(error, lapin::Error::InvalidChannelState(_)) {
        tracing::debug!(error = %error, "{what} failed: the channel is closed");
    } else {
        tracing::warn!(error = %error, "{what} failed; the broker will redeliver");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What a recorder saw: when, which tag, and how it was settled.
    type Log = Arc<Mutex<Vec<(Duration, u64, &'static str)>>>;

    /// Records its settle in virtual time instead of sending it.
    struct Recorder {
        tag: u64,
        start: Instant,
        log: Log,
    }

    impl Recorder {
        fn note(&self, how: &'static str) {
            self.log
                .lock()
                .expect("log")
                .push((self.start.elapsed(), self.tag, how));
        }
    }

    impl Settler for Recorder {
        async fn ack(self, multiple: bool) -> Result<(), lapin::Error> {
            self.note(if multiple { "multiple" } else { "single" });
            Ok(())
        }

        async fn nack(self, requeue: bool) -> Result<(), lapin::Error> {
            self.note(if requeue { "requeue" } else { "dead-letter" });
            Ok(())
        }
    }

    /// A collector of recorders: its sender, the log, the time it started,
    /// and its task, which ends once the sender is dropped and every settle
    /// is recorded.
    fn start() -> (
        mpsc::UnboundedSender<Event<Recorder>>,
        Log,
        Instant,
        tokio::task::JoinHandle<()>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let collector = tokio::spawn(collect(rx));
        (tx, Log::default(), Instant::now(), collector)
    }

    fn recorder(tag: u64, log: &Log, start: Instant) -> Recorder {
        Recorder {
            tag,
            start,
            log: log.clone(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_of_finished_messages_goes_as_one_multiple_ack() {
        let (tx, log, t0, collector) = start();
        for tag in 1..=3 {
            tx.send(Event::Received(tag)).expect("send");
        }
        for tag in [2, 3, 1] {
            tx.send(Event::Ack(tag, recorder(tag, &log, t0)))
                .expect("send");
        }
        drop(tx);
        collector.await.expect("collector");
        let log = log.lock().expect("log").clone();
        assert_eq!(log, vec![(Duration::ZERO, 3, "multiple")]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_nack_goes_at_once_and_no_multiple_ack_covers_it() {
        let (tx, log, t0, collector) = start();
        for tag in 1..=3 {
            tx.send(Event::Received(tag)).expect("send");
        }
        tx.send(Event::Nack(2, recorder(2, &log, t0), true))
            .expect("send");
        tx.send(Event::Ack(3, recorder(3, &log, t0))).expect("send");
        tx.send(Event::Ack(1, recorder(1, &log, t0))).expect("send");
        drop(tx);
        collector.await.expect("collector");
        let log = log.lock().expect("log").clone();
        assert_eq!(log[0], (Duration::ZERO, 2, "requeue"));
        // Tag 1 then acks the run 1 and 3: 2 is no longer in it.
        assert_eq!(log[1].1, 3);
        assert_eq!(log.len(), 2, "{log:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn acks_behind_a_long_job_go_within_the_hold_however_busy_the_channel() {
        let (tx, log, t0, collector) = start();
        // Tag 1 runs long; 40 more finish behind it, one every millisecond,
        // each event sooner after the last than the hold.
        tx.send(Event::Received(1)).expect("send");
        for tag in 2..=41 {
            tx.send(Event::Received(tag)).expect("send");
            tx.send(Event::Ack(tag, recorder(tag, &log, t0)))
                .expect("send");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let first = log.lock().expect("log").first().cloned();
        let (when, tag, how) = first.expect("acks went out while the channel was busy");
        assert_eq!((tag, how), (2, "single"));
        assert!(
            when <= HOLD + Duration::from_millis(1),
            "the first ack behind the long job waited {when:?}"
        );
        // The long job's own ack goes, and nothing was acked twice.
        tx.send(Event::Ack(1, recorder(1, &log, t0))).expect("send");
        drop(tx);
        collector.await.expect("collector");
        let mut tags: Vec<u64> = log.lock().expect("log").iter().map(|e| e.1).collect();
        tags.sort_unstable();
        assert_eq!(tags, (1..=41).collect::<Vec<_>>());
    }
}
