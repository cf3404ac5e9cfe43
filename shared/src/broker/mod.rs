//! RabbitMQ: the topology, the job message, and the confirming publisher.
//!
//! Every queue is a durable quorum queue and every message is persistent and
//! published `mandatory` with publisher confirms: ingest answers 202 only
//! once the broker has taken responsibility for the job
//! (<https://www.rabbitmq.com/docs/confirms>).

use std::time::Duration;

use lapin::types::{AMQPValue, LongString};
use lapin::{Channel, Connection, ConnectionProperties};

mod message;
mod publisher;
mod topology;

pub use message::{MalformedJob, decode};
pub use publisher::{DEFAULT_PUBLISH_WINDOW, Publisher};
pub use topology::Topology;

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

/// Connects, opens a channel and declares the topology on it: what a
/// consumer, the drain and the dead-letter reconciler each need first.
pub async fn open_channel(
    url: &str,
    name: &str,
    timeout: Duration,
    topology: &Topology,
) -> Result<(Connection, Channel), BrokerError> {
    let connection = connect(url, name, timeout).await?;
    let channel = connection.create_channel().await?;
    topology.declare(&channel).await?;
    Ok((connection, channel))
}
