//! Admission of bodies that are not yet verified: what an unsigned client
//! can take before its signature is checked is bounded here.
//!
//! - **Memory:** every byte buffered for a body, across all requests, is
//!   taken from one budget (`HOOKINBOX_MAX_BUFFERED_BYTES`) as it arrives,
//!   never from a declared length. Once three quarters of it are taken a
//!   new body is refused at once (503, `Retry-After`), while the bodies
//!   inside may grow into the last quarter; a body that would pass the
//!   whole budget is refused as it grows. Bodies are kept as the chunks
//!   that arrived (`body`), never in a buffer that grows by copying, so
//!   what is counted is what is held. Bodies that declare more than [`LARGE_BODY`] (or no
//!   length) share at most half the budget, so the small bodies GitHub
//!   mostly sends still find room while large ones are flooded in; and
//!   one client holds at most a quarter (each at least one largest body
//!   while it grows).
//! - **Slots:** a body being received holds a *receiving* slot
//!   (`HOOKINBOX_MAX_RECEIVING`), not one of the slots for verified work
//!   (`HOOKINBOX_MAX_IN_FLIGHT`, taken after the signature), so
//!   connections that trickle bytes never take a signed delivery's slot.
//! - **Per client:** one client (the peer, or the client a trusted proxy
//!   names) may send at most `HOOKINBOX_MAX_UNVERIFIED_PER_CLIENT`
//!   unverified bodies at once, and hold at most a quarter of the budget.
//!
//! The pace of a body (a minimum rate, a deadline that grows with the
//! declared length) is enforced where it is read, in `body`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use actix_web::HttpRequest;
use actix_web::http::StatusCode;
use hookinbox::client::{self, TrustedProxies};
use hookinbox::config::IngestConfig;

use crate::answer::{Outcome, Reject};

/// A body that declares more than this (or no length) is large: all
/// unverified large bodies together hold at most half the budget.
pub(crate) const LARGE_BODY: usize = 1024 * 1024;

/// The budget, the slots and the clients' shares, shared by all requests.
pub(crate) struct Admission {
    budget: usize,
    /// What unverified large bodies may hold together.
    large_budget: usize,
    /// New bodies are let in only while less than this is taken.
    admit_below: usize,
    client_budget: usize,
    max_receiving: usize,
    per_client: usize,
    trusted: TrustedProxies,
    ledger: Mutex<Ledger>,
}

/// What is taken now.
#[derive(Default)]
struct Ledger {
    buffered: usize,
    /// Bytes of unverified large bodies.
    large: usize,
    receiving: usize,
    clients: HashMap<IpAddr, Share>,
}

/// One client's unverified bodies and their bytes.
#[derive(Default)]
struct Share {
    bodies: usize,
    bytes: usize,
}

impl Admission {
    /// The limits of `config`.
    pub(crate) fn new(config: &IngestConfig) -> Arc<Self> {
        let budget = config.max_buffered_bytes;
        let one_body = IngestConfig::held_body_bytes(config.max_body_bytes);
        Arc::new(Self {
            budget,
            large_budget: (budget / 2).max(one_body),
            admit_below: budget / 4 * 3,
            client_budget: (budget / 4).max(one_body),
            max_receiving: config.max_receiving,
            per_client: config.max_unverified_per_client,
            trusted: config.trusted_proxies.clone(),
            ledger: Mutex::new(Ledger::default()),
        })
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // A panic while the lock is held leaves counts, never broken
        // memory: keep serving with them.
        self.ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Lets a request start receiving its body, or refuses it: three
    /// quarters of the budget are taken (503), every receiving slot is
    /// taken (503), or its client already sends its share of unverified
    /// bodies (429).
    pub(crate) fn enter(
        self: &Arc<Self>,
        req: &HttpRequest,
        declared: Option<usize>,
    ) -> Result<Ticket, Reject> {
        let large = declared.is_none_or(|n| n > LARGE_BODY);
        let client = client::bucket(client::client(req, &self.trusted));
        let mut ledger = self.ledger();
        if ledger.buffered >= self.admit_below
            || (large && ledger.large >= self.large_budget / 4 * 3)
        {
            return Err(over_budget());
        }
        if ledger.receiving >= self.max_receiving {
            return Err(Reject::new(
                StatusCode::SERVICE_UNAVAILABLE,
                Outcome::ReceivingFull,
                "too many bodies are being received, retry later",
            )
            .retry_after(1));
        }
        let share = ledger.clients.entry(client).or_default();
        if share.bodies >= self.per_client {
            return Err(Reject::new(
                StatusCode::TOO_MANY_REQUESTS,
                Outcome::ClientShare,
                "this client sends too many bodies at once, retry later",
            )
            .retry_after(1));
        }
        share.bodies += 1;
        ledger.receiving += 1;
        publish(&ledger);
        Ok(Ticket {
            admission: self.clone(),
            client,
            bytes: 0,
            unverified_bytes: 0,
            receiving: true,
            large,
        })
    }
}

fn over_budget() -> Reject {
    Reject::new(
        StatusCode::SERVICE_UNAVAILABLE,
        Outcome::OverBudget,
        "too many bytes are being received, retry later",
    )
    .retry_after(1)
}

fn publish(ledger: &Ledger) {
    metrics::gauge!(hookinbox::metrics::INGEST_BUFFERED_BYTES).set(ledger.buffered as f64);
    metrics::gauge!(hookinbox::metrics::INGEST_RECEIVING).set(ledger.receiving as f64);
}

/// One request's place: its receiving slot until its body is verified, and
/// the bytes its body holds until the request ends (on drop).
pub(crate) struct Ticket {
    admission: Arc<Admission>,
    client: IpAddr,
    bytes: usize,
    unverified_bytes: usize,
    receiving: bool,
    large: bool,
}

impl Ticket {
    /// Takes `n` more bytes for a body that grows, before they are
    /// allocated; refuses (503) when the budget or (429) the client's share
    /// would pass.
    pub(crate) fn reserve(&mut self, n: usize) -> Result<(), Reject> {
        let admission = &self.admission;
        let mut ledger = admission.ledger();
        if ledger.buffered + n > admission.budget {
            return Err(over_budget());
        }
        if self.receiving {
            if self.large && ledger.large + n > admission.large_budget {
                return Err(over_budget());
            }
            let share = ledger.clients.entry(self.client).or_default();
            if share.bytes + n > admission.client_budget {
                return Err(Reject::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    Outcome::ClientShare,
                    "this client sends too many bytes at once, retry later",
                )
                .retry_after(1));
            }
            share.bytes += n;
            self.unverified_bytes += n;
            if self.large {
                ledger.large += n;
            }
        }
        ledger.buffered += n;
        self.bytes += n;
        publish(&ledger);
        Ok(())
    }

    /// Takes `n` bytes without refusing: for a verified body being
    /// assembled, which must not be lost for want of room.
    pub(crate) fn force(&mut self, n: usize) {
        let mut ledger = self.admission.ledger();
        ledger.buffered += n;
        self.bytes += n;
        publish(&ledger);
    }

    /// Gives back `n` bytes (parts once copied into one body).
    pub(crate) fn release(&mut self, n: usize) {
        let n = n.min(self.bytes);
        let mut ledger = self.admission.ledger();
        ledger.buffered -= n;
        self.bytes -= n;
        if self.receiving {
            let n = n.min(self.unverified_bytes);
            self.unverified_bytes -= n;
            if let Some(share) = ledger.clients.get_mut(&self.client) {
                share.bytes = share.bytes.saturating_sub(n);
            }
            if self.large {
                ledger.large = ledger.large.saturating_sub(n);
            }
        }
        publish(&ledger);
    }

    /// The body is verified: it leaves its receiving slot and its client's
    /// share; its bytes stay in the budget until the request ends.
    pub(crate) fn verified(&mut self) {
        if !self.receiving {
            return;
        }
        self.receiving = false;
        let mut ledger = self.admission.ledger();
        ledger.receiving -= 1;
        release_share(&mut ledger, self.client, self.unverified_bytes);
        if self.large {
            ledger.large = ledger.large.saturating_sub(self.unverified_bytes);
        }
        self.unverified_bytes = 0;
        publish(&ledger);
    }
}

fn release_share(ledger: &mut Ledger, client: IpAddr, bytes: usize) {
    if let Some(share) = ledger.clients.get_mut(&client) {
        share.bodies = share.bodies.saturating_sub(1);
        share.bytes = share.bytes.saturating_sub(bytes);
        if share.bodies == 0 {
            ledger.clients.remove(&client);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut ledger = self.admission.ledger();
        ledger.buffered = ledger.buffered.saturating_sub(self.bytes);
        if self.receiving {
            ledger.receiving -= 1;
            release_share(&mut ledger, self.client, self.unverified_bytes);
            if self.large {
                ledger.large = ledger.large.saturating_sub(self.unverified_bytes);
            }
        }
        publish(&ledger);
    }
}
