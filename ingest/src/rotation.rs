//! Secret rotation, watched: how often each secret position of each source
//! verified a request.

use std::collections::BTreeMap;
use std::sync::Mutex;

use hookinbox::SourceName;

/// How often each secret position of each source verified a request.
/// Rotation can be finished once the old secret's count stops moving; the
/// same counts are exported as `hookinbox_secret_matches_total`.
#[derive(Default, Debug)]
pub struct SecretMatches(Mutex<BTreeMap<(String, usize), u64>>);

impl SecretMatches {
    pub(crate) fn record(&self, source: &SourceName, position: usize) {
        metrics::counter!(
            hookinbox::metrics::SECRET_MATCHES,
            "source" => source.as_str().to_owned(),
            "position" => position.to_string()
        )
        .increment(1);
        if let Ok(mut counts) = self.0.lock() {
            *counts
                .entry((source.as_str().to_owned(), position))
                .or_default() += 1;
        }
    }

    /// Matches of `source`'s secret at `position` (0 is the first listed).
    pub fn get(&self, source: &str, position: usize) -> u64 {
        self.0
            .lock()
            .map(|c| c.get(&(source.to_owned(), position)).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}
