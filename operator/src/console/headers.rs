//! What every answer of the console carries, and the one check that runs
//! before any handler under `--insecure-loopback`.
//!
//! - `Content-Security-Policy`: only the console's own resources (its
//!   stylesheet; no script at all), never framed, forms post to itself.
//!   The pages hold no inline script or style for it to block.
//! - `X-Frame-Options: DENY` for browsers without `frame-ancestors`,
//!   `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`.
//! - `Cache-Control: no-store` on everything (payloads, CSRF tokens and
//!   session lists must not sit in a cache); the stylesheet sets its own.
//! - Under `--insecure-loopback` (no tokens), a request whose `Host` is
//!   not a loopback name gets 421: a DNS name rebound to 127.0.0.1 could
//!   otherwise drive the console from a web page.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{StatusCode, header};
use actix_web::middleware::{DefaultHeaders, Next};
use actix_web::{Error, HttpResponse, web};

use super::config::Access;
use super::state::State;

/// The policy: the console's own origin only.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; frame-ancestors 'none'; \
     form-action 'self'; base-uri 'none'; object-src 'none'";

/// The headers every answer carries (a handler's own win).
pub fn security_headers() -> DefaultHeaders {
    DefaultHeaders::new()
        .add((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
        .add((header::X_FRAME_OPTIONS, "DENY"))
        .add((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .add((header::REFERRER_POLICY, "no-referrer"))
        .add((header::CACHE_CONTROL, "no-store"))
}

/// Whether `host` (a `Host` header: a name or address, with or without a
/// port) names this machine's loopback: `localhost`, `127.x.y.z`, `[::1]`.
pub fn is_loopback_host(host: &str) -> bool {
    let port_ok = |p: &str| p.is_empty() || (p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    if let Some(rest) = host.strip_prefix('[') {
        let Some((addr, after)) = rest.split_once(']') else {
            return false;
        };
        let port = match after.strip_prefix(':') {
            Some(p) if !p.is_empty() => p,
            Some(_) => return false,
            None if after.is_empty() => "",
            None => return false,
        };
        return port_ok(port)
            && addr
                .parse::<std::net::Ipv6Addr>()
                .is_ok_and(|a| a.is_loopback());
    }
    let (name, port) = match host.split_once(':') {
        Some((_, "")) => return false,
        Some((name, port)) => (name, port),
        None => (host, ""),
    };
    port_ok(port)
        && (name.eq_ignore_ascii_case("localhost")
            || name
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(|a| a.is_loopback()))
}

/// Under `--insecure-loopback`, answers 421 to a request for any other
/// host; with tokens, lets every request through.
pub async fn loopback_hosts_only(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    let insecure = req
        .app_data::<web::Data<State>>()
        .is_some_and(|s| matches!(s.access, Access::InsecureLoopback));
    if insecure {
        let host = req
            .uri()
            .authority()
            .map(|a| a.as_str().to_owned())
            .or_else(|| {
                req.headers()
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .map(str::to_owned)
            });
        if !host.as_deref().is_some_and(is_loopback_host) {
            let answer = HttpResponse::build(StatusCode::MISDIRECTED_REQUEST)
                .content_type("text/plain; charset=utf-8")
                .body(
                    "This console runs without tokens (--insecure-loopback) and answers only \
                     to a loopback host: localhost, 127.0.0.1 or [::1].\n",
                );
            return Ok(req.into_response(answer));
        }
    }
    Ok(next.call(req).await?.map_into_boxed_body())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_names_are_loopback_hosts() {
        for good in [
            "localhost",
            "LOCALHOST:9900",
            "127.0.0.1",
            "127.0.0.1:9900",
            "127.8.9.10:1",
            "[::1]",
            "[::1]:9900",
        ] {
            assert!(is_loopback_host(good), "{good}");
        }
        for bad in [
            "",
            "evil.example",
            "evil.example:9900",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "10.0.0.1:9900",
            "0.0.0.0:9900",
            "[::2]:9900",
            "[::1",
            "[::1]x",
            "[::1]:",
            "localhost:",
            "localhost:99999999",
            "localhost:80:80",
            "::1",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }
}
