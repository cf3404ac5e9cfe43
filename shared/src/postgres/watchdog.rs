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
            if config.get_hosts().iter().all(|h| matches!(h, Host::Tcp(_))) {
                let read_write = config.get_target_session_attrs() == TargetSessionAttrs::ReadWrite;
                for i in 0..config.get_hosts().len() {
                    let Some(stream) = tcp(&config, i).await else {
                        continue;
                    };
                    let Ok((client, connection)) = config
                        .connect_raw(Watchdog::new(stream, request_timeout), NoTls)
                        .await
                    else {
                        continue;
                    };
                    let connection = spawn(connection);
                    // Why: `connect_raw` skips `target_session_attrs`; a
                    // standby (or a primary being demoted) must never be
                    // handed out for writes.
                    if read_write && !takes_writes(&client).await {
                        connection.abort();
                        continue;
                    }
                    return Ok((client, connection));
                }
            }
            // No host would do (or a socket): tokio-postgres tries them
            // again and says why (its errors cannot be built outside it).
            let (client, connection) = config.connect(NoTls).await?;
            Ok((client, spawn(connection)))
        })
    }
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

/// Fails reads once a write has had no byte of answer for `timeout`.
/// An idle connection (nothing written since the last answer) never
/// times out.
struct Watchdog {
    inner: TcpStream,
    timeout: Duration,
    timer: Pin<Box<Sleep>>,
    waiting: bool,
}

impl Watchdog {
    fn new(inner: TcpStream, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            timer: Box::pin(tokio::time::sleep(timeout)),
            waiting: false,
        }
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
                if buf.filled().len() > before {
                    self.waiting = false;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if self.waiting && self.timer.as_mut().poll(cx).is_ready() => {
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
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) && !self.waiting {
            // The clock starts at the first unanswered write.
            self.waiting = true;
            let at = Instant::now() + self.timeout;
            self.timer.as_mut().reset(at);
            // Registers this task with the timer, so that a read
            // pending with no traffic still wakes at the deadline.
            let _ = self.timer.as_mut().poll(cx);
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
