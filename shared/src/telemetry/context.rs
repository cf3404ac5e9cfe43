//! A span's place in a trace, carried between processes as a W3C
//! `traceparent` (<https://www.w3.org/TR/trace-context/>): in a job's
//! message headers from ingest to the worker, stored with a delivery's
//! row for the retries and replays that link back to it, and sent on a
//! forwarded request so the receiver continues the trace.
//!
//! With traces off ([`enabled`] is false) every method here returns at
//! once: no context is built, read or written.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TraceId};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The header (HTTP) and message header (AMQP) of the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether traces are exported: an OTLP endpoint is set and the exporter
/// is installed.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

pub(super) fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// What a `tracing` span can do with its place in a trace.
pub trait SpanTrace {
    /// The span's `traceparent`, when traces are on. It carries the
    /// sampling decision, so a process downstream samples as this one did.
    fn traceparent(&self) -> Option<String>;
    /// Makes the span a child of a remote span (a `traceparent` read from
    /// a message or a row). Call before anything else reads the span's
    /// context: a started span keeps its parent. A malformed value is
    /// ignored (the span starts a trace of its own).
    fn continue_from(&self, traceparent: &str);
    /// Links the span to another trace's span (the original of a retry or
    /// a replay). A malformed value is ignored.
    fn link_to(&self, traceparent: &str);
    /// Records the span's `trace_id` and `span_id` fields (declared empty
    /// when the span was made), so the log lines inside it carry them.
    fn record_ids(&self);
}

/// A span for one step of a traced unit of work, named `name` in the
/// trace, a child of the current span; a disabled span, which costs
/// nothing, when traces are off.
pub fn step(name: &'static str) -> tracing::Span {
    if !enabled() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "step",
        otel.name = name,
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty
    );
    span.record_ids();
    span
}

fn remote(traceparent: &str) -> opentelemetry::Context {
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    TraceContextPropagator::new().extract(&carrier)
}

impl SpanTrace for tracing::Span {
    fn traceparent(&self) -> Option<String> {
        if !enabled() {
            return None;
        }
        let cx = self.context();
        if !cx.span().span_context().is_valid() {
            return None;
        }
        let mut carrier = HashMap::new();
        TraceContextPropagator::new().inject_context(&cx, &mut carrier);
        carrier.remove(TRACEPARENT)
    }

    fn continue_from(&self, traceparent: &str) {
        if !enabled() {
            return;
        }
        let cx = remote(traceparent);
        if cx.span().span_context().is_valid() {
            let _ = self.set_parent(cx);
        }
    }

    fn link_to(&self, traceparent: &str) {
        if !enabled() {
            return;
        }
        let cx = remote(traceparent);
        // `add_link` ignores an invalid context.
        self.add_link(cx.span().span_context().clone());
    }

    fn record_ids(&self) {
        if !enabled() {
            return;
        }
        let cx = self.context();
        let span = cx.span();
        let ids = span.span_context();
        if ids.trace_id() != TraceId::INVALID {
            self.record("trace_id", tracing::field::display(ids.trace_id()));
            self.record("span_id", tracing::field::display(ids.span_id()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_is_read_back() {
        let cx = remote("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let span = cx.span();
        let ids = span.span_context();
        assert!(ids.is_valid() && ids.is_remote() && ids.is_sampled());
        assert_eq!(
            ids.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        for bad in [
            "",
            "00-xyz",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        ] {
            assert!(!remote(bad).span().span_context().is_valid(), "{bad}");
        }
    }

    #[test]
    fn off_means_nothing_is_read_or_written() {
        let span = tracing::info_span!("x", trace_id = tracing::field::Empty);
        assert_eq!(span.traceparent(), None);
        span.continue_from("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        span.record_ids();
    }
}
