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
//! most [`HOLD`], then are acked one by one, so a long job, such as a
//! deferred copy waiting out another worker's lease, never holds back the
//! others' acks (and the prefetch window with them). Nacks go out at once, one by one. Every ack is still
//! sent only after its job's outcome is committed: a job hands its message
//! here only then.

use std::collections::BTreeMap;
use std::time::Duration;

use lapin::acker::Acker;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use tokio::sync::mpsc;

/// How long an acked message waits for the unsettled ones before it to
/// join a run, before it is acked on its own.
const HOLD: Duration = Duration::from_millis(2);

/// What the collector hears, in the order it happened on the channel.
enum Event {
    /// The consumer received this delivery tag; its job runs.
    Received(u64),
    /// The job's outcome is recorded: ack.
    Ack(u64, Acker),
    /// Give the message back (`requeue`) or dead-letter it (not).
    Nack(u64, Acker, bool),
}

/// The collector of one consuming channel.
#[derive(Clone)]
pub(super) struct Acks {
    tx: mpsc::UnboundedSender<Event>,
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

    pub(super) fn ack(&self, tag: u64, acker: Acker) {
        let _ = self.tx.send(Event::Ack(tag, acker));
    }

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
            Self::Alone(acker) => acker.ack(BasicAckOptions::default()).await,
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
            Self::Alone(acker) => acker.nack(nack_options(requeue)).await,
            Self::Collected { tag, acker, acks } => {
                acks.nack(tag, acker, requeue);
                Ok(())
            }
        }
    }
}

fn nack_options(requeue: bool) -> BasicNackOptions {
    BasicNackOptions {
        requeue,
        ..Default::default()
    }
}

/// Unsettled tags in order: `None` while the job runs (or its message was
/// left unacked), `Some` once acked by its job and not yet sent.
type Unsettled = BTreeMap<u64, Option<Acker>>;

async fn collect(mut rx: mpsc::UnboundedReceiver<Event>) {
    let mut unsettled = Unsettled::new();
    loop {
        let waiting = unsettled.values().any(Option::is_some);
        let event = if waiting {
            match tokio::time::timeout(HOLD, rx.recv()).await {
                Ok(event) => event,
                Err(_) => {
                    ack_each(&mut unsettled).await;
                    continue;
                }
            }
        } else {
            rx.recv().await
        };
        let Some(event) = event else { break };
        apply(event, &mut unsettled).await;
        // Jobs that finished with this one (one completion statement) are
        // about to hand theirs over: let them, then take all there is.
        tokio::task::yield_now().await;
        while let Ok(event) = rx.try_recv() {
            apply(event, &mut unsettled).await;
        }
        ack_run(&mut unsettled).await;
    }
    ack_run(&mut unsettled).await;
    ack_each(&mut unsettled).await;
}

async fn apply(event: Event, unsettled: &mut Unsettled) {
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
            if let Err(e) = acker.nack(nack_options(requeue)).await {
                tracing::debug!(error = %e, "nack failed");
            }
        }
    }
}

/// Sends the run of acked messages from the oldest unsettled one as one
/// `multiple` ack.
async fn ack_run(unsettled: &mut Unsettled) {
    let mut last = None;
    while let Some(entry) = unsettled.first_entry() {
        if entry.get().is_none() {
            break;
        }
        last = entry.remove();
    }
    if let Some(acker) = last
        && let Err(e) = acker.ack(BasicAckOptions { multiple: true }).await
    {
        // The channel died; the broker redelivers those messages, and
        // their takes find the deliveries resolved.
        tracing::debug!(error = %e, "ack failed");
    }
}

/// Acks every acked message still waiting, one by one.
async fn ack_each(unsettled: &mut Unsettled) {
    let behind: Vec<u64> = unsettled
        .iter()
        .filter(|(_, acker)| acker.is_some())
        .map(|(tag, _)| *tag)
        .collect();
    for tag in behind {
        if let Some(Some(acker)) = unsettled.remove(&tag)
            && let Err(e) = acker.ack(BasicAckOptions::default()).await
        {
            tracing::debug!(error = %e, "ack failed");
        }
    }
}
