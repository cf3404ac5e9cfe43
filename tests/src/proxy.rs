//! A closable TCP proxy, to make Postgres or RabbitMQ unreachable, silent
//! or slow for one test without touching the shared service.
//!
//! - [`Proxy::close`] cuts every connection and refuses new ones.
//! - [`Proxy::stall`] makes every connection half-open: the client's side
//!   stays up and its bytes are accepted, but nothing reaches the server and
//!   nothing comes back. A stalled connection never recovers; the client must
//!   notice on its own. When the stall ends ([`Proxy::open`]) the server's
//!   side is closed, as a server finally timing out a dead peer would.
//! - [`Proxy::delay`] holds every chunk, both ways, for a while before
//!   forwarding it.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forwards.
    Open,
    /// Refuses connections (existing ones were cut).
    Closed,
    /// Swallows everything (half-open).
    Stalled,
    /// Forwards each chunk after this delay.
    Delayed(Duration),
}

/// The shared state: the mode and a generation bumped on every cut.
type State = (Mode, u64);

/// Forwards 127.0.0.1:`port()` to a target.
pub struct Proxy {
    addr: SocketAddr,
    state: watch::Sender<State>,
}

impl Proxy {
    /// Starts a proxy to `target` (`host:port`).
    pub async fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let (state, _) = watch::channel((Mode::Open, 0u64));
        let target = target.to_owned();
        let accept_state = state.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if accept_state.borrow().0 == Mode::Closed {
                    drop(inbound);
                    continue;
                }
                tokio::spawn(connection(
                    inbound,
                    target.clone(),
                    accept_state.subscribe(),
                ));
            }
        });
        Self { addr, state }
    }

    /// The local port to connect to instead of the target.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Cuts every connection and refuses new ones.
    pub fn close(&self) {
        self.state.send_modify(|(mode, generation)| {
            *mode = Mode::Closed;
            *generation += 1;
        });
    }

    /// Makes every connection, old and new, half-open.
    pub fn stall(&self) {
        self.state.send_modify(|(mode, _)| *mode = Mode::Stalled);
    }

    /// Delays every chunk by `by`.
    pub fn delay(&self, by: Duration) {
        self.state
            .send_modify(|(mode, _)| *mode = Mode::Delayed(by));
    }

    /// Forwards normally again. Connections stalled before stay dead.
    pub fn open(&self) {
        self.state.send_modify(|(mode, _)| *mode = Mode::Open);
    }

    /// Accepts connections again after [`Proxy::close`].
    pub fn reopen(&self) {
        self.open();
    }
}

/// How forwarding stopped.
enum End {
    /// One side closed or failed, or the proxy cut everything.
    Done,
    /// The proxy stalled.
    Stall,
}

async fn connection(inbound: TcpStream, target: String, mut state: watch::Receiver<State>) {
    let Ok(outbound) = TcpStream::connect(&target).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (mut client_r, client_w) = inbound.into_split();
    let (mut server_r, mut server_w) = outbound.into_split();
    let mut client_w = client_w;
    let generation = state.borrow().1;
    let end = if state.borrow().0 == Mode::Stalled {
        End::Stall
    } else {
        tokio::select! {
            _ = pump(&mut client_r, &mut server_w, state.clone()) => End::Done,
            _ = pump(&mut server_r, &mut client_w, state.clone()) => End::Done,
            end = changed(&mut state, generation) => end,
        }
    };
    if let End::Stall = end {
        black_hole(client_r, client_w, (server_r, server_w), state).await;
    }
}

/// Copies one way, holding each chunk while the proxy is delayed.
async fn pump(from: &mut OwnedReadHalf, to: &mut OwnedWriteHalf, state: watch::Receiver<State>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mode = state.borrow().0;
        if let Mode::Delayed(by) = mode {
            tokio::time::sleep(by).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Waits until this connection must be cut or stalled.
async fn changed(state: &mut watch::Receiver<State>, generation: u64) -> End {
    loop {
        if state.changed().await.is_err() {
            return End::Done;
        }
        let (mode, now) = *state.borrow();
        if now != generation || mode == Mode::Closed {
            return End::Done;
        }
        if mode == Mode::Stalled {
            return End::Stall;
        }
    }
}

/// A half-open connection: the client's bytes are read and dropped, nothing
/// is ever written back, and the client's side stays open until the client
/// closes it. The server's side is closed once the stall ends.
async fn black_hole(
    mut client_r: OwnedReadHalf,
    _client_w: OwnedWriteHalf,
    server: (OwnedReadHalf, OwnedWriteHalf),
    mut state: watch::Receiver<State>,
) {
    let mut server = Some(server);
    let mut sink = [0u8; 4096];
    loop {
        tokio::select! {
            read = client_r.read(&mut sink) => {
                if matches!(read, Ok(0) | Err(_)) {
                    return;
                }
            }
            changed = state.changed(), if server.is_some() => {
                if changed.is_err() {
                    return;
                }
                if state.borrow().0 != Mode::Stalled {
                    server = None;
                }
            }
        }
    }
}
