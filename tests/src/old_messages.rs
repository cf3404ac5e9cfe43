//! Messages as the version before bodies lived in Postgres published them:
//! the raw body as the payload, its `Content-Type` and its `X-GitHub-*`
//! headers on the message. Such messages may sit in a queue across an
//! upgrade; the worker runs them with the body they carry when Postgres
//! holds none. Written here by hand, from that version's format, so that
//! the tests do not depend on the code under test to make them.

use std::time::Duration;

use hookinbox::broker::Topology;
use hookinbox::job::Envelope;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties};

/// Publishes `job` to its destination's queue (the old shared queue for a
/// leg without a destination) with `body` as its payload, as the previous
/// version did, and waits for the broker's confirm.
pub async fn publish_with_body(
    amqp_url: &str,
    topology: &Topology,
    job: &Envelope,
    content_type: &str,
    github_headers: &[(&str, &str)],
    body: &[u8],
) {
    let text = |s: &str| AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()));
    let mut headers = FieldTable::default();
    headers.insert("hookinbox-provider".into(), text(&job.key.provider));
    headers.insert("hookinbox-source".into(), text(job.key.source.as_str()));
    headers.insert("hookinbox-hook-id".into(), text(job.key.hook_id.as_str()));
    headers.insert(
        "hookinbox-delivery-id".into(),
        text(job.key.delivery_id.as_str()),
    );
    if !job.key.destination.is_legacy() {
        headers.insert(
            "hookinbox-destination".into(),
            text(job.key.destination.as_str()),
        );
    }
    headers.insert("hookinbox-event".into(), text(job.event.as_str()));
    headers.insert("hookinbox-token".into(), text(&job.token.to_string()));
    if let Some(attempts) = job.attempts {
        headers.insert("hookinbox-attempts".into(), AMQPValue::LongInt(attempts));
    }
    for (name, value) in github_headers {
        headers.insert(ShortString::from(*name), text(value));
    }
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type(ShortString::from(content_type))
        .with_message_id(ShortString::from(job.key.delivery_id.as_str()))
        .with_headers(headers);
    let connection = Connection::connect(
        amqp_url,
        ConnectionProperties::default()
            .with_executor(tokio_executor_trait::Tokio::current())
            .with_reactor(tokio_reactor_trait::Tokio),
    )
    .await
    .expect("connect");
    let channel = connection.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    topology.declare(&channel).await.expect("topology");
    if !job.key.destination.is_legacy() {
        topology
            .declare_leg_queue(&channel, &job.key.source, &job.key.destination)
            .await
            .expect("the leg's queue");
    }
    let confirm = channel
        .basic_publish(
            &topology.work_exchange(),
            &Topology::leg_routing_key(&job.key.source, &job.key.destination),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            body,
            properties,
        )
        .await
        .expect("publish");
    let confirmed = tokio::time::timeout(Duration::from_secs(10), confirm)
        .await
        .expect("confirmed in time")
        .expect("confirm");
    assert!(confirmed.is_ack(), "the broker took it: {confirmed:?}");
    let _ = connection.close(200, "published").await;
}
