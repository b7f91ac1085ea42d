//! Golden byte vectors for the in-sandbox interface's schema, and its refusal
//! of host frames.

use allox_protocol::sandbox_api::*;
use allox_protocol::*;

fn payload<T: serde::Serialize>(m: &T) -> Vec<u8> {
    postcard::to_stdvec(m).unwrap()
}

#[test]
fn golden_guest_hello() {
    let m = SandboxClientFrame::Hello(SandboxHello {
        version: 1,
        build: "ab".into(),
    });
    // variant 2 (0 and 1 are the host's, reserved), version 1, "ab"
    assert_eq!(payload(&m), [0x02, 0x01, 0x02, b'a', b'b']);
    assert_eq!(
        encode(&m).unwrap(),
        [0x06, 0x02, 0x01, 0x02, b'a', b'b', 0x00]
    );
    let w = SandboxServerFrame::Welcome(SandboxHello {
        version: 1,
        build: "ab".into(),
    });
    assert_eq!(payload(&w), [0x00, 0x01, 0x02, b'a', b'b']);
}

#[test]
fn golden_guest_requests() {
    let req = |request_id, request| {
        payload(&SandboxClientFrame::Request(SandboxRequestEnvelope {
            request_id,
            request,
        }))
    };
    // variant 3, request_id, SandboxRequest variant, fields
    assert_eq!(
        req(1, SandboxRequest::Whoami(Whoami {})),
        [0x03, 0x01, 0x00]
    );
    assert_eq!(
        req(
            300,
            SandboxRequest::TurnBegin(SandboxTurnBegin {
                turn_id: Some("t".into())
            })
        ),
        [0x03, 0xac, 0x02, 0x01, 0x01, 0x01, b't']
    );
    // turn_id None, status failed (1), label None
    assert_eq!(
        req(
            5,
            SandboxRequest::TurnEnd(SandboxTurnEnd {
                turn_id: None,
                status: TurnStatus::Failed,
                label: None,
            })
        ),
        [0x03, 0x05, 0x02, 0x00, 0x01, 0x00]
    );
    assert_eq!(
        req(
            2,
            SandboxRequest::PluginCall(PluginCall {
                route: "x".into(),
                params: "{}".into(),
            })
        ),
        [0x03, 0x02, 0x03, 0x01, b'x', 0x02, b'{', b'}']
    );
}

#[test]
fn golden_guest_responses() {
    let m = SandboxServerFrame::Response(SandboxResponseEnvelope {
        request_id: 5,
        outcome: SandboxOutcome::Ok(SandboxResponse::Identity(SandboxCaller {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: "r".into(),
        })),
    });
    // ServerFrame 2, id 5, Ok 0, Identity 0, "a", "s", "r"
    assert_eq!(
        payload(&m),
        [0x02, 0x05, 0x00, 0x00, 0x01, b'a', 0x01, b's', 0x01, b'r']
    );
    let m = SandboxServerFrame::Response(SandboxResponseEnvelope {
        request_id: 0,
        outcome: SandboxOutcome::Err(ErrorBody::new(ErrorCode::Unsupported, "x")),
    });
    assert_eq!(payload(&m), [0x02, 0x00, 0x01, 0x05, 0x01, b'x']);
    let m = SandboxServerFrame::Refused(ErrorBody::new(ErrorCode::VersionMismatch, "v"));
    assert_eq!(payload(&m), [0x01, 0x04, 0x01, b'v']);
}

#[test]
fn wire_order_of_guest_actions_is_pinned() {
    assert_eq!(
        SandboxRequest::ACTIONS,
        ["whoami", "turn.begin", "turn.end", "plugin.call"]
    );
}

#[test]
fn the_reserved_host_indexes_decode_as_nothing() {
    // Index 0 and 1 followed by anything at all.
    for first in [0u8, 1] {
        for rest in [&[][..], &[0], &[1, 2, 3], &[0x7f; 8]] {
            let mut p = vec![first];
            p.extend_from_slice(rest);
            assert!(decode::<SandboxClientFrame>(&p).is_err(), "{p:?}");
        }
    }
    assert!(decode::<SandboxClientFrame>(&[0x04]).is_err());
}

#[test]
fn a_host_turn_end_naming_another_session_is_refused_as_unsupported() {
    let host = payload(&ClientFrame::Request(RequestEnvelope {
        conversation: 4,
        request_id: 9,
        request: Request::TurnEnd(TurnEnd {
            agent_id: "a".into(),
            session_id: "other".into(),
            turn_id: "turn-1".into(),
            status: TurnStatus::Ok,
            label: None,
        }),
    }));
    let Some(ServerFrame::Response(r)) = sandbox_api::host_frame_refusal(&host) else {
        panic!("a host request is answered in the host's framing");
    };
    assert_eq!((r.conversation, r.request_id), (4, 9));
    let Outcome::Err(e) = r.outcome else {
        panic!("refused")
    };
    assert_eq!(e.code, ErrorCode::Unsupported);
    assert!(
        e.message.starts_with("turn.end is a host action"),
        "{}",
        e.message
    );
    assert!(sandbox_api::host_frame_refusal(&[0x03, 0x01, 0x00]).is_none());
}
