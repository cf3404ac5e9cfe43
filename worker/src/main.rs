//! `hookinbox-worker`: consumes jobs and runs their effects; its
//! subcommands are the operator's tools. Everything lives in the library;
//! this file reads the settings and dispatches.

use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use hookinbox::config::{HandlerKind, WorkerArgs};
use hookinbox::handler::{Handler, Store};
use hookinbox::runtime::Worker;

/// Runs hookinbox jobs: take the claim, run the effect, complete fenced.
#[derive(Parser)]
#[command(name = "hookinbox-worker", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: WorkerArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Run the worker (the default with no subcommand).
    Run,
    /// Apply pending database migrations, then exit.
    Migrate,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    hookinbox::telemetry::init();
    let cli = Cli::parse();
    let handler_kind = cli.args.handler;
    let config = cli
        .args
        .validate()
        .context("refusing to start: bad setting")?;
    match cli.command.unwrap_or(Command::Run) {
        Command::Migrate => {
            let pool = hookinbox::db::pool(&config.common.database_url, 1)?;
            let applied = hookinbox::db::migrate(&pool)
                .await
                .context("migration failed")?;
            println!("applied {applied} migration(s)");
            Ok(())
        }
        Command::Run => {
            let handler: Arc<dyn Handler> = match handler_kind {
                HandlerKind::Store => Arc::new(Store),
            };
            let worker = Worker::build(config, handler)
                .await
                .context("cannot start hookinbox-worker")?;
            let shutdown = hookinbox::shutdown::on_signals();
            worker.run(shutdown).await.context("worker failed")
        }
    }
}
