//! A plain HTTP/1.1 client on one kept connection, as `http.client` or
//! `requests.Session` use one: what the gateway's tests and benchmark
//! drive it with.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub struct KeepAlive {
    s: BufReader<TcpStream>,
    host: String,
    token: String,
}

impl KeepAlive {
    pub fn connect(addr: SocketAddr, token: &str) -> KeepAlive {
        let s = TcpStream::connect(addr).expect("connect to the gateway");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        KeepAlive {
            s: BufReader::new(s),
            host: addr.to_string(),
            token: token.to_owned(),
        }
    }

    /// One request; its status and body. Panics if the server closed the
    /// connection or said it would.
    pub fn post(&mut self, path: &str, body: &str) -> (u16, Value) {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.host,
            self.token,
            body.len()
        );
        // One write, as http.client and requests send a small request
        // (two would wait on this side's Nagle for the server's ACK).
        self.s.get_mut().write_all(request.as_bytes()).unwrap();
        let mut status = String::new();
        self.s.read_line(&mut status).unwrap();
        let code: u16 = status
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no status line: {status:?}"));
        let mut length = 0;
        loop {
            let mut h = String::new();
            self.s.read_line(&mut h).unwrap();
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let lower = h.to_ascii_lowercase();
            assert_ne!(
                lower, "connection: close",
                "the gateway closed a keep-alive connection"
            );
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        self.s.read_exact(&mut body).unwrap();
        (code, serde_json::from_slice(&body).unwrap())
    }
}
