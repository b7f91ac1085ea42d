//! Arbitrary bytes through everything that reads untrusted input: the frame
//! reader (in arbitrary pieces), the strict decoder for both directions and
//! the JSON request parser. Nothing may panic, and whatever decodes must
//! encode back to the same bytes.
#![no_main]

use allox_protocol::{decode, encode, json, ClientFrame, FrameReader, ServerFrame};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.first().copied().unwrap_or(0) as usize;
    let mut reader = FrameReader::new();
    let (a, b) = data.split_at(split.min(data.len()));
    reader.push(a);
    reader.push(b);
    while let Some(frame) = reader.next_frame() {
        let Ok(payload) = frame else { continue };
        if let Ok(m) = decode::<ClientFrame>(&payload) {
            let again = encode(&m).expect("a decoded message encodes");
            assert_eq!(&again[..again.len() - 1], &allox_protocol::frame::frame(&payload).unwrap()[..again.len() - 1]);
        }
        let _ = decode::<ServerFrame>(&payload);
    }
    let _ = decode::<ClientFrame>(data);
    let _ = decode::<ServerFrame>(data);
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(req) = json::parse_request(text) {
            let back = json::request_to_json(&req).to_string();
            assert_eq!(json::parse_request(&back).unwrap(), req);
        }
    }
});
