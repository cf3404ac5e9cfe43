//! An OTLP/HTTP endpoint for the benchmark's traced variants
//! (`scripts/bench.sh --cost` with `OTEL_EXPORTER_OTLP_ENDPOINT=sink`):
//! it decodes each `POST /v1/traces` as protobuf, so the exporters do
//! their whole work, counts the spans and keeps nothing. `GET /count`
//! answers the spans so far.
//!
//!   otlpsink --port PORT

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use actix_web::{App, HttpResponse, HttpServer, web};
use clap::Parser;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;

#[derive(Parser)]
struct Args {
    /// The loopback port to listen on.
    #[arg(long)]
    port: u16,
}

async fn traces(body: web::Bytes, count: web::Data<AtomicU64>) -> HttpResponse {
    match ExportTraceServiceRequest::decode(body.as_ref()) {
        Ok(request) => {
            let spans: usize = request
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .map(|s| s.spans.len())
                .sum();
            count.fetch_add(spans as u64, Ordering::Relaxed);
            HttpResponse::Ok()
                .content_type("application/x-protobuf")
                .body(ExportTraceServiceResponse::default().encode_to_vec())
        }
        Err(_) => HttpResponse::BadRequest().finish(),
    }
}

async fn count(count: web::Data<AtomicU64>) -> HttpResponse {
    HttpResponse::Ok().body(count.load(Ordering::Relaxed).to_string())
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let spans = web::Data::from(Arc::new(AtomicU64::new(0)));
    HttpServer::new(move || {
        App::new()
            .app_data(spans.clone())
            .app_data(web::PayloadConfig::new(64 * 1024 * 1024))
            .route("/v1/traces", web::post().to(traces))
            .route("/count", web::get().to(count))
    })
    .workers(1)
    .bind(("127.0.0.1", args.port))?
    .run()
    .await
}
