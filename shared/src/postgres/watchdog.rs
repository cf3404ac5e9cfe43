//! A TCP stream for tokio-postgres that fails once a request has gone
//! unanswered for too long.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_postgres::NoTls;
use tokio_postgres::config::{Host, TargetSessionAttrs};

/// Connects through a [`Watchdog`] stream.
pub(super) struct Connect {
    pub(super) request_timeout: Duration,
}

impl deadpool_postgres::Connect for Connect {
    fn connect(
        &self,
        config: &tokio_postgres::Config,
    ) -> BoxFuture<
        '_,
        Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
    > {
        let config = config.clone();
        let request_timeout = self.request_timeout;
        Box::pin(async move {
            // A Unix socket cannot be half-open across a network: such a
            // host is connected by tokio-postgres itself.
            if !config.get_hosts().iter().all(|h| matches!(h, Host::Tcp(_))) {
                let (client, connection) = config.connect(NoTls).await?;
                return Ok((client, spawn(connection)));
            }
            loop {
                if let Some(watched) = watched(&config, request_timeout).await {
                    return Ok(watched);
                }
                // No host would do: tokio-postgres tries them again and
                // says why (its errors cannot be built outside it). If it
                // gets in (a server that came up meanwhile), its connection
                // is closed unused and the hosts are tried again. Why: a
                // connection without the watchdog, handed out after a
                // restart, hung a request for good once it went half-open.
                // The pool's create timeout bounds the loop.
                let (client, connection) = config.connect(NoTls).await?;
                drop((client, connection));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    }
}

/// A connection through a [`Watchdog`] to the first of `config`'s hosts
/// that accepts one (and, with `target_session_attrs=read-write`, takes
/// writes); `None` when none does.
async fn watched(
    config: &tokio_postgres::Config,
    request_timeout: Duration,
) -> Option<(tokio_postgres::Client, tokio::task::JoinHandle<()>)> {
    let read_write = config.get_target_session_attrs() == TargetSessionAttrs::ReadWrite;
    for i in 0..config.get_hosts().len() {
        let Some(stream) = tcp(config, i).await else {
            continue;
        };
        let Ok((client, connection)) = config
            .connect_raw(Watchdog::new(stream, request_timeout), NoTls)
            .await
        else {
            continue;
        };
        let connection = spawn(connection);
        // Why: `connect_raw` skips `target_session_attrs`; a standby (or a
        // primary being demoted) must never be handed out for writes.
        if read_write && !takes_writes(&client).await {
            connection.abort();
            continue;
        }
        return Some((client, connection));
    }
    None
}

/// Whether the server behind `client` takes writes (not a standby, nor
/// read-only by default), as libpq's `target_session_attrs=read-write`
/// asks.
async fn takes_writes(client: &tokio_postgres::Client) -> bool {
    let Ok(messages) = client.simple_query("SHOW transaction_read_only").await else {
        return false;
    };
    messages.iter().any(
        |m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(row) if row.get(0) == Some("off")),
    )
}

fn spawn<F>(connection: F) -> tokio::task::JoinHandle<()>
where
    F: Future<Output = Result<(), tokio_postgres::Error>> + Send + 'static,
{
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "Postgres connection ended");
        }
    })
}

/// A TCP connection to `config`'s host `i`, if it accepts one in time.
async fn tcp(config: &tokio_postgres::Config, i: usize) -> Option<TcpStream> {
    let ports = config.get_ports();
    let timeout = config
        .get_connect_timeout()
        .copied()
        .unwrap_or(Duration::from_secs(5));
    let Some(Host::Tcp(name)) = config.get_hosts().get(i) else {
        return None;
    };
    let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let Ok(Ok(stream)) =
        tokio::time::timeout(timeout, TcpStream::connect((name.as_str(), port))).await
    else {
        return None;
    };
    let _ = stream.set_nodelay(true);
    let keepalive = socket2::TcpKeepalive::new().with_time(Duration::from_secs(30));
    let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
    Some(stream)
}

/// Fails reads once a request has gone `timeout` without a byte of its
/// answer. A connection with no request outstanding (every request
/// answered up to its `ReadyForQuery`) never times out.
///
/// Why count the protocol's messages rather than bytes: an answer may
/// come in pieces (a pooler such as PgBouncer forwards each as it gets
/// it), and two requests may be written before the first is answered
/// (a dropped statement's `Close`, then the next statement); a
/// connection that goes half-open between two pieces, or between the two
/// answers, still owes the rest. Disarmed by the first byte, the watchdog
/// let such a request wait forever, and the job behind it hold its
/// message unacked until the worker stopped. So each request the client
/// writes (the startup message, each `Sync`, each simple `Query`) is owed
/// one `ReadyForQuery`; while one is owed, every byte read restarts the
/// clock, and `timeout` of silence fails the connection.
struct Watchdog {
    inner: TcpStream,
    timeout: Duration,
    timer: Pin<Box<Sleep>>,
    /// What the client wrote: requests that owe an answer.
    sent: Frames,
    /// What the server wrote: the answers that ended.
    received: Frames,
    /// `ReadyForQuery` messages still owed.
    owed: u64,
}

impl Watchdog {
    fn new(inner: TcpStream, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            timer: Box::pin(tokio::time::sleep(timeout)),
            sent: Frames::new(true),
            received: Frames::new(false),
            owed: 0,
        }
    }

    /// Restarts the clock and registers this task with the timer, so that
    /// a read pending with no traffic still wakes at the deadline.
    fn restart(&mut self, cx: &mut Context<'_>) {
        let at = Instant::now() + self.timeout;
        self.timer.as_mut().reset(at);
        let _ = self.timer.as_mut().poll(cx);
    }
}

impl AsyncRead for Watchdog {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                if !read.is_empty() {
                    let answered = self.received.feed(read);
                    self.owed = self.owed.saturating_sub(answered);
                    if self.owed > 0 {
                        // The server is talking: its answer is not stuck.
                        self.restart(cx);
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if self.owed > 0 && self.timer.as_mut().poll(cx).is_ready() => {
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "Postgres did not answer in time",
                )))
            }
            other => other,
        }
    }
}

impl AsyncWrite for Watchdog {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written
            && n > 0
        {
            let requests = self.sent.feed(&buf[..n]);
            if requests > 0 {
                // The clock starts at the first request owed an answer.
                if self.owed == 0 {
                    self.restart(cx);
                }
                self.owed += requests;
            }
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The message framing of one direction of the protocol, fed the bytes as
/// they pass: each message is a type byte and a 4-byte length (counting
/// itself), except the client's first, the startup message, which has no
/// type byte (<https://www.postgresql.org/docs/current/protocol-message-formats.html>).
struct Frames {
    /// The client's side: counts the messages that each owe one
    /// `ReadyForQuery` (`S` Sync, `Q` Query, and the startup message).
    /// The server's side: counts `Z` (`ReadyForQuery`).
    client: bool,
    /// The next message is the untyped startup message.
    untyped: bool,
    /// The header read so far of the message being framed.
    header: [u8; 5],
    header_len: usize,
    /// Body bytes of the current message still to pass.
    body_left: usize,
}

impl Frames {
    /// The client's side (`true`, which begins with the startup message)
    /// or the server's.
    fn new(client: bool) -> Self {
        Self {
            client,
            untyped: client,
            header: [0; 5],
            header_len: 0,
            body_left: 0,
        }
    }

    /// Takes the next bytes of the stream; returns how many of the
    /// messages it counts (see `client`) began in them.
    fn feed(&mut self, mut bytes: &[u8]) -> u64 {
        let mut counted = 0;
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let skip = self.body_left.min(bytes.len());
                self.body_left -= skip;
                bytes = &bytes[skip..];
                continue;
            }
            let header_size = if self.untyped { 4 } else { 5 };
            let take = (header_size - self.header_len).min(bytes.len());
            self.header[self.header_len..self.header_len + take].copy_from_slice(&bytes[..take]);
            self.header_len += take;
            bytes = &bytes[take..];
            if self.header_len < header_size {
                break;
            }
            let (kind, length) = if self.untyped {
                (None, &self.header[..4])
            } else {
                (Some(self.header[0]), &self.header[1..5])
            };
            let length = u32::from_be_bytes([length[0], length[1], length[2], length[3]]) as usize;
            // The length counts itself (and, untyped, nothing else).
            self.body_left = length.saturating_sub(4);
            counted += u64::from(match (self.client, kind) {
                (true, None) => true,
                (true, Some(kind)) => kind == b'S' || kind == b'Q',
                (false, kind) => kind == Some(b'Z'),
            });
            self.untyped = false;
            self.header_len = 0;
        }
        counted
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A message: its type, then its length and body.
    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn startup() -> Vec<u8> {
        let body = b"\0\x03\0\0user\0postgres\0\0";
        let mut m = (body.len() as u32 + 4).to_be_bytes().to_vec();
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn requests_and_answers_are_counted_whatever_the_pieces() {
        let mut requests = startup();
        for kind in [b'P', b'B', b'E', b'S', b'Q', b'X'] {
            requests.extend(message(kind, b"select 1\0"));
        }
        let mut answers = Vec::new();
        for kind in [b'R', b'S', b'Z', b'1', b'2', b'D', b'C', b'Z', b'C', b'Z'] {
            answers.extend(message(kind, &[b'I'; 7]));
        }
        for piece in [1, 2, 3, 5, 7, 64] {
            let mut sent = Frames::new(true);
            let counted: u64 = requests.chunks(piece).map(|c| sent.feed(c)).sum();
            assert_eq!(counted, 3, "startup, Sync and Query, in pieces of {piece}");
            let mut received = Frames::new(false);
            let counted: u64 = answers.chunks(piece).map(|c| received.feed(c)).sum();
            assert_eq!(counted, 3, "three ReadyForQuery, in pieces of {piece}");
        }
    }

    /// A connection through the watchdog, and the server's end of it,
    /// after the client wrote `requests` and the server answered `answer`
    /// (all of it read by the client). The server's end stays open, silent.
    async fn exchanged(requests: &[u8], answer: &[u8]) -> (Watchdog, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (mut server, _) = listener.accept().await.expect("accept");
        let mut client = Watchdog::new(client, TIMEOUT);
        client.write_all(requests).await.expect("write");
        let mut got = vec![0u8; requests.len()];
        server.read_exact(&mut got).await.expect("server reads");
        server.write_all(answer).await.expect("server writes");
        let mut buf = vec![0u8; answer.len()];
        client
            .read_exact(&mut buf)
            .await
            .expect("the answer that came");
        (client, server)
    }

    const TIMEOUT: Duration = Duration::from_millis(200);

    /// The client's next read fails with a timeout, after [`TIMEOUT`].
    async fn times_out(client: &mut Watchdog) {
        let started = tokio::time::Instant::now();
        let read = client.read(&mut [0u8; 64]).await;
        assert_eq!(
            read.expect_err("an answer is owed").kind(),
            io::ErrorKind::TimedOut
        );
        assert!(started.elapsed() >= TIMEOUT);
    }

    #[tokio::test]
    async fn an_answer_that_stops_half_way_fails_the_read_and_a_whole_one_does_not() {
        // The startup's answer whole, then half of the Sync's: a
        // CommandComplete without its ReadyForQuery.
        let mut requests = startup();
        requests.extend(message(b'S', b""));
        let mut answer = message(b'R', &[0; 4]);
        answer.extend(message(b'Z', b"I"));
        answer.extend(message(b'C', b"SELECT 1\0"));
        let (mut client, _server) = exchanged(&requests, &answer).await;
        times_out(&mut client).await;

        // Nothing owed: an idle connection waits for as long as it takes.
        let (mut client, _server) = exchanged(&startup(), &message(b'Z', b"I")).await;
        let idle = tokio::time::timeout(TIMEOUT * 3, client.read(&mut [0u8; 64])).await;
        assert!(idle.is_err(), "an idle connection never times out");
    }

    #[tokio::test]
    async fn a_second_request_written_before_the_first_was_answered_is_watched_too() {
        // The startup, then a statement's Close and Sync, then a commit,
        // written before any answer; the startup's and the Close's answers
        // come, the commit's never does.
        let mut requests = startup();
        requests.extend(message(b'C', b"Ss1\0"));
        requests.extend(message(b'S', b""));
        requests.extend(message(b'Q', b"commit\0"));
        let mut answer = message(b'Z', b"I");
        answer.extend(message(b'3', b""));
        answer.extend(message(b'Z', b"T"));
        let (mut client, _server) = exchanged(&requests, &answer).await;
        times_out(&mut client).await;
    }
}
