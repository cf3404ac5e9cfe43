//! Page sessions and CSRF tokens. A session is a cookie the server can
//! check without storing it: `NAME:EXPIRES:NONCE:MAC`, the MAC keyed by the
//! token's own session key (derived from its secret), so that changing or
//! removing a token ends its sessions on every replica at once. The cookie
//! is `HttpOnly` and `SameSite=Strict`; every form that changes something
//! also carries the session's CSRF token, an HMAC of its nonce.

use std::time::Duration;

use chrono::Utc;
use subtle::ConstantTimeEq;

use super::tokens::{Identity, Tokens, sign};

/// The session cookie's name.
pub const COOKIE: &str = "hookinbox_admin";

/// How long a session lasts.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// A signed-in page session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// Who signed in.
    pub identity: Identity,
    /// The token forms must carry.
    pub csrf: String,
}

fn csrf_of(key: &[u8], nonce: &str) -> String {
    hex::encode(sign(key, &[b"csrf", nonce.as_bytes()]))
}

/// A new session's cookie value for the token named `name`.
pub fn issue(tokens: &Tokens, name: &str) -> Option<String> {
    let (_, key) = tokens.session_key(name)?;
    let expires = Utc::now().timestamp() + LIFETIME.as_secs() as i64;
    let nonce = hex::encode(rand::random::<[u8; 16]>());
    let mac = sign(
        key,
        &[
            b"session",
            name.as_bytes(),
            expires.to_string().as_bytes(),
            nonce.as_bytes(),
        ],
    );
    Some(format!("{name}:{expires}:{nonce}:{}", hex::encode(mac)))
}

/// The session a cookie value stands for, if it is ours, unexpired, and
/// its token still exists.
pub fn check(tokens: &Tokens, value: &str) -> Option<Session> {
    let mut parts = value.split(':');
    let (name, expires, nonce, mac) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let (identity, key) = tokens.session_key(name)?;
    let want = sign(
        key,
        &[
            b"session",
            name.as_bytes(),
            expires.as_bytes(),
            nonce.as_bytes(),
        ],
    );
    let given = hex::decode(mac).ok()?;
    if !bool::from(want.as_slice().ct_eq(given.as_slice())) {
        return None;
    }
    if expires.parse::<i64>().ok()? < Utc::now().timestamp() {
        return None;
    }
    Some(Session {
        identity: identity.clone(),
        csrf: csrf_of(key, nonce),
    })
}

/// The CSRF token of the console without sign-in (`--insecure-loopback`):
/// one per process, from a random key.
pub fn loopback_csrf(process_key: &[u8; 32]) -> String {
    csrf_of(process_key, "loopback")
}

/// Whether a form's CSRF token is the session's, in constant time.
pub fn csrf_matches(expected: &str, given: &str) -> bool {
    bool::from(expected.as_bytes().ct_eq(given.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Tokens {
        Tokens::parse("alice operator aaaaaaaaaaaaaaaaaaaa\nbob viewer bbbbbbbbbbbbbbbbbbbb\n")
            .expect("valid")
    }

    #[test]
    fn a_session_checks_and_a_forged_one_does_not() {
        let t = tokens();
        let cookie = issue(&t, "bob").expect("bob exists");
        let session = check(&t, &cookie).expect("valid");
        assert_eq!(session.identity.name, "bob");
        // Claiming another name with bob's MAC fails.
        let forged = cookie.replacen("bob", "alice", 1);
        assert_eq!(check(&t, &forged), None);
        assert_eq!(check(&t, "alice:99999999999:00:00"), None);
        // Another tokens file (a rotated secret) ends the session.
        let rotated = Tokens::parse("bob viewer cccccccccccccccccccc\n").expect("valid");
        assert_eq!(check(&rotated, &cookie), None);
    }

    #[test]
    fn csrf_is_bound_to_the_session() {
        let t = tokens();
        let a = check(&t, &issue(&t, "alice").expect("a")).expect("a");
        let b = check(&t, &issue(&t, "alice").expect("b")).expect("b");
        assert_ne!(a.csrf, b.csrf);
        assert!(csrf_matches(&a.csrf, &a.csrf.clone()));
        assert!(!csrf_matches(&a.csrf, &b.csrf));
        assert!(!csrf_matches(&a.csrf, ""));
    }
}
