//! The admin console, `hookinbox-worker admin`: a web page and a JSON API
//! (`/api/v1/…`) to see stuck work and dead letters and to replay or purge
//! them safely, served by this binary with no separate front-end build.
//!
//! The pattern is filter → count → dry run → a frozen selection → a
//! throttled, cancellable bulk job → an audit record. Callers are named
//! tokens (`HOOKINBOX_ADMIN_TOKENS_FILE`), viewers or operators; the API
//! takes them as bearer tokens, the page signs in with one for a session
//! kept in Postgres, and every form that changes something (the sign-in
//! form too) carries a CSRF token.
//! The lists and counts are the operator CLI's own library calls
//! (`hookinbox::deliveries`).
//!
//! # Layout
//!
//! - `config`: [`AdminArgs`] → [`AdminConfig`]; `tokens`: the tokens file
//!   and the constant-time lookup.
//! - `session`: page sessions in Postgres, their cookie and CSRF token;
//!   `throttle`: failed sign-ins per client; `client`: who the client is
//!   (the peer, or the forwarded address behind a trusted proxy); `auth`:
//!   who is calling.
//! - `headers`: the security headers of every answer and the loopback
//!   host check; `body`: request bodies, capped and timed.
//! - `params`: filters from a query string or a JSON body, each bad field
//!   named.
//! - `api`: the JSON handlers; `pages`: the page handlers (`sign_in`: the
//!   sign-in form, sign-out and the sessions page); `views`: the
//!   HTML (maud) and the stylesheet; `detail`: one delivery, its headers,
//!   timeline and payload, for both.
//! - `destinations`: the console's side of destinations
//!   (`crate::destinations`, shared with the CLI): the list, pause and
//!   resume.
//! - `jobs`: the console's side of bulk jobs (`crate::jobs`, shared with
//!   the CLI): selections by filter or ids, rates, the limit.
//! - `state`, `error`, `startup`: what requests share, the error type and
//!   its statuses, and [`AdminApp`] (build, port, run until stopped).

mod api;
mod auth;
mod body;
mod config;
mod destinations;
mod detail;
mod error;
mod headers;
mod jobs;
mod pages;
mod params;
mod session;
mod sign_in;
mod startup;
mod state;
mod throttle;
mod tokens;
mod views;

pub use config::{Access, AdminArgs, AdminConfig, DEFAULT_METRICS_LISTEN};
pub use hookinbox::client::TrustedProxies;
pub use params::FILTER_FIELDS;
pub use startup::{AdminApp, AdminHandle, AdminStartError};
pub use tokens::{Identity, Role, Tokens};
