//! The VM's uplink: `allox.net=ADDRESS/PREFIX[,GATEWAY]` on the kernel
//! command line configures the guest's one network device (virtio-net,
//! which QEMU attaches only when asked: `scripts/run-vm.sh --net user`).
//! Only the supervisor's namespace sees it, and in it the session network's
//! broker: every session has a network namespace of its own with a
//! loopback only.
//!
//! Configured with three rtnetlink requests (link up, address, default
//! route), each acknowledged by the kernel.

use rustix::fd::OwnedFd;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
use std::net::Ipv4Addr;

/// `allox.net=`: the device's address and prefix, and the default route's
/// gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uplink {
    pub addr: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Option<Ipv4Addr>,
}

impl Uplink {
    /// `10.0.2.15/24,10.0.2.2` or `10.0.2.15/24`.
    pub fn parse(v: &str) -> Result<Uplink, String> {
        let (cidr, gw) = match v.split_once(',') {
            Some((c, g)) => (c, Some(g)),
            None => (v, None),
        };
        let (a, p) = cidr
            .split_once('/')
            .ok_or_else(|| format!("{v:?}: expected ADDRESS/PREFIX[,GATEWAY]"))?;
        let addr: Ipv4Addr = a
            .parse()
            .map_err(|_| format!("{v:?}: {a:?} is not an IPv4 address"))?;
        let prefix: u8 = p
            .parse()
            .ok()
            .filter(|p| (1..=32).contains(p))
            .ok_or_else(|| format!("{v:?}: prefix {p:?} is not a number from 1 to 32"))?;
        let gateway = gw
            .map(|g| {
                g.parse::<Ipv4Addr>()
                    .map_err(|_| format!("{v:?}: gateway {g:?} is not an IPv4 address"))
            })
            .transpose()?;
        Ok(Uplink {
            addr,
            prefix,
            gateway,
        })
    }
}

const RTM_NEWLINK: u16 = 16;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const IFF_UP: u32 = 0x1;
const AF_INET: u8 = 2;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_BOOT: u8 = 3;
const RTN_UNICAST: u8 = 1;

/// An rtnetlink socket of the calling thread's network namespace.
struct Rtnl {
    fd: OwnedFd,
    seq: u32,
}

fn attr(msg: &mut Vec<u8>, kind: u16, data: &[u8]) {
    msg.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(data);
    while msg.len() % 4 != 0 {
        msg.push(0);
    }
}

impl Rtnl {
    fn new() -> std::io::Result<Rtnl> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC,
            // NETLINK_ROUTE is protocol 0.
            None,
        )?;
        Ok(Rtnl { fd, seq: 0 })
    }

    /// Sends one request (`body` after the header) and waits for the
    /// kernel's acknowledgement.
    fn ask(&mut self, kind: u16, flags: u16, body: &[u8]) -> std::io::Result<()> {
        self.seq += 1;
        let mut msg = Vec::with_capacity(16 + body.len());
        msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
        msg.extend_from_slice(&kind.to_ne_bytes());
        msg.extend_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        msg.extend_from_slice(&self.seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(body);
        rustix::net::send(&self.fd, &msg, SendFlags::empty())?;
        let mut buf = [0u8; 4096];
        let (n, _) = rustix::net::recv(&self.fd, &mut buf, RecvFlags::empty())?;
        let b = &buf[..n];
        let kind = b.get(4..6).map(|x| u16::from_ne_bytes([x[0], x[1]]));
        let err = b
            .get(16..20)
            .map(|x| i32::from_ne_bytes([x[0], x[1], x[2], x[3]]));
        match (kind, err) {
            (Some(NLMSG_ERROR), Some(0)) => Ok(()),
            (Some(NLMSG_ERROR), Some(e)) => Err(std::io::Error::from_raw_os_error(-e)),
            _ => Err(std::io::Error::other(
                "an answer that is not an acknowledgement",
            )),
        }
    }

    fn link_up(&mut self, index: u32) -> std::io::Result<()> {
        let mut b = vec![0u8, 0];
        b.extend_from_slice(&0u16.to_ne_bytes());
        b.extend_from_slice(&(index as i32).to_ne_bytes());
        b.extend_from_slice(&IFF_UP.to_ne_bytes());
        b.extend_from_slice(&IFF_UP.to_ne_bytes());
        self.ask(RTM_NEWLINK, 0, &b)
    }

    fn add_address(&mut self, index: u32, addr: Ipv4Addr, prefix: u8) -> std::io::Result<()> {
        let mut b = vec![AF_INET, prefix, 0, 0];
        b.extend_from_slice(&index.to_ne_bytes());
        attr(&mut b, IFA_LOCAL, &addr.octets());
        attr(&mut b, IFA_ADDRESS, &addr.octets());
        self.ask(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, &b)
    }

    fn add_default_route(&mut self, index: u32, gateway: Ipv4Addr) -> std::io::Result<()> {
        // rtmsg: family, dst_len 0 (default), src_len, tos, table,
        // protocol, scope universe, type unicast; flags.
        let mut b = vec![AF_INET, 0, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, 0, RTN_UNICAST];
        b.extend_from_slice(&0u32.to_ne_bytes());
        attr(&mut b, RTA_GATEWAY, &gateway.octets());
        attr(&mut b, RTA_OIF, &index.to_ne_bytes());
        self.ask(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, &b)
    }
}

/// The index of network device `name`.
fn index_of(name: &str) -> std::io::Result<u32> {
    let s = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    Ok(rustix::net::netdevice::name_to_index(&s, name)?)
}

/// Configures `device` as `up` says, in the calling thread's network
/// namespace; the loopback is brought up too.
pub fn configure(device: &str, up: &Uplink) -> std::io::Result<()> {
    let mut rtnl = Rtnl::new()?;
    rtnl.link_up(index_of("lo")?)?;
    let index = index_of(device)?;
    rtnl.link_up(index)?;
    rtnl.add_address(index, up.addr, up.prefix)?;
    if let Some(gw) = up.gateway {
        rtnl.add_default_route(index, gw)?;
    }
    Ok(())
}

/// The machine's network devices but the loopback, by name (from sysfs).
pub fn devices() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/class/net")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lo")
        .collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_read_or_say_what_is_wrong() {
        assert_eq!(
            Uplink::parse("10.0.2.15/24,10.0.2.2"),
            Ok(Uplink {
                addr: Ipv4Addr::new(10, 0, 2, 15),
                prefix: 24,
                gateway: Some(Ipv4Addr::new(10, 0, 2, 2)),
            })
        );
        assert_eq!(Uplink::parse("10.0.2.15/24").unwrap().gateway, None);
        for (bad, why) in [
            ("10.0.2.15", "ADDRESS/PREFIX"),
            ("10.0.2/24", "not an IPv4 address"),
            ("10.0.2.15/33", "prefix \"33\""),
            ("10.0.2.15/24,gw", "gateway \"gw\""),
        ] {
            let e = Uplink::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    /// In a network namespace of its own (a thread's), on the loopback:
    /// the address and the default route land as asked.
    #[test]
    fn the_kernel_takes_the_address_and_the_route() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIP uplink::the_kernel_takes_the_address_and_the_route: needs root (a network namespace)");
            return;
        }
        let (route, fib) = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let up = Uplink::parse("10.9.0.1/24,10.9.0.254").unwrap();
            configure("lo", &up).unwrap();
            // Once more: the address is there already, and says so.
            let again = configure("lo", &up).unwrap_err();
            assert_eq!(again.raw_os_error(), Some(libc_eexist()), "{again}");
            (
                std::fs::read_to_string("/proc/thread-self/net/route").unwrap(),
                std::fs::read_to_string("/proc/thread-self/net/fib_trie").unwrap(),
            )
        })
        .join()
        .unwrap();
        // Destination 0.0.0.0 through 10.9.0.254 (little-endian hex).
        assert!(
            route
                .lines()
                .any(|l| l.starts_with("lo\t00000000\tFE00090A")),
            "{route}"
        );
        assert!(fib.contains("10.9.0.1"), "{fib}");
    }

    fn libc_eexist() -> i32 {
        rustix::io::Errno::EXIST.raw_os_error()
    }
}
