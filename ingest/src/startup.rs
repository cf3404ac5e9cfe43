//! Start-up: the pool, the publisher, the metrics listener and the HTTP
//! server, bound (port 0 picks one) and not yet running.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{App, HttpResponse, HttpServer, web};
use deadpool_postgres::Pool;
use hookinbox::broker::Publisher;
use hookinbox::config::IngestConfig;
use hookinbox::deliveries::group_commit;
use hookinbox::metrics::{Readiness, Ready};
use hookinbox::postgres::{self, BatchShape, DbError};
use serde_json::json;

use crate::admission::Admission;
use crate::limits::RateLimits;
use crate::receive::{State, receive_default, receive_named};
use crate::rotation::SecretMatches;

/// Stops a running server (see [`IngestApp::handle`]).
pub use actix_web::dev::ServerHandle;

/// Why ingest could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Postgres failed (pool or migrations).
    #[error(transparent)]
    Db(#[from] DbError),
    /// The listener could not be bound.
    #[error("cannot listen: {0}")]
    Listen(#[from] std::io::Error),
}

/// A built, bound, not yet running ingest server.
pub struct IngestApp {
    server: actix_web::dev::Server,
    port: u16,
    metrics_port: u16,
    secret_matches: Arc<SecretMatches>,
    publisher: Arc<Publisher>,
}

impl IngestApp {
    /// Builds the pool (migrating when `HOOKINBOX_AUTO_MIGRATE` is on), the
    /// publisher and the listener. Binding port 0 picks a free port; see
    /// [`IngestApp::port`].
    pub async fn build(config: IngestConfig) -> Result<Self, StartError> {
        let listener = TcpListener::bind(config.listen)?;
        Self::build_with_listener(config, listener).await
    }

    /// Like [`IngestApp::build`], on a listener the caller bound.
    pub async fn build_with_listener(
        config: IngestConfig,
        listener: TcpListener,
    ) -> Result<Self, StartError> {
        let common = &config.common;
        let pool = common.checked_pool().await?;
        if common.auto_migrate {
            common.migrate().await?;
        }
        let publisher = Arc::new(common.publisher("hookinbox-ingest"));
        // Declares the topology now if the broker is up; if not, the first
        // publish connects and /readyz says so meanwhile.
        if let Err(e) = publisher.connect().await {
            tracing::warn!(error = %e, "RabbitMQ not reachable at start; will retry on publish");
        }
        let port = listener.local_addr()?.port();
        let readiness = readiness(pool.clone(), publisher.clone());
        let (metrics_port, metrics_server) =
            hookinbox::metrics::serve(config.metrics_listen, readiness.clone())?;
        tokio::spawn(metrics_server);
        metrics::gauge!(hookinbox::metrics::LEASE_SECONDS).set(common.lease.as_secs_f64());
        let secret_matches = Arc::new(SecretMatches::default());
        let in_flight = Arc::new(tokio::sync::Semaphore::new(config.max_in_flight));
        let batcher = (config.claim_batch > 1).then(|| {
            let shape = BatchShape {
                max_batch: config.claim_batch,
                linger: common.batch_linger,
                observe: hookinbox::metrics::claim_batch_rows,
            };
            group_commit::claims(pool.clone(), common.policy(), shape)
        });
        let admission = Admission::new(&config);
        let state = web::Data::new(State {
            admission,
            rate_limits: RateLimits::new(config.sources.values()),
            batcher,
            in_flight,
            policy: common.policy(),
            config,
            pool,
            publisher: publisher.clone(),
            secret_matches: secret_matches.clone(),
        });
        let readiness = web::Data::new(readiness);
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .app_data(readiness.clone())
                .route("/healthz", web::get().to(hookinbox::metrics::healthz))
                .route("/readyz", web::get().to(hookinbox::metrics::readyz))
                .service(web::resource("/webhooks/github").route(web::post().to(receive_default)))
                .service(
                    web::resource("/webhooks/github/{source}").route(web::post().to(receive_named)),
                )
                .default_service(web::to(not_found))
        })
        // Slowloris: the request head must arrive within this time.
        .client_request_timeout(Duration::from_secs(5))
        .listen(listener)?
        .run();
        Ok(Self {
            server,
            port,
            metrics_port,
            secret_matches,
            publisher,
        })
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of the metrics listener.
    pub fn metrics_port(&self) -> u16 {
        self.metrics_port
    }

    /// Secret matches by source and position, for rotation.
    pub fn secret_matches(&self) -> Arc<SecretMatches> {
        self.secret_matches.clone()
    }

    /// A handle that can stop the server.
    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Serves until the server is stopped (SIGTERM, SIGINT or the handle),
    /// every request in flight answered; then closes the broker connection
    /// before the runtime stops (see `broker::close`).
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let served = self.server.await;
        self.publisher.close().await;
        served
    }
}

/// Ingest is ready when Postgres answers: with the broker down it still
/// takes deliveries (it parks their bodies and answers 202), so taking it
/// out of rotation then would turn accepted deliveries into refused
/// connections, which GitHub never retries. The broker's state is
/// reported beside it.
fn readiness(pool: Pool, publisher: Arc<Publisher>) -> Readiness {
    Arc::new(move || {
        let pool = pool.clone();
        let publisher = publisher.clone();
        Box::pin(async move {
            let postgres = postgres::ping(&pool).await;
            let rabbitmq = publisher.is_connected().await;
            Ready {
                ok: postgres,
                checks: vec![("postgres", postgres), ("rabbitmq", rabbitmq)],
            }
        })
    })
}

async fn not_found() -> HttpResponse {
    HttpResponse::NotFound().json(json!({"status": "error", "error": "no such route"}))
}
