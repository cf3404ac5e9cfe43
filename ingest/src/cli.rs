//! The command line of `hookinbox-ingest`: with no subcommand it serves
//! webhooks until SIGTERM or SIGINT; `healthcheck` asks the metrics
//! listener and exits. Exit codes: 0 done (or healthy), 1 a bad setting,
//! a failed start, or unhealthy.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use hookinbox::config::IngestArgs;
use hookinbox::telemetry::LogArgs;

use crate::startup::IngestApp;

/// Receives GitHub webhooks and hands each delivery to the workers once.
#[derive(Parser)]
#[command(name = "hookinbox-ingest", version, about)]
pub struct Cli {
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

impl Cli {
    /// Runs the command and returns the process's exit code.
    pub fn run(self) -> ExitCode {
        let healthcheck = matches!(self.command, Some(Command::Healthcheck));
        let listen = self.args.metrics_listen;
        hookinbox::cli::enter(healthcheck, listen, &self.log, serve(self.args), 1)
    }
}

/// Validates the settings, builds the app and serves until stopped.
async fn serve(args: IngestArgs) -> anyhow::Result<u8> {
    let config = args.validate().context("refusing to start: bad setting")?;
    let app = IngestApp::build(config)
        .await
        .context("cannot start hookinbox-ingest")?;
    let (port, metrics_port) = (app.port(), app.metrics_port());
    tracing::info!(port, metrics_port, "hookinbox-ingest listening");
    app.run_until_stopped().await.context("server failed")?;
    Ok(0)
}
