//! A closable TCP proxy, to make Postgres or RabbitMQ unreachable for one
//! test without stopping the shared service.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards 127.0.0.1:`port()` to a target while open. Closing it cuts
/// every connection through it and refuses new ones until it reopens.
pub struct Proxy {
    addr: SocketAddr,
    open: Arc<AtomicBool>,
    /// Bumped on close; each forwarded connection dies when it changes.
    generation: watch::Sender<u64>,
}

impl Proxy {
    /// Starts a proxy to `target` (`host:port`).
    pub async fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let open = Arc::new(AtomicBool::new(true));
        let (generation, _) = watch::channel(0u64);
        let target = target.to_owned();
        let accept_open = open.clone();
        let accept_gen = generation.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !accept_open.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let target = target.clone();
                let mut gen_rx = accept_gen.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = gen_rx.changed() => {}
                    }
                });
            }
        });
        Self {
            addr,
            open,
            generation,
        }
    }

    /// The local port to connect to instead of the target.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Cuts every connection and refuses new ones.
    pub fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Accepts connections again.
    pub fn reopen(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}
