//! Unsigned bodies that hold ingest's resources, for `scripts/body-attacks.sh`
//! (loopback only):
//!
//! - `--mode memory`: each connection declares `--declared` bytes, sends
//!   `--send` of them at once, then one byte a second (enough for any pace
//!   rule that only asks for progress), and never finishes;
//! - `--mode slow`: each connection sends its request head and one byte of
//!   body, then one byte a second.
//!
//! `--connections` are kept open for `--seconds`, spread over `--clients`
//! source addresses (127.0.1.2 and up: loopback in other disguises, as an
//! attacker's many addresses would be). A connection that ingest closes
//! (refused or cut) is opened again a second later, so the pressure is
//! renewed the whole time. It prints how many connections were opened and how ingest ended
//! them.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

/// Unsigned bodies that hold ingest's resources.
#[derive(Parser)]
struct Args {
    /// Ingest's address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    target: SocketAddr,
    /// `memory` or `slow`.
    #[arg(long, default_value = "slow")]
    mode: String,
    /// Connections held open at once.
    #[arg(long, default_value_t = 100)]
    connections: usize,
    /// Source addresses to spread them over (1: one client).
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Declared `Content-Length`.
    #[arg(long, default_value_t = 24 * 1024 * 1024)]
    declared: usize,
    /// Bytes sent at once in `memory` mode.
    #[arg(long, default_value_t = 24 * 1024 * 1024 - 1024)]
    send: usize,
    /// Seconds to keep the pressure on.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

fn source(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 1 + (n / 250) as u8, 2 + (n % 250) as u8)
}

/// Holds one connection until `until`, opening it again whenever ingest
/// ends it; counts how each ended.
async fn hold(
    args: Arc<Args>,
    from: Ipv4Addr,
    until: Instant,
    endings: Arc<Mutex<BTreeMap<String, u64>>>,
) {
    let head = format!(
        "POST /webhooks/github HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
         x-github-event: push\r\nx-github-delivery: flood\r\n\
         x-hub-signature-256: sha256=0000000000000000000000000000000000000000000000000000000000000000\r\n\
         content-length: {}\r\n\r\n",
        args.target, args.declared
    );
    let first = if args.mode == "memory" {
        args.send.min(args.declared)
    } else {
        1
    };
    let chunk = vec![b' '; 64 * 1024];
    while Instant::now() < until {
        let ending = async {
            let socket = TcpSocket::new_v4().map_err(|e| e.kind().to_string())?;
            socket
                .bind(SocketAddr::from((from, 0)))
                .map_err(|e| e.kind().to_string())?;
            let mut stream = socket
                .connect(args.target)
                .await
                .map_err(|e| format!("connect: {}", e.kind()))?;
            stream
                .write_all(head.as_bytes())
                .await
                .map_err(|e| e.kind().to_string())?;
            let mut left = first;
            while left > 0 {
                let n = left.min(chunk.len());
                stream
                    .write_all(&chunk[..n])
                    .await
                    .map_err(|e| format!("write: {}", e.kind()))?;
                left -= n;
            }
            let mut answer = [0u8; 64];
            loop {
                tokio::select! {
                    read = stream.read(&mut answer) => {
                        return Ok::<String, String>(match read {
                            Ok(0) | Err(_) => "closed".to_owned(),
                            Ok(n) => String::from_utf8_lossy(&answer[..n])
                                .split_whitespace()
                                .nth(1)
                                .unwrap_or("?")
                                .to_owned(),
                        });
                    }
                    () = tokio::time::sleep(Duration::from_secs(1)) => {
                        if Instant::now() >= until {
                            return Ok("held to the end".to_owned());
                        }
                        if stream.write_all(b" ").await.is_err() {
                            return Ok("closed".to_owned());
                        }
                    }
                }
            }
        };
        // A refused body that ingest stops reading blocks its writer: the
        // run's end ends it too.
        let end = tokio::time::Instant::from_std(until + Duration::from_secs(1));
        let ended = match tokio::time::timeout_at(end, ending).await {
            Ok(Ok(e) | Err(e)) => e,
            Err(_) => "blocked to the end".to_owned(),
        };
        *endings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(ended)
            .or_default() += 1;
        if Instant::now() < until {
            // Not a tight loop against a refusing server.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

#[tokio::main]
async fn main() {
    let args = Arc::new(Args::parse());
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let endings = Arc::new(Mutex::new(BTreeMap::new()));
    let mut tasks = Vec::new();
    for n in 0..args.connections {
        let from = source(n % args.clients.max(1));
        tasks.push(tokio::spawn(hold(
            args.clone(),
            from,
            until,
            endings.clone(),
        )));
    }
    for task in tasks {
        let _ = task.await;
    }
    let endings = endings
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let total: u64 = endings.values().sum();
    let parts: Vec<String> = endings.iter().map(|(k, v)| format!("{k} ×{v}")).collect();
    println!(
        "bodyflood {} mode, {} connections from {} clients for {} s: {total} opened; ended: {}",
        args.mode,
        args.connections,
        args.clients,
        args.seconds,
        parts.join(", ")
    );
}
