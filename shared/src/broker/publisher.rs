//! The confirming publisher: ingest answers 202 only once the broker has
//! taken responsibility for the job
//! (<https://www.rabbitmq.com/docs/confirms>).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::publisher_confirm::Confirmation;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};
use tokio::sync::Mutex;

use super::{BrokerError, DEAD_ROUTING_KEY, Topology, close_within, connect, message};
use crate::deliveries::DeadLetter;
use crate::job::Envelope;
use crate::key::{DestinationName, SourceName};

/// A publisher with confirms over one lazily (re)connected channel.
///
/// Many publishes share the channel and are in flight at once; each caller
/// awaits only its own confirm (pipelined confirms). A failed channel is
/// dropped and the next publish reconnects.
pub struct Publisher {
    url: String,
    name: String,
    topology: Topology,
    timeout: Duration,
    state: Mutex<PublisherState>,
    /// Publishes awaiting their confirm at once.
    window: Arc<tokio::sync::Semaphore>,
    /// The destinations' queues declared on the current channel (by its
    /// id): a leg's queue is declared before its first publish.
    declared: std::sync::Mutex<(u16, HashSet<String>)>,
}

/// Publishes awaiting a confirm at once, by default.
pub const DEFAULT_PUBLISH_WINDOW: usize = 256;

#[derive(Default)]
struct PublisherState {
    connection: Option<Connection>,
    channel: Option<Channel>,
    /// After a failed connect, publishes fail fast for a moment instead of
    /// each waiting out its own connect timeout against a dead broker.
    failed_at: Option<Instant>,
    /// Closed for good ([`Publisher::close`]): no publish reconnects.
    closed: bool,
}

/// How long publishes fail fast after a failed connect.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

impl Publisher {
    /// A publisher for `url`; nothing connects until the first publish.
    pub fn new(url: &str, name: &str, topology: Topology, timeout: Duration) -> Self {
        Self {
            url: url.to_owned(),
            name: name.to_owned(),
            topology,
            timeout,
            state: Mutex::new(PublisherState::default()),
            window: Arc::new(tokio::sync::Semaphore::new(DEFAULT_PUBLISH_WINDOW)),
            declared: std::sync::Mutex::new((0, HashSet::new())),
        }
    }

    /// Allows `window` publishes to await their confirms at once (1: each
    /// publish waits for the one before it to be confirmed).
    pub fn with_window(mut self, window: usize) -> Self {
        self.window = Arc::new(tokio::sync::Semaphore::new(window.max(1)));
        self
    }

    /// The topology it publishes into.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Connects now (and declares the topology) if not connected.
    pub async fn connect(&self) -> Result<(), BrokerError> {
        self.channel().await.map(|_| ())
    }

    /// True when the channel is open.
    pub async fn is_connected(&self) -> bool {
        let state = self.state.lock().await;
        state
            .channel
            .as_ref()
            .is_some_and(|c| c.status().connected())
    }

    async fn channel(&self) -> Result<Channel, BrokerError> {
        let mut state = self.state.lock().await;
        if state.closed {
            return Err(BrokerError::Unavailable("publisher closed".to_owned()));
        }
        if let Some(channel) = &state.channel
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        if let Some(at) = state.failed_at
            && at.elapsed() < RECONNECT_PAUSE
        {
            return Err(BrokerError::Unavailable("reconnecting".to_owned()));
        }
        if let Some(old) = state.connection.take() {
            // Best effort: the old connection is usually dead already. Its
            // channel goes after it (see `broker::close`).
            let channel = state.channel.take();
            close_within(old, channel, "reconnect", Duration::from_millis(100)).await;
        }
        state.channel = None;
        match self.open().await {
            Ok((connection, channel)) => {
                state.connection = Some(connection);
                state.channel = Some(channel.clone());
                state.failed_at = None;
                // A new connection: declare each destination's queue again
                // (its channel may reuse the old one's id).
                *self.declared.lock().unwrap_or_else(|e| e.into_inner()) =
                    (channel.id(), HashSet::new());
                Ok(channel)
            }
            Err(e) => {
                state.failed_at = Some(Instant::now());
                Err(e)
            }
        }
    }

    async fn open(&self) -> Result<(Connection, Channel), BrokerError> {
        let connection = connect(&self.url, &self.name, self.timeout).await?;
        let setup = async {
            let channel = connection.create_channel().await?;
            self.topology.declare(&channel).await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            Ok::<_, lapin::Error>(channel)
        };
        let failed = match tokio::time::timeout(self.timeout, setup).await {
            Ok(Ok(channel)) => return Ok((connection, channel)),
            Ok(Err(e)) => BrokerError::Unavailable(e.to_string()),
            Err(_) => BrokerError::Unavailable("topology declare timed out".to_owned()),
        };
        close_within(connection, (), "setup failed", self.timeout).await;
        Err(failed)
    }

    /// Drops the channel if it is still the one that failed, so the next
    /// publish reconnects.
    async fn forget(&self, failed: &Channel) {
        let mut state = self.state.lock().await;
        if state
            .channel
            .as_ref()
            .is_some_and(|c| c.id() == failed.id())
        {
            state.channel = None;
        }
    }

    async fn publish_raw(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), BrokerError> {
        // Pipelined confirms: up to `window` publishes share the channel,
        // each awaiting only its own confirm. The bound keeps a stalled
        // broker from collecting an unbounded backlog of unconfirmed bodies.
        let _permit = match tokio::time::timeout(self.timeout, self.window.acquire()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(BrokerError::Unavailable("publisher closed".to_owned())),
            Err(_) => return Err(BrokerError::Timeout(self.timeout)),
        };
        let channel = self.channel().await?;
        let confirm = async {
            let confirm = channel
                .basic_publish(
                    exchange,
                    routing_key,
                    // mandatory: an unroutable message comes back as a
                    // return instead of vanishing, and counts as a failure.
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    body,
                    properties,
                )
                .await?;
            confirm.await
        };
        let result = match tokio::time::timeout(self.timeout, confirm).await {
            Ok(Ok(Confirmation::Ack(None))) => Ok(()),
            Ok(Ok(Confirmation::Ack(Some(_)))) => Err(BrokerError::Returned),
            Ok(Ok(Confirmation::Nack(_))) => Err(BrokerError::Nacked),
            // Confirms are always selected on this channel; a channel that
            // lost confirm mode must not be trusted.
            Ok(Ok(Confirmation::NotRequested)) => Err(BrokerError::Unavailable(
                "channel not in confirm mode".to_owned(),
            )),
            Ok(Err(e)) => Err(BrokerError::Channel(e)),
            Err(_) => Err(BrokerError::Timeout(self.timeout)),
        };
        if matches!(
            result,
            Err(BrokerError::Channel(_) | BrokerError::Timeout(_))
        ) {
            self.forget(&channel).await;
        }
        result
    }

    /// Publishes a job (its envelope: the leg's key, and a copy of its body
    /// when it has one) to its
    /// destination's queue and waits for its confirm. Only `Ok` means the
    /// broker holds the job; every other outcome (nack, return, timeout,
    /// closed channel) is a failed publish. The queue is declared first if
    /// this channel has not yet.
    pub async fn publish(&self, job: &Envelope) -> Result<(), BrokerError> {
        let (source, destination) = (&job.key.source, &job.key.destination);
        if !destination.is_legacy() {
            self.ensure_leg_queue(source, destination).await?;
        }
        self.publish_raw(
            &self.topology.work_exchange(),
            &Topology::leg_routing_key(source, destination),
            message::payload(job),
            message::properties(job),
        )
        .await
    }

    /// Publishes a destination's probe through the shared work queue, not
    /// the destination's own: while its breaker is open, that queue holds
    /// the destination's backlog, and the workers hold its head unacked
    /// until the breaker closes, so a probe queued behind them would never
    /// be consumed. Every worker consumes the shared queue and runs the
    /// probe in its destination's lane. Confirmed like [`Publisher::publish`].
    pub async fn publish_probe(&self, job: &Envelope) -> Result<(), BrokerError> {
        self.publish_raw(
            &self.topology.work_exchange(),
            &Topology::leg_routing_key(&job.key.source, &DestinationName::legacy()),
            &[],
            message::properties(job),
        )
        .await
    }

    /// Declares a destination's queue on the current channel, once per
    /// channel: a publish to a queue nobody declared would come back
    /// unroutable.
    async fn ensure_leg_queue(
        &self,
        source: &SourceName,
        destination: &DestinationName,
    ) -> Result<(), BrokerError> {
        let channel = self.channel().await?;
        let queue = self.topology.leg_queue(source, destination);
        {
            let declared = self.declared.lock().unwrap_or_else(|e| e.into_inner());
            if declared.0 == channel.id() && declared.1.contains(&queue) {
                return Ok(());
            }
        }
        let declare = self
            .topology
            .declare_leg_queue(&channel, source, destination);
        match tokio::time::timeout(self.timeout, declare).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                self.forget(&channel).await;
                return Err(BrokerError::Channel(e));
            }
            Err(_) => {
                self.forget(&channel).await;
                return Err(BrokerError::Timeout(self.timeout));
            }
        }
        let mut declared = self.declared.lock().unwrap_or_else(|e| e.into_inner());
        if declared.0 != channel.id() {
            *declared = (channel.id(), HashSet::new());
        }
        declared.1.insert(queue);
        Ok(())
    }

    /// Publishes a dead-letter copy of a failed job, with headers for the
    /// key, the event, the error class, the attempts and the first and last
    /// failure. Postgres stays the record, body included; the copy feeds
    /// tools and alerts, and a second copy of the same key is harmless.
    pub async fn publish_dead_letter(
        &self,
        job: &Envelope,
        dead: &DeadLetter,
    ) -> Result<(), BrokerError> {
        self.publish_raw(
            &self.topology.dead_letter_exchange(),
            DEAD_ROUTING_KEY,
            &[],
            message::dead_letter_properties(job, dead),
        )
        .await
    }

    /// Publishes a message as it is (properties and body) to the
    /// dead-letter exchange, with a confirm. Used to rewrite the queue when
    /// operators reconcile it.
    pub async fn republish_dead_letter(
        &self,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), BrokerError> {
        self.publish_raw(
            &self.topology.dead_letter_exchange(),
            DEAD_ROUTING_KEY,
            body,
            properties,
        )
        .await
    }

    /// Ready messages and consumers of one of this topology's queues.
    pub async fn queue_stats(&self, queue: &str) -> Result<(u32, u32), BrokerError> {
        let channel = self.channel().await?;
        let declared = channel
            .queue_declare(
                queue,
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await;
        match declared {
            Ok(q) => Ok((q.message_count(), q.consumer_count())),
            Err(e) => {
                // A failed passive declare closes the channel.
                self.forget(&channel).await;
                Err(BrokerError::Channel(e))
            }
        }
    }

    /// Closes the connection and waits for its I/O loop to end (see
    /// `broker::close`); publishes after this fail instead of reconnecting.
    pub async fn close(&self) {
        let mut state = self.state.lock().await;
        state.closed = true;
        let channel = state.channel.take();
        if let Some(connection) = state.connection.take() {
            super::close(connection, channel, "shutdown").await;
        }
    }
}
