//! Access control on the RPC port: the peers allowed to connect, as a list of CIDR networks.
//!
//! The llama.cpp RPC protocol has no authentication, so the only gate is the peer's address. The
//! default allows loopback only (`127.0.0.0/8`, `::1`); `--allow`, `server.allow` or
//! `LLAMAD__SERVER__ALLOW` replace it. An IPv4-mapped IPv6 peer (`::ffff:a.b.c.d`, as a dual-stack
//! listener reports IPv4 clients) is matched as the IPv4 address it carries.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::error::{Error, Result};

/// The networks whose peers may connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowList {
    nets: Vec<IpNet>,
}

impl Default for AllowList {
    fn default() -> Self {
        AllowList::loopback()
    }
}

impl AllowList {
    /// `127.0.0.0/8` and `::1/128`.
    pub fn loopback() -> AllowList {
        AllowList {
            nets: vec![
                IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(127, 0, 0, 0), 8)),
                IpNet::V6(Ipv6Net::new_assert(Ipv6Addr::LOCALHOST, 128)),
            ],
        }
    }

    /// Every address (`0.0.0.0/0` and `::/0`).
    pub fn any() -> AllowList {
        AllowList {
            nets: vec![
                IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::UNSPECIFIED, 0)),
                IpNet::V6(Ipv6Net::new_assert(Ipv6Addr::UNSPECIFIED, 0)),
            ],
        }
    }

    /// Parses `CIDR,CIDR,...`: networks (`10.0.0.0/8`, `fd00::/8`), single addresses (`10.1.2.3`,
    /// `::1`), `loopback` and `any`. Separators are `,` and white space; the list must not be empty.
    pub fn parse(list: &str) -> Result<AllowList> {
        let mut nets = Vec::new();
        for item in list.split(|c: char| c == ',' || c.is_whitespace()).filter(|s| !s.is_empty()) {
            match item.to_ascii_lowercase().as_str() {
                "loopback" | "localhost" => nets.extend(AllowList::loopback().nets),
                "any" | "all" => nets.extend(AllowList::any().nets),
                _ => nets.push(parse_net(item)?),
            }
        }
        if nets.is_empty() {
            return Err(Error::Config(
                "allow: empty list (use `any` to allow every peer, `loopback` for this host only)".into(),
            ));
        }
        nets.sort();
        nets.dedup();
        Ok(AllowList { nets })
    }

    /// Whether a peer at `ip` may connect.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.nets.iter().any(|n| n.contains(&ip))
    }

    /// Whether the list admits only loopback peers.
    pub fn is_loopback_only(&self) -> bool {
        self.nets.iter().all(|n| match n {
            IpNet::V4(n) => n.network().is_loopback() && n.prefix_len() >= 8,
            IpNet::V6(n) => n.network().is_loopback() && n.prefix_len() == 128,
        })
    }

    /// The networks, in order.
    pub fn nets(&self) -> &[IpNet] {
        &self.nets
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, n) in self.nets.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{n}")?;
        }
        Ok(())
    }
}

fn parse_net(item: &str) -> Result<IpNet> {
    let bad =
        |why: String| Error::Config(format!("allow: `{item}` is not an address or CIDR network: {why}"));
    let net = if item.contains('/') {
        item.parse::<IpNet>().map_err(|e| bad(e.to_string()))?
    } else {
        IpNet::from(item.parse::<IpAddr>().map_err(|e| bad(e.to_string()))?)
    };
    // An IPv4-mapped network is stored as the IPv4 network it denotes, to match mapped peers.
    Ok(match net {
        IpNet::V6(n) if n.prefix_len() >= 96 => match n.network().to_ipv4_mapped() {
            Some(v4) => IpNet::V4(Ipv4Net::new_assert(v4, n.prefix_len() - 96)),
            None => net.trunc(),
        },
        _ => net.trunc(),
    })
}

/// `ip` with an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, how a dual-stack socket reports an
/// IPv4 peer) written as the IPv4 address, so that both spellings of one peer compare equal.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The host part of a suggestion for allowing `ip` (`a.b.c.d/32` or `x::y/128`).
pub fn host_cidr(ip: IpAddr) -> String {
    match canonical(ip) {
        IpAddr::V6(v6) => format!("{v6}/128"),
        IpAddr::V4(v4) => format!("{v4}/32"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn default_is_loopback_only() {
        let a = AllowList::default();
        assert!(a.allows(ip("127.0.0.1")) && a.allows(ip("127.255.0.9")) && a.allows(ip("::1")));
        assert!(a.allows(ip("::ffff:127.0.0.1")), "v4-mapped loopback");
        assert!(!a.allows(ip("10.0.0.1")) && !a.allows(ip("::2")) && !a.allows(ip("::ffff:10.0.0.1")));
        assert!(!a.allows(ip("fe80::1")) && !a.allows(ip("0.0.0.0")));
        assert!(a.is_loopback_only());
        assert_eq!(a.to_string(), "127.0.0.0/8,::1/128");
    }

    #[test]
    fn networks_hosts_and_keywords() {
        let a = AllowList::parse("10.0.0.0/8, 192.168.1.7 fd00::/8,2001:db8::1").unwrap();
        for yes in ["10.255.1.2", "192.168.1.7", "fd12::3", "2001:db8::1", "::ffff:10.1.1.1"] {
            assert!(a.allows(ip(yes)), "{yes}");
        }
        for no in ["11.0.0.1", "192.168.1.8", "fe00::1", "2001:db8::2", "127.0.0.1", "::1"] {
            assert!(!a.allows(ip(no)), "{no}");
        }
        assert!(!a.is_loopback_only());
        // Host bits are masked; the list is sorted and deduplicated.
        assert_eq!(AllowList::parse("10.1.2.3/8,10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        let any = AllowList::parse("any").unwrap();
        assert!(any.allows(ip("8.8.8.8")) && any.allows(ip("2001:4860::8888")));
        assert_eq!(AllowList::parse("loopback").unwrap(), AllowList::loopback());
    }

    #[test]
    fn v4_mapped_networks_match_v4_peers() {
        let a = AllowList::parse("::ffff:192.168.0.0/112").unwrap();
        assert_eq!(a.to_string(), "192.168.0.0/16");
        assert!(a.allows(ip("192.168.3.4")) && a.allows(ip("::ffff:192.168.3.4")));
        assert!(!a.allows(ip("192.169.0.1")));
    }

    #[test]
    fn bad_lists_are_named() {
        for (list, needle) in
            [("10.0.0.0/33", "10.0.0.0/33"), ("example.com", "example.com"), (" , ", "empty")]
        {
            let e = AllowList::parse(list).unwrap_err().to_string();
            assert!(e.contains(needle), "{list}: {e}");
        }
    }

    #[test]
    fn host_suggestions() {
        assert_eq!(host_cidr(ip("10.1.2.3")), "10.1.2.3/32");
        assert_eq!(host_cidr(ip("::ffff:10.1.2.3")), "10.1.2.3/32");
        assert_eq!(host_cidr(ip("fd00::5")), "fd00::5/128");
    }
}
