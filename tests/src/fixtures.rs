//! GitHub payloads for tests: the few kept in this repo, plus the whole
//! real corpus when `HOOKINBOX_GITHUB_FIXTURES` names its folder (one
//! subfolder per event, one JSON file per payload).

use std::path::{Path, PathBuf};

/// One payload and the event it belongs to.
#[derive(Clone, Debug)]
pub struct Fixture {
    /// The event (its folder's name).
    pub event: String,
    /// Its path, for messages.
    pub path: PathBuf,
    /// The raw bytes.
    pub body: Vec<u8>,
}

fn load_dir(root: &Path, out: &mut Vec<Fixture>) {
    let Ok(events) = std::fs::read_dir(root) else {
        panic!("cannot read fixtures folder {}", root.display());
    };
    let mut events: Vec<_> = events.flatten().filter(|e| e.path().is_dir()).collect();
    events.sort_by_key(|e| e.path());
    for event in events {
        let name = event.file_name().to_string_lossy().into_owned();
        let mut files: Vec<_> = std::fs::read_dir(event.path())
            .expect("event folder")
            .flatten()
            .map(|f| f.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        for path in files {
            let body = std::fs::read(&path).expect("fixture readable");
            out.push(Fixture {
                event: name.clone(),
                path,
                body,
            });
        }
    }
}

/// The repo's own payloads, then the real corpus if configured.
pub fn all() -> Vec<Fixture> {
    let mut out = Vec::new();
    load_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures"),
        &mut out,
    );
    if let Some(dir) = corpus_dir() {
        load_dir(&dir, &mut out);
    }
    assert!(!out.is_empty());
    out
}

/// The real corpus folder, when `HOOKINBOX_GITHUB_FIXTURES` names one.
pub fn corpus_dir() -> Option<PathBuf> {
    std::env::var_os("HOOKINBOX_GITHUB_FIXTURES")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The repo's own `event` payload.
pub fn own(event: &str) -> Vec<u8> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(event);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("own fixture folder")
        .flatten()
        .map(|f| f.path())
        .collect();
    files.sort();
    std::fs::read(&files[0]).expect("own fixture")
}

/// `body`, a JSON object, made unique: a `hookinbox_nonce` member goes in
/// first. GitHub never sends one body under two delivery ids, and ingest's
/// replay guard refuses a body seen before under another id; tests that
/// send a payload many times send it made unique each time.
pub fn unique(body: &[u8]) -> Vec<u8> {
    with_nonce(body, &uuid::Uuid::new_v4().simple().to_string())
}

/// `body`, a JSON object, with `"hookinbox_nonce": nonce` as its first
/// member: the same nonce gives the same bytes (a redelivery), another
/// nonce another body. `nonce` must need no JSON escaping.
pub fn with_nonce(body: &[u8], nonce: &str) -> Vec<u8> {
    let start = body.iter().position(|b| *b == b'{').expect("a JSON object");
    let mut out = Vec::with_capacity(body.len() + 32 + nonce.len());
    out.extend_from_slice(&body[..=start]);
    out.extend_from_slice(format!("\"hookinbox_nonce\":\"{nonce}\",").as_bytes());
    out.extend_from_slice(&body[start + 1..]);
    out
}

/// `body` with its `repository.id` set to `id` (the first number after
/// `"repository"`'s `"id"`), or unchanged when it has none: spreads a
/// payload mix over many repositories, for destinations ordered by them.
pub fn with_repository_id(body: &[u8], id: u64) -> Vec<u8> {
    let find = |from: usize, what: &[u8]| {
        body[from..]
            .windows(what.len())
            .position(|w| w == what)
            .map(|i| from + i + what.len())
    };
    let Some(after_key) = find(0, b"\"repository\"").and_then(|at| find(at, b"\"id\"")) else {
        return body.to_vec();
    };
    let mut start = after_key;
    while start < body.len() && matches!(body[start], b' ' | b'\n' | b'\r' | b'\t' | b':') {
        start += 1;
    }
    let end = start
        + body[start..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
    if end == start {
        return body.to_vec();
    }
    let mut out = Vec::with_capacity(body.len() + 20);
    out.extend_from_slice(&body[..start]);
    out.extend_from_slice(id.to_string().as_bytes());
    out.extend_from_slice(&body[end..]);
    out
}

/// The benchmarks' payload mix: in every ten, seven `push` and three
/// `pull_request` payloads (one or two of each fixture in turn), as events
/// and bodies. Panics when the fixtures hold none of either.
pub fn load_mix() -> Vec<(&'static str, Vec<u8>)> {
    let all = all();
    let push: Vec<_> = all.iter().filter(|f| f.event == "push").collect();
    let pr: Vec<_> = all.iter().filter(|f| f.event == "pull_request").collect();
    assert!(
        !push.is_empty() && !pr.is_empty(),
        "push and pull_request fixtures needed"
    );
    (0..10usize)
        .flat_map(|i| {
            let (event, list): (&'static str, &Vec<_>) = if i < 7 {
                ("push", &push)
            } else {
                ("pull_request", &pr)
            };
            list.iter()
                .map(move |f| (event, f.body.clone()))
                .take(1 + i % 2)
        })
        .collect()
}

/// A delivery request as GitHub sends one, for the load tools: `event`,
/// the delivery `id`, hook 777, the `signature` of `body`, a 30-s timeout.
pub fn delivery_request(
    http: &reqwest::Client,
    url: &str,
    event: &str,
    id: &str,
    signature: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest::RequestBuilder {
    http.post(url)
        .timeout(std::time::Duration::from_secs(30))
        .header("content-type", "application/json")
        .header("x-github-event", event)
        .header("x-github-delivery", id)
        .header("x-github-hook-id", "777")
        .header("x-hub-signature-256", signature)
        .body(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repository_id_is_replaced_in_place() {
        let body = br#"{"action":"x","repository": {
    "id" :  123,"name":"r"},"sender":{"id":9}}"#;
        let out = String::from_utf8(with_repository_id(body, 77)).expect("utf-8");
        assert!(out.contains(r#""id" :  77,"name""#), "{out}");
        assert!(out.contains(r#""sender":{"id":9}"#), "{out}");
        assert_eq!(with_repository_id(br#"{"zen":"x"}"#, 5), br#"{"zen":"x"}"#);
    }
}
