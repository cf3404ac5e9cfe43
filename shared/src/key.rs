//! The nouns that name a delivery, each validated where it is built.
//!
//! `X-GitHub-Delivery` is an opaque id; GitHub gives the same GUID to one
//! event delivered to two hooks or apps, so the key that makes a delivery
//! unique is `(provider, source, hook_id, delivery_id)`. A delivery runs
//! once per destination that takes it, as a *leg*, keyed by the delivery's
//! key and the destination's name ([`LegKey`]).

use std::fmt;

use uuid::Uuid;

/// The only provider today. It is part of the key so that other providers
/// can share the table later without colliding.
pub const PROVIDER_GITHUB: &str = "github";

/// Why a header or a name was refused. The text names the header and the
/// rule, never the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// `X-GitHub-Delivery` is absent.
    #[error("missing X-GitHub-Delivery header")]
    MissingDeliveryId,
    /// `X-GitHub-Delivery` breaks the 1–128 visible ASCII bytes rule.
    #[error("X-GitHub-Delivery must be 1 to 128 bytes of visible ASCII")]
    BadDeliveryId,
    /// `X-GitHub-Hook-ID` is present but not 1–20 digits.
    #[error("X-GitHub-Hook-ID must be 1 to 20 digits")]
    BadHookId,
    /// `X-GitHub-Event` is absent.
    #[error("missing X-GitHub-Event header")]
    MissingEvent,
    /// `X-GitHub-Event` is not a plain event name.
    #[error("X-GitHub-Event must be 1 to 64 characters of a-z, 0-9 and '_'")]
    BadEvent,
    /// A header that must appear once appeared several times.
    #[error("{0} header sent more than once")]
    Duplicated(&'static str),
    /// A source name breaks the naming rule.
    #[error("source name must be 1 to 64 characters of a-z, 0-9, '-' and '_'")]
    BadSource,
    /// A destination name breaks the naming rule.
    #[error("destination name must be 1 to 64 characters of a-z, 0-9, '-' and '_'")]
    BadDestination,
}

impl KeyError {
    /// The part of a stored key this error is about (`source`, `hook_id`,
    /// `delivery_id`, `event`), for errors about rows and messages.
    pub fn part(&self) -> &'static str {
        match self {
            Self::MissingDeliveryId | Self::BadDeliveryId => "delivery_id",
            Self::BadHookId => "hook_id",
            Self::MissingEvent | Self::BadEvent => "event",
            Self::BadSource => "source",
            Self::BadDestination => "destination",
            Self::Duplicated(name) => name,
        }
    }
}

/// `X-GitHub-Delivery`: opaque, 1–128 bytes of visible ASCII (0x21–0x7e).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeliveryId(String);

impl DeliveryId {
    /// Validates a raw header value.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        if raw.is_empty() || raw.len() > 128 || !raw.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(KeyError::BadDeliveryId);
        }
        // Visible ASCII is valid UTF-8.
        Ok(Self(String::from_utf8_lossy(raw).into_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `X-GitHub-Hook-ID`: 1–20 digits, or empty when the header is absent.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HookId(String);

impl HookId {
    /// Validates a raw header value; `None` (no header) gives the empty id.
    pub fn parse(raw: Option<&[u8]>) -> Result<Self, KeyError> {
        match raw {
            None => Ok(Self::default()),
            Some(raw)
                if !raw.is_empty() && raw.len() <= 20 && raw.iter().all(u8::is_ascii_digit) =>
            {
                Ok(Self(String::from_utf8_lossy(raw).into_owned()))
            }
            Some(_) => Err(KeyError::BadHookId),
        }
    }

    /// The id as text (empty when GitHub sent none).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `X-GitHub-Event`: a plain event name such as `push`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventName(String);

impl EventName {
    /// Validates a raw header value.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        if raw.is_empty()
            || raw.len() > 64
            || !raw
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_')
        {
            return Err(KeyError::BadEvent);
        }
        Ok(Self(String::from_utf8_lossy(raw).into_owned()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The naming rule of sources and destinations: 1–64 characters of a-z,
/// 0-9, '-' and '_' (they appear in routes, queue names and metric labels).
fn is_name(raw: &str) -> bool {
    !raw.is_empty()
        && raw.len() <= 64
        && raw
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// A configured webhook source: the `{source}` of `/webhooks/github/{source}`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceName(String);

impl SourceName {
    /// The source served at `/webhooks/github`.
    pub const DEFAULT: &'static str = "default";

    /// Validates a source name.
    pub fn parse(raw: &str) -> Result<Self, KeyError> {
        if !is_name(raw) {
            return Err(KeyError::BadSource);
        }
        Ok(Self(raw.to_owned()))
    }

    /// The `default` source.
    pub fn default_source() -> Self {
        Self(Self::DEFAULT.to_owned())
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A source's destination: the app a leg of each delivery goes to. Unique
/// within its source. The empty name is kept for legs claimed before
/// destinations existed ([`DestinationName::legacy`]); no configured
/// destination has it.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DestinationName(String);

impl DestinationName {
    /// Validates a configured destination name.
    pub fn parse(raw: &str) -> Result<Self, KeyError> {
        if !is_name(raw) {
            return Err(KeyError::BadDestination);
        }
        Ok(Self(raw.to_owned()))
    }

    /// A name as stored in a row or a message: a valid name, or empty for
    /// a leg claimed before destinations existed.
    pub fn stored(raw: &str) -> Result<Self, KeyError> {
        if raw.is_empty() {
            return Ok(Self::legacy());
        }
        Self::parse(raw)
    }

    /// The destination of legs claimed before destinations existed: they
    /// run with their source's first destination.
    pub fn legacy() -> Self {
        Self(String::new())
    }

    /// Whether this is the [`DestinationName::legacy`] name.
    pub fn is_legacy(&self) -> bool {
        self.0.is_empty()
    }

    /// The name as text (empty for the legacy name).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", self.as_str())
            }
        }
    )*};
}
display_as_str!(DeliveryId, HookId, EventName, SourceName, DestinationName);

/// The key's parts bind as text parameters, so statements take them as is.
macro_rules! to_sql_as_str {
    ($($t:ty),*) => {$(
        impl tokio_postgres::types::ToSql for $t {
            fn to_sql(
                &self,
                ty: &tokio_postgres::types::Type,
                out: &mut bytes::BytesMut,
            ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
                self.as_str().to_sql(ty, out)
            }

            fn accepts(ty: &tokio_postgres::types::Type) -> bool {
                <&str as tokio_postgres::types::ToSql>::accepts(ty)
            }

            tokio_postgres::types::to_sql_checked!();
        }
    )*};
}
to_sql_as_str!(DeliveryId, HookId, SourceName, DestinationName);

/// What makes a delivery unique: `(provider, source, hook_id, delivery_id)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeliveryKey {
    /// Always [`PROVIDER_GITHUB`] today.
    pub provider: String,
    /// The configured webhook that received it.
    pub source: SourceName,
    /// `X-GitHub-Hook-ID`, empty when absent.
    pub hook_id: HookId,
    /// `X-GitHub-Delivery`.
    pub delivery_id: DeliveryId,
}

impl DeliveryKey {
    /// A GitHub delivery's key.
    pub fn github(source: SourceName, hook_id: HookId, delivery_id: DeliveryId) -> Self {
        Self {
            provider: PROVIDER_GITHUB.to_owned(),
            source,
            hook_id,
            delivery_id,
        }
    }

    /// A key from its four stored parts (a row, a message's headers), each
    /// validated as ingest validates the headers. An empty `hook_id` means
    /// GitHub sent none.
    pub fn from_parts(
        provider: &str,
        source: &str,
        hook_id: &str,
        delivery_id: &str,
    ) -> Result<Self, KeyError> {
        Ok(Self {
            provider: provider.to_owned(),
            source: SourceName::parse(source)?,
            hook_id: HookId::parse((!hook_id.is_empty()).then_some(hook_id.as_bytes()))?,
            delivery_id: DeliveryId::parse(delivery_id.as_bytes())?,
        })
    }

    /// This delivery's leg to `destination`.
    pub fn leg(self, destination: DestinationName) -> LegKey {
        LegKey {
            delivery: self,
            destination,
        }
    }
}

/// What makes a leg unique: its delivery's key and its destination. Every
/// transition of the state machine addresses one leg. It derefs to the
/// delivery's key, so `leg.delivery_id` reads as it did.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LegKey {
    /// The delivery.
    pub delivery: DeliveryKey,
    /// The destination this leg goes to (empty for a leg claimed before
    /// destinations existed).
    pub destination: DestinationName,
}

impl LegKey {
    /// A key from its five stored parts (a row, a message's headers), each
    /// validated as ingest validates the headers and the configuration.
    pub fn from_parts(
        provider: &str,
        source: &str,
        hook_id: &str,
        delivery_id: &str,
        destination: &str,
    ) -> Result<Self, KeyError> {
        Ok(
            DeliveryKey::from_parts(provider, source, hook_id, delivery_id)?
                .leg(DestinationName::stored(destination)?),
        )
    }

    /// The idempotency key handed to receivers:
    /// `<provider>:<source>:<hook_id>:<delivery_id>:<destination>`, the
    /// same on every attempt of this leg and different for each
    /// destination. A leg claimed before destinations existed keeps the
    /// four-part key it had then.
    pub fn idempotency_key(&self) -> String {
        let d = &self.delivery;
        let key = format!(
            "{}:{}:{}:{}",
            d.provider, d.source, d.hook_id, d.delivery_id
        );
        if self.destination.is_legacy() {
            key
        } else {
            format!("{key}:{}", self.destination)
        }
    }
}

impl std::ops::Deref for LegKey {
    type Target = DeliveryKey;

    fn deref(&self) -> &DeliveryKey {
        &self.delivery
    }
}

/// The fencing token of a claim. Every transition after the claim is
/// guarded by it, so a holder that lost its claim can change nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClaimToken(pub Uuid);

impl ClaimToken {
    /// A fresh random token.
    pub fn new() -> Self {
        Self(Uuid::new_v4())
    }
}

impl Default for ClaimToken {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_id_is_one_to_128_visible_ascii_bytes() {
        assert!(DeliveryId::parse(b"72d3162e-cc78-11e3-81ab-4c9367dc0958").is_ok());
        assert!(DeliveryId::parse(&[b'a'; 128]).is_ok());
        for bad in [
            &b""[..],
            &[b'a'; 129][..],
            b"has space",
            b"tab\there",
            b"crlf\r\ninjected",
            "caf\u{e9}".as_bytes(),
            b"\x7f",
        ] {
            assert_eq!(DeliveryId::parse(bad), Err(KeyError::BadDeliveryId));
        }
    }

    #[test]
    fn hook_id_is_absent_or_one_to_twenty_digits() {
        assert_eq!(HookId::parse(None).map(|h| h.0), Ok(String::new()));
        assert!(HookId::parse(Some(b"12345678901234567890")).is_ok());
        for bad in [&b""[..], b"123456789012345678901", b"12a", b"-1", b" 1"] {
            assert_eq!(HookId::parse(Some(bad)), Err(KeyError::BadHookId));
        }
    }

    #[test]
    fn event_names_are_plain() {
        assert!(EventName::parse(b"pull_request_review").is_ok());
        for bad in [&b""[..], b"Push", b"push\n", b"a b", &[b'a'; 65][..]] {
            assert_eq!(EventName::parse(bad), Err(KeyError::BadEvent));
        }
    }

    #[test]
    fn idempotency_key_joins_the_parts() {
        let key = DeliveryKey::github(
            SourceName::default_source(),
            HookId::parse(Some(b"42")).expect("digits"),
            DeliveryId::parse(b"abc").expect("ascii"),
        );
        let ci = key
            .clone()
            .leg(DestinationName::parse("ci").expect("a name"));
        assert_eq!(ci.idempotency_key(), "github:default:42:abc:ci");
        let legacy = key.leg(DestinationName::legacy());
        assert_eq!(legacy.idempotency_key(), "github:default:42:abc");
    }

    #[test]
    fn destination_names_follow_the_source_rule() {
        assert!(DestinationName::parse("ci-bot_2").is_ok());
        for bad in ["", "CI", "a b", "a.b", &"a".repeat(65)] {
            assert_eq!(DestinationName::parse(bad), Err(KeyError::BadDestination));
        }
        assert!(DestinationName::stored("").expect("legacy").is_legacy());
        assert!(DestinationName::stored("Bad").is_err());
    }
}
