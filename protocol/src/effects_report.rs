//! The report of the system-effects verifier
//! (`allox-system-effects-verify`): what `effects.verify` carries as its
//! exact bytes, and what the verifier writes over an export anywhere.
//! Written as canonical JSON (RFC 8785), with no time and no path outside
//! the set, so that one set gives the same bytes wherever it is verified.

use crate::effects::{EffectsDomain, EffectsVerdict};
use serde::{Deserialize, Serialize};

/// The report's format (its `verifier` field).
pub const REPORT_VERSION: u32 = 1;

/// What is wrong with a set: the first bad file (and record) found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bad {
    /// The file, relative to the set.
    pub file: String,
    /// The record it belongs to, when it is one.
    #[serde(default)]
    pub seq: Option<u64>,
    #[serde(default)]
    pub kind: Option<String>,
    pub why: String,
}

/// One domain as declared by the observer and as recomputed here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainCheck {
    pub domain: EffectsDomain,
    pub declared: EffectsVerdict,
    pub recomputed: EffectsVerdict,
}

/// What the verifier found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub verifier: u32,
    /// Whether the set is sound and its verdict follows from its captures.
    pub ok: bool,
    #[serde(default)]
    pub first_bad: Option<Bad>,
    /// The chain's root, when the chain could be read to its end.
    #[serde(default)]
    pub root: Option<String>,
    #[serde(default)]
    pub agent_id: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub run_id: Option<String>,
    #[serde(default)]
    pub protocol: Option<u64>,
    /// The records' kinds, in order.
    #[serde(default)]
    pub records: Vec<String>,
    /// The run's verdict as recomputed (the worst of the domains').
    #[serde(default)]
    pub verdict: Option<EffectsVerdict>,
    #[serde(default)]
    pub domains: Vec<DomainCheck>,
    /// Protocol v3: the comparisons B→C and A→C, recomputed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoveryCheck>,
}

/// A protocol v3 set's recovery as the verifier found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryCheck {
    pub b_to_c: Vec<DomainCheck>,
    pub a_to_c: Vec<DomainCheck>,
    /// A→C, recomputed, CONSISTENT in every observed domain.
    pub consistent: bool,
}

impl Default for Report {
    fn default() -> Report {
        Report::new()
    }
}

impl Report {
    /// A report of this format with nothing found yet (not `ok`).
    pub fn new() -> Report {
        Report {
            verifier: REPORT_VERSION,
            ok: false,
            first_bad: None,
            root: None,
            agent_id: None,
            session_id: None,
            run_id: None,
            protocol: None,
            records: Vec::new(),
            verdict: None,
            domains: Vec::new(),
            recovery: None,
        }
    }

    /// The report on what is not a set at all: `file` and why.
    pub fn broken(file: &str, why: String) -> Report {
        Report {
            first_bad: Some(Bad {
                file: file.into(),
                seq: None,
                kind: None,
                why,
            }),
            ..Report::new()
        }
    }

    /// The first bad thing, as one line.
    pub fn first_bad_line(&self) -> Option<String> {
        self.first_bad.as_ref().map(|b| match (b.seq, &b.kind) {
            (Some(s), Some(k)) => format!("record {s} ({k}), {}: {}", b.file, b.why),
            (Some(s), None) => format!("record {s}, {}: {}", b.file, b.why),
            _ => format!("{}: {}", b.file, b.why),
        })
    }
}
