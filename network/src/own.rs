//! The addresses of the machine the broker runs on (the host, or the VM):
//! every address of every interface of the supervisor's network
//! namespace, not only the loopback. Through the proxy they reach the
//! host's own services (one listening on `0.0.0.0` answers on each), so
//! the policy treats them as a special range: an allow rule must name the
//! address or its network (`*` does not).

use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a reading of the interfaces' addresses is used before it is
/// read again: an address added since is a special one at most this late.
pub const REFRESH: Duration = Duration::from_secs(1);

/// The machine's own addresses, read from its interfaces (`getifaddrs`)
/// when judged, at most once per [`REFRESH`].
#[derive(Default)]
pub struct OwnAddresses {
    read: Mutex<Option<(Instant, Vec<IpAddr>)>>,
}

impl OwnAddresses {
    pub fn new() -> OwnAddresses {
        OwnAddresses::default()
    }

    /// Whether `addr` (an IPv4-mapped IPv6 address as its IPv4 one) is
    /// an address of one of the machine's interfaces.
    pub fn holds(&self, addr: IpAddr) -> bool {
        let addr = unmapped(addr);
        let mut read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = read.as_ref().is_some_and(|(at, _)| at.elapsed() < REFRESH);
        if !fresh {
            *read = Some((Instant::now(), interfaces()));
        }
        read.as_ref().is_some_and(|(_, all)| all.contains(&addr))
    }
}

fn unmapped(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

/// Every address of every interface; none if they cannot be read (the
/// other special ranges still hold).
fn interfaces() -> Vec<IpAddr> {
    let all = match nix::ifaddrs::getifaddrs() {
        Ok(all) => all,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the interfaces' addresses");
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for i in all {
        let Some(a) = i.address else { continue };
        if let Some(v4) = a.as_sockaddr_in() {
            out.push(IpAddr::V4(v4.ip()));
        } else if let Some(v6) = a.as_sockaddr_in6() {
            out.push(unmapped(IpAddr::V6(v6.ip())));
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_and_every_interface_address_are_the_machine_s() {
        let own = OwnAddresses::new();
        assert!(own.holds("127.0.0.1".parse().unwrap()));
        assert!(own.holds("::ffff:127.0.0.1".parse().unwrap()));
        // TEST-NET-3: documentation only, on no interface.
        assert!(!own.holds("203.0.113.9".parse().unwrap()));
        for a in interfaces() {
            assert!(own.holds(a), "{a}");
        }
    }
}
