//! nftables, part of the `network` domain: netlink dumps (`NETLINK_NETFILTER`,
//! the `nf_tables` subsystem) of the namespace's tables, chains, rules,
//! sets, stateful objects and flowtables.
//!
//! Keys, in `nft`'s words, and values (the sha256 of the object's
//! attributes as the kernel dumps them, volatile ones left out):
//! * `nft table FAMILY NAME`: without its use count;
//! * `nft chain FAMILY TABLE NAME`: without its use count and counters;
//! * `nft rule FAMILY TABLE CHAIN HANDLE`: its expressions, a `counter`'s,
//!   `quota`'s, `last`'s and `connlimit`'s running state left out (their
//!   names stay: a counter added or removed is a change);
//! * `nft set FAMILY TABLE NAME`: without its expressions (their
//!   counters); the elements are not captured;
//! * `nft object FAMILY TABLE NAME`: its type and user data (a counter's or
//!   quota's state is traffic, not configuration);
//! * `nft flowtable FAMILY TABLE NAME`: without its use count.
//!
//! A kernel without nftables is an observation (`nftables: none in this
//! kernel`), not a gap: nothing there can change.

use super::Capture;
use sha2::{Digest, Sha256};

const NETLINK_NETFILTER: isize = 12;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_DUMP_INTR: u16 = 0x10;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLA_TYPE_MASK: u16 = 0x3fff;

/// What a dump asks for: its request and answer message types, the word
/// in the key, and the attributes of its name, its table and (rules) its
/// chain, and those left out of the value.
struct Kind {
    get: u16,
    new: u16,
    word: &'static str,
    table: u16,
    name: u16,
    chain: Option<u16>,
    /// Rules: the handle (a big-endian u64) is the name.
    handle_is_name: bool,
    skip: &'static [u16],
}

const KINDS: [Kind; 6] = [
    // NFT_MSG_GETTABLE / NEWTABLE; NFTA_TABLE_NAME 1, USE 3, PAD 5.
    Kind {
        get: 1,
        new: 0,
        word: "table",
        table: 0,
        name: 1,
        chain: None,
        handle_is_name: false,
        skip: &[3, 5],
    },
    // GETCHAIN / NEWCHAIN; NFTA_CHAIN_TABLE 1, NAME 3, USE 6, COUNTERS 8, PAD 9.
    Kind {
        get: 4,
        new: 3,
        word: "chain",
        table: 1,
        name: 3,
        chain: None,
        handle_is_name: false,
        skip: &[6, 8, 9],
    },
    // GETRULE / NEWRULE; NFTA_RULE_TABLE 1, CHAIN 2, HANDLE 3, PAD 8.
    Kind {
        get: 7,
        new: 6,
        word: "rule",
        table: 1,
        name: 3,
        chain: Some(2),
        handle_is_name: true,
        skip: &[8],
    },
    // GETSET / NEWSET; NFTA_SET_TABLE 1, NAME 2, PAD 14, EXPR 17, EXPRESSIONS 18.
    Kind {
        get: 10,
        new: 9,
        word: "set",
        table: 1,
        name: 2,
        chain: None,
        handle_is_name: false,
        skip: &[14, 17, 18],
    },
    // GETOBJ / NEWOBJ; NFTA_OBJ_TABLE 1, NAME 2, DATA 4, USE 5, PAD 7.
    Kind {
        get: 19,
        new: 18,
        word: "object",
        table: 1,
        name: 2,
        chain: None,
        handle_is_name: false,
        skip: &[4, 5, 7],
    },
    // GETFLOWTABLE / NEWFLOWTABLE; NFTA_FLOWTABLE_TABLE 1, NAME 2, USE 4, PAD 6.
    Kind {
        get: 23,
        new: 22,
        word: "flowtable",
        table: 1,
        name: 2,
        chain: None,
        handle_is_name: false,
        skip: &[4, 6],
    },
];

/// NFTA_RULE_EXPRESSIONS.
const RULE_EXPRESSIONS: u16 = 4;
/// Expressions whose data is running state, not configuration.
const STATEFUL: [&str; 4] = ["counter", "quota", "last", "connlimit"];

/// Adds the nftables items of the current network namespace to `c`.
pub fn capture_into(c: &mut Capture) {
    let open = || -> std::io::Result<netlink_sys::Socket> {
        let mut s = netlink_sys::Socket::new(NETLINK_NETFILTER)?;
        s.bind_auto()?;
        s.connect(&netlink_sys::SocketAddr::new(0, 0))?;
        Ok(s)
    };
    let sock = match open() {
        Ok(s) => s,
        Err(e) if e.raw_os_error() == Some(libc::EPROTONOSUPPORT) => {
            c.insert("nftables", "none in this kernel");
            return;
        }
        Err(e) => return c.gap(format!("nftables: cannot open a netlink socket: {e}")),
    };
    for k in &KINDS {
        match dump(&sock, k.get) {
            Ok(msgs) => {
                for m in msgs {
                    if let Some((key, value)) = item(k, &m) {
                        c.insert(key, value);
                    }
                }
            }
            // No nf_tables subsystem: nothing of it can change.
            Err(Dump::Absent) => {
                c.insert("nftables", "none in this kernel");
                return;
            }
            Err(Dump::Failed(why)) => c.gap(format!("nftables: {} dump: {why}", k.word)),
        }
    }
}

enum Dump {
    Absent,
    Failed(String),
}

/// One answer: its message type and its payload after the nfgenmsg.
struct Msg {
    kind: u16,
    family: u8,
    attrs: Vec<u8>,
}

fn dump(sock: &netlink_sys::Socket, get: u16) -> Result<Vec<Msg>, Dump> {
    for _ in 0..5 {
        if let Some(v) = dump_once(sock, get)? {
            return Ok(v);
        }
    }
    Err(Dump::Failed(
        "interrupted by changes five times in a row".into(),
    ))
}

fn dump_once(sock: &netlink_sys::Socket, get: u16) -> Result<Option<Vec<Msg>>, Dump> {
    let failed = |what: &str, e: std::io::Error| Dump::Failed(format!("{what}: {e}"));
    // nlmsghdr (16 bytes) + nfgenmsg (family AF_UNSPEC, version 0, res_id 0).
    let mut req = Vec::with_capacity(20);
    req.extend_from_slice(&20u32.to_ne_bytes());
    req.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | get).to_ne_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    req.extend_from_slice(&[0, 0, 0, 0]);
    sock.send(&req, 0).map_err(|e| failed("send", e))?;
    let mut out = Vec::new();
    let mut interrupted = false;
    let mut rx = vec![0u8; 1 << 16];
    loop {
        let n = sock
            .recv(&mut &mut rx[..], 0)
            .map_err(|e| failed("recv", e))?;
        let mut off = 0;
        while off + 16 <= n {
            let h = &rx[off..n];
            let len = u32::from_ne_bytes(h[0..4].try_into().unwrap()) as usize;
            let kind = u16::from_ne_bytes(h[4..6].try_into().unwrap());
            let flags = u16::from_ne_bytes(h[6..8].try_into().unwrap());
            if len < 16 || len > h.len() {
                return Err(Dump::Failed("an answer does not parse".into()));
            }
            if flags & NLM_F_DUMP_INTR != 0 {
                interrupted = true;
            }
            match kind {
                NLMSG_DONE => return Ok((!interrupted).then_some(out)),
                NLMSG_ERROR => {
                    let errno = i32::from_ne_bytes(h[16..20].try_into().unwrap_or([0; 4]));
                    if errno == 0 {
                        // An acknowledgement, not an error.
                    } else if [
                        -libc::ENOENT,
                        -libc::EOPNOTSUPP,
                        -libc::EPROTONOSUPPORT,
                        // nfnetlink without the nf_tables subsystem.
                        -libc::EINVAL,
                    ]
                    .contains(&errno)
                    {
                        return Err(Dump::Absent);
                    } else {
                        return Err(Dump::Failed(format!(
                            "the kernel refused: {}",
                            std::io::Error::from_raw_os_error(-errno)
                        )));
                    }
                }
                _ if len >= 20 => out.push(Msg {
                    kind,
                    family: h[16],
                    attrs: h[20..len].to_vec(),
                }),
                _ => {}
            }
            off += (len + 3) & !3;
        }
    }
}

/// The attributes of `b`: (type without flags, payload).
fn attrs(b: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 4 <= b.len() {
        let len = u16::from_ne_bytes([b[off], b[off + 1]]) as usize;
        let ty = u16::from_ne_bytes([b[off + 2], b[off + 3]]) & NLA_TYPE_MASK;
        if len < 4 || off + len > b.len() {
            break;
        }
        out.push((ty, &b[off + 4..off + len]));
        off += (len + 3) & !3;
    }
    out
}

fn text(b: &[u8]) -> String {
    let b = b.strip_suffix(&[0]).unwrap_or(b);
    String::from_utf8_lossy(b).replace(' ', "\\x20")
}

fn family(f: u8) -> String {
    match f {
        1 => "inet".into(),
        2 => "ip".into(),
        3 => "arp".into(),
        5 => "netdev".into(),
        7 => "bridge".into(),
        10 => "ip6".into(),
        other => format!("family{other}"),
    }
}

/// A rule's expressions as hashed: each expression's name, and its data
/// unless it is running state.
fn expressions(b: &[u8], h: &mut Sha256) {
    for (_, elem) in attrs(b) {
        let parts = attrs(elem);
        // NFTA_EXPR_NAME 1, NFTA_EXPR_DATA 2.
        let name = parts
            .iter()
            .find(|(t, _)| *t == 1)
            .map(|(_, v)| text(v))
            .unwrap_or_default();
        h.update(b"expr ");
        h.update(name.as_bytes());
        if !STATEFUL.contains(&name.as_str()) {
            for (t, v) in parts.iter().filter(|(t, _)| *t == 2) {
                h.update(t.to_ne_bytes());
                h.update((v.len() as u32).to_ne_bytes());
                h.update(v);
            }
        }
    }
}

/// The key and value of one dumped object of kind `k`.
fn item(k: &Kind, m: &Msg) -> Option<(String, String)> {
    if m.kind != (NFNL_SUBSYS_NFTABLES << 8) | k.new {
        return None;
    }
    let a = attrs(&m.attrs);
    let get = |t: u16| a.iter().find(|(ty, _)| *ty == t).map(|(_, v)| *v);
    let name = if k.handle_is_name {
        let h = get(k.name)?;
        u64::from_be_bytes(h.try_into().ok()?).to_string()
    } else {
        text(get(k.name)?)
    };
    let mut key = format!("nft {} {}", k.word, family(m.family));
    if k.table != 0 {
        key.push(' ');
        key.push_str(&text(get(k.table)?));
    }
    if let Some(c) = k.chain {
        key.push(' ');
        key.push_str(&text(get(c)?));
    }
    key.push(' ');
    key.push_str(&name);
    let mut h = Sha256::new();
    for (t, v) in &a {
        if k.skip.contains(t) {
            continue;
        }
        h.update(t.to_ne_bytes());
        if k.word == "rule" && *t == RULE_EXPRESSIONS {
            expressions(v, &mut h);
            continue;
        }
        h.update((v.len() as u32).to_ne_bytes());
        h.update(v);
    }
    Some((key, crate::chain::hex(&h.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nla(ty: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
        v.extend_from_slice(&ty.to_ne_bytes());
        v.extend_from_slice(payload);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v
    }

    fn rule(counter_packets: u64, expr: &str) -> Msg {
        let data = nla(1, &counter_packets.to_be_bytes());
        let mut e = nla(1, format!("{expr}\0").as_bytes());
        e.extend(nla(2 | 0x8000, &data));
        let list = nla(1 | 0x8000, &e);
        let mut attrs = nla(1, b"filter\0");
        attrs.extend(nla(2, b"input\0"));
        attrs.extend(nla(3, &7u64.to_be_bytes()));
        attrs.extend(nla(4 | 0x8000, &list));
        Msg {
            kind: (NFNL_SUBSYS_NFTABLES << 8) | 6,
            family: 1,
            attrs,
        }
    }

    #[test]
    fn a_rule_is_keyed_by_family_table_chain_and_handle_and_its_counters_do_not_count() {
        let (k, v) = item(&KINDS[2], &rule(1, "counter")).unwrap();
        assert_eq!(k, "nft rule inet filter input 7");
        // The counter's packets moved: the same rule.
        assert_eq!(item(&KINDS[2], &rule(99, "counter")).unwrap().1, v);
        // Another expression's data is configuration: a change.
        let (_, a) = item(&KINDS[2], &rule(1, "payload")).unwrap();
        let (_, b) = item(&KINDS[2], &rule(2, "payload")).unwrap();
        assert_ne!(a, b);
        // Another message type is not a rule.
        let mut m = rule(1, "counter");
        m.kind = (NFNL_SUBSYS_NFTABLES << 8) | 3;
        assert!(item(&KINDS[2], &m).is_none());
    }

    #[test]
    fn a_table_is_keyed_by_family_and_name_and_its_use_count_does_not_count() {
        let table = |use_count: u32, flags: u32| Msg {
            kind: NFNL_SUBSYS_NFTABLES << 8,
            family: 2,
            attrs: [
                nla(1, b"nat\0"),
                nla(2, &flags.to_be_bytes()),
                nla(3, &use_count.to_be_bytes()),
            ]
            .concat(),
        };
        let (k, v) = item(&KINDS[0], &table(1, 0)).unwrap();
        assert_eq!(k, "nft table ip nat");
        assert_eq!(item(&KINDS[0], &table(5, 0)).unwrap().1, v);
        assert_ne!(item(&KINDS[0], &table(1, 1)).unwrap().1, v);
    }
}
