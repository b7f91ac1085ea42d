//! One request to the in-sandbox interface over a fresh connection: what
//! the `allox` client and its `share` commands send.

use allox_protocol::sandbox_api::{
    SandboxClientFrame, SandboxHello, SandboxRequest, SandboxRequestEnvelope, SandboxResponse,
    SandboxServerFrame,
};
use allox_protocol::{decode, encode, ErrorBody, ErrorCode, FrameReader};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

/// One request over a fresh connection.
pub fn ask(socket: &std::path::Path, req: SandboxRequest) -> Result<SandboxResponse, ErrorBody> {
    let unavailable = |what: String| ErrorBody::new(ErrorCode::Unavailable, what);
    let mut s = UnixStream::connect(socket).map_err(|e| {
        unavailable(format!(
            "cannot connect to {}: {e} (the in-sandbox interface exists inside Allox OS sandboxes only)",
            socket.display()
        ))
    })?;
    let send = |s: &mut UnixStream, f: &SandboxClientFrame| -> Result<(), ErrorBody> {
        let bytes = encode(f).map_err(|e| ErrorBody::invalid(allox_protocol::error_chain(&e)))?;
        s.write_all(&bytes)
            .map_err(|e| unavailable(format!("cannot send: {e}")))
    };
    send(&mut s, &SandboxClientFrame::Hello(SandboxHello::new()))?;
    send(
        &mut s,
        &SandboxClientFrame::Request(SandboxRequestEnvelope {
            request_id: 1,
            request: req,
        }),
    )?;
    let mut reader = FrameReader::new();
    let mut buf = [0u8; 16 << 10];
    loop {
        while let Some(frame) = reader.next_frame() {
            let payload = frame.map_err(|e| unavailable(format!("bad answer: {e}")))?;
            let frame: SandboxServerFrame = decode(&payload).map_err(|e| {
                unavailable(format!("bad answer: {}", allox_protocol::error_chain(&e)))
            })?;
            match frame {
                SandboxServerFrame::Welcome(_) => {}
                SandboxServerFrame::Refused(e) => return Err(e),
                SandboxServerFrame::Response(r) => return r.outcome.into(),
            }
        }
        let n = s
            .read(&mut buf)
            .map_err(|e| unavailable(format!("cannot read the answer: {e}")))?;
        if n == 0 {
            return Err(unavailable(
                "the supervisor closed the connection without an answer".into(),
            ));
        }
        reader.push(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_protocol::sandbox_api::Whoami;

    #[test]
    fn outside_a_sandbox_the_error_says_so() {
        let e = ask(
            std::path::Path::new("/nonexistent/guest.sock"),
            SandboxRequest::Whoami(Whoami {}),
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::Unavailable);
        assert!(
            e.message.contains("inside Allox OS sandboxes"),
            "{}",
            e.message
        );
    }
}
