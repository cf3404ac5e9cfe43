//! A destination's receiver for the fault suite: a small HTTP/1.1 server on
//! 127.0.0.1 that records every request (its `Idempotency-Key`, delivery
//! id and a hash of its body) and answers as its [`Mode`] says: at once,
//! slowly, with a status, by cutting the connection mid-answer, or not at
//! all (stopped: connections refused, open ones closed).
//!
//! Written on a raw socket, not an HTTP framework, because a framework
//! cannot cut a connection after reading a request or in the middle of
//! its answer. It reads what `forward` sends: a request head and a body of
//! `Content-Length` bytes, on keep-alive connections.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

/// How the receiver answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// 200 at once.
    Ok,
    /// 200 after this long.
    Slow(Duration),
    /// This status at once.
    Status(u16),
    /// Reads the request, then cuts the connection (a reset): every other
    /// request before a byte of the answer, the others in the middle of
    /// its head.
    Reset,
    /// Not listening: connections are refused, open ones closed.
    Down,
}

/// How one request was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// 2xx, written in full: the request's effect happened.
    Effect,
    /// This status (not 2xx).
    Status(u16),
    /// The connection was cut before a whole answer.
    Cut,
}

/// One request the receiver read.
#[derive(Clone, Debug)]
pub struct Arrival {
    /// Its `Idempotency-Key`.
    pub key: String,
    /// Its `X-GitHub-Delivery`.
    pub delivery: String,
    /// SHA-256 of its body.
    pub body: [u8; 32],
    /// When it was read.
    pub at: Instant,
    /// How it was answered.
    pub answer: Answer,
}

struct State {
    mode: watch::Sender<Mode>,
    arrivals: Mutex<Vec<Arrival>>,
    resets: AtomicU64,
}

/// A running receiver; its port stays the same across [`Mode::Down`].
pub struct Sink {
    port: u16,
    state: Arc<State>,
}

/// The largest request head it reads.
const MAX_HEAD: usize = 64 * 1024;

/// The largest body it reads (GitHub's cap is 25 MB).
const MAX_BODY: usize = 32 * 1024 * 1024;

impl Sink {
    /// Starts a receiver answering [`Mode::Ok`] on a free port.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = listen(0).await?;
        let port = listener.local_addr()?.port();
        let (mode, _) = watch::channel(Mode::Ok);
        let state = Arc::new(State {
            mode,
            arrivals: Mutex::new(Vec::new()),
            resets: AtomicU64::new(0),
        });
        tokio::spawn(serve(listener, port, state.clone()));
        Ok(Self { port, state })
    }

    /// The URL `forward` posts to.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    /// Answers as `mode` says from now on.
    pub fn set(&self, mode: Mode) {
        self.state.mode.send_replace(mode);
    }

    /// Every request so far.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.state.arrivals.lock().expect("arrivals").clone()
    }
}

/// A listening socket on 127.0.0.1:`port` (0: any free port), reusing the
/// address so that it can listen again on the same port after a stop.
async fn listen(port: u16) -> anyhow::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(([127, 0, 0, 1], port).into())?;
    Ok(socket.listen(1024)?)
}

/// Accepts connections while the mode is not [`Mode::Down`]; while it is,
/// nothing listens on the port.
async fn serve(mut listener: TcpListener, port: u16, state: Arc<State>) {
    let mut modes = state.mode.subscribe();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => Some(accepted),
            changed = modes.changed() => {
                if changed.is_err() {
                    return;
                }
                None
            }
        };
        match accepted {
            Some(Ok((stream, _))) => {
                tokio::spawn(connection(stream, state.clone()));
            }
            Some(Err(_)) => {}
            None if *modes.borrow_and_update() == Mode::Down => {
                drop(listener);
                if modes.wait_for(|m| *m != Mode::Down).await.is_err() {
                    return;
                }
                listener = match relisten(port).await {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("faults: a receiver could not listen again: {e:#}");
                        return;
                    }
                };
            }
            None => {}
        }
    }
}

/// Listens on `port` again, retrying for up to 5 s while the port is busy.
async fn relisten(port: u16) -> anyhow::Result<TcpListener> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match listen(port).await {
            Ok(l) => return Ok(l),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// One connection: requests in turn until the peer closes, a request is
/// malformed, or the receiver stops.
async fn connection(mut stream: TcpStream, state: Arc<State>) {
    let mut modes = state.mode.subscribe();
    let mut buffered = Vec::new();
    loop {
        let request = tokio::select! {
            request = read_request(&mut stream, &mut buffered) => request,
            _ = modes.wait_for(|m| *m == Mode::Down) => return,
        };
        let Ok(Some(request)) = request else {
            return;
        };
        let mode = *state.mode.borrow();
        let (answer, keep) = answer(&mut stream, mode, &state).await;
        state
            .arrivals
            .lock()
            .expect("arrivals")
            .push(Arrival { answer, ..request });
        if !keep {
            return;
        }
    }
}

/// Answers one request as `mode` says; the answer, and whether the
/// connection stays open.
async fn answer(stream: &mut TcpStream, mode: Mode, state: &State) -> (Answer, bool) {
    let status = match mode {
        Mode::Ok => 200,
        Mode::Slow(delay) => {
            tokio::time::sleep(delay).await;
            200
        }
        Mode::Status(code) => code,
        Mode::Reset => {
            // Every other reset comes in the middle of the answer's head.
            if state.resets.fetch_add(1, Ordering::Relaxed) % 2 == 1 {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-le").await;
            }
            // SO_LINGER 0: the close sends a reset, not a FIN.
            let _ = stream.set_zero_linger();
            return (Answer::Cut, false);
        }
        Mode::Down => return (Answer::Cut, false),
    };
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Answer",
    };
    let head = format!("HTTP/1.1 {status} {reason}\r\ncontent-length: 2\r\n\r\nok");
    match stream.write_all(head.as_bytes()).await {
        Ok(()) if (200..300).contains(&status) => (Answer::Effect, true),
        Ok(()) => (Answer::Status(status), true),
        Err(_) => (Answer::Cut, false),
    }
}

/// Reads one request (head and `Content-Length` body) from `stream`, with
/// what is left of earlier reads in `buffered`; `None` when the peer
/// closed between requests.
async fn read_request(
    stream: &mut TcpStream,
    buffered: &mut Vec<u8>,
) -> anyhow::Result<Option<Arrival>> {
    let head_end = loop {
        if let Some(at) = buffered.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if buffered.len() > MAX_HEAD {
            bail!("request head too large");
        }
        if !fill(stream, buffered).await? {
            if buffered.is_empty() {
                return Ok(None);
            }
            bail!("closed mid-request");
        }
    };
    let head = std::str::from_utf8(&buffered[..head_end]).context("head is not UTF-8")?;
    let header = |name: &str| {
        head.split("\r\n").skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let length: usize = match header("content-length") {
        Some(v) => v.parse().context("bad content-length")?,
        None => 0,
    };
    if length > MAX_BODY {
        bail!("body too large");
    }
    let key = header("idempotency-key").unwrap_or_default();
    let delivery = header("x-github-delivery").unwrap_or_default();
    while buffered.len() < head_end + length {
        if !fill(stream, buffered).await? {
            bail!("closed mid-body");
        }
    }
    let body = Sha256::digest(&buffered[head_end..head_end + length]).into();
    buffered.drain(..head_end + length);
    Ok(Some(Arrival {
        key,
        delivery,
        body,
        at: Instant::now(),
        answer: Answer::Cut,
    }))
}

/// Reads more into `buffered`; false at the end of the stream.
async fn fill(stream: &mut TcpStream, buffered: &mut Vec<u8>) -> anyhow::Result<bool> {
    let mut chunk = [0u8; 16 * 1024];
    let n = stream.read(&mut chunk).await?;
    buffered.extend_from_slice(&chunk[..n]);
    Ok(n > 0)
}
