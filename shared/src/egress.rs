//! The egress policy of `forward` destinations: which addresses a
//! forwarded request may connect to.
//!
//! A destination URL is an outbound request from inside the deployment, so
//! by default the addresses that reach *into* it are refused: loopback,
//! the private ranges (RFC 1918), link-local and the cloud metadata
//! endpoints, carrier-grade NAT, unique-local IPv6, multicast,
//! unspecified, broadcast and the reserved ranges; an IPv6 address that
//! carries an IPv4 one (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`,
//! NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) is judged by the IPv4 address
//! it carries. A destination (`allow_networks`) or the whole worker
//! (`HOOKINBOX_FORWARD_ALLOW_NETWORKS`) may allow networks by CIDR.
//!
//! The worker applies it where it connects, on every attempt: to each
//! address a host name resolves to, and to an address written in the URL
//! (see the worker's `handlers::egress`).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::IpNet;

use crate::client::parse_networks;

/// Why an address is refused; also the `reason` label of
/// `hookinbox_destination_blocked_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// RFC 1918: `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`.
    Private,
    /// `169.254.0.0/16`, `fe80::/10`.
    LinkLocal,
    /// A cloud metadata endpoint: `169.254.169.254`, `fd00:ec2::254`,
    /// `100.100.100.200`.
    Metadata,
    /// Carrier-grade NAT, `100.64.0.0/10`.
    Cgnat,
    /// Unique-local IPv6, `fc00::/7` (and the old site-local `fec0::/10`).
    UniqueLocal,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `0.0.0.0/8` ("this network": `0.0.0.0` reaches the host itself),
    /// `::`.
    Unspecified,
    /// `255.255.255.255`.
    Broadcast,
    /// Reserved, documentation, benchmarking and protocol ranges, never a
    /// receiver's address.
    Reserved,
    /// The destination answered with a redirect to elsewhere, which is
    /// never followed (counted with the refusals).
    Redirect,
}

impl Reason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Loopback => "loopback",
            Self::Private => "private",
            Self::LinkLocal => "link_local",
            Self::Metadata => "metadata",
            Self::Cgnat => "cgnat",
            Self::UniqueLocal => "unique_local",
            Self::Multicast => "multicast",
            Self::Unspecified => "unspecified",
            Self::Broadcast => "broadcast",
            Self::Reserved => "reserved",
            Self::Redirect => "redirect",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An address the policy refused, and why. Its text names the address,
/// never the URL (which may carry a token).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the receiver's address {address} is refused by the egress policy ({reason}); allow its \
     network with the destination's allow_networks or HOOKINBOX_FORWARD_ALLOW_NETWORKS"
)]
pub struct Blocked {
    /// The address.
    pub address: IpAddr,
    /// Why.
    pub reason: Reason,
}

/// Networks allowed in spite of the default refusals: a list of CIDRs (a
/// bare address is its own /32 or /128).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowNetworks(Vec<IpNet>);

impl FromStr for AllowNetworks {
    type Err = String;

    /// Parses a comma-separated list; blanks around items are ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s.split(','))
    }
}

impl AllowNetworks {
    /// Parses each item as a CIDR or an address; the error names the item.
    pub fn parse<'a>(items: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        parse_networks(items).map(Self)
    }

    /// Both lists.
    pub fn union(&self, other: &Self) -> Self {
        let mut nets = self.0.clone();
        nets.extend(other.0.iter().copied().filter(|n| !self.0.contains(n)));
        Self(nets)
    }

    /// Whether no network is allowed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The networks, as written (truncated to their prefix).
    pub fn networks(&self) -> &[IpNet] {
        &self.0
    }

    fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// Whether a connection to `ip` may be made: allowed when an allowed
    /// network holds it (or, for an IPv6 address carrying an IPv4 one,
    /// holds the IPv4 address), or when no default refusal applies.
    pub fn check(&self, ip: IpAddr) -> Result<(), Blocked> {
        let embedded = match ip {
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        if self.contains(ip) || embedded.is_some_and(|v4| self.contains(v4)) {
            return Ok(());
        }
        match refused(ip) {
            Some(reason) => Err(Blocked {
                address: ip,
                reason,
            }),
            None => Ok(()),
        }
    }
}

/// Why `ip` is refused by default, if it is.
pub fn refused(ip: IpAddr) -> Option<Reason> {
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => refused_v6(v6),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u8) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix))
    };
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn refused_v4(ip: Ipv4Addr) -> Option<Reason> {
    const METADATA: [[u8; 4]; 2] = [[169, 254, 169, 254], [100, 100, 100, 200]];
    if METADATA.contains(&ip.octets()) {
        return Some(Reason::Metadata);
    }
    let ranges: &[([u8; 4], u8, Reason)] = &[
        ([0, 0, 0, 0], 8, Reason::Unspecified),
        ([127, 0, 0, 0], 8, Reason::Loopback),
        ([10, 0, 0, 0], 8, Reason::Private),
        ([172, 16, 0, 0], 12, Reason::Private),
        ([192, 168, 0, 0], 16, Reason::Private),
        ([169, 254, 0, 0], 16, Reason::LinkLocal),
        ([100, 64, 0, 0], 10, Reason::Cgnat),
        ([224, 0, 0, 0], 4, Reason::Multicast),
        ([255, 255, 255, 255], 32, Reason::Broadcast),
        ([240, 0, 0, 0], 4, Reason::Reserved),
        ([192, 0, 0, 0], 24, Reason::Reserved),
        ([192, 0, 2, 0], 24, Reason::Reserved),
        ([198, 18, 0, 0], 15, Reason::Reserved),
        ([198, 51, 100, 0], 24, Reason::Reserved),
        ([203, 0, 113, 0], 24, Reason::Reserved),
    ];
    ranges
        .iter()
        .find(|(net, prefix, _)| in_v4(ip, *net, *prefix))
        .map(|(_, _, reason)| *reason)
}

/// The IPv4 address an IPv6 address carries: mapped (`::ffff:a.b.c.d`),
/// compatible (`::a.b.c.d`, deprecated but still parsed), NAT64
/// (`64:ff9b::/96`, `64:ff9b:1::/48`) or 6to4 (`2002:AABB:CCDD::/48`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    // `::` and `::1` are IPv6's own unspecified and loopback addresses.
    if s[..6] == [0; 6] && !(s[6] == 0 && s[7] <= 1) {
        return Some(low);
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1) {
        return Some(low);
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    None
}

fn refused_v6(ip: Ipv6Addr) -> Option<Reason> {
    if let Some(v4) = embedded_v4(ip) {
        return refused_v4(v4);
    }
    let s = ip.segments();
    if ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
        return Some(Reason::Metadata);
    }
    if ip.is_unspecified() {
        Some(Reason::Unspecified)
    } else if ip.is_loopback() {
        Some(Reason::Loopback)
    } else if s[0] & 0xffc0 == 0xfe80 {
        Some(Reason::LinkLocal)
    } else if s[0] & 0xfe00 == 0xfc00 || s[0] & 0xffc0 == 0xfec0 {
        Some(Reason::UniqueLocal)
    } else if s[0] & 0xff00 == 0xff00 {
        Some(Reason::Multicast)
    } else if (s[0] == 0x2001 && s[1] == 0x0db8) || (s[0] == 0x100 && s[1..4] == [0, 0, 0]) {
        // Documentation (2001:db8::/32) and discard-only (100::/64).
        Some(Reason::Reserved)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn the_default_refusals_and_their_reasons() {
        let cases = [
            ("127.0.0.1", Some(Reason::Loopback)),
            ("127.255.255.254", Some(Reason::Loopback)),
            ("::1", Some(Reason::Loopback)),
            ("10.1.2.3", Some(Reason::Private)),
            ("172.16.0.1", Some(Reason::Private)),
            ("172.31.255.255", Some(Reason::Private)),
            ("192.168.1.1", Some(Reason::Private)),
            ("169.254.1.1", Some(Reason::LinkLocal)),
            ("169.254.169.254", Some(Reason::Metadata)),
            ("100.100.100.200", Some(Reason::Metadata)),
            ("fd00:ec2::254", Some(Reason::Metadata)),
            ("fe80::1", Some(Reason::LinkLocal)),
            ("100.64.0.1", Some(Reason::Cgnat)),
            ("100.127.255.255", Some(Reason::Cgnat)),
            ("fc00::1", Some(Reason::UniqueLocal)),
            ("fd12:3456::1", Some(Reason::UniqueLocal)),
            ("224.0.0.1", Some(Reason::Multicast)),
            ("ff02::1", Some(Reason::Multicast)),
            ("0.0.0.0", Some(Reason::Unspecified)),
            ("0.1.2.3", Some(Reason::Unspecified)),
            ("::", Some(Reason::Unspecified)),
            ("255.255.255.255", Some(Reason::Broadcast)),
            ("240.0.0.1", Some(Reason::Reserved)),
            ("::ffff:127.0.0.1", Some(Reason::Loopback)),
            ("::ffff:10.0.0.1", Some(Reason::Private)),
            ("::ffff:169.254.169.254", Some(Reason::Metadata)),
            ("::127.0.0.1", Some(Reason::Loopback)),
            ("::10.0.0.1", Some(Reason::Private)),
            ("64:ff9b::7f00:1", Some(Reason::Loopback)),
            ("2002:a00:1::", Some(Reason::Private)),
            // Public addresses pass.
            ("8.8.8.8", None),
            ("140.82.112.3", None),
            ("172.32.0.1", None),
            ("100.128.0.1", None),
            ("2606:4700::1111", None),
            ("::ffff:8.8.8.8", None),
            ("64:ff9b::808:808", None),
        ];
        for (address, want) in cases {
            assert_eq!(refused(ip(address)), want, "{address}");
        }
    }

    #[test]
    fn allowed_networks_win_also_for_the_ipv6_forms_of_an_ipv4_address() {
        let allow: AllowNetworks = "127.0.0.0/8, 10.0.0.5".parse().expect("valid");
        for ok in ["127.0.0.2", "::ffff:127.0.0.1", "10.0.0.5", "8.8.8.8"] {
            assert_eq!(allow.check(ip(ok)), Ok(()), "{ok}");
        }
        for refused in ["10.0.0.6", "::1", "169.254.169.254", "192.168.0.1"] {
            assert!(allow.check(ip(refused)).is_err(), "{refused}");
        }
        let none = AllowNetworks::default();
        assert_eq!(
            none.check(ip("127.0.0.1")),
            Err(Blocked {
                address: ip("127.0.0.1"),
                reason: Reason::Loopback
            })
        );
        assert!("10.0.0.0/33".parse::<AllowNetworks>().is_err());
        assert!("nowhere".parse::<AllowNetworks>().is_err());
        let both = allow.union(&"192.168.0.0/16".parse().expect("valid"));
        assert_eq!(both.networks().len(), 3);
    }
}
