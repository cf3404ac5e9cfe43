//! A GitHub-sized payload: 25 MB, accepted, stored, with ingest's memory
//! growing by at most three times the body.

use hookinbox_tests::{SECRET, TestEnv, sign};
use hookinbox_worker::JobOutcome;

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_25_mb_delivery_is_accepted_and_stored_within_three_times_its_size() {
    let env = TestEnv::new().await;
    let ingest = env.spawn("hookinbox-ingest", &[("HOOKINBOX_GITHUB_SECRET", SECRET)]);
    let base = format!("http://127.0.0.1:{}", ingest.port);
    ingest.wait_ready().await;
    let pid = ingest.child.id().expect("pid");
    let before = status_kib(pid, "VmRSS:");

    const SIZE: usize = 25_000_000;
    let head = br#"{"ref":"refs/heads/main","commits":[],"padding":""#;
    let tail = br#""}"#;
    let mut body = Vec::with_capacity(SIZE);
    body.extend_from_slice(head);
    body.extend(std::iter::repeat_n(b'x', SIZE - head.len() - tail.len()));
    body.extend_from_slice(tail);
    assert_eq!(body.len(), SIZE);

    let status = reqwest::Client::new()
        .post(format!("{base}/webhooks/github"))
        .header("content-type", "application/json")
        .header("x-github-event", "push")
        .header("x-github-delivery", "large-1")
        .header("x-hub-signature-256", sign(SECRET, &body))
        .body(body)
        .send()
        .await
        .expect("answer")
        .status();
    assert_eq!(status.as_u16(), 202);
    let peak = status_kib(pid, "VmHWM:");
    let growth = peak.saturating_sub(before) * 1024;
    eprintln!(
        "ingest RSS {before} KiB before, peak {peak} KiB: grew {growth} bytes for a {SIZE}-byte body"
    );
    assert!(
        growth as usize <= 3 * SIZE,
        "ingest grew by {growth} bytes for a {SIZE}-byte body"
    );

    let report = env.store_worker().await.drain().await.expect("drain");
    assert_eq!(report.outcomes, vec![JobOutcome::Completed]);
    let stored: i32 = env
        .db
        .query_one("select length(payload->>'padding') from github_events", &[])
        .await
        .expect("stored")
        .get(0);
    assert_eq!(stored as usize, SIZE - head.len() - tail.len());
    env.cleanup().await;
}
