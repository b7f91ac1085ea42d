//! A DNS server for tests and demos: on a UDP port of 127.0.0.1, it answers
//! `A` queries for the names in its table, `NXDOMAIN` for any other, and
//! records every name it is asked — so a test can point the broker's
//! resolver at it (`--network-resolver`) and count what was looked up.

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{rdata::A, RData, Record, RecordType};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};

pub struct DnsStub {
    addr: SocketAddr,
    asked: Arc<Mutex<Vec<String>>>,
}

impl DnsStub {
    /// Starts serving `names` (without trailing dots) from a thread of its
    /// own, which lives as long as the process.
    pub fn start(names: HashMap<String, Ipv4Addr>) -> std::io::Result<DnsStub> {
        let sock = UdpSocket::bind("127.0.0.1:0")?;
        let addr = sock.local_addr()?;
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = asked.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = sock.recv_from(&mut buf) {
                if let Some(answer) = answer(&buf[..n], &names, &log) {
                    let _ = sock.send_to(&answer, from);
                }
            }
        });
        Ok(DnsStub { addr, asked })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every name asked so far, in order (once per query).
    pub fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn answer(
    query: &[u8],
    names: &HashMap<String, Ipv4Addr>,
    log: &Mutex<Vec<String>>,
) -> Option<Vec<u8>> {
    let q = Message::from_vec(query).ok()?;
    let mut r = Message::new();
    r.set_id(q.id());
    r.set_message_type(MessageType::Response);
    r.set_op_code(q.op_code());
    r.set_recursion_desired(q.recursion_desired());
    r.set_recursion_available(true);
    let mut known = false;
    for query in q.queries() {
        r.add_query(query.clone());
        let name = query.name().to_ascii();
        let name = name.trim_end_matches('.');
        log.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(name.to_string());
        if let Some(ip) = names.get(name) {
            known = true;
            if query.query_type() == RecordType::A {
                r.add_answer(Record::from_rdata(
                    query.name().clone(),
                    60,
                    RData::A(A(*ip)),
                ));
            }
        }
    }
    if !known {
        r.set_response_code(ResponseCode::NXDomain);
    }
    r.to_vec().ok()
}
