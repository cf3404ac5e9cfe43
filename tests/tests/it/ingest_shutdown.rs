//! Ingest on SIGTERM: it stops accepting connections, answers every
//! request already in flight, and publishes every claim it made.

use std::time::Duration;

use hookinbox_tests::{Hook, SECRET, TestEnv, wait_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Connections to `port` that process `pid` has accepted: established
/// sockets on that local port (`/proc/net/tcp`) among its open files.
fn accepted(pid: u32, port: u16) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter_map(|target| {
                    let target = target.to_string_lossy().into_owned();
                    Some(
                        target
                            .strip_prefix("socket:[")?
                            .strip_suffix(']')?
                            .to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            cols.len() > 9
                && cols[1].ends_with(&local)
                && cols[3] == "01"
                && inodes.contains(cols[9])
        })
        .count()
}

#[tokio::test]
async fn sigterm_answers_every_request_in_flight_and_publishes_every_claim() {
    const REQUESTS: usize = 20;
    let env = TestEnv::new().await;
    let mut ingest = env.spawn("hookinbox-ingest", &[("HOOKINBOX_GITHUB_SECRET", SECRET)]);
    ingest.wait_ready().await;
    let pid = ingest.child.id().expect("pid");

    // Each request sends its head and half its body, then waits: it is in
    // flight, inside ingest's handler, when SIGTERM arrives.
    let mut streams = Vec::new();
    let mut rests = Vec::new();
    for _ in 0..REQUESTS {
        let hook = Hook::fixture("push");
        let head = format!(
            "POST /webhooks/github HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nX-GitHub-Event: push\r\nX-GitHub-Delivery: {}\r\n\
             X-GitHub-Hook-ID: 123456\r\nX-Hub-Signature-256: {}\r\nConnection: close\r\n\r\n",
            hook.body.len(),
            hook.id(),
            hook.signature.as_deref().expect("signed"),
        );
        let half = hook.body.len() / 2;
        let mut stream = TcpStream::connect(("127.0.0.1", ingest.port))
            .await
            .expect("connect");
        stream.write_all(head.as_bytes()).await.expect("head");
        stream.write_all(&hook.body[..half]).await.expect("half");
        streams.push(stream);
        rests.push(hook.body[half..].to_vec());
    }
    wait_until(
        "ingest to hold every connection",
        Duration::from_secs(10),
        || async { accepted(pid, ingest.port) >= REQUESTS },
    )
    .await;

    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    wait_until(
        "ingest to stop accepting connections",
        Duration::from_secs(10),
        || async {
            TcpStream::connect(("127.0.0.1", ingest.port))
                .await
                .is_err()
        },
    )
    .await;

    // The requests in flight finish their bodies and are answered.
    let mut answered = 0;
    for (mut stream, rest) in streams.into_iter().zip(rests) {
        stream.write_all(&rest).await.expect("rest of the body");
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .expect("an answer");
        assert!(
            response.starts_with("HTTP/1.1 202"),
            "in-flight request answered: {response}"
        );
        answered += 1;
    }
    assert_eq!(answered, REQUESTS);
    let status = tokio::time::timeout(Duration::from_secs(30), ingest.child.wait())
        .await
        .expect("ingest exits")
        .expect("wait");
    assert!(status.success(), "clean exit: {status:?}");

    // Every claim was published (or, past its installation's round, held
    // for fairness) before its 202: none left for the scheduler, and every
    // claim wrote its body.
    assert_eq!(env.deliveries().await, REQUESTS as i64);
    let held = env
        .count("select count(*) from deliveries where last_error_class = 'fair'")
        .await;
    assert_eq!(i64::from(env.work_depth().await) + held, REQUESTS as i64);
    assert_eq!(
        env.count("select count(*) from deliveries where last_error_class = 'publish'")
            .await,
        0
    );
    assert_eq!(
        env.count("select count(*) from bodies").await,
        REQUESTS as i64
    );
    env.cleanup().await;
}
