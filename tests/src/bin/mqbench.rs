//! Baseline B_mq: a raw lapin publisher with publisher confirms, 256 in
//! flight, over the same payload mix, into the same kind of quorum queue
//! (declared by hookinbox's own topology under a scratch prefix).
//! Prints messages per second.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use hookinbox_tests::fixtures;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions};
use lapin::publisher_confirm::Confirmation;
use lapin::{BasicProperties, Connection, ConnectionProperties};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10);
    let window: usize = 256;
    let all = fixtures::all();
    let push: Vec<_> = all
        .iter()
        .filter(|f| f.event == "push")
        .map(|f| f.body.clone())
        .collect();
    let pr: Vec<_> = all
        .iter()
        .filter(|f| f.event == "pull_request")
        .map(|f| f.body.clone())
        .collect();
    let bodies: Vec<Vec<u8>> = (0..10)
        .map(|i| {
            if i < 7 {
                push[i % push.len()].clone()
            } else {
                pr[i % pr.len()].clone()
            }
        })
        .collect();

    let connection = Connection::connect(
        &url,
        ConnectionProperties::default()
            .with_executor(tokio_executor_trait::Tokio::current())
            .with_reactor(tokio_reactor_trait::Tokio),
    )
    .await?;
    let channel = connection.create_channel().await?;
    let prefix = format!("mqbench-{}", std::process::id());
    let topology = hookinbox::broker::Topology::new(&prefix);
    topology.declare(&channel).await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut in_flight = VecDeque::with_capacity(window);
    let start = Instant::now();
    let mut confirmed: u64 = 0;
    let mut i = 0usize;
    while start.elapsed() < Duration::from_secs(seconds) {
        if in_flight.len() == window {
            let confirm: lapin::publisher_confirm::PublisherConfirm =
                in_flight.pop_front().expect("window");
            if matches!(confirm.await?, Confirmation::Ack(None)) {
                confirmed += 1;
            }
        }
        let confirm = channel
            .basic_publish(
                &topology.work_exchange(),
                "job",
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                &bodies[i % bodies.len()],
                BasicProperties::default().with_delivery_mode(2),
            )
            .await?;
        in_flight.push_back(confirm);
        i += 1;
    }
    for confirm in in_flight {
        if matches!(confirm.await?, Confirmation::Ack(None)) {
            confirmed += 1;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "B_mq: {:.0} confirmed messages/s ({confirmed} in {elapsed:.1} s, window {window})",
        confirmed as f64 / elapsed
    );
    for q in [topology.work_queue(), topology.dead_letter_queue()] {
        let _ = channel
            .queue_delete(&q, QueueDeleteOptions::default())
            .await;
    }
    let _ = connection.close(200, "done").await;
    Ok(())
}
