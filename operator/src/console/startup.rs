//! Start-up: the pool, the job runner, the metrics listener and the HTTP
//! server, bound (port 0 picks one) and not yet running.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{App, HttpResponse, HttpServer, middleware, web};
use hookinbox::metrics::{Readiness, Ready};
use hookinbox::postgres::{self, DbError};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::config::{Access, AdminConfig};
use super::state::State;
use super::throttle::Throttle;
use super::{api, headers, pages, session, sign_in};
use crate::destinations::SecretValues;
use crate::jobs::{self, Runner};

/// Stops a running console (see [`AdminApp::handle`]).
pub use actix_web::dev::ServerHandle as AdminHandle;

/// Why the console could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminStartError {
    /// Postgres failed (pool or migrations).
    #[error(transparent)]
    Db(#[from] DbError),
    /// A listener could not be bound.
    #[error("cannot listen: {0}")]
    Listen(#[from] std::io::Error),
}

/// A built, bound, not yet running console.
pub struct AdminApp {
    server: actix_web::dev::Server,
    port: u16,
    metrics_port: u16,
    stop_runner: CancellationToken,
    runner: tokio::task::JoinHandle<()>,
}

/// Connections the console keeps: a page takes at most two at once.
const POOL_SIZE: usize = 8;

impl AdminApp {
    /// Builds the pool (migrating when `HOOKINBOX_AUTO_MIGRATE` is on),
    /// ends the sessions of tokens no longer in the tokens file, and builds
    /// the job runner, the metrics listener and the server.
    pub async fn build(config: AdminConfig) -> Result<Self, AdminStartError> {
        let listener = TcpListener::bind(config.listen)?;
        let common = &config.worker.common;
        let pool = common.pool_of(POOL_SIZE.min(common.db_pool_size).max(2))?;
        if common.auto_migrate {
            common.migrate().await?;
        }
        if let Access::Tokens(tokens) = &config.access {
            session::end_removed(&pool.get().await.map_err(DbError::from)?, tokens).await?;
        }
        let port = listener.local_addr()?.port();
        let (metrics_port, metrics_server) =
            hookinbox::metrics::serve(config.worker.metrics_listen, readiness(pool.clone()))?;
        tokio::spawn(metrics_server);
        let state = web::Data::new(State {
            pool: pool.clone(),
            access: config.access.clone(),
            throttle: Throttle::default(),
            trusted_proxies: config.trusted_proxies.clone(),
            secure_cookies: config.secure_cookies,
            body_timeout: config.body_timeout,
            process_key: rand::random(),
            wake_runner: Arc::new(tokio::sync::Notify::new()),
            routes: config.worker.routes.clone(),
            secret_values: SecretValues::of(&config.worker.routes),
        });
        let stop_runner = CancellationToken::new();
        let runner = jobs::spawn(
            Runner::new(pool.clone(), config.worker.clone()),
            state.wake_runner.clone(),
            stop_runner.clone(),
        );
        let ready = web::Data::new(readiness(pool));
        let server = HttpServer::new(move || {
            // Registered last, run first: the host check before anything,
            // the headers on every answer, the check's own included.
            App::new()
                .wrap(middleware::from_fn(headers::loopback_hosts_only))
                .wrap(headers::security_headers())
                .app_data(state.clone())
                .app_data(ready.clone())
                .route("/healthz", web::get().to(hookinbox::metrics::healthz))
                .route("/readyz", web::get().to(hookinbox::metrics::readyz))
                .route("/static/admin.css", web::get().to(pages::stylesheet))
                .service(
                    web::scope("/api/v1")
                        .route("/overview", web::get().to(api::overview))
                        .route("/deliveries", web::get().to(api::list))
                        .route("/deliveries/count", web::get().to(api::count))
                        .route(
                            "/deliveries/{source}/{delivery_id}",
                            web::get().to(api::one),
                        )
                        .route("/replays", web::post().to(api::replay))
                        .route("/replays/{job}", web::get().to(api::replay_job))
                        .route("/replays/{job}", web::delete().to(api::cancel_replay))
                        .route("/purges", web::post().to(api::purge))
                        .route("/purges/{job}", web::get().to(api::purge_job))
                        .route("/purges/{job}", web::delete().to(api::cancel_purge))
                        .route("/jobs", web::get().to(api::jobs_list))
                        .route("/audit", web::get().to(api::audit))
                        .route("/destinations", web::get().to(api::destinations))
                        .route(
                            "/destinations/{source}/{name}/pause",
                            web::post().to(api::pause_destination),
                        )
                        .route(
                            "/destinations/{source}/{name}/resume",
                            web::post().to(api::resume_destination),
                        )
                        .route(
                            "/destinations/{source}/{name}/halted",
                            web::get().to(api::halted),
                        )
                        .route(
                            "/destinations/{source}/{name}/halted/{key}/skip",
                            web::post().to(api::skip_halted),
                        )
                        .route(
                            "/destinations/{source}/{name}/halted/{key}/retry",
                            web::post().to(api::retry_halted),
                        )
                        .route("/sessions", web::get().to(api::sessions))
                        .route("/sessions/{id}", web::delete().to(api::revoke_session))
                        .default_service(web::to(api_not_found)),
                )
                .route("/login", web::get().to(sign_in::login_form))
                .route("/login", web::post().to(sign_in::login))
                .route("/logout", web::post().to(sign_in::logout))
                .route("/", web::get().to(pages::overview))
                .route("/deliveries", web::get().to(pages::deliveries))
                .route(
                    "/deliveries/{source}/{delivery_id}",
                    web::get().to(pages::delivery),
                )
                .route(
                    "/deliveries/{source}/{delivery_id}/replay",
                    web::post().to(pages::replay_one),
                )
                .route(
                    "/deliveries/{source}/{delivery_id}/purge",
                    web::post().to(pages::purge_one),
                )
                .route("/bulk", web::get().to(pages::bulk))
                .route("/bulk", web::post().to(pages::bulk_start))
                .route("/jobs", web::get().to(pages::jobs_page))
                .route("/jobs/{id}", web::get().to(pages::job_page))
                .route("/jobs/{id}/cancel", web::post().to(pages::job_cancel))
                .route("/audit", web::get().to(pages::audit_page))
                .route("/destinations", web::get().to(pages::destinations_page))
                .route(
                    "/destinations/{source}/{name}/pause",
                    web::post().to(pages::pause_destination),
                )
                .route(
                    "/destinations/{source}/{name}/resume",
                    web::post().to(pages::resume_destination),
                )
                .route(
                    "/destinations/{source}/{name}/halted/{key}/skip",
                    web::post().to(pages::skip_halted),
                )
                .route(
                    "/destinations/{source}/{name}/halted/{key}/retry",
                    web::post().to(pages::retry_halted),
                )
                .route("/sessions", web::get().to(sign_in::sessions_page))
                .route(
                    "/sessions/{id}/revoke",
                    web::post().to(sign_in::session_revoke),
                )
        })
        // The head; bodies have their own deadline (`body`).
        .client_request_timeout(Duration::from_secs(10))
        .listen(listener)?
        .run();
        Ok(Self {
            server,
            port,
            metrics_port,
            stop_runner,
            runner,
        })
    }

    /// The port the console listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of the metrics listener.
    pub fn metrics_port(&self) -> u16 {
        self.metrics_port
    }

    /// A handle that can stop the server.
    pub fn handle(&self) -> AdminHandle {
        self.server.handle()
    }

    /// Serves until the server is stopped (SIGTERM, SIGINT or the handle),
    /// then stops the job runner and waits for it, its jobs' broker
    /// connections closed (a job left running is resumed by the next
    /// console once its lease expires).
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let result = self.server.await;
        self.stop_runner.cancel();
        let _ = self.runner.await;
        result
    }
}

/// Ready when Postgres answers: every page and call reads it.
fn readiness(pool: deadpool_postgres::Pool) -> Readiness {
    Arc::new(move || {
        let pool = pool.clone();
        Box::pin(async move {
            let ok = postgres::ping(&pool).await;
            Ready {
                ok,
                checks: vec![("postgres", ok)],
            }
        })
    })
}

async fn api_not_found() -> HttpResponse {
    HttpResponse::NotFound().json(json!({"error": "no such route"}))
}
