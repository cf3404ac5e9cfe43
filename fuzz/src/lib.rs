//! The checks each fuzz target runs on one input.
//!
//! The fuzz targets call these, and `shared/tests/fuzz_corpus.rs` includes
//! this file to replay the committed corpora on stable Rust, so both run
//! exactly the same code. Every function panics when an invariant breaks.

use hookinbox::key::{DeliveryId, EventName, HookId, SourceName};
use hookinbox::payload::{self, ContentType};
use hookinbox::signature::{Secret, Secrets, Signature};

/// Splits an input into `(header, body)` at the first `\n`; without one the
/// whole input is the header and the body is empty.
pub fn split_header_body(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// `signature`: parsing and verifying an arbitrary header over an arbitrary
/// body, and signing then verifying the body.
pub fn signature(data: &[u8]) {
    let (header, body) = split_header_body(data);

    let parsed = Signature::parse(header);
    if parsed.is_ok() {
        // Only `sha256=` plus 64 hex digits parses.
        assert_eq!(header.len(), 7 + 64, "parsed a header of the wrong length");
        assert!(header.starts_with(b"sha256="), "parsed without the prefix");
        assert!(
            header[7..].iter().all(u8::is_ascii_hexdigit),
            "parsed a non-hex digest"
        );
    }

    let key = Secret::new("k");
    let secrets = Secrets::new(vec![key.clone()]);
    let verified = secrets.verify(body, header);
    if parsed.is_err() {
        assert!(verified.is_err(), "a malformed header verified");
    }
    if verified.is_ok() {
        // Only the digest of this body under this key verifies.
        assert_eq!(verified, Ok(0));
        assert_eq!(
            header.to_ascii_lowercase(),
            key.sign(body).into_bytes(),
            "a header other than the body's digest verified"
        );
    }

    // A correctly signed body always verifies, whatever the body.
    let s = Secret::new("k");
    let h = s.sign(body);
    assert!(
        Secrets::new(vec![s]).verify(body, h.as_bytes()) == Ok(0),
        "a correctly signed body did not verify"
    );
    assert!(
        Signature::parse(h.as_bytes()).is_ok(),
        "sign() output did not parse"
    );
}

/// `delivery_ids`: the header and name validators, and what a value that
/// passes them looks like.
pub fn delivery_ids(data: &[u8]) {
    if let Ok(id) = DeliveryId::parse(data) {
        let s = id.as_str();
        assert!(
            (1..=128).contains(&s.len()),
            "delivery id of {} bytes accepted",
            s.len()
        );
        assert!(
            s.bytes().all(|b| (0x21..=0x7e).contains(&b)),
            "delivery id with a byte outside 0x21..=0x7e accepted"
        );
        assert_eq!(s.as_bytes(), data, "delivery id changed by parsing");
    }

    if let Ok(hook) = HookId::parse(Some(data)) {
        let s = hook.as_str();
        assert!(
            (1..=20).contains(&s.len()),
            "hook id of {} bytes accepted",
            s.len()
        );
        assert!(
            s.bytes().all(|b| b.is_ascii_digit()),
            "hook id with a non-digit accepted"
        );
        assert_eq!(s.as_bytes(), data, "hook id changed by parsing");
    }

    if let Ok(event) = EventName::parse(data) {
        let s = event.as_str();
        assert!(
            (1..=64).contains(&s.len()),
            "event name of {} bytes",
            s.len()
        );
        assert!(
            s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
            "event name with a character outside a-z, 0-9, '_'"
        );
    }

    let text = String::from_utf8_lossy(data);
    if let Ok(source) = SourceName::parse(&text) {
        let s = source.as_str();
        assert!(
            (1..=64).contains(&s.len()),
            "source name of {} bytes",
            s.len()
        );
        assert!(
            s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'),
            "source name with a character outside a-z, 0-9, '-', '_'"
        );
    }
}

/// `form_body`: decoding a body as form and as JSON, reading `action` from
/// whatever decoded, and classifying the input as a `Content-Type`.
pub fn form_body(data: &[u8]) {
    for content_type in [ContentType::Form, ContentType::Json] {
        if let Ok(text) = payload::json_text(content_type, data)
            && let Ok(Some(action)) = payload::action(&text)
        {
            assert!(action.chars().count() <= 64, "action longer than 64 chars");
            assert!(
                !action.chars().any(char::is_control),
                "action with a control character"
            );
        }
    }
    let _ = ContentType::parse(&String::from_utf8_lossy(data));
}

/// `config`: parsing arbitrary text as a sources file never panics.
pub fn config(data: &[u8]) {
    let _ = hookinbox::config::from_toml(&String::from_utf8_lossy(data));
}
