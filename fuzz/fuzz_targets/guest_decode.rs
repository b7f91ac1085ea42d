//! Arbitrary bytes through what the in-sandbox interface reads from a sandbox:
//! the frame reader (in arbitrary pieces), the strict guest decoder, the
//! host-frame refusal and the guest JSON parser. Nothing may panic, and
//! whatever decodes must encode back to the same bytes.
#![no_main]

use allox_protocol::sandbox_api::{self, SandboxClientFrame, SandboxServerFrame};
use allox_protocol::{decode, encode, FrameReader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.first().copied().unwrap_or(0) as usize;
    let mut reader = FrameReader::new();
    let (a, b) = data.split_at(split.min(data.len()));
    reader.push(a);
    reader.push(b);
    while let Some(frame) = reader.next_frame() {
        let Ok(payload) = frame else { continue };
        match decode::<SandboxClientFrame>(&payload) {
            Ok(m) => {
                let again = encode(&m).expect("a decoded message encodes");
                let framed = allox_protocol::frame::frame(&payload).unwrap();
                assert_eq!(again, framed);
                // Disjoint from the host's frames by construction.
                assert!(sandbox_api::host_frame_refusal(&payload).is_none());
            }
            Err(_) => {
                let _ = sandbox_api::host_frame_refusal(&payload);
            }
        }
        let _ = decode::<SandboxServerFrame>(&payload);
    }
    let _ = decode::<SandboxClientFrame>(data);
    let _ = decode::<SandboxServerFrame>(data);
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(req) = sandbox_api::parse_json_request(text) {
            let back = sandbox_api::request_to_json(&req).to_string();
            assert_eq!(sandbox_api::parse_json_request(&back).unwrap(), req);
        }
    }
});
