//! Traces over OTLP, configured by the standard `OTEL_*` variables
//! (<https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/>).
//! Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or the traces-only
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set: then no layer is
//! installed, and the spans' context helpers ([`super::context`]) return
//! at once.
//!
//! Protocols: `http/protobuf` (the default) and `grpc`. Spans leave in
//! batches from a thread of the SDK's own; `OTEL_BSP_*` tune the batches
//! and `OTEL_EXPORTER_OTLP_HEADERS` adds headers (read by the SDK).
//! Only hookinbox's own spans are exported, at `info`, whatever `RUST_LOG`
//! says.

use std::sync::OnceLock;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};

/// How a binary exports traces.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TraceArgs {
    /// The OTLP collector's base URL (`http://collector:4318` for
    /// http/protobuf, which sends to `<base>/v1/traces`;
    /// `http://collector:4317` for grpc). Unset: no traces.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_ENDPOINT",
        value_name = "OTEL_EXPORTER_OTLP_ENDPOINT"
    )]
    pub otlp_endpoint: Option<String>,

    /// The traces' own URL, used as it is; wins over the base URL.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        value_name = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )]
    pub otlp_traces_endpoint: Option<String>,

    /// `http/protobuf` or `grpc` (plain HTTP/2; use http/protobuf for an
    /// https collector).
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_PROTOCOL",
        value_name = "OTEL_EXPORTER_OTLP_PROTOCOL",
        default_value = "http/protobuf"
    )]
    pub otlp_protocol: String,

    /// The service name spans carry (default: the binary's name,
    /// `hookinbox-ingest` or `hookinbox-worker`).
    #[arg(long, env = "OTEL_SERVICE_NAME", value_name = "OTEL_SERVICE_NAME")]
    pub service_name: Option<String>,

    /// always_on, always_off, traceidratio, parentbased_always_on,
    /// parentbased_always_off or parentbased_traceidratio.
    #[arg(
        long,
        env = "OTEL_TRACES_SAMPLER",
        value_name = "OTEL_TRACES_SAMPLER",
        default_value = "parentbased_always_on"
    )]
    pub traces_sampler: String,

    /// The ratio of the `traceidratio` samplers, 0 to 1 (default 1).
    #[arg(
        long,
        env = "OTEL_TRACES_SAMPLER_ARG",
        value_name = "OTEL_TRACES_SAMPLER_ARG"
    )]
    pub traces_sampler_arg: Option<String>,
}

/// A traces setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// A setting's value is not one this build takes.
    #[error("{0}: {1}")]
    Setting(&'static str, String),
    /// The exporter could not be built.
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(String),
}

/// The wire the spans go over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    HttpProtobuf,
    Grpc,
}

/// The settings, checked.
#[derive(Debug)]
struct Plan {
    endpoint: String,
    protocol: Protocol,
    service_name: String,
    sampler: Sampler,
}

impl TraceArgs {
    /// The checked settings; `None` when no endpoint is set (traces off).
    fn plan(&self) -> Result<Option<Plan>, TraceError> {
        let set = |v: &Option<String>| {
            v.as_deref()
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let (base, traces) = (set(&self.otlp_endpoint), set(&self.otlp_traces_endpoint));
        if base.is_none() && traces.is_none() {
            return Ok(None);
        }
        let protocol = match self.otlp_protocol.trim() {
            "http/protobuf" => Protocol::HttpProtobuf,
            "grpc" => Protocol::Grpc,
            other => {
                return Err(TraceError::Setting(
                    "OTEL_EXPORTER_OTLP_PROTOCOL",
                    format!("{other:?} is not http/protobuf or grpc"),
                ));
            }
        };
        // The spec's rule: the base URL gets the signal's path over HTTP;
        // the traces' own URL is used as it is.
        let endpoint = match (traces, base) {
            (Some(url), _) => url,
            (None, Some(base)) if protocol == Protocol::HttpProtobuf => {
                format!("{}/v1/traces", base.trim_end_matches('/'))
            }
            (None, Some(base)) => base,
            (None, None) => return Ok(None),
        };
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(TraceError::Setting(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("{endpoint:?} is not an http:// or https:// URL"),
            ));
        }
        Ok(Some(Plan {
            endpoint,
            protocol,
            service_name: set(&self.service_name).unwrap_or_else(program_name),
            sampler: sampler(&self.traces_sampler, self.traces_sampler_arg.as_deref())?,
        }))
    }
}

/// The running program's file name (`hookinbox-ingest`, `hookinbox-worker`).
fn program_name() -> String {
    std::env::args_os()
        .next()
        .and_then(|p| {
            std::path::Path::new(&p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "hookinbox".to_owned())
}

/// `OTEL_TRACES_SAMPLER` and its argument, as the spec names them.
fn sampler(name: &str, arg: Option<&str>) -> Result<Sampler, TraceError> {
    let ratio = || -> Result<f64, TraceError> {
        match arg.map(str::trim).filter(|a| !a.is_empty()) {
            None => Ok(1.0),
            Some(a) => a
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| {
                    TraceError::Setting(
                        "OTEL_TRACES_SAMPLER_ARG",
                        format!("{a:?} is not a ratio from 0 to 1"),
                    )
                }),
        }
    };
    Ok(match name.trim() {
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "traceidratio" => Sampler::TraceIdRatioBased(ratio()?),
        "parentbased_always_on" => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        "parentbased_always_off" => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        "parentbased_traceidratio" => {
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio()?)))
        }
        other => {
            return Err(TraceError::Setting(
                "OTEL_TRACES_SAMPLER",
                format!(
                    "{other:?} is not one of always_on, always_off, traceidratio, \
                     parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
                ),
            ));
        }
    })
}

/// The provider, kept to flush and stop it at exit.
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The layer that turns hookinbox's spans into OTLP spans, or `None` when
/// traces are off. A gRPC exporter is built on `runtime` (tonic needs
/// one); the HTTP exporter needs none.
pub(super) fn install<S>(
    args: &TraceArgs,
    runtime: Option<&tokio::runtime::Handle>,
) -> Result<Option<Box<dyn Layer<S> + Send + Sync>>, TraceError>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    let Some(plan) = args.plan()? else {
        return Ok(None);
    };
    let exporter = match plan.protocol {
        Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(&plan.endpoint)
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .build(),
        Protocol::Grpc => {
            let handle = runtime
                .cloned()
                .or_else(|| tokio::runtime::Handle::try_current().ok())
                .ok_or_else(|| {
                    TraceError::Setting(
                        "OTEL_EXPORTER_OTLP_PROTOCOL",
                        "grpc needs a runtime here; use http/protobuf".to_owned(),
                    )
                })?;
            let _entered = handle.enter();
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(&plan.endpoint)
                .build()
        }
    }
    .map_err(|e| TraceError::Exporter(e.to_string()))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(plan.sampler)
        .with_resource(
            Resource::builder()
                .with_service_name(plan.service_name)
                .build(),
        )
        .build();
    let tracer = provider.tracer("hookinbox");
    if PROVIDER.set(provider).is_err() {
        // Installed before (a second init in one process): keep the first.
        return Ok(None);
    }
    super::context::set_enabled(true);
    // hookinbox's own spans only: the libraries' are noise in a delivery's
    // trace, and some would describe statements and frames.
    let targets = Targets::new()
        .with_default(LevelFilter::OFF)
        .with_target("hookinbox", LevelFilter::INFO)
        .with_target("hookinbox_ingest", LevelFilter::INFO)
        .with_target("hookinbox_worker", LevelFilter::INFO);
    Ok(Some(
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(targets)
            .boxed(),
    ))
}

/// Flushes and stops the exporter, if one was installed.
pub(super) fn shutdown() {
    if let Some(provider) = PROVIDER.get() {
        let _ = provider.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(endpoint: Option<&str>) -> TraceArgs {
        TraceArgs {
            otlp_endpoint: endpoint.map(str::to_owned),
            otlp_protocol: "http/protobuf".to_owned(),
            traces_sampler: "parentbased_always_on".to_owned(),
            ..TraceArgs::default()
        }
    }

    #[test]
    fn off_without_an_endpoint() {
        assert!(args(None).plan().expect("plan").is_none());
        assert!(args(Some(" ")).plan().expect("plan").is_none());
    }

    #[test]
    fn the_base_url_gets_the_traces_path_over_http_only() {
        let plan = args(Some("http://c:4318/"))
            .plan()
            .expect("ok")
            .expect("on");
        assert_eq!(plan.endpoint, "http://c:4318/v1/traces");
        let mut grpc = args(Some("http://c:4317"));
        grpc.otlp_protocol = "grpc".to_owned();
        assert_eq!(
            grpc.plan().expect("ok").expect("on").endpoint,
            "http://c:4317"
        );
        let mut own = args(Some("http://c:4318"));
        own.otlp_traces_endpoint = Some("http://t:9/x".to_owned());
        assert_eq!(
            own.plan().expect("ok").expect("on").endpoint,
            "http://t:9/x"
        );
    }

    #[test]
    fn bad_settings_are_named() {
        let mut json = args(Some("http://c:4318"));
        json.otlp_protocol = "http/json".to_owned();
        assert!(
            json.plan()
                .expect_err("refused")
                .to_string()
                .contains("OTEL_EXPORTER_OTLP_PROTOCOL")
        );
        let mut sampler = args(Some("http://c:4318"));
        sampler.traces_sampler = "jaeger_remote".to_owned();
        assert!(
            sampler
                .plan()
                .expect_err("refused")
                .to_string()
                .contains("OTEL_TRACES_SAMPLER")
        );
        sampler.traces_sampler = "parentbased_traceidratio".to_owned();
        sampler.traces_sampler_arg = Some("1.5".to_owned());
        assert!(
            sampler
                .plan()
                .expect_err("refused")
                .to_string()
                .contains("OTEL_TRACES_SAMPLER_ARG")
        );
        sampler.traces_sampler_arg = Some("0.01".to_owned());
        assert!(sampler.plan().is_ok());
        assert!(args(Some("collector:4318")).plan().is_err());
    }
}
