//! `hookinbox-ingest`: verifies GitHub webhooks, claims them in Postgres,
//! publishes them to RabbitMQ and answers 202. Everything lives in the
//! library; this file reads the settings and starts the server.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use hookinbox::config::IngestArgs;
use hookinbox::ingest::IngestApp;

/// Receives GitHub webhooks and hands each delivery to the workers once.
#[derive(Parser)]
#[command(name = "hookinbox-ingest", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: IngestArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Serve webhooks (the default with no subcommand).
    Run,
    /// Exit 0 if this host's metrics listener answers /healthz (for
    /// container health checks).
    Healthcheck,
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    if let Some(Command::Healthcheck) = cli.command {
        let healthy = hookinbox::metrics::healthcheck(cli.args.metrics_listen);
        return Ok(if healthy {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    hookinbox::telemetry::init();
    #[cfg(feature = "failpoints")]
    hookinbox::failpoints::setup();
    let config = cli
        .args
        .validate()
        .context("refusing to start: bad setting")?;
    let app = IngestApp::build(config)
        .await
        .context("cannot start hookinbox-ingest")?;
    tracing::info!(
        port = app.port(),
        metrics_port = app.metrics_port(),
        "hookinbox-ingest listening"
    );
    app.run_until_stopped().await.context("server failed")?;
    Ok(ExitCode::SUCCESS)
}
