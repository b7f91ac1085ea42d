//! Bytes on the wire: as bytes in the binary protocol (the same encoding as
//! a `Vec<u8>`: a length, then the bytes), as a base64 string in JSON.

use base64::Engine;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Any bytes, not only UTF-8 text.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Bytes(pub Vec<u8>);

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Short ones as text where they are, long ones by length.
        if self.0.len() <= 64 {
            write!(f, "b{:?}", String::from_utf8_lossy(&self.0))
        } else {
            write!(f, "<{} bytes>", self.0.len())
        }
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Bytes {
        Bytes(v)
    }
}

impl From<&[u8]> for Bytes {
    fn from(v: &[u8]) -> Bytes {
        Bytes(v.to_vec())
    }
}

impl From<&str> for Bytes {
    fn from(v: &str) -> Bytes {
        Bytes(v.as_bytes().to_vec())
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl schemars::JsonSchema for Bytes {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Bytes".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "contentEncoding": "base64",
            "description": "Bytes, base64 (standard alphabet, padded)"
        })
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
        } else {
            s.serialize_bytes(&self.0)
        }
    }
}

struct Visitor;

impl<'de> serde::de::Visitor<'de> for Visitor {
    type Value = Bytes;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("bytes (base64 in JSON)")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Bytes, E> {
        base64::engine::general_purpose::STANDARD
            .decode(v)
            .map(Bytes)
            .map_err(|e| E::custom(format!("not base64: {e}")))
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Bytes, E> {
        Ok(Bytes(v.to_vec()))
    }

    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
        Ok(Bytes(v))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
        while let Some(b) = seq.next_element::<u8>()? {
            v.push(b);
        }
        Ok(Bytes(v))
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        if d.is_human_readable() {
            d.deserialize_str(Visitor)
        } else {
            d.deserialize_bytes(Visitor)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_value_round_trips_both_ways() {
        let all = Bytes((0..=255u8).collect());
        let wire = postcard::to_allocvec(&all).unwrap();
        // The same bytes as a Vec<u8> would give: a length, then the bytes.
        assert_eq!(wire, postcard::to_allocvec(&all.0).unwrap());
        assert_eq!(postcard::from_bytes::<Bytes>(&wire).unwrap(), all);
        let json = serde_json::to_string(&all).unwrap();
        assert!(json.starts_with("\"AAECAwQF"), "{json}");
        assert_eq!(serde_json::from_str::<Bytes>(&json).unwrap(), all);
        let e = serde_json::from_str::<Bytes>("\"not base64!\"").unwrap_err();
        assert!(e.to_string().contains("not base64"), "{e}");
    }
}
