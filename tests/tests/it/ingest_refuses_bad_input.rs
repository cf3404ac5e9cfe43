//! Ingest refuses bad input: every bad request gets its documented status,
//! a message that says what was wrong, and writes nothing; slow and greedy
//! clients are cut off without holding up anyone else.

use std::time::Duration;

use hookinbox_tests::{Hook, SECRET, TestEnv, fixtures, sign};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How a case is sent: through the HTTP client (a signed push, changed by
/// the closure), or as raw bytes when a client library would refuse to
/// send the request at all.
enum Send {
    Client(Box<dyn Fn(&mut Hook)>),
    Raw(Vec<u8>),
}
use Send::{Client, Raw};

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

/// A chunked body that passes a 64 KiB cap.
fn chunked_over_the_cap() -> Vec<u8> {
    let mut chunked = b"POST /webhooks/github HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
        X-GitHub-Event: push\r\nX-GitHub-Delivery: i1\r\nX-Hub-Signature-256: sha256=00\r\nTransfer-Encoding: chunked\r\n\r\n"
        .to_vec();
    for _ in 0..80 {
        chunked.extend_from_slice(b"400\r\n");
        chunked.extend(std::iter::repeat_n(b' ', 1024));
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    chunked
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

    let cases: Vec<(&'static str, u16, Send)> = vec![
        // Signature
        (
            "signature with another secret",
            401,
            Client(Box::new(|h| h.signature = Some(sign("wrong", &h.body)))),
        ),
        ("missing signature", 401, Client(Box::new(|h| h.signature = None))),
        (
            "sha1 signature only",
            401,
            Client(Box::new(|h| {
                h.signature = None;
                h.extra.push((
                    "x-hub-signature".into(),
                    "sha1=0123456789abcdef0123456789abcdef01234567".into(),
                ));
            })),
        ),
        (
            "signature without prefix",
            401,
            Client(Box::new(move |h| {
                h.signature = Some(
                    sign(SECRET, &h.body)
                        .trim_start_matches("sha256=")
                        .to_owned(),
                )
            })),
        ),
        (
            "signature too short",
            401,
            Client(Box::new(|h| {
                let s = sign(SECRET, &h.body);
                h.signature = Some(s[..s.len() - 2].to_owned());
            })),
        ),
        (
            "signature not hex",
            401,
            Client(Box::new(|h| h.signature = Some(format!("sha256={}", "z".repeat(64))))),
        ),
        (
            "signature sent twice",
            401,
            Client(Box::new(move |h| {
                h.extra.push(("x-hub-signature-256".into(), good.clone()));
            })),
        ),
        // Delivery id
        ("missing delivery id", 400, Client(Box::new(|h| h.delivery = None))),
        (
            "delivery id of 129 bytes",
            400,
            Client(Box::new(|h| h.delivery = Some("a".repeat(129)))),
        ),
        (
            "delivery id with a tab",
            400,
            Client(Box::new(|h| h.delivery = Some("abc\tdef".into()))),
        ),
        (
            "delivery id with a space",
            400,
            Client(Box::new(|h| h.delivery = Some("abc def".into()))),
        ),
        (
            "delivery id sent twice",
            400,
            Client(Box::new(|h| h.extra.push(("x-github-delivery".into(), "other".into())))),
        ),
        (
            "delivery id not ASCII",
            400,
            Raw(request("X-GitHub-Delivery: caf\u{e9}\r\n", &body, None)),
        ),
        (
            "delivery id with a control character",
            400,
            Raw(request("X-GitHub-Delivery: d\x01d\r\n", &body, None)),
        ),
        (
            "delivery id with a bare CR",
            400,
            Raw(request("X-GitHub-Delivery: e\re\r\n", &body, None)),
        ),
        (
            "delivery id folded onto a second line",
            400,
            Raw(request("X-GitHub-Delivery: f\r\n f\r\n", &body, None)),
        ),
        // Event and hook id
        ("missing event", 400, Client(Box::new(|h| h.event = None))),
        (
            "malformed event",
            400,
            Client(Box::new(|h| h.event = Some("Push Event".into()))),
        ),
        (
            "hook id not digits",
            400,
            Client(Box::new(|h| h.hook_id = Some("12ab".into()))),
        ),
        (
            "hook id of 21 digits",
            400,
            Client(Box::new(|h| h.hook_id = Some("1".repeat(21)))),
        ),
        // Body and framing
        (
            "gzip encoding",
            415,
            Client(Box::new(|h| h.extra.push(("content-encoding".into(), "gzip".into())))),
        ),
        (
            "deflate encoding",
            415,
            Client(Box::new(|h| h.extra.push(("content-encoding".into(), "deflate".into())))),
        ),
        (
            "plain text content type",
            415,
            Client(Box::new(|h| h.content_type = "text/plain".into())),
        ),
        (
            "body over the cap",
            413,
            Client(Box::new(|h| {
                let mut big = b"{\"pad\":\"".to_vec();
                big.extend(std::iter::repeat_n(b'x', 70 * 1024));
                big.extend(b"\"}");
                h.signature = Some(sign(SECRET, &big));
                h.body = big;
            })),
        ),
        (
            "content-length over the cap, no body sent",
            413,
            Raw(b"POST /webhooks/github HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 999999999\r\n\r\n".to_vec()),
        ),
        ("chunked body over the cap", 413, Raw(chunked_over_the_cap())),
        (
            "content-length with transfer-encoding",
            400,
            Raw(request("X-GitHub-Delivery: h1\r\nTransfer-Encoding: chunked\r\n", &body, None)),
        ),
        (
            "120 headers",
            431,
            Raw(request(
                &format!(
                    "X-GitHub-Delivery: j1\r\n{}",
                    (0..120).map(|i| format!("X-Filler-{i}: x\r\n")).collect::<String>()
                ),
                &body,
                None,
            )),
        ),
        (
            "signed body that is not JSON",
            400,
            Client(Box::new(|h| {
                h.body = b"Hello, World!".to_vec();
                h.signature = Some(sign(SECRET, &h.body));
            })),
        ),
        (
            "form body without payload field",
            400,
            Client(Box::new(|h| {
                h.content_type = "application/x-www-form-urlencoded".into();
                h.body = b"other=1".to_vec();
                h.signature = Some(sign(SECRET, &h.body));
            })),
        ),
        (
            "unknown source",
            404,
            Client(Box::new(|h| h.path = "/webhooks/github/nope".into())),
        ),
    ];
    for (name, status, send) in cases {
        match send {
            Client(mutate) => {
                let mut hook = Hook::new("push", body.clone());
                mutate(&mut hook);
                let answer = ingest.send(&hook).await;
                assert_eq!(answer.status, status, "{name}: {:?}", answer.body);
                assert_eq!(answer.kind(), "error", "{name}");
                let error = answer.body["error"].as_str().unwrap_or("");
                assert!(!error.is_empty(), "{name}: the error says what was wrong");
                if let Some(sig) = &hook.signature {
                    assert!(
                        !error.contains(sig.trim_start_matches("sha256=")),
                        "{name}: never echoes a signature"
                    );
                }
            }
            Raw(bytes) => assert_eq!(raw(port, &bytes).await, status, "{name}"),
        }
        assert_eq!(env.deliveries().await, 0, "{name}: nothing claimed");
    }
    assert_eq!(env.work_depth().await, 0, "nothing published");

    // Upper-case hex digits are accepted (documented): claimed and published.
    let mut upper = Hook::new("push", body.clone());
    upper.delivery = Some("k1".into());
    upper.signature = Some(format!(
        "sha256={}",
        sign(SECRET, &body)
            .trim_start_matches("sha256=")
            .to_uppercase()
    ));
    assert_eq!(
        ingest.send(&upper).await.status,
        202,
        "upper-case signature"
    );
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
async fn chunked_body_over_the_cap_is_refused_while_streaming() {
    let env = TestEnv::new().await;
    let mut args = env.ingest_args();
    args.max_body_bytes = 1024;
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..64).map(|_| Ok(vec![b' '; 512])).collect();
    let resp = ingest
        .http
        .post(format!("{}/webhooks/github", ingest.base))
        .header("content-type", "application/json")
        .header("x-github-event", "push")
        .header("x-github-delivery", "chunked-1")
        .header("x-hub-signature-256", sign(SECRET, b"x"))
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status().as_u16(), 413);
    assert_eq!(env.deliveries().await, 0);
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
    let hook = hookinbox_tests::Hook::fixture("push");
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
async fn past_the_in_flight_limit_ingest_sheds_verified_load_at_once_with_429() {
    let env = TestEnv::new().await;
    let ingest = env.spawn(
        "hookinbox-ingest",
        &[
            ("HOOKINBOX_GITHUB_SECRET", SECRET),
            ("HOOKINBOX_MAX_IN_FLIGHT", "1"),
            ("HOOKINBOX_CLAIM_BATCH", "1"),
        ],
    );
    let base = format!("http://127.0.0.1:{}", ingest.port);
    ingest.wait_ready().await;
    // A lock on the claims table holds a verified request in its claim,
    // and so in the only slot for verified work.
    let mut locker = hookinbox_tests::connect(&env.app_database_url()).await;
    let lock = locker.transaction().await.expect("begin");
    lock.batch_execute("lock table deliveries in exclusive mode")
        .await
        .expect("lock");
    let body = fixtures::own("push");
    let send = |body: Vec<u8>, base: String| async move {
        let started = std::time::Instant::now();
        let status = reqwest::Client::new()
            .post(format!("{base}/webhooks/github"))
            .header("content-type", "application/json")
            .header("x-github-event", "push")
            .header("x-github-delivery", uuid::Uuid::new_v4().to_string())
            .header("x-hub-signature-256", sign(SECRET, &body))
            .body(body)
            .send()
            .await
            .expect("answer")
            .status()
            .as_u16();
        (status, started.elapsed())
    };
    // Each request waits on the lock while it holds the slot, or is shed:
    // send them one after another (the first waits) until one is shed.
    let mut waiting = Vec::new();
    let shed = loop {
        let task = tokio::spawn(send(fixtures::unique(&body), base.clone()));
        match tokio::time::timeout(Duration::from_secs(2), task).await {
            Ok(answer) => break answer.expect("send"),
            Err(_) => waiting.push(()),
        }
        assert!(waiting.len() < 5, "no request was shed");
    };
    assert_eq!(shed.0, 429);
    assert!(
        shed.1 < Duration::from_secs(1),
        "shed at once, not queued: {:?}",
        shed.1
    );
    lock.commit().await.expect("unlock");
    hookinbox_tests::wait_until("the slot to free", Duration::from_secs(20), || async {
        send(fixtures::unique(&body), base.clone()).await.0 == 202
    })
    .await;
    env.cleanup().await;
}

#[tokio::test]
async fn past_the_receiving_limit_ingest_sheds_unverified_bodies_at_once_with_503() {
    let env = TestEnv::new().await;
    let ingest = env.spawn(
        "hookinbox-ingest",
        &[
            ("HOOKINBOX_GITHUB_SECRET", SECRET),
            ("HOOKINBOX_MAX_RECEIVING", "2"),
            // The holders below keep their slots for the whole test.
            ("HOOKINBOX_BODY_TIMEOUT_MS", "60000"),
            ("HOOKINBOX_MIN_BODY_BYTES_PER_SEC", "1"),
        ],
    );
    let base = format!("http://127.0.0.1:{}", ingest.port);
    ingest.wait_ready().await;
    // Bodies still arriving hold the two receiving slots. Each keeps
    // above the minimum pace (1 byte/s over 2-s windows) with a byte every
    // 200 ms, so that a slow first send on a loaded machine does not find
    // them dropped as too slow and their slots free.
    let mut holders = Vec::new();
    for i in 0..2 {
        let mut holder = TcpStream::connect(("127.0.0.1", ingest.port))
            .await
            .expect("connect");
        holder
            .write_all(
                format!(
                    "POST /webhooks/github HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                     X-GitHub-Event: push\r\nX-GitHub-Delivery: o{i}\r\nX-Hub-Signature-256: sha256=00\r\nContent-Length: 100000\r\n\r\n{{"
                )
                .as_bytes(),
            )
            .await
            .expect("write");
        holders.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if holder.write_all(b" ").await.is_err() {
                    return;
                }
            }
        }));
    }
    let body = fixtures::own("push");
    let send = || async {
        let started = std::time::Instant::now();
        let body = fixtures::unique(&body);
        let answer = reqwest::Client::new()
            .post(format!("{base}/webhooks/github"))
            .header("content-type", "application/json")
            .header("x-github-event", "push")
            .header("x-github-delivery", uuid::Uuid::new_v4().to_string())
            .header("x-hub-signature-256", sign(SECRET, &body))
            .body(body)
            .send()
            .await
            .expect("answer");
        let retry_after = answer.headers().get("retry-after").cloned();
        (answer.status().as_u16(), started.elapsed(), retry_after)
    };
    // Why wait for the gauge before the first send: a send that arrives
    // before a holder's head is parsed takes a slot itself, and the holder
    // is the one refused, so no slot would stay held.
    crate::ingest_admission::receiving(&ingest, 2).await;
    let answer = send().await;
    assert_eq!(answer.0, 503);
    assert_eq!(answer.2.as_ref().and_then(|v| v.to_str().ok()), Some("1"));
    assert!(
        answer.1 < Duration::from_secs(1),
        "shed at once, not queued: {:?}",
        answer.1
    );
    for holder in holders {
        holder.abort();
    }
    hookinbox_tests::wait_until("the slots to free", Duration::from_secs(20), || async {
        send().await.0 == 202
    })
    .await;
    env.cleanup().await;
}
