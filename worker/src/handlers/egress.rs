//! Where `forward` connects: the egress policy (`hookinbox::egress`)
//! applied at connect time, on every attempt.
//!
//! A host name goes through [`GuardedResolver`], the client's resolver:
//! each address it resolves to is checked, the refused ones are dropped,
//! and when none is left the connection fails with [`Blocked`] before any
//! byte is sent. Because the check sits in the resolver, a name that
//! resolves to a public address at one attempt and to a private one at the
//! next is caught at the next. An address written in the URL (in any of
//! its spellings: `0x7f000001`, `2130706433`, `017700000001` and `127.1`
//! are all `127.0.0.1` once the URL is parsed) never reaches a resolver,
//! so the handler checks it itself ([`literal_address`]).
//!
//! `HOOKINBOX_FORWARD_HOSTS_FILE` names a hosts file consulted before DNS
//! and re-read at every resolution (`crate::resolve`), for tests and
//! air-gapped setups; its answers pass the same check as DNS's.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use hookinbox::egress::{AllowNetworks, Blocked};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::resolve::lookup_hosts_file;

/// A resolver that returns only the addresses the policy allows.
pub(super) struct GuardedResolver {
    allow: AllowNetworks,
    hosts_file: Option<PathBuf>,
}

impl GuardedResolver {
    /// Checks against `allow`, consulting `hosts_file` before DNS.
    pub(super) fn new(allow: AllowNetworks, hosts_file: Option<PathBuf>) -> Self {
        Self { allow, hosts_file }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow = self.allow.clone();
        let hosts_file = self.hosts_file.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let from_file = match &hosts_file {
                Some(path) => lookup_hosts_file(path, &host).await?,
                None => None,
            };
            let addresses: Vec<IpAddr> = match from_file {
                Some(addresses) => addresses,
                None => tokio::net::lookup_host((host.as_str(), 0))
                    .await?
                    .map(|a| a.ip())
                    .collect(),
            };
            let addrs: Addrs = Box::new(allowed(&allow, addresses)?.into_iter());
            Ok(addrs)
        })
    }
}

/// The allowed addresses among `addresses`, as socket addresses (port 0:
/// the URL's); [`Blocked`] for the first refused one when none is allowed.
fn allowed(allow: &AllowNetworks, addresses: Vec<IpAddr>) -> Result<Vec<SocketAddr>, Blocked> {
    let mut kept = Vec::with_capacity(addresses.len());
    let mut refused = None;
    for ip in addresses {
        match allow.check(ip) {
            Ok(()) => kept.push(SocketAddr::new(ip, 0)),
            Err(blocked) => {
                tracing::debug!(address = %ip, reason = %blocked.reason, "resolved address refused by the egress policy");
                refused.get_or_insert(blocked);
            }
        }
    }
    match (kept.is_empty(), refused) {
        (true, Some(blocked)) => Err(blocked),
        _ => Ok(kept),
    }
}

/// The address a URL names directly, if its host is one (`[::1]` too).
pub(super) fn literal_address(url: &reqwest::Url) -> Option<IpAddr> {
    let host = url.host_str()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.parse().ok()
}

/// The egress refusal in an error's chain, if it is one.
pub(super) fn blocked_in(e: &(dyn std::error::Error + 'static)) -> Option<Blocked> {
    let mut next = Some(e);
    while let Some(error) = next {
        if let Some(blocked) = error.downcast_ref::<Blocked>() {
            return Some(*blocked);
        }
        next = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_an_address_in_a_url_is_that_address() {
        for (url, ip) in [
            ("http://127.0.0.1/", "127.0.0.1"),
            ("http://0x7f000001/", "127.0.0.1"),
            ("http://2130706433/", "127.0.0.1"),
            ("http://017700000001/", "127.0.0.1"),
            ("http://127.1/", "127.0.0.1"),
            ("http://0177.0.0.1/", "127.0.0.1"),
            ("http://[::1]:8080/", "::1"),
            ("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1"),
            ("https://[fd00:ec2::254]/", "fd00:ec2::254"),
        ] {
            let parsed = reqwest::Url::parse(url).expect("a URL");
            assert_eq!(
                literal_address(&parsed),
                Some(ip.parse().expect("an address")),
                "{url}"
            );
        }
        let named = reqwest::Url::parse("http://localhost:1/").expect("a URL");
        assert_eq!(literal_address(&named), None);
    }

    #[test]
    fn refused_addresses_are_dropped_and_none_left_is_a_refusal() {
        let allow: AllowNetworks = "127.0.0.1/32".parse().expect("valid");
        let ip = |s: &str| s.parse::<IpAddr>().expect("an address");
        assert_eq!(
            allowed(&allow, vec![ip("127.0.0.2"), ip("127.0.0.1")]).expect("one left"),
            vec![SocketAddr::new(ip("127.0.0.1"), 0)]
        );
        let err = allowed(&allow, vec![ip("10.0.0.1"), ip("127.0.0.2")]).expect_err("none left");
        assert_eq!(err.address, ip("10.0.0.1"));
    }
}
