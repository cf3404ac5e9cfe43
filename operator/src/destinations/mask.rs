//! The secret values a destination's answer must never show: a receiver
//! may echo what it was sent ("invalid token Bearer …"), and the attempt
//! log keeps the first 4 KiB of each answer. Workers mask a destination's
//! own secret header values before they write the log; before an answer's
//! excerpt or an error is shown, every secret header value of every
//! configured destination is masked again (a row written by an older
//! worker, or under another destination's name), by the same rule
//! ([`ForwardConfig::secret_values`]).

use hookinbox::config::{
    DestinationKind, ForwardConfig, Route, mask_secret_values, sort_secret_values,
};

/// The secret header values of the configured destinations.
#[derive(Clone, Debug, Default)]
pub struct SecretValues(Vec<String>);

impl SecretValues {
    /// The secret values ([`ForwardConfig::secret_values`]) of every
    /// forward destination in `routes`.
    pub fn of(routes: &[Route]) -> Self {
        let mut all: Vec<String> = routes
            .iter()
            .filter_map(|r| match &r.destination.kind {
                DestinationKind::Forward(forward) => Some(forward),
                _ => None,
            })
            .flat_map(ForwardConfig::secret_values)
            .collect();
        sort_secret_values(&mut all);
        Self(all)
    }

    /// `text` with every secret value replaced by `[redacted]`.
    pub fn mask(&self, text: &str) -> String {
        self.mask_bytes(text.as_bytes())
    }

    /// An answer's bytes as text (invalid UTF-8 replaced), masked.
    pub fn mask_bytes(&self, bytes: &[u8]) -> String {
        String::from_utf8_lossy(&mask_secret_values(bytes, &self.0)).into_owned()
    }
}
