//! Logging through `tracing`: JSON in containers, text on a terminal; and,
//! when an OTLP endpoint is set, traces ([`traces`]).
//!
//! `HOOKINBOX_LOG_FORMAT` is `json`, `text` or `auto` (the default: text
//! when standard error is a terminal). `RUST_LOG` filters, default `info`.
//! Both are settings of each binary ([`LogArgs`]), so `--help` lists them,
//! with the standard `OTEL_*` variables of the traces ([`TraceArgs`]).
//! Logs carry delivery ids, events, outcomes and durations; never secrets,
//! signature headers or payloads. Inside a traced span a log line carries
//! the span's `trace_id` and `span_id` ([`context::record_ids`]).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub mod context;
pub mod traces;

pub use context::{SpanTrace, enabled, step};
pub use traces::{TraceArgs, TraceError};

/// How a binary logs and traces.
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

    /// Traces: off unless an OTLP endpoint is set.
    #[command(flatten)]
    pub traces: TraceArgs,
}

/// Installs the global subscriber: the log layer, and the traces' layer
/// when an OTLP endpoint is set. Call once, first thing in `main`. A
/// traces setting that cannot be used is reported on standard error and
/// traces stay off; [`try_init`] returns it instead.
pub fn init(args: &LogArgs) {
    if let Err(e) = try_init(args, None) {
        eprintln!("traces are off: {e}");
    }
}

/// [`init`], returning a traces setting that cannot be used (logging is
/// installed either way). The HTTP exporter runs on a thread of the SDK's
/// own; a gRPC exporter is built on `runtime`, which must outlive it.
pub fn try_init(
    args: &LogArgs,
    runtime: Option<&tokio::runtime::Handle>,
) -> Result<(), TraceError> {
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
    let logs = if json {
        tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed()
    };
    let (spans, installed) = match traces::install(&args.traces, runtime) {
        Ok(Some(layer)) => (Some(layer), Ok(())),
        Ok(None) => (None, Ok(())),
        Err(e) => (None, Err(e)),
    };
    // Ignore the error of a second init (tests may call it more than once).
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(spans)
        .try_init();
    installed
}

/// Sends the spans still buffered and stops the exporter; call once, at
/// the end of `main`, outside any runtime. Nothing when traces are off.
pub fn shutdown() {
    traces::shutdown();
}
