//! Replays the committed fuzz corpora (`fuzz/corpus/<target>/`) on stable
//! Rust, without a fuzzer: every file goes through the same checks as the
//! matching `cargo fuzz` target, so an input that once found a bug keeps
//! guarding against it.

use std::path::{Path, PathBuf};

#[path = "../../fuzz/src/lib.rs"]
mod checks;

/// The corpus directory of one fuzz target.
fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

/// Every file of a target's corpus, sorted by path.
fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "{} holds no corpus file", dir.display());
    paths
        .into_iter()
        .map(|path| {
            let data = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            (path, data)
        })
        .collect()
}

/// Runs `check` on every file of a target's corpus, naming the file that
/// fails.
fn replay(target: &str, check: fn(&[u8])) {
    for (path, data) in corpus(target) {
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(
            outcome.is_ok(),
            "{target}: corpus file {} failed its check",
            path.display()
        );
    }
}

#[test]
fn signature_corpus() {
    replay("signature", checks::signature);
}

#[test]
fn delivery_ids_corpus() {
    replay("delivery_ids", checks::delivery_ids);
}

#[test]
fn form_body_corpus() {
    replay("form_body", checks::form_body);
}

#[test]
fn config_corpus() {
    replay("config", checks::config);
}

/// The invariants are only worth replaying if the corpora reach both the
/// accepting and the refusing side of each check.
#[test]
fn corpora_reach_both_outcomes() {
    use hookinbox::key::{DeliveryId, HookId};
    use hookinbox::payload::{ContentType, action, json_text};
    use hookinbox::signature::{Secret, Secrets};

    let secrets = Secrets::new(vec![Secret::new("k")]);
    let verifies = |data: &[u8]| {
        let (header, body) = checks::split_header_body(data);
        secrets.verify(body, header).is_ok()
    };
    let signature = corpus("signature");
    assert!(signature.iter().any(|(_, d)| verifies(d)));
    assert!(signature.iter().any(|(_, d)| !verifies(d)));

    let ids = corpus("delivery_ids");
    assert!(ids.iter().any(|(_, d)| DeliveryId::parse(d).is_ok()));
    assert!(ids.iter().any(|(_, d)| DeliveryId::parse(d).is_err()));
    assert!(ids.iter().any(|(_, d)| HookId::parse(Some(d)).is_ok()));
    assert!(ids.iter().any(|(_, d)| HookId::parse(Some(d)).is_err()));

    let has_action = |d: &[u8]| {
        json_text(ContentType::Form, d)
            .ok()
            .is_some_and(|text| matches!(action(&text), Ok(Some(_))))
    };
    let forms = corpus("form_body");
    assert!(forms.iter().any(|(_, d)| has_action(d)));
    assert!(forms.iter().any(|(_, d)| !has_action(d)));

    let configs = corpus("config");
    let parses = |d: &[u8]| hookinbox::config::from_toml(&String::from_utf8_lossy(d)).is_ok();
    assert!(configs.iter().any(|(_, d)| parses(d)));
    assert!(configs.iter().any(|(_, d)| !parses(d)));
}
