//! How both binaries enter ([`enter`]): the same first steps before their
//! command ([`preamble`]), and the same way of running it to an exit code
//! ([`block_on`]).

use std::fmt::Display;
use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;

use crate::telemetry::LogArgs;

/// Runs a binary's command the way both binaries do: [`preamble`] (which
/// answers `healthcheck` alone), then `command` on a runtime
/// ([`block_on`]), exiting with `failure` when it fails; last, the spans
/// still buffered are sent ([`crate::telemetry::shutdown`]).
pub fn enter<E: Display>(
    healthcheck: bool,
    metrics_listen: SocketAddr,
    log: &LogArgs,
    command: impl Future<Output = Result<u8, E>>,
    failure: u8,
) -> ExitCode {
    if let Some(code) = preamble(healthcheck, metrics_listen, log) {
        return code;
    }
    let code = block_on(command, failure);
    crate::telemetry::shutdown();
    code
}

/// What every command does first. `healthcheck`: the command is
/// `healthcheck`, which asks this host's metrics listener for `/healthz`
/// and ends there (a container's health check starts no logging and no
/// runtime): its exit code is returned. Otherwise logging (and traces,
/// when an OTLP endpoint is set) starts, and the fault suite's kill points
/// are armed when built with them, and `None` says to go on. A traces
/// setting that cannot be used exits 1, naming it.
pub fn preamble(healthcheck: bool, metrics_listen: SocketAddr, log: &LogArgs) -> Option<ExitCode> {
    if healthcheck {
        return Some(if crate::metrics::healthcheck(metrics_listen) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    if let Err(e) = crate::telemetry::try_init(log, traces_runtime(log).map(|r| r.handle())) {
        eprintln!("Error: refusing to start: bad setting: {e}");
        return Some(ExitCode::FAILURE);
    }
    #[cfg(feature = "failpoints")]
    crate::failpoints::setup();
    None
}

/// The gRPC exporter's runtime (tonic needs one), kept for the life of
/// the process so the last spans still leave after the command's runtime
/// is gone; none for the HTTP exporter, which runs on a thread of the
/// SDK's own.
fn traces_runtime(log: &LogArgs) -> Option<&'static tokio::runtime::Runtime> {
    static RUNTIME: std::sync::OnceLock<Option<tokio::runtime::Runtime>> =
        std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let grpc = log.traces.otlp_protocol.trim() == "grpc";
            grpc.then(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("otlp-grpc")
                    .enable_all()
                    .build()
                    .ok()
            })
            .flatten()
        })
        .as_ref()
}
/// Runs a command on a new multi-threaded runtime. Its `Ok(code)` is the
/// exit code; an error is printed on one line with its causes
/// (`Error: refusing to start: bad setting: HOOKINBOX_…: …`) and exits
/// with `failure`.
pub fn block_on<E: Display>(command: impl Future<Output = Result<u8, E>>, failure: u8) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("Error: cannot start the runtime: {e}");
            return ExitCode::from(failure);
        }
    };
    match runtime.block_on(command) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::from(failure)
        }
    }
}
