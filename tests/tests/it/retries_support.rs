//! A scripted handler for failure tests.

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
    pub fn new(errors: Vec<HandlerError>) -> Arc<Self> {
        Arc::new(Self {
            errors: Mutex::new(errors.into_iter().rev().collect()),
            calls: Mutex::new(Vec::new()),
        })
    }

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
