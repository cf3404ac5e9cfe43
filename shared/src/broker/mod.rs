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
mod nodes;
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

/// Checks `AMQP_URL` without connecting: one URL, or the URLs of a
/// cluster's nodes separated by commas, each valid.
pub fn check_url(url: &str) -> Result<(), BrokerError> {
    let urls = nodes::urls(url);
    if urls.is_empty() {
        return Err(BrokerError::BadUrl("no URL".to_owned()));
    }
    for (i, node) in urls.iter().enumerate() {
        node.parse::<lapin::uri::AMQPUri>().map_err(|e| {
            // The parser may quote the URL, password and all: never in an
            // error that is logged.
            let e = e.replace(node, "…");
            BrokerError::BadUrl(if urls.len() > 1 {
                format!("node {} of {}: {e}", i + 1, urls.len())
            } else {
                e
            })
        })?;
    }
    Ok(())
}

fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.to_owned()))
}

/// Opens a connection whose I/O runs on the current tokio runtime, to
/// the first node of `url` (one URL, or a cluster's, comma-separated) that
/// answers within `timeout`: the node this process reached last first,
/// then the others in turn. When that connection is lost, the next one
/// starts at the node after it (`nodes`).
pub async fn connect(url: &str, name: &str, timeout: Duration) -> Result<Connection, BrokerError> {
    let urls = nodes::urls(url);
    let mut last = BrokerError::BadUrl("no URL".to_owned());
    for i in nodes::order(urls.len()) {
        match connect_node(urls[i], name, timeout).await {
            Ok(connection) => {
                nodes::reached(i);
                if urls.len() > 1 {
                    let count = urls.len();
                    connection.on_error(move |_| nodes::lost(i, count));
                    tracing::info!(node = i + 1, nodes = count, "connected to RabbitMQ");
                }
                return Ok(connection);
            }
            Err(e) => {
                if urls.len() > 1 {
                    tracing::warn!(node = i + 1, nodes = urls.len(), error = %e, "RabbitMQ node unavailable; trying the next");
                }
                last = e;
            }
        }
    }
    Err(last)
}

/// Connects to one node.
async fn connect_node(url: &str, name: &str, timeout: Duration) -> Result<Connection, BrokerError> {
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
/// consumer, the drain and the dead-letter reconciler each need first. A
/// connection whose channel fails is closed before the error returns.
pub async fn open_channel(
    url: &str,
    name: &str,
    timeout: Duration,
    topology: &Topology,
) -> Result<(Connection, Channel), BrokerError> {
    let connection = connect(url, name, timeout).await?;
    let setup = async {
        let channel = connection.create_channel().await?;
        topology.declare(&channel).await?;
        Ok::<_, lapin::Error>(channel)
    };
    match setup.await {
        Ok(channel) => Ok((connection, channel)),
        Err(e) => {
            close(connection, (), "setup failed").await;
            Err(e.into())
        }
    }
}

/// How long [`close`] waits for the broker's close-ok, and then again for
/// the connection's I/O loop to end.
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Closes `connection` and waits until its I/O loop has ended; then drops
/// `held`: the caller's channels and consumers of that connection.
///
/// The order matters to a clean stop. lapin runs each connection's I/O in
/// a thread of its own that polls the socket through this runtime: a loop
/// still running when the runtime stops logs `ERROR lapin::io_loop … A
/// Tokio 1.x context was found, but it is being shutdown`. A channel
/// dropped while its connection is open closes itself in the background,
/// and when the connection's close overtakes that, lapin logs `ERROR …
/// invalid channel state: Closing` (an active consumer dropped does the same
/// with its cancel); dropped once the connection is closed, they do
/// nothing. So every connection ends here, its channels
/// after it, before its binary's runtime stops.
///
/// Returns false when the loop had not ended within [`CLOSE_WAIT`] (an
/// unanswered close; the broker's heartbeat ends it later).
pub async fn close<H>(connection: Connection, held: H, reason: &str) -> bool {
    close_within(connection, held, reason, CLOSE_WAIT).await
}

/// [`close`], waiting at most `wait` for each step.
pub async fn close_within<H>(
    connection: Connection,
    held: H,
    reason: &str,
    wait: Duration,
) -> bool {
    if connection.status().connected() {
        match tokio::time::timeout(wait, connection.close(200, reason)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "closing a RabbitMQ connection failed"),
            Err(_) => tracing::debug!(?wait, "RabbitMQ did not answer a connection close"),
        }
    }
    // Joining the loop's thread blocks; it is joined on a thread of its
    // own (not the runtime's blocking pool, which the runtime's stop would
    // wait for), and a loop that does not end is left to the process's
    // exit.
    let (ended, joined) = tokio::sync::oneshot::channel();
    let joiner = std::thread::Builder::new()
        .name("lapin-close".to_owned())
        .spawn(move || {
            let _ = connection.run();
            let _ = ended.send(());
        });
    let done = joiner.is_ok() && matches!(tokio::time::timeout(wait, joined).await, Ok(Ok(())));
    drop(held);
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_url_is_refused_without_quoting_it() {
        for url in [
            "amqp:user:s3cret@host",
            "amqp://guest:guest@127.0.0.1:5672/%2f,amqp:user:s3cret@host",
        ] {
            let error = check_url(url).expect_err("refused").to_string();
            assert!(!error.contains("s3cret"), "{error}");
        }
        assert!(check_url("amqp://a:5672/%2f, amqp://b:5672/%2f").is_ok());
    }
}
