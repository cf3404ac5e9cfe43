//! `hookinbox-worker`: consumes jobs and runs their effects; its
//! subcommands are the operator's tools. Everything lives in the library;
//! this file reads the settings and dispatches.

use anyhow::Context;
use clap::{Parser, Subcommand};
use hookinbox::config::WorkerArgs;
use hookinbox::ops::OpsCommand;
use hookinbox::runtime::Worker;
use std::process::ExitCode;

/// Runs hookinbox jobs (take the claim, run the effect, complete fenced),
/// and the operator's commands.
#[derive(Parser)]
#[command(
    name = "hookinbox-worker",
    version,
    about,
    after_help = "Exit codes: 0 done, 1 nothing matched, 2 usage or connection error.\n\nExamples:\n  hookinbox-worker                       # run the worker\n  hookinbox-worker migrate\n  hookinbox-worker dlq list --json\n  hookinbox-worker dlq replay --all --dry-run\n  hookinbox-worker deliveries show <X-GitHub-Delivery>"
)]
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
    /// Exit 0 if this host's metrics listener answers /healthz (for
    /// container health checks).
    Healthcheck,
    #[command(flatten)]
    Ops(OpsCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Healthcheck) = cli.command {
        return if hookinbox::metrics::healthcheck(cli.args.metrics_listen) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    hookinbox::telemetry::init();
    #[cfg(feature = "failpoints")]
    hookinbox::failpoints::setup();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("Error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<u8> {
    let config = cli
        .args
        .validate()
        .context("refusing to start: bad setting")?;
    match cli.command.unwrap_or(Command::Run) {
        Command::Healthcheck => Ok(0),
        Command::Migrate => {
            let pool = hookinbox::db::pool(&config.common.database_url, 1)?;
            let applied = hookinbox::db::migrate(&pool)
                .await
                .context("migration failed")?;
            println!("applied {applied} migration(s)");
            Ok(0)
        }
        Command::Ops(command) => {
            let found = hookinbox::ops::run(command, &config, &mut std::io::stdout().lock())
                .await
                .context("command failed")?;
            Ok(found.exit_code())
        }
        Command::Run => {
            let handler = hookinbox::handler::from_config(&config.handlers)
                .context("cannot build the HTTP client")?;
            let worker = Worker::build(config, handler)
                .await
                .context("cannot start hookinbox-worker")?;
            let shutdown = hookinbox::shutdown::on_signals();
            worker.run(shutdown).await.context("worker failed")?;
            Ok(0)
        }
    }
}
