//! Integration tests against the real Postgres and RabbitMQ, one module per
//! behaviour. Each test has its own database and queue prefix.

mod answers;
mod corpus;
mod example;
mod failures;
mod fencing;
mod forward;
mod large;
mod lifecycle;
mod matrix;
mod observability;
mod outages;
mod plans;
mod races;
mod retention;
mod retries;
mod retries_support;
mod serial;
mod settings;
mod sources;

use hookinbox::Job;
use hookinbox_worker::{Effect, Handler, HandlerError};

/// A handler that always fails permanently.
pub struct AlwaysPermanent;

#[async_trait::async_trait]
impl Handler for AlwaysPermanent {
    async fn handle(&self, _job: &Job, _effect: &mut Effect) -> Result<(), HandlerError> {
        Err(HandlerError::permanent("receiver refused the event"))
    }
}
