//! What an unsigned client can take from ingest before its signature is
//! checked: memory only as its bytes arrive and within a budget, a
//! receiving slot (never a slot for verified work), a share per client,
//! and time only at a minimum pace. The attackers connect from other
//! loopback addresses (127.0.0.2 and up) than the signed deliveries
//! (127.0.0.1), as GitHub and an attacker are different clients.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hookinbox_tests::{SECRET, Spawned, TestEnv, sign, wait_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A JSON body of exactly `size` bytes, unlike any other.
fn body_of(size: usize) -> Vec<u8> {
    let head = format!(r#"{{"id":"{}","zen":""#, uuid::Uuid::new_v4());
    let head = head.as_bytes();
    let tail = br#""}"#;
    let mut body = head.to_vec();
    body.extend(std::iter::repeat_n(b'x', size - head.len() - tail.len()));
    body.extend_from_slice(tail);
    body
}

/// Opens a connection from `from` and sends a request head declaring
/// `declared` bytes, with `extra` header lines, then `first` bytes of body.
async fn open(
    from: Ipv4Addr,
    port: u16,
    declared: usize,
    signature: &str,
    extra: &str,
    first: &[u8],
) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((from, 0)))
        .expect("bind a loopback address");
    let mut stream = socket
        .connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("connect");
    let head = format!(
        "POST /webhooks/github HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         x-github-event: push\r\nx-github-delivery: {}\r\nx-hub-signature-256: {signature}\r\n\
         {extra}content-length: {declared}\r\n\r\n",
        uuid::Uuid::new_v4()
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    // A refused body may be cut off while it is written: its answer tells.
    let _ = stream.write_all(first).await;
    stream
}

const UNSIGNED: &str = "sha256=0000000000000000000000000000000000000000000000000000000000000000";

/// The status of the answer on `stream` (0 if it closed without one).
async fn status(stream: &mut TcpStream) -> u16 {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(30), read).await;
    String::from_utf8_lossy(&got)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A connection that declares `declared` bytes, keeps sending one byte
/// every 200 ms (5 bytes/s) and never finishes its body, until dropped.
struct Trickle {
    stop: Arc<AtomicBool>,
}

impl Trickle {
    async fn start(from: Ipv4Addr, port: u16, declared: usize, extra: &str) -> Self {
        let mut stream = open(from, port, declared, UNSIGNED, extra, b"{").await;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        tokio::spawn(async move {
            while !flag.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if stream.write_all(b" ").await.is_err() {
                    break;
                }
            }
        });
        Self { stop }
    }
}

/// A body that keeps pace (one byte of its rest every 200 ms) until told
/// to send the rest at once; then its answer's status.
struct Paced {
    finish: tokio::sync::oneshot::Sender<()>,
    answer: tokio::task::JoinHandle<u16>,
}

impl Paced {
    fn start(mut stream: TcpStream, rest: Vec<u8>) -> Self {
        let (finish, mut told) = tokio::sync::oneshot::channel::<()>();
        let answer = tokio::spawn(async move {
            let mut sent = 0;
            loop {
                tokio::select! {
                    _ = &mut told => break,
                    () = tokio::time::sleep(Duration::from_millis(200)) => {
                        if sent + 1 < rest.len() && stream.write_all(&rest[sent..=sent]).await.is_ok() {
                            sent += 1;
                        }
                    }
                }
            }
            let _ = stream.write_all(&rest[sent..]).await;
            status(&mut stream).await
        });
        Self { finish, answer }
    }

    async fn finish(self) -> u16 {
        let _ = self.finish.send(());
        self.answer.await.expect("the paced body's task")
    }
}

impl Drop for Trickle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Waits until ingest is receiving exactly `n` unverified bodies.
pub(crate) async fn receiving(ingest: &Spawned, n: u32) {
    wait_until(
        &format!("{n} bodies being received"),
        Duration::from_secs(30),
        || async { gauge(ingest, "hookinbox_ingest_receiving_bodies").await == f64::from(n) },
    )
    .await;
}

/// Whether ingest has refused a body for the budget.
async fn refused_over_budget(ingest: &Spawned) -> bool {
    let (_, metrics) = ingest.scrape("/metrics").await;
    metrics
        .lines()
        .any(|l| l.contains("outcome=\"over_budget\"") && !l.ends_with(" 0"))
}

/// A gauge's value on ingest's metrics listener.
async fn gauge(ingest: &Spawned, name: &str) -> f64 {
    let (_, text) = ingest.scrape("/metrics").await;
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

async fn spawn_ingest(env: &TestEnv, extra: &[(&str, &str)]) -> Spawned {
    let mut vars = vec![("HOOKINBOX_GITHUB_SECRET", SECRET)];
    vars.extend_from_slice(extra);
    let ingest = env.spawn("hookinbox-ingest", &vars);
    ingest.wait_ready().await;
    ingest
}

/// A signed delivery of `size` bytes from 127.0.0.1, sent whole.
async fn signed(port: u16, size: usize) -> u16 {
    let body = body_of(size);
    let mut stream = open(
        Ipv4Addr::LOCALHOST,
        port,
        body.len(),
        &sign(SECRET, &body),
        "",
        &body,
    )
    .await;
    status(&mut stream).await
}

fn attacker(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 1 + (n / 250) as u8, 2 + (n % 250) as u8)
}

#[tokio::test]
async fn a_declared_length_takes_no_memory_and_past_the_budget_a_body_is_refused_leaving_those_inside_unharmed()
 {
    let env = TestEnv::new().await;
    let ingest = spawn_ingest(
        &env,
        &[
            ("HOOKINBOX_MAX_BODY_BYTES", "262144"),
            ("HOOKINBOX_MAX_BUFFERED_BYTES", "1048576"),
            ("HOOKINBOX_MIN_BODY_BYTES_PER_SEC", "1"),
            ("HOOKINBOX_BODY_TIMEOUT_MS", "120000"),
        ],
    )
    .await;
    let port = ingest.port;
    // 30 clients declare 250,000 bytes each (7.5 MB in all, seven times
    // the budget) and trickle: each is let in, holding only the first
    // buffer, never its declared length.
    let mut trickles = Vec::new();
    for n in 0..30 {
        trickles.push(Trickle::start(attacker(n), port, 250_000, "").await);
    }
    receiving(&ingest, 30).await;
    let held = gauge(&ingest, "hookinbox_ingest_buffered_bytes").await;
    assert!(
        held > 0.0 && held <= 30.0 * 17.0 * 1024.0,
        "30 bodies that sent a few bytes hold {held} bytes"
    );

    // A signed delivery, half sent, then keeping pace: it is inside.
    let inside = body_of(150 * 1024);
    let stream = open(
        Ipv4Addr::LOCALHOST,
        port,
        inside.len(),
        &sign(SECRET, &inside),
        "",
        &inside[..75 * 1024],
    )
    .await;
    let inside = Paced::start(stream, inside[75 * 1024..].to_vec());
    wait_until(
        "the half body buffered",
        Duration::from_secs(30),
        || async {
            gauge(&ingest, "hookinbox_ingest_buffered_bytes").await >= held + 75.0 * 1024.0
        },
    )
    .await;

    // A large unsigned body from another client, keeping pace, takes the
    // budget past three quarters.
    let big = body_of(250 * 1024);
    let stream = open(
        attacker(100),
        port,
        big.len(),
        UNSIGNED,
        "",
        &big[..240 * 1024],
    )
    .await;
    let _big = Paced::start(stream, big[240 * 1024..].to_vec());
    wait_until(
        "three quarters of the budget taken",
        Duration::from_secs(30),
        || async { gauge(&ingest, "hookinbox_ingest_buffered_bytes").await >= 786_432.0 },
    )
    .await;

    // A new body is now refused at once, with 503 and Retry-After.
    let mut refused = open(attacker(101), port, 1000, UNSIGNED, "", b"{").await;
    let answer = read_answer(&mut refused).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(
        refused_over_budget(&ingest).await,
        "the refusal is counted by its reason"
    );

    // The delivery inside is unharmed: its rest arrives, growing into the
    // last quarter, and it is accepted.
    assert_eq!(inside.finish().await, 202);
    assert_eq!(
        env.count("select count(*) from deliveries").await,
        1,
        "only the signed delivery is claimed"
    );
    drop(trickles);
    env.cleanup().await;
}

#[tokio::test]
async fn connections_that_trickle_bytes_never_take_a_signed_deliverys_slot() {
    let env = TestEnv::new().await;
    // Four slots for verified work; 200 unverified bodies from four
    // clients trickle at 5 bytes/s (above this test's minimum pace).
    let ingest = spawn_ingest(
        &env,
        &[
            ("HOOKINBOX_MAX_IN_FLIGHT", "4"),
            ("HOOKINBOX_MIN_BODY_BYTES_PER_SEC", "1"),
            ("HOOKINBOX_BODY_TIMEOUT_MS", "120000"),
        ],
    )
    .await;
    let port = ingest.port;
    let mut trickles = Vec::new();
    for n in 0..200 {
        let from = Ipv4Addr::new(127, 0, 2, 2 + (n % 4) as u8);
        trickles.push(Trickle::start(from, port, 1_000_000, "").await);
    }
    receiving(&ingest, 200).await;
    for _ in 0..20 {
        assert_eq!(
            signed(port, 2048).await,
            202,
            "a signed delivery is accepted"
        );
    }
    assert_eq!(env.count("select count(*) from deliveries").await, 20);
    drop(trickles);
    env.cleanup().await;
}

#[tokio::test]
async fn a_client_past_its_share_of_unverified_bodies_gets_429_and_others_are_unharmed() {
    let env = TestEnv::new().await;
    let ingest = spawn_ingest(
        &env,
        &[
            ("HOOKINBOX_MAX_UNVERIFIED_PER_CLIENT", "8"),
            ("HOOKINBOX_MIN_BODY_BYTES_PER_SEC", "1"),
            ("HOOKINBOX_BODY_TIMEOUT_MS", "120000"),
            ("HOOKINBOX_TRUSTED_PROXIES", "127.0.3.1"),
        ],
    )
    .await;
    let port = ingest.port;
    let one = Ipv4Addr::new(127, 0, 3, 2);
    let mut trickles = Vec::new();
    for _ in 0..8 {
        trickles.push(Trickle::start(one, port, 1_000_000, "").await);
    }
    receiving(&ingest, 8).await;
    let mut ninth = open(one, port, 100, UNSIGNED, "", b"{").await;
    let answer = read_answer(&mut ninth).await;
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(
        answer.contains("client_share") || answer.contains("too many bodies"),
        "{answer}"
    );
    // Another client, and a signed delivery, are unharmed.
    trickles.push(Trickle::start(Ipv4Addr::new(127, 0, 3, 3), port, 1_000_000, "").await);
    assert_eq!(signed(port, 2048).await, 202);

    // Behind a trusted proxy, the client is the one it names.
    for _ in 0..8 {
        trickles.push(
            Trickle::start(
                Ipv4Addr::new(127, 0, 3, 1),
                port,
                1_000_000,
                "x-forwarded-for: 198.51.100.7\r\n",
            )
            .await,
        );
    }
    receiving(&ingest, 17).await;
    let mut named = open(
        Ipv4Addr::new(127, 0, 3, 1),
        port,
        100,
        UNSIGNED,
        "x-forwarded-for: 198.51.100.7\r\n",
        b"{",
    )
    .await;
    assert!(read_answer(&mut named).await.starts_with("HTTP/1.1 429"));
    trickles.push(
        Trickle::start(
            Ipv4Addr::new(127, 0, 3, 1),
            port,
            1_000_000,
            "x-forwarded-for: 198.51.100.8\r\n",
        )
        .await,
    );
    receiving(&ingest, 18).await;
    drop(trickles);
    env.cleanup().await;
}

/// The answer's head and as much of its body as arrives at once.
async fn read_answer(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got);
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text[..end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .and_then(|v| v.trim().parse::<usize>().ok())
                            })
                            .unwrap_or(0);
                        if got.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(30), read).await;
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn a_body_below_the_minimum_pace_is_cut_and_a_long_one_at_pace_gets_time_for_its_length() {
    let env = TestEnv::new().await;
    let ingest = spawn_ingest(
        &env,
        &[
            ("HOOKINBOX_MIN_BODY_BYTES_PER_SEC", "1024"),
            ("HOOKINBOX_BODY_TIMEOUT_MS", "1000"),
        ],
    )
    .await;
    let port = ingest.port;
    // One byte, then nothing: cut after one window, not at a deadline
    // that its declared length would stretch to ten minutes.
    let started = Instant::now();
    let mut stalled = open(attacker(0), port, 600_000, UNSIGNED, "", b"{").await;
    let answer = read_answer(&mut stalled).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("slower than 1024 bytes per second"),
        "{answer}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "cut after {:?}",
        started.elapsed()
    );

    // 8 KiB at 2 KiB/s takes four seconds, past the 1 s timeout, and
    // within the time its length earns at the minimum pace (1 s + 8 s).
    let body = body_of(8 * 1024);
    let mut stream = open(
        Ipv4Addr::LOCALHOST,
        port,
        body.len(),
        &sign(SECRET, &body),
        "",
        &[],
    )
    .await;
    for piece in body.chunks(512) {
        stream.write_all(piece).await.expect("piece");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(status(&mut stream).await, 202);
    env.cleanup().await;
}

#[tokio::test]
async fn large_bodies_flooding_in_leave_room_for_small_signed_deliveries() {
    let env = TestEnv::new().await;
    // Large unverified bodies (over 1 MiB declared) hold at most half of
    // this 8 MiB budget together.
    let ingest = spawn_ingest(
        &env,
        &[
            ("HOOKINBOX_MAX_BODY_BYTES", "2000000"),
            ("HOOKINBOX_MAX_BUFFERED_BYTES", "8388608"),
            ("HOOKINBOX_MIN_BODY_BYTES_PER_SEC", "1"),
            ("HOOKINBOX_BODY_TIMEOUT_MS", "120000"),
        ],
    )
    .await;
    let port = ingest.port;
    let big = body_of(2_000_000);
    let mut floods = Vec::new();
    for n in 0..6 {
        let stream = open(
            attacker(n),
            port,
            big.len(),
            UNSIGNED,
            "",
            &big[..1_900_000],
        )
        .await;
        floods.push(Paced::start(stream, big[1_900_000..].to_vec()));
    }
    // Six would take 12 MB: once the large bodies' half is full, the
    // others are refused.
    wait_until("a large body refused", Duration::from_secs(30), || {
        refused_over_budget(&ingest)
    })
    .await;
    let held = gauge(&ingest, "hookinbox_ingest_buffered_bytes").await;
    assert!(
        held <= 4.0 * 1024.0 * 1024.0,
        "large bodies hold {held} bytes"
    );
    for _ in 0..5 {
        assert_eq!(
            signed(port, 4096).await,
            202,
            "a small signed delivery finds room"
        );
    }
    drop(floods);
    env.cleanup().await;
}
