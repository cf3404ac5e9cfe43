//! RabbitMQ: the topology, the job message, and the confirming publisher.
//!
//! Every queue is a durable quorum queue and every message is persistent and
//! published `mandatory` with publisher confirms: ingest answers 202 only
//! once the broker has taken responsibility for the job
//! (<https://www.rabbitmq.com/docs/confirms>).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::sync::Mutex;

use crate::deliveries::ErrorClass;
use crate::key::{ClaimToken, DeliveryId, DeliveryKey, EventName, HookId, SourceName};

/// How many times the broker redelivers one message (after a consumer died
/// or requeued it) before it dead-letters it. Explicit, so that a message
/// that kills every consumer ends in the dead-letter queue instead of
/// looping; `at-least-once` dead-lettering means it is never dropped.
pub const DELIVERY_LIMIT: i64 = 50;

/// Routing key of jobs on the work exchange.
const WORK_ROUTING_KEY: &str = "job";
/// Routing key of copies on the dead-letter exchange.
const DEAD_ROUTING_KEY: &str = "dead";

/// Errors of the broker layer. None of them carries a payload.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// `AMQP_URL` does not parse.
    #[error("AMQP_URL is not a valid AMQP URL: {0}")]
    BadUrl(String),
    /// Connecting or declaring failed.
    #[error("RabbitMQ unavailable: {0}")]
    Unavailable(String),
    /// The broker refused the message (basic.nack).
    #[error("RabbitMQ refused the message (nack)")]
    Nacked,
    /// The message was acked but returned as unroutable.
    #[error("RabbitMQ returned the message as unroutable")]
    Returned,
    /// No confirm arrived within the publish timeout.
    #[error("no publisher confirm within {0:?}")]
    Timeout(Duration),
    /// The channel or connection failed under the publish.
    #[error("RabbitMQ channel failed: {0}")]
    Channel(#[from] lapin::Error),
}

/// Checks `AMQP_URL` without connecting.
pub fn check_url(url: &str) -> Result<(), BrokerError> {
    url.parse::<lapin::uri::AMQPUri>()
        .map(|_| ())
        .map_err(BrokerError::BadUrl)
}

/// The names of every exchange and queue under one prefix
/// (`HOOKINBOX_QUEUE_PREFIX`), so test runs and deployments never share one.
#[derive(Clone, Debug)]
pub struct Topology {
    prefix: String,
}

impl Topology {
    /// Names everything under `prefix`.
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    /// The exchange ingest publishes jobs to.
    pub fn work_exchange(&self) -> String {
        format!("{}.work", self.prefix)
    }

    /// The quorum queue workers consume.
    pub fn work_queue(&self) -> String {
        format!("{}.work", self.prefix)
    }

    /// The dead-letter exchange, fed by the work queue and by workers.
    pub fn dead_letter_exchange(&self) -> String {
        format!("{}.dlx", self.prefix)
    }

    /// The dead-letter queue operators inspect.
    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dlq", self.prefix)
    }

    /// Declares everything, idempotently: both binaries call it at every
    /// (re)connect, so whichever starts first creates the topology.
    pub async fn declare(&self, channel: &Channel) -> Result<(), lapin::Error> {
        let durable_exchange = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let durable_queue = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .exchange_declare(
                &self.dead_letter_exchange(),
                ExchangeKind::Fanout,
                durable_exchange,
                FieldTable::default(),
            )
            .await?;
        let mut dlq_args = FieldTable::default();
        // Quorum queues replicate and fsync before confirming: a confirmed
        // message survives a broker crash.
        dlq_args.insert("x-queue-type".into(), long_string("quorum"));
        channel
            .queue_declare(&self.dead_letter_queue(), durable_queue, dlq_args)
            .await?;
        channel
            .queue_bind(
                &self.dead_letter_queue(),
                &self.dead_letter_exchange(),
                "",
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;

        channel
            .exchange_declare(
                &self.work_exchange(),
                ExchangeKind::Direct,
                durable_exchange,
                FieldTable::default(),
            )
            .await?;
        let mut work_args = FieldTable::default();
        work_args.insert("x-queue-type".into(), long_string("quorum"));
        work_args.insert(
            "x-dead-letter-exchange".into(),
            long_string(&self.dead_letter_exchange()),
        );
        // at-least-once: the broker keeps a dead letter until the DLQ has
        // confirmed it, instead of the default fire-and-forget that can drop
        // one (https://www.rabbitmq.com/docs/quorum-queues#dead-lettering).
        work_args.insert(
            "x-dead-letter-strategy".into(),
            long_string("at-least-once"),
        );
        // at-least-once dead-lettering requires reject-publish: a full queue
        // nacks new publishes (ingest answers 503) rather than dropping old
        // messages from its head.
        work_args.insert("x-overflow".into(), long_string("reject-publish"));
        work_args.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongLongInt(DELIVERY_LIMIT),
        );
        channel
            .queue_declare(&self.work_queue(), durable_queue, work_args)
            .await?;
        channel
            .queue_bind(
                &self.work_queue(),
                &self.work_exchange(),
                WORK_ROUTING_KEY,
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(())
    }
}

fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.to_owned()))
}

/// Opens a connection whose I/O runs on the current tokio runtime.
pub async fn connect(url: &str, name: &str, timeout: Duration) -> Result<Connection, BrokerError> {
    let properties = ConnectionProperties::default()
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio)
        .with_connection_name(LongString::from(name.to_owned()));
    match tokio::time::timeout(timeout, Connection::connect(url, properties)).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(e)) => Err(BrokerError::Unavailable(e.to_string())),
        Err(_) => Err(BrokerError::Unavailable(format!(
            "no connection within {timeout:?}"
        ))),
    }
}

const H_PROVIDER: &str = "hookinbox-provider";
const H_SOURCE: &str = "hookinbox-source";
const H_HOOK_ID: &str = "hookinbox-hook-id";
const H_DELIVERY_ID: &str = "hookinbox-delivery-id";
const H_EVENT: &str = "hookinbox-event";
const H_ACTION: &str = "hookinbox-action";
const H_TOKEN: &str = "hookinbox-token";
const GITHUB_HEADER_PREFIX: &str = "x-github-";

/// A job: one delivery on its way from ingest to a worker. The raw body is
/// the message payload, byte for byte; everything else rides in headers.
#[derive(Clone, Debug)]
pub struct Job {
    /// The delivery's key.
    pub key: DeliveryKey,
    /// `X-GitHub-Event`.
    pub event: EventName,
    /// The payload's `action`, when it has one.
    pub action: Option<String>,
    /// The claim token the job was published with.
    pub token: ClaimToken,
    /// The original `Content-Type`.
    pub content_type: String,
    /// The original `X-GitHub-*` request headers (lower-case names).
    pub github_headers: Vec<(String, String)>,
    /// The raw body, as signed.
    pub body: Bytes,
}

/// Why a message could not be read as a job.
#[derive(Debug, thiserror::Error)]
#[error("malformed job message: {0}")]
pub struct MalformedJob(&'static str);

impl Job {
    fn properties(&self) -> BasicProperties {
        let mut headers = FieldTable::default();
        headers.insert(H_PROVIDER.into(), long_string(&self.key.provider));
        headers.insert(H_SOURCE.into(), long_string(self.key.source.as_str()));
        headers.insert(H_HOOK_ID.into(), long_string(self.key.hook_id.as_str()));
        headers.insert(
            H_DELIVERY_ID.into(),
            long_string(self.key.delivery_id.as_str()),
        );
        headers.insert(H_EVENT.into(), long_string(self.event.as_str()));
        if let Some(action) = &self.action {
            headers.insert(H_ACTION.into(), long_string(action));
        }
        headers.insert(H_TOKEN.into(), long_string(&self.token.to_string()));
        for (name, value) in &self.github_headers {
            headers.insert(ShortString::from(name.clone()), long_string(value));
        }
        BasicProperties::default()
            // 2 = persistent: written to disk, survives a broker restart.
            .with_delivery_mode(2)
            .with_content_type(ShortString::from(self.content_type.clone()))
            .with_message_id(ShortString::from(self.key.delivery_id.as_str().to_owned()))
            .with_headers(headers)
    }

    /// Reads a job back from a consumed message.
    pub fn from_message(properties: &BasicProperties, data: Vec<u8>) -> Result<Self, MalformedJob> {
        let headers = properties
            .headers()
            .as_ref()
            .ok_or(MalformedJob("no headers"))?;
        let text = |name: &'static str| -> Result<String, MalformedJob> {
            match headers.inner().get(name) {
                Some(AMQPValue::LongString(s)) => std::str::from_utf8(s.as_bytes())
                    .map(str::to_owned)
                    .map_err(|_| MalformedJob(name)),
                _ => Err(MalformedJob(name)),
            }
        };
        let source = SourceName::parse(&text(H_SOURCE)?).map_err(|_| MalformedJob(H_SOURCE))?;
        let hook = text(H_HOOK_ID)?;
        let hook_id = HookId::parse((!hook.is_empty()).then_some(hook.as_bytes()))
            .map_err(|_| MalformedJob(H_HOOK_ID))?;
        let delivery_id = DeliveryId::parse(text(H_DELIVERY_ID)?.as_bytes())
            .map_err(|_| MalformedJob(H_DELIVERY_ID))?;
        let mut key = DeliveryKey::github(source, hook_id, delivery_id);
        key.provider = text(H_PROVIDER)?;
        let event =
            EventName::parse(text(H_EVENT)?.as_bytes()).map_err(|_| MalformedJob(H_EVENT))?;
        let action = text(H_ACTION).ok();
        let token = text(H_TOKEN)?
            .parse()
            .map(ClaimToken)
            .map_err(|_| MalformedJob(H_TOKEN))?;
        let github_headers = headers
            .inner()
            .iter()
            .filter(|(name, _)| name.as_str().starts_with(GITHUB_HEADER_PREFIX))
            .filter_map(|(name, value)| match value {
                AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes())
                    .ok()
                    .map(|v| (name.as_str().to_owned(), v.to_owned())),
                _ => None,
            })
            .collect();
        let content_type = properties
            .content_type()
            .as_ref()
            .map(|c| c.as_str().to_owned())
            .unwrap_or_else(|| "application/json".to_owned());
        Ok(Self {
            key,
            event,
            action,
            token,
            content_type,
            github_headers,
            body: Bytes::from(data),
        })
    }
}

impl Job {
    /// The job of a parked delivery, to publish again.
    pub fn from_parked(parked: crate::deliveries::ParkedJob) -> Result<Self, MalformedJob> {
        Ok(Self {
            event: EventName::parse(parked.event.as_bytes()).map_err(|_| MalformedJob("event"))?,
            key: parked.key,
            action: parked.action,
            token: parked.token,
            content_type: parked.content_type,
            github_headers: parked.headers,
            body: Bytes::from(parked.body),
        })
    }
}

/// Why and when a delivery was dead-lettered, for the copy's headers.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    /// The failure's class.
    pub class: ErrorClass,
    /// Takes so far.
    pub attempts: i32,
    /// First failure of the delivery.
    pub first_failed_at: DateTime<Utc>,
    /// The failure that dead-lettered it.
    pub last_failed_at: DateTime<Utc>,
}

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
            // Best effort: the old connection is usually dead already.
            let _ =
                tokio::time::timeout(Duration::from_millis(100), old.close(200, "reconnect")).await;
        }
        state.channel = None;
        match self.open().await {
            Ok((connection, channel)) => {
                state.connection = Some(connection);
                state.channel = Some(channel.clone());
                state.failed_at = None;
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
        match tokio::time::timeout(self.timeout, setup).await {
            Ok(Ok(channel)) => Ok((connection, channel)),
            Ok(Err(e)) => Err(BrokerError::Unavailable(e.to_string())),
            Err(_) => Err(BrokerError::Unavailable(
                "topology declare timed out".to_owned(),
            )),
        }
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

    /// Publishes a job to the work queue and waits for its confirm. Only
    /// `Ok` means the broker holds the job; every other outcome (nack,
    /// return, timeout, closed channel) is a failed publish.
    pub async fn publish(&self, job: &Job) -> Result<(), BrokerError> {
        self.publish_raw(
            &self.topology.work_exchange(),
            WORK_ROUTING_KEY,
            &job.body,
            job.properties(),
        )
        .await
    }

    /// Publishes a dead-letter copy of a failed job, with headers for the
    /// key, the event, the error class, the attempts and the first and last
    /// failure. Postgres stays the record; the copy feeds tools and alerts,
    /// and a second copy of the same key is harmless.
    pub async fn publish_dead_letter(
        &self,
        job: &Job,
        dead: &DeadLetter,
    ) -> Result<(), BrokerError> {
        let mut properties = job.properties();
        let mut headers = properties.headers().clone().unwrap_or_default();
        headers.insert(
            "hookinbox-error-class".into(),
            long_string(dead.class.as_str()),
        );
        headers.insert(
            "hookinbox-attempts".into(),
            AMQPValue::LongInt(dead.attempts),
        );
        headers.insert(
            "hookinbox-first-failed-at".into(),
            long_string(&dead.first_failed_at.to_rfc3339()),
        );
        headers.insert(
            "hookinbox-last-failed-at".into(),
            long_string(&dead.last_failed_at.to_rfc3339()),
        );
        headers.insert(
            "hookinbox-idempotency-key".into(),
            long_string(&job.key.idempotency_key()),
        );
        properties = properties.with_headers(headers);
        self.publish_raw(
            &self.topology.dead_letter_exchange(),
            DEAD_ROUTING_KEY,
            &job.body,
            properties,
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

    /// Closes the connection.
    pub async fn close(&self) {
        let mut state = self.state.lock().await;
        state.channel = None;
        if let Some(connection) = state.connection.take() {
            let _ = connection.close(200, "shutdown").await;
        }
    }
}
