//! The admin console, `hookinbox-worker admin`: a web page and a JSON API
//! (`/api/v1/…`) to see stuck work and dead letters and to replay or purge
//! them safely, served by this binary with no separate front-end build.
//!
//! The pattern is filter → count → dry run → a frozen selection → a
//! throttled, cancellable bulk job → an audit record. Callers are named
//! tokens (`HOOKINBOX_ADMIN_TOKENS_FILE`), viewers or operators; the API
//! takes them as bearer tokens, the page signs in with one for a session
//! cookie, and every form that changes something carries a CSRF token.
//! The lists and counts are the operator CLI's own library calls
//! (`hookinbox::deliveries`).
//!
//! # Layout
//!
//! - `config`: [`AdminArgs`] → [`AdminConfig`]; `tokens`: the tokens file
//!   and the constant-time lookup.
//! - `session`: the signed session cookie and its CSRF token; `lockout`:
//!   failed sign-ins per address; `auth`: who is calling.
//! - `params`: filters from a query string or a JSON body, each bad field
//!   named.
//! - `api`: the JSON handlers; `pages`: the page handlers; `views`: the
//!   HTML (maud) and the stylesheet; `detail`: one delivery, its headers,
//!   timeline and payload, for both.
//! - `jobs`: bulk replays and purges: the frozen selection (`mod.rs`),
//!   their tables (`store`) and the background runner (`runner`).
//! - `audit`: the audit log.
//! - `state`, `error`, `startup`: what requests share, the error type and
//!   its statuses, and [`AdminApp`] (build, port, run until stopped).

mod api;
mod audit;
mod auth;
mod config;
mod detail;
mod error;
mod jobs;
mod lockout;
mod pages;
mod params;
mod session;
mod startup;
mod state;
mod tokens;
mod views;

pub use config::{Access, AdminArgs, AdminConfig};
pub use startup::{AdminApp, AdminHandle, AdminStartError};
pub use tokens::{Identity, Role, Tokens};
