//! The allow-list (`HOOKINBOX_GITHUB_META_FILE`): only clients in the
//! `hooks` ranges of GitHub's `/meta` answer are admitted, others refused
//! 403 before their body is read; behind a trusted proxy, the client it
//! names. Loopback addresses only: the meta file lists 127.0.0.1/32, and
//! connections come from other 127.0.0.0/8 addresses.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hookinbox_tests::{Hook, SECRET, TestEnv, worker_command};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn from(ip: [u8; 4]) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::from(ip))
        .build()
        .expect("client")
}

/// Sends only the headers of a large POST from `ip` and returns the status
/// line ingest answers with, without ever sending a byte of body.
async fn headers_only_from(ip: [u8; 4], port: u16) -> String {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((ip, 0)))
        .expect("bind a loopback source");
    let mut stream = socket
        .connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("connect");
    stream
        .write_all(
            b"POST /webhooks/github HTTP/1.1\r\nHost: ingest\r\n\
              Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n",
        )
        .await
        .expect("write");
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut answer))
        .await
        .expect("answered before any body byte")
        .expect("read");
    String::from_utf8_lossy(&answer[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test]
async fn only_githubs_addresses_are_admitted_and_others_refused_before_the_body() {
    let env = TestEnv::new().await;
    let meta = std::env::temp_dir().join(format!("{}-meta.json", env.prefix));
    std::fs::write(
        &meta,
        r#"{"verifiable_password_authentication": false, "hooks": ["127.0.0.1/32"], "web": ["127.0.0.0/8"]}"#,
    )
    .expect("meta file");
    let meta_path = meta.to_string_lossy().into_owned();
    let ingest = env.spawn(
        "hookinbox-ingest",
        &[
            ("HOOKINBOX_GITHUB_SECRET", SECRET),
            ("HOOKINBOX_GITHUB_META_FILE", &meta_path),
            ("HOOKINBOX_TRUSTED_PROXIES", "127.0.0.3"),
        ],
    );
    ingest.wait_ready().await;
    let base = format!("http://127.0.0.1:{}", ingest.port);

    // GitHub's address: in.
    assert_eq!(
        Hook::fixture("push")
            .post(&from([127, 0, 0, 1]), &base)
            .await
            .status,
        202
    );
    // Another address: refused, before the body (none is ever sent).
    assert!(
        headers_only_from([127, 0, 0, 2], ingest.port)
            .await
            .starts_with("HTTP/1.1 403"),
    );
    let refused = Hook::fixture("push")
        .post(&from([127, 0, 0, 2]), &base)
        .await;
    assert_eq!(refused.status, 403);
    assert_eq!(
        refused.body["error"],
        "this address is not one GitHub sends webhooks from"
    );
    // Its own X-Forwarded-For is not believed: it is no trusted proxy.
    let mut spoofed = Hook::fixture("push");
    spoofed
        .extra
        .push(("x-forwarded-for".into(), "127.0.0.1".into()));
    assert_eq!(spoofed.post(&from([127, 0, 0, 2]), &base).await.status, 403);
    // The trusted proxy forwards GitHub's request: in; anyone else's: out.
    let mut via_proxy = Hook::fixture("push");
    via_proxy
        .extra
        .push(("x-forwarded-for".into(), "127.0.0.1".into()));
    assert_eq!(
        via_proxy.post(&from([127, 0, 0, 3]), &base).await.status,
        202
    );
    let mut other_via_proxy = Hook::fixture("push");
    other_via_proxy
        .extra
        .push(("x-forwarded-for".into(), "127.0.0.9".into()));
    assert_eq!(
        other_via_proxy
            .post(&from([127, 0, 0, 3]), &base)
            .await
            .status,
        403
    );

    assert_eq!(
        env.deliveries().await,
        2,
        "a refused request writes nothing"
    );
    let (_, metrics) = ingest.scrape("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("hookinbox_ingest_requests_total{")
                && l.contains("outcome=\"not_github\"")
                && l.ends_with(" 4")),
        "{metrics}"
    );
    let _ = std::fs::remove_file(meta);
    env.cleanup().await;
}

#[tokio::test]
async fn a_meta_file_that_cannot_be_used_refuses_to_start_naming_it() {
    let env = TestEnv::new().await;
    let meta = std::env::temp_dir().join(format!("{}-bad-meta.json", env.prefix));
    for (content, says) in [
        ("{}", "\"hooks\""),
        (r#"{"hooks": ["127.0.0.1/99"]}"#, "not a CIDR"),
        (r#"{"hooks": []}"#, "lists no"),
    ] {
        std::fs::write(&meta, content).expect("meta file");
        let worker = std::path::PathBuf::from(worker_command(&env, &[], &[]).get_program());
        let out = std::process::Command::new(worker.with_file_name("hookinbox-ingest"))
            .env_clear()
            .env("HOOKINBOX_GITHUB_SECRET", SECRET)
            .env("HOOKINBOX_GITHUB_META_FILE", &meta)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{content}: {stderr}");
        assert!(
            stderr.contains("HOOKINBOX_GITHUB_META_FILE") && stderr.contains(says),
            "{content}: {stderr}"
        );
    }
    let _ = std::fs::remove_file(meta);
    env.cleanup().await;
}
