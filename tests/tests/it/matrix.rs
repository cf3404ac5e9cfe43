//! The bad-input matrix, over raw sockets where a client library would
//! refuse to send the request. Each case gets its documented status and
//! nothing reaches Postgres or the broker.

use std::time::Duration;

use hookinbox_tests::{SECRET, TestEnv, fixtures, sign};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends raw bytes and returns the status of the answer (0 if the server
/// closed the connection without one).
async fn raw(port: u16, request: &[u8]) -> u16 {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    stream.write_all(request).await.expect("write");
    read_status(&mut stream).await
}

async fn read_status(stream: &mut TcpStream) -> u16 {
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if got.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer within 20 s");
    let text = String::from_utf8_lossy(&got);
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A request with these extra header lines (each ending in CRLF). The body
/// is signed unless `signature` is given; `Some("")` sends no signature.
fn request(headers: &str, body: &[u8], signature: Option<&str>) -> Vec<u8> {
    let sig = match signature {
        Some("") => String::new(),
        Some(s) => format!("X-Hub-Signature-256: {s}\r\n"),
        None => format!("X-Hub-Signature-256: {}\r\n", sign(SECRET, body)),
    };
    let mut out = format!(
        "POST /webhooks/github HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         X-GitHub-Event: push\r\n{sig}Content-Length: {}\r\n{headers}\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

#[tokio::test]
async fn every_bad_request_gets_its_status_and_writes_nothing() {
    let env = TestEnv::new().await;
    let mut args = env.ingest_args();
    args.max_body_bytes = 64 * 1024;
    args.body_timeout_ms = 1000;
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let port = ingest.port;
    let body = fixtures::own("push");
    let good = sign(SECRET, &body);
    let upper = format!(
        "sha256={}",
        good.trim_start_matches("sha256=").to_uppercase()
    );

    let mut cases: Vec<(&str, Vec<u8>, u16)> = vec![
        // Signature
        ("signature missing", request("X-GitHub-Delivery: a1\r\n", &body, Some("")), 401),
        (
            "signature duplicated",
            request(&format!("X-GitHub-Delivery: a2\r\nX-Hub-Signature-256: {good}\r\n"), &body, None),
            401,
        ),
        (
            "sha1 only",
            request("X-GitHub-Delivery: a3\r\nX-Hub-Signature: sha1=0123456789abcdef0123456789abcdef01234567\r\n", &body, Some("")),
            401,
        ),
        ("no prefix", request("X-GitHub-Delivery: a4\r\n", &body, Some(good.trim_start_matches("sha256="))), 401),
        ("wrong length", request("X-GitHub-Delivery: a5\r\n", &body, Some(&good[..good.len() - 1])), 401),
        ("non-hex", request("X-GitHub-Delivery: a6\r\n", &body, Some(&format!("sha256={}", "x".repeat(64)))), 401),
        // Delivery id
        ("delivery id missing", request("", &body, None), 400),
        ("delivery id duplicated", request("X-GitHub-Delivery: b1\r\nX-GitHub-Delivery: b2\r\n", &body, None), 400),
        ("delivery id of 129 bytes", request(&format!("X-GitHub-Delivery: {}\r\n", "c".repeat(129)), &body, None), 400),
        ("delivery id not ASCII", request("X-GitHub-Delivery: caf\u{e9}\r\n", &body, None), 400),
        ("delivery id with a control character", request("X-GitHub-Delivery: d\x01d\r\n", &body, None), 400),
        ("delivery id with a bare CR", request("X-GitHub-Delivery: e\re\r\n", &body, None), 400),
        ("delivery id folded onto a second line", request("X-GitHub-Delivery: f\r\n f\r\n", &body, None), 400),
        // Body and framing
        (
            "content-length over the cap",
            b"POST /webhooks/github HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 999999999\r\n\r\n".to_vec(),
            413,
        ),
        ("gzip", request("X-GitHub-Delivery: g1\r\nContent-Encoding: gzip\r\n", &body, None), 415),
        ("deflate", request("X-GitHub-Delivery: g2\r\nContent-Encoding: deflate\r\n", &body, None), 415),
        (
            "content-length with transfer-encoding",
            request("X-GitHub-Delivery: h1\r\nTransfer-Encoding: chunked\r\n", &body, None),
            400,
        ),
    ];
    // Chunked, past the cap.
    let mut chunked = b"POST /webhooks/github HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
        X-GitHub-Event: push\r\nX-GitHub-Delivery: i1\r\nX-Hub-Signature-256: sha256=00\r\nTransfer-Encoding: chunked\r\n\r\n"
        .to_vec();
    for _ in 0..80 {
        chunked.extend_from_slice(b"400\r\n");
        chunked.extend(std::iter::repeat_n(b' ', 1024));
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    cases.push(("chunked over the cap", chunked, 413));
    // More than 100 headers.
    let many: String = (0..120).map(|i| format!("X-Filler-{i}: x\r\n")).collect();
    cases.push((
        "120 headers",
        request(&format!("X-GitHub-Delivery: j1\r\n{many}"), &body, None),
        431,
    ));
    // Upper-case hex digits are accepted (documented), so this one is 202.
    cases.push((
        "upper-case signature",
        request("X-GitHub-Delivery: k1\r\n", &body, Some(&upper)),
        202,
    ));

    for (name, bytes, expected) in &cases {
        let status = raw(port, bytes).await;
        assert_eq!(status, *expected, "{name}");
    }
    // Only the upper-case-signature delivery was claimed and published.
    assert_eq!(env.deliveries().await, 1);
    assert_eq!(
        env.count("select count(*) from deliveries where delivery_id = 'k1'")
            .await,
        1
    );
    assert_eq!(env.work_depth().await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn slow_clients_time_out_and_do_not_hold_up_others() {
    let env = TestEnv::new().await;
    let mut args = env.ingest_args();
    args.body_timeout_ms = 1000;
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let port = ingest.port;

    // Slowloris: the head never finishes.
    let mut slowloris = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    slowloris
        .write_all(b"POST /webhooks/github HTTP/1.1\r\nHost: localhost\r\nX-GitHub-Event: pu")
        .await
        .expect("write");
    // Slow body: the head arrives, the body trickles and stops.
    let mut slow_body = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    slow_body
        .write_all(
            b"POST /webhooks/github HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
              X-GitHub-Event: push\r\nX-GitHub-Delivery: s1\r\nX-Hub-Signature-256: sha256=00\r\nContent-Length: 100\r\n\r\n{\"a\"",
        )
        .await
        .expect("write");
    // Slow reader: sends a request and never reads the answer.
    let mut slow_reader = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    slow_reader
        .write_all(&request(
            "X-GitHub-Delivery: r1\r\n",
            b"{}",
            Some("sha256=00"),
        ))
        .await
        .expect("write");

    // Meanwhile a real delivery is served at once.
    let hook = hookinbox_tests::Hook::new("push", fixtures::own("push"));
    let answer = tokio::time::timeout(Duration::from_secs(5), ingest.send(&hook))
        .await
        .expect("served while slow clients hang");
    assert_eq!(answer.status, 202);

    assert_eq!(read_status(&mut slow_body).await, 408, "slow body");
    assert_eq!(read_status(&mut slowloris).await, 408, "slowloris head");
    assert_eq!(
        read_status(&mut slow_reader).await,
        401,
        "the slow reader's answer waited for it"
    );
    assert_eq!(
        env.deliveries().await,
        1,
        "only the real delivery was claimed"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn past_the_in_flight_limit_ingest_sheds_load_at_once_with_429() {
    let env = TestEnv::new().await;
    let ingest = env.spawn(
        "hookinbox-ingest",
        &[
            ("HOOKINBOX_GITHUB_SECRET", SECRET),
            ("HOOKINBOX_MAX_IN_FLIGHT", "1"),
            // The holder below keeps its slot for the whole test, even on
            // a loaded machine.
            ("HOOKINBOX_BODY_TIMEOUT_MS", "60000"),
        ],
    );
    let base = format!("http://127.0.0.1:{}", ingest.port);
    ingest.wait_ready().await;
    // Requests whose bodies are still arriving hold the only slot. Several
    // connections, so that the slot is held even if one of them waits to
    // be dispatched.
    let mut holders = Vec::new();
    for i in 0..4 {
        let mut holder = TcpStream::connect(("127.0.0.1", ingest.port))
            .await
            .expect("connect");
        holder
            .write_all(
                format!(
                    "POST /webhooks/github HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                     X-GitHub-Event: push\r\nX-GitHub-Delivery: o{i}\r\nX-Hub-Signature-256: sha256=00\r\nContent-Length: 100\r\n\r\n{{"
                )
                .as_bytes(),
            )
            .await
            .expect("write");
        holders.push(holder);
    }
    let body = fixtures::own("push");
    let send = || async {
        let started = std::time::Instant::now();
        let status = reqwest::Client::new()
            .post(format!("{base}/webhooks/github"))
            .header("content-type", "application/json")
            .header("x-github-event", "push")
            .header("x-github-delivery", uuid::Uuid::new_v4().to_string())
            .header("x-hub-signature-256", sign(SECRET, &body))
            .body(body.clone())
            .send()
            .await
            .expect("answer")
            .status()
            .as_u16();
        (status, started.elapsed())
    };
    // The slot is taken once the holder's head is parsed.
    // On a loaded machine that can take a moment: keep sending (each one
    // answered 202 while the slot is free) for up to 20 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut answer = send().await;
    while answer.0 != 429 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        answer = send().await;
    }
    assert_eq!(answer.0, 429);
    assert!(
        answer.1 < Duration::from_secs(1),
        "shed at once, not queued: {:?}",
        answer.1
    );
    drop(holders);
    hookinbox_tests::wait_until("the slot to free", Duration::from_secs(20), || async {
        send().await.0 == 202
    })
    .await;
    env.cleanup().await;
}
