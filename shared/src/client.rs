//! Who the client is (for the console's sign-in throttle and session list,
//! and for ingest's share of unverified bodies): the peer's address, or,
//! when the peer is one of the trusted proxies
//! (`HOOKINBOX_ADMIN_TRUSTED_PROXIES`, `HOOKINBOX_TRUSTED_PROXIES`), the
//! address it forwarded in
//! `X-Forwarded-For`. A header from anyone else is ignored: it could be
//! forged to dodge the throttle or to throttle someone else. Also GitHub's
//! webhook ranges ([`HookRanges`]), which ingest may admit alone.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use actix_web::HttpRequest;
use actix_web::http::header::HeaderMap;
use ipnet::IpNet;

/// The proxies whose `X-Forwarded-For` and `X-Forwarded-Proto` are
/// believed: a list of CIDRs (a bare address is its own /32 or /128).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

impl FromStr for TrustedProxies {
    type Err = String;

    /// Parses a comma-separated list; blanks around items are ignored and
    /// an empty list trusts nobody.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_networks(s.split(',')).map(Self)
    }
}

/// Parses each item as a CIDR or an address (its own /32 or /128),
/// truncated to its prefix; blank items are skipped; the error names the
/// item.
pub fn parse_networks<'a>(items: impl IntoIterator<Item = &'a str>) -> Result<Vec<IpNet>, String> {
    let mut nets = Vec::new();
    for item in items.into_iter().map(str::trim).filter(|i| !i.is_empty()) {
        let net = item
            .parse::<IpNet>()
            .or_else(|_| item.parse::<IpAddr>().map(IpNet::from))
            .map_err(|_| format!("'{item}' is neither an address nor a CIDR such as 10.0.0.0/8"))?;
        nets.push(net.trunc());
    }
    Ok(nets)
}

impl TrustedProxies {
    /// Whether `ip` is one of them.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// Whether no proxy is trusted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// An IPv4 address written as IPv6 (`::ffff:a.b.c.d`, as a dual-stack
/// socket reports it) is the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// One `X-Forwarded-For` item: an address, with or without a port.
fn forwarded_item(item: &str) -> Option<IpAddr> {
    let item = item.trim();
    item.parse::<IpAddr>()
        .ok()
        .or_else(|| item.parse::<SocketAddr>().ok().map(|a| a.ip()))
        .map(canonical)
}

/// The addresses GitHub sends webhooks from: the `hooks` ranges of the
/// answer of GitHub's `GET /meta` (<https://api.github.com/meta>), for
/// ingest's optional allow-list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookRanges(Vec<IpNet>);

impl HookRanges {
    /// Reads the `hooks` array of a `/meta` answer: at least one CIDR, each
    /// one parsing. Says what is wrong otherwise.
    pub fn from_meta(json: &[u8]) -> Result<Self, String> {
        let meta: serde_json::Value =
            serde_json::from_slice(json).map_err(|e| format!("is not JSON: {e}"))?;
        let hooks = meta
            .get("hooks")
            .and_then(|h| h.as_array())
            .ok_or("has no \"hooks\" array (GitHub's /meta answer has one)")?;
        let ranges = hooks
            .iter()
            .map(|h| {
                let text = h.as_str().ok_or(format!("{h} in \"hooks\" is not text"))?;
                text.parse::<IpNet>()
                    .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| format!("{text:?} in \"hooks\" is not a CIDR"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if ranges.is_empty() {
            return Err("lists no \"hooks\" range: every request would be refused".to_owned());
        }
        Ok(Self(ranges))
    }

    /// Whether `ip` is in one of the ranges.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// How many ranges.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true once read (an empty list is refused).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The client behind `peer`: the peer itself unless it is a trusted
/// proxy; then the right-most `X-Forwarded-For` address that is not a
/// trusted proxy (each proxy appends the address it got the request
/// from, so the items left of the last untrusted one could be anything
/// the client wrote). An item that is not an address stops the walk at
/// the last trusted hop.
pub fn client_of(peer: IpAddr, headers: &HeaderMap, trusted: &TrustedProxies) -> IpAddr {
    let peer = canonical(peer);
    if !trusted.contains(peer) {
        return peer;
    }
    let items: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .collect();
    let mut client = peer;
    for item in items.iter().rev() {
        match forwarded_item(item) {
            Some(ip) if trusted.contains(ip) => client = ip,
            Some(ip) => return ip,
            None => return client,
        }
    }
    client
}

/// The client of a request (see [`client_of`]).
pub fn client(req: &HttpRequest, trusted: &TrustedProxies) -> IpAddr {
    let peer = req
        .peer_addr()
        .map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip());
    client_of(peer, req.headers(), trusted)
}

/// Whether a request reached a trusted proxy over https: its
/// `X-Forwarded-Proto` says so and the peer is a trusted proxy.
pub fn forwarded_https(req: &HttpRequest, trusted: &TrustedProxies) -> bool {
    let from_proxy = req.peer_addr().is_some_and(|a| trusted.contains(a.ip()));
    from_proxy
        && req
            .headers()
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').next())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

/// The key failures are counted under: an IPv4 address, or the /64 of an
/// IPv6 one (a single host is usually given a whole /64).
pub fn bucket(ip: IpAddr) -> IpAddr {
    match canonical(ip) {
        IpAddr::V6(v6) => {
            let mut segments = v6.segments();
            segments[4..].fill(0);
            IpAddr::from(segments)
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_ranges_come_from_the_meta_answer() {
        let meta = br#"{"verifiable_password_authentication": false,
            "hooks": ["192.30.252.0/22", "185.199.108.0/22", "2a0a:a440::/29", "140.82.115.9"],
            "web": ["1.2.3.4/32"]}"#;
        let ranges = HookRanges::from_meta(meta).expect("parses");
        assert_eq!(ranges.len(), 4);
        for inside in [
            "192.30.252.1",
            "185.199.111.255",
            "2a0a:a440::1",
            "140.82.115.9",
            "::ffff:192.30.252.7",
        ] {
            assert!(ranges.contains(inside.parse().expect("ip")), "{inside}");
        }
        for outside in ["1.2.3.4", "192.30.256.1", "127.0.0.1"]
            .iter()
            .filter_map(|s| s.parse::<IpAddr>().ok())
        {
            assert!(!ranges.contains(outside), "{outside}");
        }
        for bad in [
            &b"[]"[..],
            b"{}",
            b"{\"hooks\": []}",
            b"{\"hooks\": [\"nope\"]}",
            b"not json",
        ] {
            assert!(HookRanges::from_meta(bad).is_err());
        }
    }
    use actix_web::http::header::{HeaderName, HeaderValue};

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append(
                HeaderName::from_static("x-forwarded-for"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn a_list_of_cidrs_and_addresses_parses_and_a_bad_item_is_named() {
        let t: TrustedProxies = " 10.0.0.0/8, 192.168.1.7 ,fd00::/8,".parse().expect("ok");
        assert!(t.contains(ip("10.1.2.3")));
        assert!(t.contains(ip("192.168.1.7")));
        assert!(!t.contains(ip("192.168.1.8")));
        assert!(t.contains(ip("fd00::1")));
        assert!(t.contains(ip("::ffff:10.0.0.1")), "a mapped address");
        assert!("".parse::<TrustedProxies>().expect("ok").is_empty());
        let e = "10.0.0.0/8,proxy.local".parse::<TrustedProxies>();
        assert!(e.expect_err("bad").contains("'proxy.local'"));
        assert!("10.0.0.0/33".parse::<TrustedProxies>().is_err());
    }

    #[test]
    fn the_forwarded_address_counts_only_from_a_trusted_peer() {
        let trusted: TrustedProxies = "10.0.0.0/8".parse().expect("ok");
        let h = headers(&["198.51.100.9, 203.0.113.7"]);
        // Not a trusted peer: its header is ignored.
        assert_eq!(client_of(ip("192.0.2.1"), &h, &trusted), ip("192.0.2.1"));
        assert_eq!(
            client_of(ip("10.0.0.5"), &h, &TrustedProxies::default()),
            ip("10.0.0.5")
        );
        // A trusted peer: the right-most untrusted item.
        assert_eq!(client_of(ip("10.0.0.5"), &h, &trusted), ip("203.0.113.7"));
        // Trusted hops are skipped; headers are read in order.
        let chain = headers(&["198.51.100.9", "203.0.113.7:4711, 10.9.9.9"]);
        assert_eq!(
            client_of(ip("10.0.0.5"), &chain, &trusted),
            ip("203.0.113.7")
        );
        // Garbage stops at the last trusted hop; no header is the peer.
        let junk = headers(&["203.0.113.7, not-an-address, 10.9.9.9"]);
        assert_eq!(client_of(ip("10.0.0.5"), &junk, &trusted), ip("10.9.9.9"));
        assert_eq!(
            client_of(ip("10.0.0.5"), &headers(&[]), &trusted),
            ip("10.0.0.5")
        );
    }

    #[test]
    fn ipv6_clients_are_counted_by_their_64() {
        assert_eq!(bucket(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(bucket(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
        assert_eq!(bucket(ip("192.0.2.1")), ip("192.0.2.1"));
    }
}
