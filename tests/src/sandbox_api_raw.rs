//! A raw client of the in-sandbox interface: frames written by hand, sent by a
//! Python program inside a sandbox (for tests that a run cannot speak the
//! host's protocol there, or forge an identity).

use crate::{call, process_start, ProcDaemon};
use allox_protocol::sandbox_api::*;
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

pub fn sandbox_frame(f: &SandboxClientFrame) -> Vec<u8> {
    encode(f).unwrap()
}

pub fn sandbox_request(id: u64, request: SandboxRequest) -> Vec<u8> {
    sandbox_frame(&SandboxClientFrame::Request(SandboxRequestEnvelope {
        request_id: id,
        request,
    }))
}

pub fn sandbox_error(payload: &[u8]) -> ErrorBody {
    match decode::<SandboxServerFrame>(payload).unwrap() {
        SandboxServerFrame::Response(SandboxResponseEnvelope {
            outcome: SandboxOutcome::Err(e),
            ..
        }) => e,
        other => panic!("{other:?}"),
    }
}
