//! `hookinbox-ingest`: verifies GitHub webhooks, claims them in Postgres,
//! publishes them to RabbitMQ and answers 202. Everything lives in the
//! library; this file reads the settings and starts the server.

use anyhow::Context;
use clap::Parser;
use hookinbox::config::IngestArgs;
use hookinbox::ingest::IngestApp;

/// Receives GitHub webhooks and hands each delivery to the workers once.
#[derive(Parser)]
#[command(name = "hookinbox-ingest", version, about)]
struct Cli {
    #[command(flatten)]
    args: IngestArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    hookinbox::telemetry::init();
    let config = Cli::parse()
        .args
        .validate()
        .context("refusing to start: bad setting")?;
    let app = IngestApp::build(config)
        .await
        .context("cannot start hookinbox-ingest")?;
    tracing::info!(port = app.port(), "hookinbox-ingest listening");
    app.run_until_stopped().await.context("server failed")
}
