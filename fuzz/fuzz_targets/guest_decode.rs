//! Arbitrary bytes through what the guest interface reads from a sandbox:
//! the frame reader (in arbitrary pieces), the strict guest decoder, the
//! host-frame refusal and the guest JSON parser. Nothing may panic, and
//! whatever decodes must encode back to the same bytes.
#![no_main]

use allox_protocol::guest::{self, GuestClientFrame, GuestServerFrame};
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
        match decode::<GuestClientFrame>(&payload) {
            Ok(m) => {
                let again = encode(&m).expect("a decoded message encodes");
                let framed = allox_protocol::frame::frame(&payload).unwrap();
                assert_eq!(again, framed);
                // Disjoint from the host's frames by construction.
                assert!(guest::host_frame_refusal(&payload).is_none());
            }
            Err(_) => {
                let _ = guest::host_frame_refusal(&payload);
            }
        }
        let _ = decode::<GuestServerFrame>(&payload);
    }
    let _ = decode::<GuestClientFrame>(data);
    let _ = decode::<GuestServerFrame>(data);
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(req) = guest::parse_json_request(text) {
            let back = guest::request_to_json(&req).to_string();
            assert_eq!(guest::parse_json_request(&back).unwrap(), req);
        }
    }
});
