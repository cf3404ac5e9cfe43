//! Hosts files: `ADDRESS NAME…` lines that an HTTP client of the worker
//! consults before DNS, re-read at every resolution, so that a change
//! counts at the next connection as a DNS answer's would. `forward` reads
//! `HOOKINBOX_FORWARD_HOSTS_FILE` (its answers then pass the egress
//! policy, `handlers::egress`); the reconciler's client of GitHub's API
//! reads `HOOKINBOX_GITHUB_API_HOSTS_FILE` ([`HostsFileResolver`]). For
//! tests (a GHE.com API name served on 127.0.0.1) and air-gapped setups.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// The addresses `host` has in the hosts file at `path`, if it is there.
/// The file is read at every call.
pub(crate) async fn lookup_hosts_file(path: &Path, host: &str) -> io::Result<Option<Vec<IpAddr>>> {
    let text = tokio::fs::read_to_string(path).await?;
    let host = host.trim_end_matches('.');
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut fields = line.split_whitespace();
        let Some(Ok(ip)) = fields.next().map(str::parse::<IpAddr>) else {
            continue;
        };
        if fields.any(|name| name.trim_end_matches('.').eq_ignore_ascii_case(host)) {
            found.push(ip);
        }
    }
    Ok((!found.is_empty()).then_some(found))
}

/// A resolver that answers from a hosts file first and asks DNS for the
/// names it does not hold.
pub(crate) struct HostsFileResolver {
    path: PathBuf,
}

impl HostsFileResolver {
    /// Consults the hosts file at `path` before DNS.
    pub(crate) fn new(path: PathBuf) -> Self {
        Self { path }
    }
}

impl Resolve for HostsFileResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let path = self.path.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addresses: Vec<SocketAddr> = match lookup_hosts_file(&path, &host).await? {
                Some(found) => found.into_iter().map(|ip| SocketAddr::new(ip, 0)).collect(),
                None => tokio::net::lookup_host((host.as_str(), 0)).await?.collect(),
            };
            let addrs: Addrs = Box::new(addresses.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_hosts_file_is_read_at_every_lookup() {
        let path = std::env::temp_dir().join(format!("hookinbox-hosts-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, "# test\n127.0.0.1 a.test B.test.\n::1 a.test\n").expect("write");
        let found = lookup_hosts_file(&path, "b.test").await.expect("read");
        assert_eq!(found, Some(vec!["127.0.0.1".parse().expect("ip")]));
        assert_eq!(
            lookup_hosts_file(&path, "a.test.")
                .await
                .expect("read")
                .map(|v| v.len()),
            Some(2)
        );
        std::fs::write(&path, "10.0.0.1 a.test\n").expect("write");
        assert_eq!(
            lookup_hosts_file(&path, "a.test").await.expect("read"),
            Some(vec!["10.0.0.1".parse().expect("ip")])
        );
        assert_eq!(
            lookup_hosts_file(&path, "c.test").await.expect("read"),
            None
        );
        let _ = std::fs::remove_file(path);
    }

    #[tokio::test]
    async fn a_name_in_the_file_resolves_to_its_address_without_dns() {
        let path = std::env::temp_dir().join(format!("hookinbox-hosts-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, "127.0.0.1 api.acme.ghe.com\n").expect("write");
        let resolver = HostsFileResolver::new(path.clone());
        let name: Name = "api.acme.ghe.com".parse().expect("a name");
        let found: Vec<SocketAddr> = resolver.resolve(name).await.expect("resolves").collect();
        assert_eq!(found, vec!["127.0.0.1:0".parse().expect("address")]);
        let _ = std::fs::remove_file(path);
    }
}
