//! A DNS server on 127.0.0.1 answering the names it is given, for demos
//! and tests that point the broker at it (`--network-resolver`) instead of
//! the system's resolver: `allox-dns-stub NAME=ADDRESS ...` prints the
//! address it listens on, then serves until killed. Every other name is
//! answered "no such name".

use allox_network::stub::DnsStub;
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut names = HashMap::new();
    for a in std::env::args().skip(1) {
        let parsed = a
            .split_once('=')
            .and_then(|(n, v)| Some((n.to_string(), v.parse::<Ipv4Addr>().ok()?)));
        match parsed {
            Some((n, v)) if !n.is_empty() => {
                names.insert(n.trim_end_matches('.').to_ascii_lowercase(), v);
            }
            _ => {
                eprintln!("allox-dns-stub: {a:?}: expected NAME=IPV4-ADDRESS");
                return ExitCode::from(2);
            }
        }
    }
    match DnsStub::start(names) {
        Ok(stub) => {
            println!("{}", stub.addr());
            loop {
                std::thread::park();
            }
        }
        Err(e) => {
            eprintln!("allox-dns-stub: cannot listen on 127.0.0.1: {e}");
            ExitCode::FAILURE
        }
    }
}
