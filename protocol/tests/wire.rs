//! Golden byte vectors and hostile inputs for the wire format.

use allox_protocol::*;

fn payload<T: serde::Serialize>(m: &T) -> Vec<u8> {
    postcard::to_stdvec(m).unwrap()
}

#[test]
fn golden_hello() {
    let m = ClientFrame::Hello(Hello {
        version: 2,
        build: "ab".into(),
        conversation: 5,
    });
    // variant 0, version varint 2, string len 2, "ab", conversation 5
    assert_eq!(payload(&m), [0x00, 0x02, 0x02, b'a', b'b', 0x05]);
    // COBS: the frame has no zero inside and ends with one.
    assert_eq!(
        encode(&m).unwrap(),
        [0x01, 0x06, 0x02, 0x02, b'a', b'b', 0x05, 0x00]
    );
}

#[test]
fn golden_request() {
    let m = ClientFrame::Request(RequestEnvelope {
        conversation: 9,
        request_id: 300,
        request: Request::AgentCreate(AgentCreate::new("a")),
    });
    // variant 1, conversation 9, request_id 300 = varint ac 02, Request
    // variant 1, "a", auto_checkpoint None, keep_last None, network
    // None, egress None, idle timeout None, lifetime None
    assert_eq!(
        payload(&m),
        [0x01, 0x09, 0xac, 0x02, 0x01, 0x01, b'a', 0x00, 0x00, 0x00, 0x00, 0x00, 0x00]
    );
    let m = ClientFrame::Request(RequestEnvelope {
        conversation: 1,
        request_id: 2,
        request: Request::SessionCreate(SessionCreate {
            network: Some(NetworkMode::Proxy),
            egress: Some(Egress {
                allow: Some(vec!["x".into()]),
                deny: vec![],
            }),
            ..SessionCreate::new("a", "s")
        }),
    });
    // variant 4, "a", "s", five limits and policies None, network Some
    // proxy (2), egress Some { allow Some ["x"], deny [] }, idle timeout
    // and lifetime None
    assert_eq!(
        payload(&m),
        [
            0x01, 0x01, 0x02, 0x04, 0x01, b'a', 0x01, b's', 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
            0x02, 0x01, 0x01, 0x01, 0x01, b'x', 0x00, 0x00, 0x00
        ]
    );
    let m = ClientFrame::Request(RequestEnvelope {
        conversation: 1,
        request_id: 7,
        request: Request::SessionRollback(SessionRollback {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "c".into(),
            kill_processes: Some(true),
        }),
    });
    assert_eq!(
        payload(&m),
        [0x01, 0x01, 0x07, 0x0b, 0x01, b'a', 0x01, b's', 0x01, b'c', 0x01, 0x01]
    );
}

#[test]
fn golden_responses() {
    let m = ServerFrame::Response(ResponseEnvelope {
        conversation: 3,
        request_id: 2,
        outcome: Outcome::Err(ErrorBody::new(ErrorCode::Conflict, "x")),
    });
    // ServerFrame 2, conversation 3, id 2, Outcome::Err 1, code 2
    // (conflict), "x"
    assert_eq!(payload(&m), [0x02, 0x03, 0x02, 0x01, 0x02, 0x01, b'x']);
    let m = ServerFrame::Response(ResponseEnvelope {
        conversation: 3,
        request_id: 1,
        outcome: Outcome::Ok(Response::Deleted(Deleted {
            deleted: "a".into(),
        })),
    });
    assert_eq!(payload(&m), [0x02, 0x03, 0x01, 0x00, 0x08, 0x01, b'a']);
}

#[test]
fn golden_diff_with_patches() {
    let m = ClientFrame::Request(RequestEnvelope {
        conversation: 1,
        request_id: 2,
        request: Request::CheckpointDiff(CheckpointDiff {
            agent_id: "a".into(),
            session_id: "s".into(),
            from: "x".into(),
            to: "y".into(),
            patch: true,
        }),
    });
    // Request variant 21, four strings, patch true last.
    assert_eq!(
        payload(&m),
        [0x01, 0x01, 0x02, 0x15, 0x01, b'a', 0x01, b's', 0x01, b'x', 0x01, b'y', 0x01]
    );
    let m = ServerFrame::Response(ResponseEnvelope {
        conversation: 3,
        request_id: 1,
        outcome: Outcome::Ok(Response::Diff(DiffListing {
            from: "a".into(),
            to: "b".into(),
            changes: vec![Change {
                path: "f".into(),
                kind: ChangeKind::Modified,
                size_before: Some(1),
                size_after: Some(2),
                patch: Some("p".into()),
                patch_truncated: true,
                escaped: false,
                unread: false,
            }],
            truncated: false,
            added: 0,
            modified: 1,
            deleted: 0,
            type_changed: 0,
            patch_truncated: true,
        })),
    });
    // Response variant 17; one change: "f", modified (1), Some 1, Some 2,
    // patch Some "p", cut, not escaped, read; not truncated, the four
    // counts, cut.
    assert_eq!(
        payload(&m),
        [
            0x02, 0x03, 0x01, 0x00, 0x11, 0x01, b'a', 0x01, b'b', 0x01, 0x01, b'f', 0x01, 0x01,
            0x01, 0x01, 0x02, 0x01, 0x01, b'p', 0x01, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
            0x01
        ]
    );
}

#[test]
fn wire_order_of_actions_and_codes_is_pinned() {
    assert_eq!(
        Request::ACTIONS,
        [
            "system.ping",
            "agent.create",
            "agent.list",
            "agent.delete",
            "session.create",
            "session.list",
            "session.delete",
            "checkpoint.create",
            "checkpoint.list",
            "checkpoint.delete",
            "checkpoint.pin",
            "session.rollback",
            "audit.list",
            "process.start",
            "process.wait",
            "process.kill",
            "process.list",
            "process.stdin",
            "turn.begin",
            "turn.end",
            "policy.set",
            "checkpoint.diff",
            "system.shutdown",
            "system.info",
            "process.events",
            "process.tree",
            "store.check",
            "plugin.list",
            "network.policy.set",
            "network.policy.get",
            "network.audit",
            "fs.stat",
            "fs.list",
            "fs.read",
            "fs.write",
            "fs.mkdir",
            "fs.remove",
            "fs.move",
            "fs.watch",
            "process.resize",
            "process.attach",
            "share.list",
            "share.agent.set",
            "share.session.set",
            "session.stats",
            "session.update",
            "monitor.ingest",
            "monitor.records",
            "monitor.summary",
            "monitor.timeline",
            "process.logs",
            "effects.get",
            "effects.list",
            "effects.history",
            "effects.status",
            "effects.unfence",
            "session.fork",
            "session.pause",
            "session.resume",
            "session.info",
            "effects.verify",
            "effects.export",
            "system.metrics",
            "session.export",
            "session.import",
            "fs.upload_local",
            "fs.download_local",
            "secret.set",
            "secret.list",
            "secret.delete",
            "port.expose",
            "port.unexpose",
            "port.list",
            "port.connect",
            "system.resumed",
        ]
    );
    for (i, code) in ErrorCode::ALL.iter().enumerate() {
        assert_eq!(payload(code), [i as u8]);
    }
}

#[test]
fn round_trip_through_frames() {
    let msgs = vec![
        ClientFrame::Hello(Hello::new(u64::MAX)),
        ClientFrame::Request(RequestEnvelope {
            conversation: u64::MAX,
            request_id: u64::MAX,
            request: Request::CheckpointCreate(CheckpointCreate {
                agent_id: "agent-a".into(),
                session_id: "s".into(),
                checkpoint_id: "c\u{0}zero".into(),
                pinned: true,
                label: Some("label with \0 inside".into()),
            }),
        }),
    ];
    let mut r = FrameReader::new();
    for m in &msgs {
        r.push(&encode(m).unwrap());
    }
    for m in &msgs {
        let p = r.next_frame().unwrap().unwrap();
        assert_eq!(&decode::<ClientFrame>(&p).unwrap(), m);
    }
}

#[test]
fn trailing_bytes_are_refused() {
    let mut p = payload(&ClientFrame::Hello(Hello {
        version: 1,
        build: String::new(),
        conversation: 1,
    }));
    p.push(0x00);
    assert!(matches!(
        decode::<ClientFrame>(&p),
        Err(DecodeError::TrailingBytes(1))
    ));
}

#[test]
fn unknown_variants_are_refused() {
    assert!(decode::<ClientFrame>(&[0x02]).is_err());
    // Request variant 200
    assert!(decode::<ClientFrame>(&[0x01, 0x01, 0x01, 0xc8, 0x01]).is_err());
    // ErrorCode 8
    assert!(decode::<ServerFrame>(&[0x02, 0x01, 0x02, 0x01, 0x08, 0x00]).is_err());
}

#[test]
fn overlong_and_noncanonical_varints_are_refused() {
    // version 1 as a two-byte varint (0x81 0x00): decodes to 1 but is not
    // canonical (then an empty build string, conversation 0).
    assert!(matches!(
        decode::<ClientFrame>(&[0x00, 0x81, 0x00, 0x00, 0x00]),
        Err(DecodeError::NonCanonical)
    ));
    // A u32 varint of 6 bytes is longer than any u32.
    assert!(decode::<ClientFrame>(&[0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00]).is_err());
    // u64 request id of 11 bytes.
    let mut p = vec![0x01];
    p.extend([0xff; 10]);
    p.extend([0x01, 0x02, 0x00]);
    assert!(decode::<ClientFrame>(&p).is_err());
}

#[test]
fn invalid_utf8_is_refused() {
    assert!(decode::<ClientFrame>(&[0x00, 0x01, 0x02, 0xc3, 0x28]).is_err());
}

#[test]
fn huge_length_prefix_does_not_allocate_or_panic() {
    // String claiming 2^32 bytes with 2 present.
    assert!(
        decode::<ClientFrame>(&[0x00, 0x01, 0xff, 0xff, 0xff, 0xff, 0x0f, b'a', b'b']).is_err()
    );
}

#[test]
fn every_prefix_of_a_valid_message_is_an_error_not_a_panic() {
    let p = payload(&ClientFrame::Request(RequestEnvelope {
        conversation: 12345,
        request_id: 99,
        request: Request::CheckpointCreate(CheckpointCreate {
            agent_id: "agent".into(),
            session_id: "session".into(),
            checkpoint_id: "ckpt".into(),
            pinned: false,
            label: Some("l".into()),
        }),
    }));
    for n in 0..p.len() {
        assert!(decode::<ClientFrame>(&p[..n]).is_err(), "prefix {n}");
    }
    assert!(decode::<ClientFrame>(&p).is_ok());
}

#[test]
fn golden_plugin_list() {
    let m = ClientFrame::Request(RequestEnvelope {
        conversation: 1,
        request_id: 2,
        request: Request::PluginList(PluginListRequest {}),
    });
    // Request variant 27, no fields.
    assert_eq!(payload(&m), [0x01, 0x01, 0x02, 0x1b]);
    let m = ServerFrame::Response(ResponseEnvelope {
        conversation: 1,
        request_id: 2,
        outcome: Outcome::Ok(Response::Plugins(PluginListing {
            loaded: vec![PluginInfo {
                name: "p".into(),
                api_version: 1,
                routes: vec!["r".into()],
                conflicts: vec![],
            }],
            installed: vec![InstalledPlugin {
                name: "p".into(),
                api_version: 1,
                enabled: true,
                summary: String::new(),
            }],
        })),
    });
    // Response variant 23; loaded: 1 × ("p", 1, ["r"], []); installed:
    // 1 × ("p", 1, true, "").
    assert_eq!(
        payload(&m),
        [
            0x02, 0x01, 0x02, 0x00, 0x17, 0x01, 0x01, b'p', 0x01, 0x01, 0x01, b'r', 0x00, 0x01,
            0x01, b'p', 0x01, 0x01, 0x00
        ]
    );
}
