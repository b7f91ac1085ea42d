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
        self.send(path, body, false)
    }

    /// As [`KeepAlive::post`], the head and the body in two writes, Nagle
    /// on, as httpx (h11) sends a request.
    pub fn post_split(&mut self, path: &str, body: &str) -> (u16, Value) {
        self.send(path, body, true)
    }

    fn send(&mut self, path: &str, body: &str, split: bool) -> (u16, Value) {
        if split {
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                self.host,
                self.token,
                body.len()
            );
            let s = self.s.get_mut();
            s.write_all(head.as_bytes()).unwrap();
            s.write_all(body.as_bytes()).unwrap();
            return self.read_answer();
        }
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.host,
            self.token,
            body.len()
        );
        // One write, as http.client and requests send a small request.
        self.s.get_mut().write_all(request.as_bytes()).unwrap();
        self.read_answer()
    }

    fn read_answer(&mut self) -> (u16, Value) {
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
