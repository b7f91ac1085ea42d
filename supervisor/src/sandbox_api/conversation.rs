//! One guest connection's protocol state, apart from its I/O: each frame
//! in, what to do about it out.

use allox_protocol::sandbox_api::{
    host_frame_refusal, SandboxClientFrame, SandboxHello, SandboxOutcome, SandboxRequest,
    SandboxResponseEnvelope, SandboxServerFrame, SANDBOX_API_PROTOCOL_VERSION,
};
use allox_protocol::{decode, encode, ErrorBody, ErrorCode, FrameError};

/// What to do about one frame.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Send these bytes (one whole frame).
    Reply(Vec<u8>),
    /// Send these bytes, then close.
    ReplyAndClose(Vec<u8>),
    /// Answer this request.
    Request { id: u64, request: SandboxRequest },
}

#[derive(Debug, Default)]
pub struct Conversation {
    greeted: bool,
}

impl Conversation {
    pub fn on_frame(&mut self, frame: Result<Vec<u8>, FrameError>) -> Step {
        let payload = match frame {
            Ok(p) => p,
            Err(e) => return Step::Reply(error_frame(0, ErrorBody::invalid(e.to_string()))),
        };
        let why = match decode::<SandboxClientFrame>(&payload) {
            Ok(SandboxClientFrame::ReservedHostHello(never))
            | Ok(SandboxClientFrame::ReservedHostRequest(never)) => match never {},
            Ok(SandboxClientFrame::Hello(h)) => return self.hello(h),
            Ok(SandboxClientFrame::Request(_)) if !self.greeted => {
                return Step::Reply(error_frame(
                    0,
                    ErrorBody::invalid("a guest conversation starts with a Hello"),
                ))
            }
            Ok(SandboxClientFrame::Request(r)) => {
                return Step::Request {
                    id: r.request_id,
                    request: r.request,
                }
            }
            Err(e) => e,
        };
        // Not a guest frame: a host frame is told, in its own framing,
        // that host actions are not served here.
        if let Some(refusal) = host_frame_refusal(&payload) {
            if let Ok(bytes) = encode(&refusal) {
                return Step::Reply(bytes);
            }
        }
        Step::Reply(error_frame(
            0,
            ErrorBody::invalid(format!(
                "not a guest frame: {}",
                allox_protocol::error_chain(&why)
            )),
        ))
    }

    fn hello(&mut self, h: SandboxHello) -> Step {
        if h.version != SANDBOX_API_PROTOCOL_VERSION {
            let refused = SandboxServerFrame::Refused(ErrorBody::new(
                ErrorCode::VersionMismatch,
                format!(
                    "guest protocol version {} is not served; this supervisor speaks {SANDBOX_API_PROTOCOL_VERSION}",
                    h.version
                ),
            ));
            return Step::ReplyAndClose(encode(&refused).unwrap_or_default());
        }
        self.greeted = true;
        Step::Reply(encode(&SandboxServerFrame::Welcome(SandboxHello::new())).unwrap_or_default())
    }
}

/// The frame answering request `id` with `outcome`; an answer too large
/// for a frame becomes an error.
pub fn response_frame(id: u64, outcome: SandboxOutcome) -> Vec<u8> {
    let frame = SandboxServerFrame::Response(SandboxResponseEnvelope {
        request_id: id,
        outcome,
    });
    encode(&frame).unwrap_or_else(|e| {
        error_frame(
            id,
            ErrorBody::new(
                ErrorCode::Internal,
                format!(
                    "the answer cannot be sent: {}",
                    allox_protocol::error_chain(&e)
                ),
            ),
        )
    })
}

fn error_frame(id: u64, e: ErrorBody) -> Vec<u8> {
    let frame = SandboxServerFrame::Response(SandboxResponseEnvelope {
        request_id: id,
        outcome: SandboxOutcome::Err(e),
    });
    encode(&frame).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_protocol::sandbox_api::{SandboxRequestEnvelope, Whoami};
    use allox_protocol::{ClientFrame, Hello, Request, ServerFrame, SessionDelete};

    fn payload<T: serde::Serialize>(m: &T) -> Vec<u8> {
        postcard::to_stdvec(m).unwrap()
    }

    fn server_frame(bytes: &[u8]) -> SandboxServerFrame {
        let mut r = allox_protocol::FrameReader::new();
        r.push(bytes);
        decode(&r.next_frame().unwrap().unwrap()).unwrap()
    }

    fn whoami(id: u64) -> Vec<u8> {
        payload(&SandboxClientFrame::Request(SandboxRequestEnvelope {
            request_id: id,
            request: SandboxRequest::Whoami(Whoami {}),
        }))
    }

    #[test]
    fn hello_first_then_requests() {
        let mut c = Conversation::default();
        let Step::Reply(b) = c.on_frame(Ok(whoami(1))) else {
            panic!("refused")
        };
        assert!(matches!(server_frame(&b), SandboxServerFrame::Response(r)
            if matches!(&r.outcome, SandboxOutcome::Err(e) if e.message.contains("Hello"))));
        let hello = payload(&SandboxClientFrame::Hello(SandboxHello::new()));
        let Step::Reply(b) = c.on_frame(Ok(hello)) else {
            panic!("welcomed")
        };
        assert!(matches!(server_frame(&b), SandboxServerFrame::Welcome(_)));
        assert_eq!(
            c.on_frame(Ok(whoami(7))),
            Step::Request {
                id: 7,
                request: SandboxRequest::Whoami(Whoami {})
            }
        );
    }

    #[test]
    fn another_version_is_refused_and_closed() {
        let mut c = Conversation::default();
        let hello = payload(&SandboxClientFrame::Hello(SandboxHello {
            version: 99,
            build: String::new(),
        }));
        let Step::ReplyAndClose(b) = c.on_frame(Ok(hello)) else {
            panic!("closed")
        };
        assert!(matches!(server_frame(&b), SandboxServerFrame::Refused(e)
            if e.code == ErrorCode::VersionMismatch));
    }

    #[test]
    fn host_frames_are_answered_unsupported_in_the_hosts_framing() {
        let mut c = Conversation::default();
        c.on_frame(Ok(payload(&SandboxClientFrame::Hello(SandboxHello::new()))));
        let host = payload(&ClientFrame::Request(allox_protocol::RequestEnvelope {
            conversation: 3,
            request_id: 4,
            request: Request::SessionDelete(SessionDelete {
                agent_id: "a".into(),
                session_id: "other".into(),
                force: false,
            }),
        }));
        let Step::Reply(b) = c.on_frame(Ok(host)) else {
            panic!("answered")
        };
        let mut r = allox_protocol::FrameReader::new();
        r.push(&b);
        let f: ServerFrame = decode(&r.next_frame().unwrap().unwrap()).unwrap();
        let ServerFrame::Response(env) = f else {
            panic!("{f:?}")
        };
        let allox_protocol::Outcome::Err(e) = env.outcome else {
            panic!("refused")
        };
        assert_eq!(e.code, ErrorCode::Unsupported);
        assert!(e.message.contains("session.delete"), "{}", e.message);
        let Step::Reply(b) = c.on_frame(Ok(payload(&ClientFrame::Hello(Hello::new(1))))) else {
            panic!("answered")
        };
        r.push(&b);
        let f: ServerFrame = decode(&r.next_frame().unwrap().unwrap()).unwrap();
        assert!(matches!(f, ServerFrame::Refused(e) if e.code == ErrorCode::Unsupported));
    }

    #[test]
    fn garbage_is_an_invalid_request() {
        let mut c = Conversation::default();
        for bad in [vec![0x09], vec![0x03, 0x01, 0x09], vec![]] {
            let Step::Reply(b) = c.on_frame(Ok(bad)) else {
                panic!("answered")
            };
            assert!(matches!(server_frame(&b), SandboxServerFrame::Response(r)
                if matches!(&r.outcome, SandboxOutcome::Err(e) if e.code == ErrorCode::InvalidRequest)));
        }
        let Step::Reply(b) = c.on_frame(Err(FrameError::Oversized)) else {
            panic!("answered")
        };
        assert!(matches!(server_frame(&b), SandboxServerFrame::Response(_)));
    }
}
