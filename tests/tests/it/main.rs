//! Integration tests against the real Postgres and RabbitMQ, one module per
//! behaviour, named after who is tested and what. Each test has its own
//! database and queue prefix.

mod admin_api;
mod admin_browser;
mod admin_input_bounds;
mod admin_plans;
mod admin_security;
mod admin_sessions;
mod admin_sign_in_throttle;
mod broker_restart_serial;
mod custom_handler_example;
mod destinations;
mod github_corpus;
mod github_platform;
mod ingest_admission;
mod ingest_allow_list;
mod ingest_dedup;
mod ingest_large_body;
mod ingest_rate_limits;
mod ingest_refuses_bad_input;
mod ingest_replay_guard;
mod ingest_routes;
mod ingest_shutdown;
mod local_setup;
mod observability;
mod operator_cli;
mod outages;
mod plans;
mod postgres_connections;
mod reconciler;
mod retention;
mod settings;
mod sources;
mod traces;
mod worker_acks;
mod worker_bad_bodies;
mod worker_failures;
mod worker_fencing;
mod worker_forward;
mod worker_one_statement;
mod worker_refusals;
mod worker_retries;
mod worker_shutdown;
