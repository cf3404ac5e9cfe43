//! Logging through `tracing`: JSON in containers, text on a terminal.
//!
//! `HOOKINBOX_LOG_FORMAT` is `json`, `text` or `auto` (the default: text
//! when standard error is a terminal). `RUST_LOG` filters, default `info`.
//! Both are settings of each binary ([`LogArgs`]), so `--help` lists them.
//! Logs carry delivery ids, events, outcomes and durations; never secrets,
//! signature headers or payloads.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How a binary logs.
#[derive(clap::Args, Clone, Debug)]
pub struct LogArgs {
    /// Log format: json, text, or auto (text when standard error is a
    /// terminal).
    #[arg(
        long,
        env = "HOOKINBOX_LOG_FORMAT",
        value_name = "HOOKINBOX_LOG_FORMAT",
        default_value = "auto",
        value_parser = ["auto", "json", "text"]
    )]
    pub log_format: String,

    /// Log filter, in tracing's syntax (`info`, `hookinbox=debug,info`).
    #[arg(
        long,
        env = "RUST_LOG",
        value_name = "RUST_LOG",
        default_value = "info"
    )]
    pub log_filter: String,
}

/// Installs the global subscriber. Call once, first thing in `main`.
pub fn init(args: &LogArgs) {
    let mut filter =
        EnvFilter::try_new(&args.log_filter).unwrap_or_else(|_| EnvFilter::new("info"));
    // These libraries log statement parameters and frames at debug level,
    // which would put payloads and secrets in the logs: cap them at info
    // whatever RUST_LOG says.
    for cap in ["tokio_postgres=info", "lapin=info", "amq_protocol=info"] {
        if let Ok(directive) = cap.parse() {
            filter = filter.add_directive(directive);
        }
    }
    let json = match args.log_format.as_str() {
        "json" => true,
        "text" => false,
        _ => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // Ignore the error of a second init (tests may call it more than once).
    let _ = if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init()
    } else {
        builder.try_init()
    };
}
