//! Handlers that script failures, for the worker tests.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use hookinbox::Job;
use hookinbox_worker::{Effect, Handler, HandlerError, Store};

/// Fails with `errors` in order, then stores; records when it was called.
pub struct Scripted {
    errors: Mutex<Vec<HandlerError>>,
    calls: Mutex<Vec<Instant>>,
}

impl Scripted {
    /// Fails with `errors`, first to last, then stores.
    pub fn new(errors: Vec<HandlerError>) -> Arc<Self> {
        Arc::new(Self {
            errors: Mutex::new(errors.into_iter().rev().collect()),
            calls: Mutex::new(Vec::new()),
        })
    }

    /// When each call began.
    pub fn calls(&self) -> Vec<Instant> {
        self.calls.lock().expect("lock").clone()
    }
}

#[async_trait::async_trait]
impl Handler for Scripted {
    async fn handle(&self, job: &Job, effect: &mut Effect) -> Result<(), HandlerError> {
        self.calls.lock().expect("lock").push(Instant::now());
        let next = self.errors.lock().expect("lock").pop();
        match next {
            Some(error) => Err(error),
            None => Store.handle(job, effect).await,
        }
    }
}

/// A handler that always fails permanently.
pub struct AlwaysPermanent;

#[async_trait::async_trait]
impl Handler for AlwaysPermanent {
    async fn handle(&self, _job: &Job, _effect: &mut Effect) -> Result<(), HandlerError> {
        Err(HandlerError::permanent("receiver refused the event"))
    }
}
