//! A complete worker around your own handler, with the same runtime as
//! `hookinbox-worker`: consume, take with a fencing token, renew the lease,
//! fence before the effect, complete in the same transaction, retry with
//! backoff, dead-letter.
//!
//! This one keeps a count of commits pushed per repository. Run it like the
//! worker (same environment variables), next to `hookinbox-ingest`:
//!
//! ```sh
//! cargo run --example custom_handler
//! ```

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use hookinbox::Job;
use hookinbox::config::WorkerArgs;
use hookinbox::payload::{self, ContentType};
use hookinbox::telemetry::LogArgs;
use hookinbox_worker::{Effect, Handler, HandlerError, Worker};

/// Counts pushed commits per repository.
struct CommitCounter;

#[async_trait::async_trait]
impl Handler for CommitCounter {
    async fn handle(&self, job: &Job, effect: &mut Effect) -> Result<(), HandlerError> {
        // Other events complete without an effect.
        if job.event.as_str() != "push" {
            return Ok(());
        }
        let content_type = ContentType::parse(&job.content_type)
            .ok_or_else(|| HandlerError::permanent("unsupported content type"))?;
        let json = payload::json_text(content_type, &job.body)
            .map_err(|e| HandlerError::permanent(e.to_string()))?;
        let push: serde_json::Value =
            serde_json::from_str(&json).map_err(|e| HandlerError::permanent(e.to_string()))?;
        let repo = push["repository"]["full_name"]
            .as_str()
            .ok_or_else(|| HandlerError::permanent("push without repository.full_name"))?;
        let commits = push["commits"].as_array().map_or(0, |c| c.len()) as i64;

        // The transaction that will also complete the delivery; the row is
        // locked under this worker's token, so a worker that lost its claim
        // can never get here, and this effect commits exactly once.
        let tx = effect.transaction().await?;
        tx.execute(
            "insert into commit_counts (repository, commits) values ($1, $2)
             on conflict (repository) do update set commits = commit_counts.commits + $2",
            &[&repo, &commits],
        )
        .await?;
        Ok(())
    }
}

/// The worker's own settings (the same as hookinbox-worker's).
#[derive(Parser)]
#[command(
    name = "custom_handler",
    about = "Counts pushed commits per repository"
)]
struct Cli {
    #[command(flatten)]
    args: WorkerArgs,
    #[command(flatten)]
    log: LogArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    hookinbox::telemetry::init(&cli.log);
    let config = cli.args.validate().context("bad setting")?;
    let worker = Worker::build(config, Arc::new(CommitCounter))
        .await
        .context("cannot start")?;
    // Your own tables: create them however you manage your schema.
    worker
        .pool()
        .get()
        .await?
        .batch_execute(
            "create table if not exists commit_counts (
                repository text primary key,
                commits    bigint not null
            )",
        )
        .await?;
    worker.run(hookinbox::shutdown::on_signals()).await?;
    Ok(())
}
