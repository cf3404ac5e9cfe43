//! A local HTTP server standing for a `forward` receiver: it records every
//! request and answers as the test scripts it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};

/// One received request.
#[derive(Clone, Debug)]
pub struct Received {
    /// Lower-case header names and their values.
    pub headers: HashMap<String, String>,
    /// The raw body.
    pub body: Vec<u8>,
    /// When it arrived.
    pub at: std::time::Instant,
}

impl Received {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// How to answer one request.
#[derive(Clone, Debug)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Extra response headers.
    pub headers: Vec<(String, String)>,
    /// Wait this long before answering.
    pub delay: Duration,
    /// The answer's body.
    pub body: Vec<u8>,
}

impl Reply {
    /// A plain answer with `status`.
    pub fn status(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            delay: Duration::ZERO,
            body: Vec::new(),
        }
    }
}

type Script = dyn Fn(&Received, usize) -> Reply + Send + Sync;

struct State {
    received: Mutex<Log>,
    script: Box<Script>,
}

/// Every request, and how many carried each idempotency key.
#[derive(Default)]
struct Log {
    all: Vec<Received>,
    per_key: HashMap<Option<String>, usize>,
}

/// A running receiver.
pub struct Receiver {
    /// `http://127.0.0.1:<port>/hook`.
    pub url: String,
    state: Arc<State>,
    handle: actix_web::dev::ServerHandle,
}

async fn receive(req: HttpRequest, body: web::Bytes, state: web::Data<State>) -> HttpResponse {
    let received = Received {
        headers: req
            .headers()
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect(),
        body: body.to_vec(),
        at: std::time::Instant::now(),
    };
    // How many earlier requests carried the same idempotency key.
    let seen = {
        let mut log = state.received.lock().expect("lock");
        let key = received.header("idempotency-key").map(str::to_owned);
        let count = log.per_key.entry(key).or_default();
        let seen = *count;
        *count += 1;
        log.all.push(received.clone());
        seen
    };
    let reply = (state.script)(&received, seen);
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut response =
        HttpResponse::build(actix_web::http::StatusCode::from_u16(reply.status).expect("status"));
    for (k, v) in reply.headers {
        // `Connection: close` closes the connection after the answer, so
        // that the next request connects (and resolves) again.
        if k.eq_ignore_ascii_case("connection") && v.eq_ignore_ascii_case("close") {
            response.force_close();
            continue;
        }
        response.insert_header((k, v));
    }
    response.body(reply.body)
}

impl Receiver {
    /// Starts a receiver that answers with `script(request, earlier
    /// requests with the same idempotency key)`.
    pub async fn start(script: impl Fn(&Received, usize) -> Reply + Send + Sync + 'static) -> Self {
        let state = Arc::new(State {
            received: Mutex::new(Log::default()),
            script: Box::new(script),
        });
        let data = web::Data::from(state.clone());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::PayloadConfig::new(64 * 1024 * 1024))
                .default_service(web::to(receive))
        })
        .workers(1)
        .disable_signals()
        .listen(listener)
        .expect("listen")
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self {
            url: format!("http://127.0.0.1:{port}/hook"),
            state,
            handle,
        }
    }

    /// A receiver that accepts everything.
    pub async fn ok() -> Self {
        Self::start(|_, _| Reply::status(200)).await
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().expect("lock").all.clone()
    }

    /// Stops it.
    pub async fn stop(&self) {
        self.handle.stop(false).await;
    }
}
