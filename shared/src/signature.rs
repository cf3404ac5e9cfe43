//! `X-Hub-Signature-256`: parsing, signing and constant-time verification.
//!
//! GitHub signs the raw request body with HMAC-SHA256 under the webhook's
//! secret and sends `sha256=<64 hex digits>`. Only the bytes on the wire are
//! ever verified, never a decoded or re-serialised body.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The prefix GitHub puts before the hex digest.
const PREFIX: &str = "sha256=";

/// Why a signature header was refused. The text never contains the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `X-Hub-Signature-256` header (an `X-Hub-Signature` SHA-1 header
    /// alone is not enough).
    #[error("missing X-Hub-Signature-256 header")]
    Missing,
    /// The header was sent more than once.
    #[error("X-Hub-Signature-256 header sent more than once")]
    Duplicated,
    /// The header is not `sha256=` followed by exactly 64 hex digits.
    #[error("X-Hub-Signature-256 must be 'sha256=' followed by 64 hex digits")]
    Malformed,
    /// Well formed, but no configured secret produces it.
    #[error("X-Hub-Signature-256 does not match the body")]
    Mismatch,
}

/// A parsed `X-Hub-Signature-256` value: the 32-byte HMAC-SHA256 digest.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Signature([u8; 32]);

impl Signature {
    /// Parses a header value. Hex digits may be lower or upper case (GitHub
    /// sends lower case); anything but `sha256=` plus 64 of them is refused.
    pub fn parse(value: &[u8]) -> Result<Self, SignatureError> {
        let hex_part = value
            .strip_prefix(PREFIX.as_bytes())
            .ok_or(SignatureError::Malformed)?;
        if hex_part.len() != 64 {
            return Err(SignatureError::Malformed);
        }
        let mut digest = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut digest).map_err(|_| SignatureError::Malformed)?;
        Ok(Self(digest))
    }

    /// The digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for Signature {
    // A signature is a credential for one body: keep it out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Signature(..)")
    }
}

/// One webhook secret. Its `Debug` never prints the value.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Wraps a secret's bytes. Callers check it is not empty (see
    /// [`crate::config`]): an empty HMAC key lets anyone sign.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes keys of any length, so this cannot fail.
        match HmacSha256::new_from_slice(&self.0) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC accepts keys of any length"),
        }
    }

    /// Signs `body` and returns the header value GitHub would send.
    pub fn sign(&self, body: &[u8]) -> String {
        let mut mac = self.mac();
        mac.update(body);
        format!("{PREFIX}{}", hex::encode(mac.finalize().into_bytes()))
    }

    /// Checks `signature` over `body` in constant time.
    pub fn verify(&self, body: &[u8], signature: &Signature) -> bool {
        self.verify_parts(&[body], signature)
    }

    /// Checks `signature` over the body given as consecutive `parts` (as
    /// it arrived), without assembling it.
    pub fn verify_parts<P: AsRef<[u8]>>(&self, parts: &[P], signature: &Signature) -> bool {
        let mut mac = self.mac();
        for part in parts {
            mac.update(part.as_ref());
        }
        // `verify_slice` compares with `subtle`, in constant time.
        mac.verify_slice(signature.as_bytes()).is_ok()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The secrets of one source. Several are allowed so that a secret can be
/// rotated: any one of them verifies.
#[derive(Clone, Debug)]
pub struct Secrets(Vec<Secret>);

impl Secrets {
    /// Builds the set. It must not be empty (checked by [`crate::config`]).
    pub fn new(secrets: Vec<Secret>) -> Self {
        Self(secrets)
    }

    /// The secrets, in order.
    pub fn into_vec(self) -> Vec<Secret> {
        self.0
    }

    /// How many secrets there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Verifies a raw signature header against `body`. On success returns
    /// the position of the secret that matched, so rotation can be watched.
    pub fn verify(&self, body: &[u8], header: &[u8]) -> Result<usize, SignatureError> {
        self.verify_parts(&[body], header)
    }

    /// [`Secrets::verify`] over a body given as consecutive `parts`.
    pub fn verify_parts<P: AsRef<[u8]>>(
        &self,
        parts: &[P],
        header: &[u8],
    ) -> Result<usize, SignatureError> {
        let signature = Signature::parse(header)?;
        self.0
            .iter()
            .position(|secret| secret.verify_parts(parts, &signature))
            .ok_or(SignatureError::Mismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn github_published_test_vector() {
        let secret = Secret::new("It's a Secret to Everybody");
        assert_eq!(
            secret.sign(b"Hello, World!"),
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
    }

    #[test]
    fn a_body_in_parts_verifies_as_the_whole_does() {
        let secrets = Secrets::new(vec![Secret::new("It's a Secret to Everybody")]);
        let header = b"sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        let parts: [&[u8]; 3] = [b"Hello", b", ", b"World!"];
        assert_eq!(secrets.verify_parts(&parts, header).ok(), Some(0));
        let wrong: [&[u8]; 2] = [b"Hello, ", b"World?"];
        assert!(secrets.verify_parts(&wrong, header).is_err());
    }

    #[test]
    fn parse_refuses_every_malformed_shape() {
        let good = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert!(Signature::parse(format!("sha256={good}").as_bytes()).is_ok());
        assert!(Signature::parse(format!("sha256={}", good.to_uppercase()).as_bytes()).is_ok());
        for bad in [
            good.to_string(),
            format!("sha1={good}"),
            format!("sha256={}", &good[..63]),
            format!("sha256={good}0"),
            format!("sha256={}g", &good[..63]),
            format!("SHA256={good}"),
            format!("sha256= {good}"),
            String::new(),
        ] {
            assert_eq!(
                Signature::parse(bad.as_bytes()),
                Err(SignatureError::Malformed),
                "{bad}"
            );
        }
    }

    #[test]
    fn any_configured_secret_verifies_and_reports_its_position() {
        let old = Secret::new("old");
        let new = Secret::new("new");
        let secrets = Secrets::new(vec![new.clone(), old.clone()]);
        let body = b"{}";
        assert_eq!(secrets.verify(body, new.sign(body).as_bytes()), Ok(0));
        assert_eq!(secrets.verify(body, old.sign(body).as_bytes()), Ok(1));
        let other = Secret::new("other");
        assert_eq!(
            secrets.verify(body, other.sign(body).as_bytes()),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn debug_never_prints_secret_material() {
        let secret = Secret::new("hunter2");
        assert!(!format!("{secret:?}").contains("hunter2"));
        let sig = Signature::parse(secret.sign(b"x").as_bytes()).expect("valid");
        assert_eq!(format!("{sig:?}"), "Signature(..)");
    }
}
