//! The collectors: each captures one domain's state as items, `key →
//! value` text in key order, at A (before the run's first instruction) and
//! at B (its tree exited, its cgroup empty and frozen). [`compare`] lists
//! what differs.
//!
//! A collector that cannot see all of its domain says so
//! ([`Capture::gaps`]): the domain is then `INCOMPLETE`, never
//! `CONSISTENT`.

pub mod bpf;
pub mod fanotify;
pub mod modules;
pub mod mounts;
pub mod network;
pub mod nftables;
mod ns;
pub mod snapshots;
pub mod sysctl;
pub mod tree;

use allox_protocol::EffectChangeKind;
use std::collections::BTreeMap;

/// One domain's state at one point.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Capture {
    // The fields in the order of their names: written as they are, they
    // are already in canonical order (crate::chain::canonical).
    /// What could not be seen, each as a line saying what and why (a file
    /// that could not be read, a dump that failed).
    pub gaps: Vec<String>,
    /// What was seen: a key naming the item (`net.ipv4.ip_forward`,
    /// `prog 42 allox_fork`), its value as text.
    #[serde(deserialize_with = "map_built_at_once")]
    pub items: BTreeMap<String, String>,
}

/// A map read back as it was written (its keys ascending, as a
/// `BTreeMap` writes them) and built at once: a map of thousands of
/// entries inserted one by one compares each key with a dozen others.
/// Keys out of order or twice are taken as inserting them would (the last
/// of equal keys kept).
fn map_built_at_once<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    struct Entries;
    impl<'de> serde::de::Visitor<'de> for Entries {
        type Value = BTreeMap<String, String>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of strings")
        }

        fn visit_map<M: serde::de::MapAccess<'de>>(
            self,
            mut m: M,
        ) -> Result<Self::Value, M::Error> {
            let mut entries = Vec::with_capacity(m.size_hint().unwrap_or(0).min(1 << 16));
            while let Some(e) = m.next_entry::<String, String>()? {
                entries.push(e);
            }
            Ok(entries.into_iter().collect())
        }
    }
    d.deserialize_map(Entries)
}

impl Capture {
    pub fn new() -> Capture {
        Capture::default()
    }

    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.items.insert(key.into(), value.into());
    }

    pub fn gap(&mut self, why: impl Into<String>) {
        self.gaps.push(why.into());
    }

    /// Whether it saw all of its domain.
    pub fn is_complete(&self) -> bool {
        self.gaps.is_empty()
    }
}

/// One difference between two captures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    pub key: String,
    pub kind: EffectChangeKind,
    pub before: Option<String>,
    pub after: Option<String>,
}

/// The items that differ between `a` and `b`, in key order.
pub fn compare(a: &Capture, b: &Capture) -> Vec<Difference> {
    let mut out = Vec::new();
    let mut ia = a.items.iter().peekable();
    let mut ib = b.items.iter().peekable();
    loop {
        let kind = match (ia.peek(), ib.peek()) {
            (None, None) => break,
            (Some(_), None) => EffectChangeKind::Removed,
            (None, Some(_)) => EffectChangeKind::Added,
            (Some((ka, _)), Some((kb, _))) => match ka.cmp(kb) {
                std::cmp::Ordering::Less => EffectChangeKind::Removed,
                std::cmp::Ordering::Greater => EffectChangeKind::Added,
                std::cmp::Ordering::Equal => EffectChangeKind::Modified,
            },
        };
        match kind {
            EffectChangeKind::Removed => {
                let (k, v) = ia.next().expect("peeked");
                out.push(Difference {
                    key: k.clone(),
                    kind,
                    before: Some(v.clone()),
                    after: None,
                });
            }
            EffectChangeKind::Added => {
                let (k, v) = ib.next().expect("peeked");
                out.push(Difference {
                    key: k.clone(),
                    kind,
                    before: None,
                    after: Some(v.clone()),
                });
            }
            EffectChangeKind::Modified => {
                let (k, va) = ia.next().expect("peeked");
                let (_, vb) = ib.next().expect("peeked");
                if va != vb {
                    out.push(Difference {
                        key: k.clone(),
                        kind,
                        before: Some(va.clone()),
                        after: Some(vb.clone()),
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A capture of `items` (for the tests of what compares captures).
    pub(crate) fn cap(items: &[(&str, &str)]) -> Capture {
        let mut c = Capture::new();
        for (k, v) in items {
            c.insert(*k, *v);
        }
        c
    }

    #[test]
    fn a_capture_read_back_is_the_capture_written_and_its_map_as_inserting_would_make_it() {
        let mut c = cap(&[("net.b", "1"), ("net.a", "2"), ("z", "")]);
        c.gap("one");
        let back: Capture = serde_json::from_slice(&serde_json::to_vec(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        // Out of order and twice (not what is written, but read all the
        // same): what inserting one by one would make, the last kept.
        let text = r#"{"items":{"b":"1","a":"2","b":"3","c":"4","a":"5"},"gaps":[]}"#;
        let read: Capture = serde_json::from_str(text).unwrap();
        let inserted: BTreeMap<String, String> =
            serde_json::from_str(r#"{"b":"1","a":"2","b":"3","c":"4","a":"5"}"#).unwrap();
        assert_eq!(read.items, inserted);
        assert_eq!(read.items["a"], "5");
        assert!(serde_json::from_str::<Capture>(r#"{"items":{"a":1},"gaps":[]}"#).is_err());
    }

    #[test]
    fn differences_are_added_removed_and_modified_in_key_order() {
        let a = cap(&[("a", "1"), ("b", "2"), ("c", "3")]);
        let b = cap(&[("b", "2"), ("c", "4"), ("d", "5")]);
        let d = compare(&a, &b);
        let got: Vec<_> = d.iter().map(|d| (d.key.as_str(), d.kind)).collect();
        assert_eq!(
            got,
            vec![
                ("a", EffectChangeKind::Removed),
                ("c", EffectChangeKind::Modified),
                ("d", EffectChangeKind::Added)
            ]
        );
        assert_eq!(d[1].before.as_deref(), Some("3"));
        assert_eq!(d[1].after.as_deref(), Some("4"));
        assert!(compare(&a, &a).is_empty());
    }
}
