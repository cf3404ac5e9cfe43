//! `hookinbox-worker`: the runtime that runs each delivery's effect once,
//! the maintenance beside it, the built-in handlers, and the command line
//! that also wires the operator's commands (`hookinbox-operator`). A job goes through these steps (see `runtime::job` for why
//! the order is the correctness argument):
//!
//! 1. **Take** the delivery with a compare-and-set that installs this
//!    worker's token and counts the attempt, before the effect.
//! 2. **Renew** the lease while the handler runs; a lost lease cancels it.
//! 3. **Fence before effect**: a database effect locks the row under the
//!    token first, or is written by the completing statement itself.
//! 4. **Complete** in the same transaction as the effect, guarded by the
//!    token; a stale worker's write changes nothing.
//! 5. **Ack after commit**.
//!
//! Build your own worker around your own [`Handler`] with the same runtime
//! (see `examples/custom_handler.rs`).
//!
//! # Layout
//!
//! - `cli`: [`Cli`], the subcommands and their exit codes; the operator's
//!   (`deliveries`, `dlq`, `admin`) come from `hookinbox_operator`.
//! - `context`: what the runtime and the maintenance share.
//! - `runtime`: [`Worker`]: the consume loop and the two-stage stop
//!   (`mod.rs`), one job (`job`), the lease heartbeat, dead-letter copies,
//!   and [`Worker::drain`], the test driver.
//! - `maintenance`: the retry scheduler, the reaper and the retention
//!   sweep, and the state-gauge sampler.
//! - `handlers`: [`Handler`], [`Effect`], [`Store`], [`Forward`], and the
//!   per-source [`Router`].
//! - [`reconcile`]: the reconciler: GitHub's delivery log against what
//!   hookinbox holds, and redeliveries of what it never took.
//! - `resolve`: hosts files consulted before DNS, by `forward` and by the
//!   reconciler's client of GitHub's API.
//!
//! Which of these modules may import which is the table of the test
//! `tests/tests/layers.rs` (CI runs it: `scripts/check-layers.sh`); the
//! command line sits on top, and `handlers` and `reconcile` use nothing of
//! this crate but `resolve`.
//! It never uses `hookinbox-ingest`, and only the command line uses
//! `hookinbox-operator` (the compiler sees to the crates).

mod cli;
mod context;
mod handlers;
mod maintenance;
pub mod reconcile;
mod resolve;
mod runtime;

pub use cli::Cli;
pub use context::RuntimeError;
pub use handlers::{
    Answer, Completion, Effect, Forward, GITHUB_SIGNATURE_HEADER, Handler, HandlerError,
    REPLAY_HEADER, Registry, Router, RouterError, SIGNATURE_HEADER, Store, classify, from_config,
    github_rate_limit, retry_after,
};
pub use runtime::{DrainReport, JobOutcome, Worker};
