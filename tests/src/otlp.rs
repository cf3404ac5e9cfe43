//! A local OTLP/HTTP receiver standing for a collector: it decodes each
//! `POST /v1/traces` (protobuf, `ExportTraceServiceRequest`, with the
//! `opentelemetry-proto` types) and keeps every span, flattened, so tests
//! can assert what a trace holds and print it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use actix_web::{App, HttpResponse, HttpServer, web};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use prost::Message;

/// One received span.
#[derive(Clone, Debug)]
pub struct Span {
    /// The resource's `service.name`.
    pub service: String,
    /// Hex, 32 digits.
    pub trace_id: String,
    /// Hex, 16 digits.
    pub span_id: String,
    /// Hex, 16 digits; empty for a root span.
    pub parent_span_id: String,
    /// The span's name.
    pub name: String,
    /// `SPAN_KIND_SERVER`, `SPAN_KIND_CONSUMER`, ...
    pub kind: String,
    /// The attributes, as text.
    pub attributes: BTreeMap<String, String>,
    /// Links, as (trace id, span id).
    pub links: Vec<(String, String)>,
}

impl Span {
    /// An attribute's value.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// A running receiver.
pub struct Collector {
    /// `http://127.0.0.1:<port>`: the value of `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: String,
    spans: Arc<Mutex<Vec<Span>>>,
    /// Requests that did not decode.
    bad: Arc<Mutex<usize>>,
    handle: actix_web::dev::ServerHandle,
}

fn text(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

fn flatten(request: ExportTraceServiceRequest) -> Vec<Span> {
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .map(|r| attributes(&r.attributes))
            .unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                let kind =
                    opentelemetry_proto::tonic::trace::v1::span::SpanKind::try_from(span.kind)
                        .map(|k| k.as_str_name().to_owned())
                        .unwrap_or_default();
                out.push(Span {
                    service: service.clone(),
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    name: span.name,
                    kind,
                    attributes: attributes(&span.attributes),
                    links: span
                        .links
                        .iter()
                        .map(|l| (hex::encode(&l.trace_id), hex::encode(&l.span_id)))
                        .collect(),
                });
            }
        }
    }
    out
}

struct State {
    spans: Arc<Mutex<Vec<Span>>>,
    bad: Arc<Mutex<usize>>,
}

async fn traces(body: web::Bytes, state: web::Data<State>) -> HttpResponse {
    match ExportTraceServiceRequest::decode(body.as_ref()) {
        Ok(request) => {
            state.spans.lock().expect("lock").extend(flatten(request));
            HttpResponse::Ok()
                .content_type("application/x-protobuf")
                .body(ExportTraceServiceResponse::default().encode_to_vec())
        }
        Err(_) => {
            *state.bad.lock().expect("lock") += 1;
            HttpResponse::BadRequest().finish()
        }
    }
}

impl Collector {
    /// Starts a receiver on a free loopback port.
    pub async fn start() -> Self {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let bad = Arc::new(Mutex::new(0));
        let data = web::Data::new(State {
            spans: spans.clone(),
            bad: bad.clone(),
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::PayloadConfig::new(16 * 1024 * 1024))
                .route("/v1/traces", web::post().to(traces))
        })
        .workers(1)
        .disable_signals()
        .listen(listener)
        .expect("listen")
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            spans,
            bad,
            handle,
        }
    }

    /// Every span so far.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().expect("lock").clone()
    }

    /// The spans of one trace.
    pub fn trace(&self, trace_id: &str) -> Vec<Span> {
        self.spans()
            .into_iter()
            .filter(|s| s.trace_id == trace_id)
            .collect()
    }

    /// Requests that did not decode as OTLP.
    pub fn bad_requests(&self) -> usize {
        *self.bad.lock().expect("lock")
    }

    /// Stops it.
    pub async fn stop(&self) {
        self.handle.stop(false).await;
    }
}

/// A trace as an indented tree: service, span name and kind, each under
/// its parent; spans whose parent is outside the trace's received spans
/// (a remote parent) are marked so, and links are listed.
pub fn render(spans: &[Span]) -> String {
    let mut out = String::new();
    let ids: std::collections::HashSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let roots: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id.is_empty() || !ids.contains(s.parent_span_id.as_str()))
        .collect();
    fn walk(out: &mut String, spans: &[Span], span: &Span, depth: usize) {
        out.push_str(&format!(
            "{}{} / {} [{}] span {}{}\n",
            "  ".repeat(depth),
            span.service,
            span.name,
            span.kind.trim_start_matches("SPAN_KIND_").to_lowercase(),
            span.span_id,
            match span.parent_span_id.as_str() {
                "" => String::new(),
                parent => format!(" parent {parent}"),
            }
        ));
        for (trace, link) in &span.links {
            out.push_str(&format!(
                "{}  link -> trace {trace} span {link}\n",
                "  ".repeat(depth)
            ));
        }
        for child in spans.iter().filter(|c| c.parent_span_id == span.span_id) {
            walk(out, spans, child, depth + 1);
        }
    }
    if let Some(first) = spans.first() {
        out.push_str(&format!("trace {}\n", first.trace_id));
    }
    for root in roots {
        walk(&mut out, spans, root, 1);
    }
    out
}
