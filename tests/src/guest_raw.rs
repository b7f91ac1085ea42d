//! A raw client of the guest interface: frames written by hand, sent by a
//! Python program inside a sandbox (for tests that a run cannot speak the
//! host's protocol there, or forge an identity).

use crate::{call, process_start, ProcDaemon};
use allox_protocol::guest::*;
use allox_protocol::*;

/// Frames, each sent on a connection of its own by a raw Python client
/// inside the sandbox; the bytes that came back, per connection.
pub fn raw_exchange(d: &ProcDaemon, a: &str, s: &str, conns: &[(Vec<u8>, usize)]) -> Vec<Vec<u8>> {
    const CLIENT: &str = r#"
import socket, sys
for line in sys.stdin.read().split():
    want, hexed = line.split(":")
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect("/run/allox/guest.sock")
    c.sendall(bytes.fromhex(hexed))
    got = b""
    while got.count(b"\0") < int(want):
        b = c.recv(65536)
        if not b:
            break
        got += b
    c.close()
    print(got.hex())
"#;
    let stdin: Vec<String> = conns
        .iter()
        .map(|(bytes, want)| {
            let hexed: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            format!("{want}:{hexed}")
        })
        .collect();
    let mut p = process_start(a, s, &["python3", "-c", CLIENT]);
    p.stdin = Some(stdin.join("\n").as_str().into());
    let r = match call(d, Request::ProcessStart(p)) {
        Ok(Response::Exited(r)) => r,
        other => panic!("the raw client: {other:?}"),
    };
    assert_eq!(r.exit_code, Some(0), "the raw client: {r:?}");
    r.stdout
        .lines()
        .map(|l| {
            (0..l.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&l[i..i + 2], 16).unwrap())
                .collect()
        })
        .collect()
}

pub fn frames(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut r = FrameReader::new();
    r.push(bytes);
    std::iter::from_fn(|| r.next_frame())
        .map(|f| f.unwrap())
        .collect()
}

pub fn guest_frame(f: &GuestClientFrame) -> Vec<u8> {
    encode(f).unwrap()
}

pub fn guest_request(id: u64, request: GuestRequest) -> Vec<u8> {
    guest_frame(&GuestClientFrame::Request(GuestRequestEnvelope {
        request_id: id,
        request,
    }))
}

pub fn guest_error(payload: &[u8]) -> ErrorBody {
    match decode::<GuestServerFrame>(payload).unwrap() {
        GuestServerFrame::Response(GuestResponseEnvelope {
            outcome: GuestOutcome::Err(e),
            ..
        }) => e,
        other => panic!("{other:?}"),
    }
}
