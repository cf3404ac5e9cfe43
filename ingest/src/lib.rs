//! `hookinbox-ingest`: the HTTP edge. A request goes through the steps of
//! the design, in this order, and nothing touches Postgres before step 4:
//!
//! 1. Read the raw body, bounded in size while streaming, in pace and in
//!    time, its bytes taken from a memory budget as they arrive; refuse
//!    any `Content-Encoding` but identity (the signature covers the bytes on
//!    the wire) and any content type but JSON or form (`body`).
//! 2. Verify `X-Hub-Signature-256` over the raw bytes, in constant time.
//! 3. Check the event (answer `ping` and events the source does not take
//!    without a claim), the delivery id and the hook id.
//! 4. Claim the delivery key in one statement.
//! 5. Publish the job with a confirm; answer 202 only after the confirm.
//!    If the publish fails, park the body in Postgres as a retry due now
//!    and answer 202 all the same: the scheduler publishes it later.
//!
//! # Layout
//!
//! - `cli`: [`Cli`], the command line of `hookinbox-ingest` (serve, or
//!   `healthcheck`).
//! - `startup`: [`IngestApp`]: build, bind, run until stopped; readiness.
//! - `receive`: the request's steps, one function each, and its log line.
//! - `admission`: what unverified bodies may take (memory budget,
//!   receiving slots, per-client shares) before the signature is checked.
//! - `answer`: what is answered: status, body, and the outcome label.
//! - `body`: framing, the bounded body read, the headers a job carries.
//! - `rotation`: [`SecretMatches`], which secret verified how often.
//!
//! Which of these modules may import which is the table of the test
//! `tests/tests/layers.rs` (CI runs it: `scripts/check-layers.sh`). It never
//! uses `hookinbox-worker` (the compiler sees to that).

mod admission;
mod allow;
mod answer;
mod body;
mod cli;
mod limits;
mod receive;
mod rotation;
mod startup;

pub use cli::Cli;
pub use rotation::SecretMatches;
pub use startup::{IngestApp, ServerHandle, StartError};
