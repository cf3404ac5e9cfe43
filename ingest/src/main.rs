//! `hookinbox-ingest`: reads its settings, starts logging, builds the app
//! (see the library) and serves until SIGTERM or SIGINT.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use hookinbox::config::IngestArgs;
use hookinbox::telemetry::LogArgs;
use hookinbox_ingest::IngestApp;

/// Receives GitHub webhooks and hands each delivery to the workers once.
#[derive(Parser)]
#[command(name = "hookinbox-ingest", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: IngestArgs,
    #[command(flatten)]
    log: LogArgs,
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
    hookinbox::telemetry::init(&cli.log);
    #[cfg(feature = "failpoints")]
    hookinbox::failpoints::setup();
    let config = cli
        .args
        .validate()
        .context("refusing to start: bad setting")?;
    let app = IngestApp::build(config)
        .await
        .context("cannot start hookinbox-ingest")?;
    let (port, metrics_port) = (app.port(), app.metrics_port());
    tracing::info!(port, metrics_port, "hookinbox-ingest listening");
    app.run_until_stopped().await.context("server failed")?;
    Ok(ExitCode::SUCCESS)
}
