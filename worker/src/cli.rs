//! The command line of `hookinbox-worker`: with no subcommand it runs the
//! worker; `migrate`, `healthcheck` and the operator commands do one thing
//! and exit.
//!
//! Exit codes: 0 done, 1 nothing matched (for `dlq replay`: nothing could
//! be replayed, the output saying why), 2 usage or connection error.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use hookinbox::config::{WorkerArgs, WorkerConfig};
use hookinbox::telemetry::LogArgs;

use hookinbox_operator::cli::{self as ops, Found, OpsCommand};
use hookinbox_operator::console::{AdminApp, AdminArgs};

use crate::reconcile::{self, PassOptions};
use crate::{Worker, handlers, maintenance};

/// Runs hookinbox jobs (take the claim, run the effect, complete fenced),
/// and the operator's commands.
pub struct Cli {
    args: CliArgs,
    /// Whether `HOOKINBOX_METRICS_LISTEN` was given (flag or variable)
    /// rather than defaulted: the console's listener defaults to loopback,
    /// the worker's to every address.
    metrics_listen_given: bool,
}

impl clap::CommandFactory for Cli {
    fn command() -> clap::Command {
        CliArgs::command()
    }

    fn command_for_update() -> clap::Command {
        CliArgs::command_for_update()
    }
}

impl clap::FromArgMatches for Cli {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Ok(Self {
            args: CliArgs::from_arg_matches(matches)?,
            metrics_listen_given: given(matches, "metrics_listen"),
        })
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.args.update_from_arg_matches(matches)?;
        self.metrics_listen_given = given(matches, "metrics_listen");
        Ok(())
    }
}

impl Parser for Cli {}

/// Whether the argument `id` came from the command line or the
/// environment, not from its default.
fn given(matches: &clap::ArgMatches, id: &str) -> bool {
    matches
        .value_source(id)
        .is_some_and(|s| s != clap::parser::ValueSource::DefaultValue)
}

#[derive(Parser)]
#[command(
    name = "hookinbox-worker",
    version,
    about,
    after_help = "Exit codes: 0 done, 1 nothing matched (for dlq replay: nothing replayed, the output saying why), 2 usage or connection error.\n\nExamples:\n  hookinbox-worker                       # run the worker\n  hookinbox-worker migrate\n  hookinbox-worker dlq list --json\n  hookinbox-worker dlq replay --all --dry-run\n  hookinbox-worker deliveries show <X-GitHub-Delivery>\n  hookinbox-worker jobs list\n  hookinbox-worker destinations\n  hookinbox-worker admin                 # the admin console on 127.0.0.1:9900"
)]
struct CliArgs {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: WorkerArgs,
    #[command(flatten)]
    log: LogArgs,
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
    /// One reconciler pass per source that names a GitHub hook: read the
    /// hook's delivery log and ask GitHub to redeliver what it saw fail
    /// and hookinbox never took. Exits 0 when every pass completed.
    #[command(
        after_help = "Examples:\n  hookinbox-worker reconcile\n  hookinbox-worker reconcile --source main --dry-run --json\n  hookinbox-worker reconcile --since 6h"
    )]
    Reconcile(ReconcileArgs),
    /// Serve the admin console and its JSON API (HOOKINBOX_ADMIN_LISTEN,
    /// default 127.0.0.1:9900) until stopped.
    #[command(
        after_help = "Example:\n  HOOKINBOX_ADMIN_TOKENS_FILE=/etc/hookinbox/admin-tokens hookinbox-worker admin\n\nThe tokens file has one `NAME ROLE SECRET` per line (role viewer or operator)."
    )]
    Admin(AdminArgs),
    #[command(flatten)]
    Ops(OpsCommand),
    /// Delete completed and failed deliveries past their retention, then exit
    /// (for a CronJob; workers also sweep on their own).
    Sweep,
}

/// `reconcile …`
#[derive(clap::Args)]
struct ReconcileArgs {
    /// Only this source.
    #[arg(long)]
    source: Option<String>,
    /// List what would be redelivered; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// One JSON object per source.
    #[arg(long)]
    json: bool,
    /// Walk back this far (e.g. 6h) instead of to the watermark; at most
    /// GitHub's log (3 days, 7 on GitHub Enterprise Server).
    #[arg(long, value_parser = ops::parse_age)]
    since: Option<Duration>,
    /// The longest wait for GitHub's rate limit, or for another worker's
    /// pass of the same source, before giving up.
    #[arg(long, value_parser = ops::parse_age, default_value = "2m")]
    max_wait: Duration,
    /// Walk GitHub's whole log, successes too, whatever
    /// HOOKINBOX_RECONCILE_FULL_EVERY_SECS says (other passes ask for the
    /// failed deliveries only).
    #[arg(long)]
    full: bool,
}

impl Cli {
    /// Runs the command and returns the process's exit code.
    pub fn run(self) -> ExitCode {
        let Self {
            args: cli,
            metrics_listen_given,
        } = self;
        let healthcheck = matches!(cli.command, Some(Command::Healthcheck));
        let (listen, log) = (cli.args.metrics_listen, cli.log.clone());
        hookinbox::cli::enter(
            healthcheck,
            listen,
            &log,
            cli.dispatch(metrics_listen_given),
            2,
        )
    }
}

impl CliArgs {
    async fn dispatch(self, metrics_listen_given: bool) -> anyhow::Result<u8> {
        let config = self
            .args
            .validate()
            .context("refusing to start: bad setting")?;
        match self.command.unwrap_or(Command::Run) {
            Command::Healthcheck => Ok(0),
            Command::Migrate => {
                let applied = config.common.migrate().await.context("migration failed")?;
                println!("applied {applied} migration(s)");
                Ok(0)
            }
            Command::Reconcile(args) => reconcile_once(&config, &args).await,
            Command::Ops(command) => {
                let found = ops::run(command, &config, &mut std::io::stdout().lock())
                    .await
                    .context("command failed")?;
                Ok(found.exit_code())
            }
            Command::Sweep => sweep(&config).await,
            Command::Admin(args) => {
                let admin = args
                    .validate(config, metrics_listen_given)
                    .context("refusing to start: bad setting")?;
                let listen = admin.listen;
                let app = AdminApp::build(admin)
                    .await
                    .context("cannot start the admin console")?;
                tracing::info!(listen = %listen, port = app.port(), "admin console listening");
                app.run_until_stopped()
                    .await
                    .context("admin console failed")?;
                Ok(0)
            }
            Command::Run => {
                let handler: Arc<dyn handlers::Handler> =
                    handlers::from_config(&config.routes, &handlers::Registry::new())
                        .context("cannot build the destinations' handlers")?;
                let worker = Worker::build(config, handler)
                    .await
                    .context("cannot start hookinbox-worker")?;
                let shutdown = hookinbox::shutdown::on_signals();
                worker.run(shutdown).await.context("worker failed")?;
                Ok(0)
            }
        }
    }
}

/// `sweep`: one retention sweep, unless another sweeper holds the lock.
async fn sweep(config: &WorkerConfig) -> anyhow::Result<u8> {
    let pool = config.common.pool_of(2)?;
    let swept = maintenance::sweep(&config.common.leaders(&pool)?, config)
        .await
        .context("command failed: sweep failed")?;
    let mut out = std::io::stdout().lock();
    let found = match swept {
        Some(swept) => {
            writeln!(
                out,
                "swept {} completed and {} failed deliveries, {} remembered bodies, {} \
                 stored events and {} logged attempts; dropped {} day partitions, created {}; \
                 bodies: {} days dropped, {} deleted by rows",
                swept.completed,
                swept.failed,
                swept.seen_bodies,
                swept.events,
                swept.attempts,
                swept.partitions,
                swept.created,
                swept.bodies.days,
                swept.bodies.deleted
            )?;
            Found::from_count(swept.total() as usize)
        }
        None => {
            writeln!(out, "another sweeper holds the lock; nothing done")?;
            Found::Nothing
        }
    };
    Ok(found.exit_code())
}

/// `reconcile`: one pass per selected source, each printed as it ends.
/// 0 when every pass completed; otherwise 2, naming each failure.
async fn reconcile_once(config: &WorkerConfig, args: &ReconcileArgs) -> anyhow::Result<u8> {
    let targets: Vec<_> = config
        .reconcile
        .iter()
        .filter(|t| {
            args.source
                .as_deref()
                .is_none_or(|s| t.source.as_str() == s)
        })
        .collect();
    if targets.is_empty() {
        anyhow::bail!(match &args.source {
            Some(source) => format!("source '{source}' names no GitHub hook to reconcile"),
            None => "no source names a GitHub hook to reconcile: set HOOKINBOX_RECONCILE_HOOK \
                     (or a [sources.github] table in HOOKINBOX_CONFIG)"
                .to_owned(),
        });
    }
    let pool = config.common.pool_of(4)?;
    let leaders = config.common.leaders(&pool)?;
    let options = PassOptions {
        dry_run: args.dry_run,
        since: args.since,
        max_wait: args.max_wait,
        full: args.full,
    };
    let mut failures = Vec::new();
    for target in targets {
        match reconcile::run(
            &pool,
            &leaders,
            target,
            config,
            &options,
            Some(args.max_wait),
        )
        .await
        {
            Ok(report) => print_report(&report, args.json)?,
            Err(e) => failures.push(format!("source '{}': {e}", target.source)),
        }
    }
    if failures.is_empty() {
        return Ok(0);
    }
    for failure in &failures {
        eprintln!("Error: reconcile did not complete for {failure}");
    }
    Ok(2)
}

fn print_report(report: &reconcile::Report, json: bool) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string(report)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "{} ({}): scanned {}, redelivered {}, late {}, unexplained {}, capped {}, skipped {}, refused {}, throttled {}; walked {}, {} API requests{}",
        report.source,
        report.hook,
        report.scanned,
        report.redelivered,
        report.late,
        report.unexplained,
        report.capped,
        report.skipped,
        report.refused,
        report.throttled,
        if report.walk == "full" {
            "the whole log"
        } else {
            "failures only"
        },
        report.api_requests,
        if report.dry_run { " (dry run)" } else { "" },
    )?;
    for guid in &report.would_redeliver {
        writeln!(out, "  would redeliver {guid}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_listener_counts_as_given_only_when_it_is() {
        // The variable would make it given; this test is about the flag.
        if std::env::var_os("HOOKINBOX_METRICS_LISTEN").is_some() {
            return;
        }
        let parse = |args: &[&str]| Cli::try_parse_from(args).expect("parses");
        assert!(!parse(&["hookinbox-worker", "admin"]).metrics_listen_given);
        assert!(
            parse(&[
                "hookinbox-worker",
                "--metrics-listen",
                "0.0.0.0:9899",
                "admin"
            ])
            .metrics_listen_given
        );
    }
}
