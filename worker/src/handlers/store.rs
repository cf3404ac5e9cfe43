//! The `store` handler.

use hookinbox::deliveries::StoredEvent;
use hookinbox::job::Job;
use hookinbox::payload::{self, ContentType};

use super::{Effect, Handler, HandlerError};

/// The `store` handler: writes the event into `github_events`, one row per
/// delivery key, in the transaction that completes the delivery. Exactly one
/// effect, always.
#[derive(Clone, Copy, Debug, Default)]
pub struct Store;

#[async_trait::async_trait]
impl Handler for Store {
    async fn handle(&self, job: &Job, effect: &mut Effect) -> Result<(), HandlerError> {
        let content_type = ContentType::parse(&job.content_type)
            .ok_or_else(|| HandlerError::permanent("unsupported content type"))?;
        let json = payload::json_text(content_type, &job.body)
            .map_err(|e| HandlerError::permanent(e.to_string()))?;
        effect
            .store_event(StoredEvent {
                event: job.event.as_str().to_owned(),
                action: job.action.clone(),
                // A JSON body (or a form field read in place) is a slice of
                // the job's body; only a decoded form field is new bytes.
                payload: match json {
                    std::borrow::Cow::Borrowed(text) => job.body.slice_ref(text.as_bytes()),
                    std::borrow::Cow::Owned(text) => bytes::Bytes::from(text),
                },
            })
            .await?;
        // Staged (or written in the handler's transaction), not committed.
        hookinbox::kill_point!("worker.mid_effect");
        Ok(())
    }

    /// The event is written by the completing statement: nothing happens
    /// outside Postgres.
    fn database_only(&self, _job: &Job) -> bool {
        true
    }

    fn database_only_leg(&self, _key: &hookinbox::key::LegKey) -> Option<bool> {
        Some(true)
    }
}
