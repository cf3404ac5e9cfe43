//! The exchanges and queues, and why each argument is what it is.

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};

use super::{DELIVERY_LIMIT, WORK_ROUTING_KEY, long_string};
use crate::key::{DestinationName, SourceName};

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

    /// The shared queue of legs claimed before destinations existed (and
    /// of every job of an earlier version): workers keep consuming it.
    pub fn work_queue(&self) -> String {
        format!("{}.work", self.prefix)
    }

    /// The quorum queue of one destination's legs: each destination has
    /// its own, so a slow or failing one never delays another. A legacy
    /// leg (the empty destination) goes through [`Topology::work_queue`].
    pub fn leg_queue(&self, source: &SourceName, destination: &DestinationName) -> String {
        if destination.is_legacy() {
            return self.work_queue();
        }
        format!("{}.work.{source}.{destination}", self.prefix)
    }

    /// The routing key of a leg's jobs on the work exchange.
    pub fn leg_routing_key(source: &SourceName, destination: &DestinationName) -> String {
        if destination.is_legacy() {
            return WORK_ROUTING_KEY.to_owned();
        }
        format!("{source}.{destination}")
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
        self.declare_work_queue(channel, &self.work_queue(), WORK_ROUTING_KEY)
            .await
    }

    /// Declares one destination's queue and binds it (after
    /// [`Topology::declare`]), idempotently: a publisher declares a queue
    /// the first time it publishes to it, a worker before it consumes it.
    pub async fn declare_leg_queue(
        &self,
        channel: &Channel,
        source: &SourceName,
        destination: &DestinationName,
    ) -> Result<(), lapin::Error> {
        self.declare_work_queue(
            channel,
            &self.leg_queue(source, destination),
            &Self::leg_routing_key(source, destination),
        )
        .await
    }

    /// A work queue: the legacy one and each destination's have the same
    /// arguments.
    async fn declare_work_queue(
        &self,
        channel: &Channel,
        queue: &str,
        routing_key: &str,
    ) -> Result<(), lapin::Error> {
        let durable_queue = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
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
            .queue_declare(queue, durable_queue, work_args)
            .await?;
        channel
            .queue_bind(
                queue,
                &self.work_exchange(),
                routing_key,
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(())
    }
}
