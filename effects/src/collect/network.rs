//! The `network` domain: rtnetlink dumps of one network namespace (the
//! current one, or the one an fd names: a scoped thread joins it, and the
//! netlink socket it opens answers about it).
//!
//! Keys and values, in `ip`'s words:
//! * `link NAME`: index, kind (and port kind), flags, mtu, master,
//!   address, qdisc, tx queue length, alias. Left out: counters and
//!   statistics; the carrier flags (`RUNNING`, `LOWER_UP`, `DORMANT`) and
//!   the operational state, which follow the wire, not the configuration;
//!   the kind's own data (a bridge's carries running timers).
//! * `addr NAME ADDRESS/PREFIX` (`addr NAME LOCAL peer ADDRESS/PREFIX` on
//!   point-to-point links): scope, broadcast, label, flags. Left out:
//!   lifetimes (they count down) and the duplicate-address-detection
//!   states `tentative` and `optimistic` (they clear on their own);
//!   IPv6 temporary (privacy) addresses, which come and go on their own.
//! * `route TABLE DESTINATION [tos T] [metric M] [dev NAME][#N]`, both
//!   families, every table (`main`, `local`, `default` by name): type,
//!   protocol, scope, gateway, preferred source, metrics, next hops.
//!   Left out: cache info and expiry times; cloned (cache) routes.
//! * `rule FAMILY PRIORITY SELECTOR ACTION` (`rule inet 100 from all lookup
//!   100`): protocol and the rest of the rule's attributes.
//!
//! * nftables: tables, chains, rules, sets, objects and flowtables
//!   ([`super::nftables`]).

use super::Capture;
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteFlags, RouteMessage};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::collections::BTreeMap;
use std::os::fd::BorrowedFd;

/// Captures links, addresses, routes and rules of the network namespace
/// `netns` (the current one when `None`).
pub fn capture(netns: Option<BorrowedFd>) -> Capture {
    match netns {
        None => capture_here(),
        Some(fd) => super::ns::in_netns(fd, "network", capture_here),
    }
}

/// What one namespace's dumps hold.
#[derive(Debug, Default, Clone)]
pub struct Dumps {
    pub links: Vec<LinkMessage>,
    pub addresses: Vec<AddressMessage>,
    pub routes: Vec<RouteMessage>,
    pub rules: Vec<RuleMessage>,
}

fn capture_here() -> Capture {
    let mut c = Capture::new();
    let mut d = Dumps::default();
    let sock = match open() {
        Ok(s) => s,
        Err(e) => {
            c.gap(format!("network: cannot open a netlink socket: {e}"));
            return c;
        }
    };
    let mut get = |what: &str, m: RouteNetlinkMessage| match dump(&sock, m) {
        Ok(v) => v,
        // A kernel without policy routing has no rules to dump, nor to
        // change: an observation, not a gap.
        Err(e) if what == "rule" && e == UNSUPPORTED => {
            c.insert("rules", "none: the kernel has no policy routing");
            Vec::new()
        }
        Err(e) => {
            c.gap(format!("network: {what} dump: {e}"));
            Vec::new()
        }
    };
    for m in get("link", RouteNetlinkMessage::GetLink(LinkMessage::default())) {
        if let RouteNetlinkMessage::NewLink(l) = m {
            d.links.push(l);
        }
    }
    for m in get(
        "address",
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
    ) {
        if let RouteNetlinkMessage::NewAddress(a) = m {
            d.addresses.push(a);
        }
    }
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut r = RouteMessage::default();
        r.header.address_family = family;
        for m in get("route", RouteNetlinkMessage::GetRoute(r)) {
            if let RouteNetlinkMessage::NewRoute(r) = m {
                d.routes.push(r);
            }
        }
        let mut r = RuleMessage::default();
        r.header.family = family;
        for m in get("rule", RouteNetlinkMessage::GetRule(r)) {
            if let RouteNetlinkMessage::NewRule(r) = m {
                d.rules.push(r);
            }
        }
    }
    render(&d, &mut c);
    super::nftables::capture_into(&mut c);
    c
}

fn open() -> std::io::Result<Socket> {
    let mut s = Socket::new(NETLINK_ROUTE)?;
    s.bind_auto()?;
    s.connect(&SocketAddr::new(0, 0))?;
    Ok(s)
}

/// One dump request and its answers, retried when the kernel says the
/// dump was interrupted by a change (`NLM_F_DUMP_INTR`).
/// What [`dump`] says of a dump the kernel does not have (`EOPNOTSUPP`).
const UNSUPPORTED: &str = "not supported by this kernel";

fn dump(sock: &Socket, req: RouteNetlinkMessage) -> Result<Vec<RouteNetlinkMessage>, String> {
    for _ in 0..5 {
        match dump_once(sock, req.clone())? {
            Some(v) => return Ok(v),
            None => continue,
        }
    }
    Err("interrupted by changes five times in a row".into())
}

fn dump_once(
    sock: &Socket,
    req: RouteNetlinkMessage,
) -> Result<Option<Vec<RouteNetlinkMessage>>, String> {
    let mut hdr = NetlinkHeader::default();
    hdr.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut packet = NetlinkMessage::new(hdr, NetlinkPayload::from(req));
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf[..]);
    sock.send(&buf, 0).map_err(|e| format!("send: {e}"))?;
    let mut out = Vec::new();
    let mut interrupted = false;
    let mut rx = vec![0u8; 1 << 16];
    loop {
        let n = sock
            .recv(&mut &mut rx[..], 0)
            .map_err(|e| format!("recv: {e}"))?;
        let mut off = 0;
        while off < n {
            let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rx[off..n])
                .map_err(|e| format!("an answer does not parse: {e}"))?;
            let len = msg.header.length as usize;
            if msg.header.flags & NLM_F_DUMP_INTR != 0 {
                interrupted = true;
            }
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok((!interrupted).then_some(out)),
                NetlinkPayload::Error(e) if e.code.map(|c| c.get()) == Some(-libc::EOPNOTSUPP) => {
                    return Err(UNSUPPORTED.to_string())
                }
                NetlinkPayload::Error(e) => return Err(format!("the kernel refused: {e}")),
                NetlinkPayload::InnerMessage(m) => out.push(m),
                NetlinkPayload::Noop | NetlinkPayload::Overrun(_) => {}
                _ => {}
            }
            if len == 0 {
                break;
            }
            off += len;
        }
    }
}

/// Turns the dumps into items.
pub fn render(d: &Dumps, c: &mut Capture) {
    let names: BTreeMap<u32, String> = d
        .links
        .iter()
        .map(|l| (l.header.index, link_name(l)))
        .collect();
    let name = |i: u32| names.get(&i).cloned().unwrap_or_else(|| format!("if{i}"));
    for l in &d.links {
        c.insert(format!("link {}", link_name(l)), link_value(l, &name));
    }
    for a in &d.addresses {
        if let Some((k, v)) = address_item(a, &name) {
            c.insert(k, v);
        }
    }
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for r in &d.routes {
        if let Some((k, v)) = route_item(r, &name) {
            let n = seen.entry(k.clone()).or_insert(0);
            *n += 1;
            let k = if *n > 1 { format!("{k}#{n}") } else { k };
            c.insert(k, v);
        }
    }
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for r in &d.rules {
        let (k, v) = rule_item(r);
        let n = seen.entry(k.clone()).or_insert(0);
        *n += 1;
        let k = if *n > 1 { format!("{k}#{n}") } else { k };
        c.insert(k, v);
    }
}

fn link_name(l: &LinkMessage) -> String {
    l.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        })
        .unwrap_or_else(|| format!("if{}", l.header.index))
}

fn hex(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn link_value(l: &LinkMessage, name: &dyn Fn(u32) -> String) -> String {
    let flags = l.header.flags - (LinkFlags::Running | LinkFlags::LowerUp | LinkFlags::Dormant);
    let mut v = format!("index={} flags={flags:?}", l.header.index);
    for a in &l.attributes {
        match a {
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    match i {
                        LinkInfo::Kind(k) => v += &format!(" kind={k}"),
                        LinkInfo::PortKind(k) => v += &format!(" port_kind={k:?}"),
                        _ => {}
                    }
                }
            }
            LinkAttribute::Mtu(m) => v += &format!(" mtu={m}"),
            LinkAttribute::Controller(m) => v += &format!(" master={}", name(*m)),
            LinkAttribute::Link(m) => v += &format!(" link={m}"),
            LinkAttribute::Address(a) => v += &format!(" address={}", hex(a)),
            LinkAttribute::Broadcast(a) => v += &format!(" brd={}", hex(a)),
            LinkAttribute::Qdisc(q) => v += &format!(" qdisc={q}"),
            LinkAttribute::TxQueueLen(q) => v += &format!(" txqlen={q}"),
            LinkAttribute::IfAlias(s) => v += &format!(" alias={s:?}"),
            LinkAttribute::Group(g) => v += &format!(" group={g}"),
            LinkAttribute::LinkNetNsId(n) => v += &format!(" link_netnsid={n}"),
            _ => {}
        }
    }
    v
}

fn address_item(a: &AddressMessage, name: &dyn Fn(u32) -> String) -> Option<(String, String)> {
    let mut address = None;
    let mut local = None;
    let mut flags = AddressFlags::from_bits_retain(u32::from(a.header.flags.bits()));
    let mut rest = String::new();
    for attr in &a.attributes {
        match attr {
            AddressAttribute::Address(x) => address = Some(*x),
            AddressAttribute::Local(x) => local = Some(*x),
            AddressAttribute::Flags(f) => flags = *f,
            AddressAttribute::Label(l) => rest += &format!(" label={l}"),
            AddressAttribute::Broadcast(b) => rest += &format!(" brd={b}"),
            AddressAttribute::Anycast(b) => rest += &format!(" anycast={b}"),
            AddressAttribute::Multicast(b) => rest += &format!(" multicast={b}"),
            AddressAttribute::RoutePriority(p) => rest += &format!(" metric={p}"),
            AddressAttribute::Protocol(p) => rest += &format!(" proto={p:?}"),
            AddressAttribute::CacheInfo(_) => {}
            other => rest += &format!(" {other:?}"),
        }
    }
    // IFA_F_TEMPORARY is IFA_F_SECONDARY's bit: on IPv6, a privacy address.
    if a.header.family == AddressFamily::Inet6 && flags.contains(AddressFlags::Secondary) {
        return None;
    }
    let flags = flags - (AddressFlags::Tentative | AddressFlags::Optimistic);
    let dev = name(a.header.index);
    let p = a.header.prefix_len;
    let key = match (local, address) {
        (Some(l), Some(x)) if l != x => format!("addr {dev} {l} peer {x}/{p}"),
        (Some(x), _) | (None, Some(x)) => format!("addr {dev} {x}/{p}"),
        (None, None) => format!("addr {dev} ?/{p}"),
    };
    Some((
        key,
        format!("scope={} flags={flags:?}{rest}", a.header.scope),
    ))
}

fn table_name(t: u32) -> String {
    match t {
        253 => "default".into(),
        254 => "main".into(),
        255 => "local".into(),
        t => t.to_string(),
    }
}

fn route_addr(a: &RouteAddress) -> String {
    match a {
        RouteAddress::Inet(x) => x.to_string(),
        RouteAddress::Inet6(x) => x.to_string(),
        other => format!("{other:?}"),
    }
}

fn route_item(r: &RouteMessage, name: &dyn Fn(u32) -> String) -> Option<(String, String)> {
    if r.header.flags.contains(RouteFlags::Cloned) {
        return None;
    }
    let h = &r.header;
    let mut table = u32::from(h.table);
    let mut dst = None;
    let mut metric = None;
    let mut dev = None;
    let mut rest = String::new();
    for a in &r.attributes {
        match a {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(d) => dst = Some(route_addr(d)),
            RouteAttribute::Priority(p) => metric = Some(*p),
            RouteAttribute::Oif(i) => dev = Some(name(*i)),
            RouteAttribute::Gateway(g) => rest += &format!(" via {}", route_addr(g)),
            RouteAttribute::PrefSource(s) => rest += &format!(" src {}", route_addr(s)),
            RouteAttribute::Source(s) => {
                rest += &format!(" from {}/{}", route_addr(s), h.source_prefix_length)
            }
            RouteAttribute::Iif(i) => rest += &format!(" iif {}", name(*i)),
            RouteAttribute::CacheInfo(_)
            | RouteAttribute::Expires(_)
            | RouteAttribute::MulticastExpires(_)
            | RouteAttribute::MfcStats(_) => {}
            other => rest += &format!(" {other:?}"),
        }
    }
    let dst = match dst {
        Some(d) => format!("{d}/{}", h.destination_prefix_length),
        None if h.destination_prefix_length == 0 => "default".into(),
        None => format!("?/{}", h.destination_prefix_length),
    };
    let mut key = format!("route {} {dst}", table_name(table));
    if h.tos != 0 {
        key += &format!(" tos {}", h.tos);
    }
    if let Some(m) = metric.filter(|m| *m != 0) {
        key += &format!(" metric {m}");
    }
    if let Some(d) = dev {
        key += &format!(" dev {d}");
    }
    Some((
        key,
        format!(
            "type {:?} proto {} scope {}{rest}",
            h.kind, h.protocol, h.scope
        ),
    ))
}

fn rule_item(r: &RuleMessage) -> (String, String) {
    let h = &r.header;
    let family = match h.family {
        AddressFamily::Inet => "inet".to_string(),
        AddressFamily::Inet6 => "inet6".to_string(),
        f => format!("{f:?}"),
    };
    let mut prio = 0;
    let mut from = None;
    let mut sel = String::new();
    let mut table = u32::from(h.table);
    let mut goto = None;
    let mut rest = String::new();
    for a in &r.attributes {
        match a {
            RuleAttribute::Priority(p) => prio = *p,
            RuleAttribute::Source(s) => from = Some(format!("{s}/{}", h.src_len)),
            RuleAttribute::Destination(d) => sel += &format!(" to {d}/{}", h.dst_len),
            RuleAttribute::Iifname(i) => sel += &format!(" iif {i}"),
            RuleAttribute::Oifname(i) => sel += &format!(" oif {i}"),
            RuleAttribute::FwMark(m) => sel += &format!(" fwmark {m:#x}"),
            RuleAttribute::FwMask(m) => sel += &format!("/{m:#x}"),
            RuleAttribute::UidRange(u) => sel += &format!(" uidrange {u:?}"),
            RuleAttribute::IpProtocol(p) => sel += &format!(" ipproto {p:?}"),
            RuleAttribute::SourcePortRange(p) => sel += &format!(" sport {p:?}"),
            RuleAttribute::DestinationPortRange(p) => sel += &format!(" dport {p:?}"),
            RuleAttribute::L3MDev(true) => sel += " l3mdev",
            RuleAttribute::Table(t) => table = *t,
            RuleAttribute::Goto(g) => goto = Some(*g),
            RuleAttribute::Protocol(p) => rest += &format!(" proto {p}"),
            other => rest += &format!(" {other:?}"),
        }
    }
    if h.tos != 0 {
        sel += &format!(" tos {}", h.tos);
    }
    let action = match h.action {
        RuleAction::ToTable => format!("lookup {}", table_name(table)),
        RuleAction::Goto => format!("goto {}", goto.unwrap_or(0)),
        RuleAction::Nop => "nop".into(),
        RuleAction::Blackhole => "blackhole".into(),
        RuleAction::Unreachable => "unreachable".into(),
        RuleAction::Prohibit => "prohibit".into(),
        other => format!("{other:?}"),
    };
    let from = from.unwrap_or_else(|| "all".into());
    (
        format!("rule {family} {prio} from {from}{sel} {action}"),
        format!("flags={:?}{rest}", h.flags).trim().to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::link::InfoKind;
    use netlink_packet_route::route::{RouteProtocol, RouteScope, RouteType};
    use std::net::{IpAddr, Ipv4Addr};

    fn dummy0() -> LinkMessage {
        let mut l = LinkMessage::default();
        l.header.index = 7;
        l.header.flags = LinkFlags::Up | LinkFlags::Broadcast | LinkFlags::Running;
        l.attributes = vec![
            LinkAttribute::IfName("dummy0".into()),
            LinkAttribute::Mtu(1500),
            LinkAttribute::Address(vec![0x02, 0, 0, 0, 0, 1]),
            LinkAttribute::CarrierChanges(3),
            LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Dummy)]),
        ];
        l
    }

    fn dumps() -> Dumps {
        let mut a = AddressMessage::default();
        a.header.family = AddressFamily::Inet;
        a.header.prefix_len = 24;
        a.header.index = 7;
        a.attributes = vec![
            AddressAttribute::Address(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3))),
            AddressAttribute::Local(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3))),
            AddressAttribute::Flags(AddressFlags::Permanent | AddressFlags::Tentative),
        ];
        let mut r = RouteMessage::default();
        r.header.address_family = AddressFamily::Inet;
        r.header.destination_prefix_length = 8;
        r.header.table = 254;
        r.header.protocol = RouteProtocol::Boot;
        r.header.scope = RouteScope::Link;
        r.header.kind = RouteType::Unicast;
        r.attributes = vec![
            RouteAttribute::Table(254),
            RouteAttribute::Destination(RouteAddress::Inet(Ipv4Addr::new(10, 0, 0, 0))),
            RouteAttribute::Oif(7),
        ];
        let mut u = RuleMessage::default();
        u.header.family = AddressFamily::Inet;
        u.header.table = 100;
        u.header.action = RuleAction::ToTable;
        u.attributes = vec![RuleAttribute::Priority(100), RuleAttribute::Table(100)];
        Dumps {
            links: vec![dummy0()],
            addresses: vec![a],
            routes: vec![r],
            rules: vec![u],
        }
    }

    #[test]
    fn dumps_become_keys_in_ip_words() {
        let mut c = Capture::new();
        render(&dumps(), &mut c);
        let keys: Vec<_> = c.items.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            vec![
                "addr dummy0 10.1.2.3/24",
                "link dummy0",
                "route main 10.0.0.0/8 dev dummy0",
                "rule inet 100 from all lookup 100",
            ]
        );
        let link = &c.items["link dummy0"];
        assert!(
            link.contains("kind=dummy") && link.contains("mtu=1500"),
            "{link}"
        );
        assert!(link.contains("address=02:00:00:00:00:01"), "{link}");
        assert!(
            !link.contains("Running") && !link.contains("CarrierChanges"),
            "{link}"
        );
        let addr = &c.items["addr dummy0 10.1.2.3/24"];
        assert!(
            addr.contains("Permanent") && !addr.contains("Tentative"),
            "{addr}"
        );
        assert_eq!(
            c.items["route main 10.0.0.0/8 dev dummy0"],
            "type Unicast proto boot scope link"
        );
    }

    #[test]
    fn carrier_and_counters_are_not_differences() {
        let mut d2 = dumps();
        d2.links[0].header.flags -= LinkFlags::Running;
        d2.links[0].attributes[3] = LinkAttribute::CarrierChanges(9);
        let (mut a, mut b) = (Capture::new(), Capture::new());
        render(&dumps(), &mut a);
        render(&d2, &mut b);
        assert_eq!(a, b);
        d2.links[0].attributes[1] = LinkAttribute::Mtu(1400);
        let mut b = Capture::new();
        render(&d2, &mut b);
        assert_eq!(super::super::compare(&a, &b).len(), 1);
    }

    #[test]
    fn ipv6_temporary_addresses_and_cloned_routes_are_left_out() {
        let mut d = dumps();
        let mut t = AddressMessage::default();
        t.header.family = AddressFamily::Inet6;
        t.header.index = 7;
        t.header.prefix_len = 64;
        t.attributes = vec![
            AddressAttribute::Address("2001:db8::1".parse().unwrap()),
            AddressAttribute::Flags(AddressFlags::Secondary),
        ];
        d.addresses.push(t);
        let mut r = d.routes[0].clone();
        r.header.flags = RouteFlags::Cloned;
        d.routes.push(r);
        let mut c = Capture::new();
        render(&d, &mut c);
        assert_eq!(c.items.len(), 4, "{:?}", c.items.keys());
    }

    #[test]
    fn the_current_namespace_dumps_without_gaps() {
        // Unprivileged: rtnetlink dumps need no capability.
        let c = capture(None);
        assert!(c.is_complete(), "{:?}", c.gaps);
        assert!(c.items.contains_key("link lo"), "{:?}", c.items.keys());
    }
}
