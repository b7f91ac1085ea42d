//! The independent verifier of a closed evidence set (one observed run's
//! `state/effects/<agent>/<session>/<run>/`, or its export): run as its
//! own pinned executable (`allox-system-effects-verify`) by the supervisor
//! after every observed run, by `effects.verify`, and on the host over an
//! `effects.export`.
//!
//! It reads the set only, trusts nothing in it, and recomputes what can be
//! recomputed from the raw captures:
//!
//! 1. the chain ([`chain::verify_in`]): canonical records, sequence, links,
//!    each body's hash, `begin` first, `close` or `fault` last, and the
//!    root the caller kept from the answer, when given;
//! 2. the files beside the chain against the hashes the `history` record
//!    holds (`history.json`, `processes.json`);
//! 3. every domain's differences again from `capture_a` and `capture_b`
//!    (and the survivors the `verdict` record lists, for `processes`), the
//!    counts of items, and each domain's verdict from them: a capture with
//!    a gap, or history with a lost record, makes it `INCOMPLETE`; a
//!    declared verdict may be worse than the recomputed one (a fault the
//!    set notes makes every domain `INCOMPLETE`), never better;
//! 4. `effects.json` (the answer as kept) against the chain: the same run,
//!    root and domains, a verdict never better than the record's, and
//!    `INCOMPLETE` always fenced.
//!
//! The snapshots of the workspace and of `shared/` are not in the set (the
//! observer deletes them); their differences are checked for form (each
//! added entry has no `before`, each removed one no `after`, a modified
//! one two different sides) and the domain's verdict follows from them.
//! Who made each change is not recomputed.
//!
//! The report is deterministic bytes: canonical JSON (RFC 8785) with no
//! time and no path outside the set, so the verifier run twice, or in the
//! VM and on the host, writes the same bytes for the same set.

use crate::chain::{self, Source, VerifyError};
use crate::collect::{compare, Capture, Difference};
use crate::observer::{EFFECTS_FILE, HISTORY_FILE, PROCESSES_FILE};
use allox_protocol::{
    DomainEffects, EffectChangeKind, EffectsDomain, EffectsVerdict, HistoryCounters, RunEffects,
    Survivor,
};
use serde::Deserialize;
use std::collections::BTreeMap;

pub use allox_protocol::effects_report::{Bad, DomainCheck, RecoveryCheck, Report, REPORT_VERSION};

/// Most changes a domain lists (the observer's cut).
pub const MAX_LISTED: usize = 1000;

/// The report's bytes: canonical JSON and a newline.
pub fn report_bytes(r: &Report) -> Vec<u8> {
    let mut b = chain::canonical(r).expect("a report is plain data");
    b.push(b'\n');
    b
}

fn bad(file: impl Into<String>, seq: Option<u64>, kind: Option<&str>, why: String) -> Bad {
    Bad {
        file: file.into(),
        seq,
        kind: kind.map(str::to_string),
        why,
    }
}

/// Makes report `r` (of a set that verified) not sound because its set is
/// not the run it was taken for: `taken` says which run that was (`asked
/// about run R of A/S`, `the export is named …/`).
pub fn not_the_run(r: &mut Report, taken: &str) {
    r.ok = false;
    r.first_bad = Some(bad(
        chain::RECORDS,
        Some(0),
        Some("begin"),
        format!(
            "{taken}, but the set is run {} of {}/{}: another run's set",
            r.run_id.as_deref().unwrap_or("?"),
            r.agent_id.as_deref().unwrap_or("?"),
            r.session_id.as_deref().unwrap_or("?")
        ),
    ));
}

/// Verifies the set `src`; `root` is the root the caller kept (from the
/// run's answer or the audit log).
pub fn verify_set(src: &dyn Source, root: Option<&str>) -> Report {
    let mut r = Report::new();
    if let Err(b) = check(src, root, &mut r) {
        r.first_bad = Some(*b);
    }
    r.ok = r.first_bad.is_none();
    r
}

/// The chain's records as `(seq, kind)` and their bodies, read back.
struct Bodies<'a> {
    reader: chain::BodyReader<'a>,
    kinds: Vec<String>,
}

impl Bodies<'_> {
    /// The body of the first record of `kind`, parsed; `None` if there is
    /// none.
    fn get<T: for<'de> Deserialize<'de>>(&self, kind: &str) -> Result<Option<T>, Box<Bad>> {
        let Some(seq) = self.kinds.iter().position(|k| k == kind) else {
            return Ok(None);
        };
        let seq = seq as u64;
        let name = self.reader.file(seq, kind);
        let bytes = self
            .reader
            .get(seq, kind)
            .map_err(|why| Box::new(bad(&name, Some(seq), Some(kind), why)))?;
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Box::new(bad(
                name,
                Some(seq),
                Some(kind),
                format!("unexpected body: {e}"),
            ))
        })
    }

    fn seq(&self, kind: &str) -> Option<u64> {
        self.kinds.iter().position(|k| k == kind).map(|s| s as u64)
    }

    /// The file that holds the first body of `kind` (its first record's
    /// when there is none).
    fn file(&self, kind: &str) -> String {
        self.reader.file(self.seq(kind).unwrap_or_default(), kind)
    }
}

#[derive(Deserialize)]
struct BeginBody {
    agent: String,
    session: String,
    run: String,
    protocol: u64,
    scope: crate::scope::Scope,
    #[serde(default)]
    recovery: Option<crate::observer::RecoveryPlan>,
    #[serde(default)]
    started_ms: u64,
}

#[derive(Deserialize)]
struct RecoveryVerdictBody {
    b_to_c_verdict: EffectsVerdict,
    a_to_c_verdict: EffectsVerdict,
    b_to_c: Vec<DomainEffects>,
    a_to_c: Vec<DomainEffects>,
    consistent: bool,
}

#[derive(Deserialize)]
struct Captures {
    captures: BTreeMap<EffectsDomain, Capture>,
}

#[derive(Deserialize)]
struct HistoryBody {
    sha256: String,
    processes_sha256: String,
    counters: HistoryCounters,
}

#[derive(Deserialize)]
struct VerdictBody {
    verdict: EffectsVerdict,
    domains: Vec<DomainEffects>,
    #[serde(default)]
    survivors: Vec<Survivor>,
}

fn check(src: &dyn Source, root: Option<&str>, r: &mut Report) -> Result<(), Box<Bad>> {
    let chain_bad = |e: VerifyError| {
        Box::new(match e {
            VerifyError::Read(f, why) => bad(f, None, None, format!("cannot be read: {why}")),
            VerifyError::Record { seq, file, why } => bad(file, Some(seq), None, why),
            VerifyError::Empty => bad(chain::RECORDS, None, None, "no record".into()),
            VerifyError::NoBegin(k) => bad(
                chain::RECORDS,
                Some(0),
                Some(&k),
                format!("the first record is {k}, not begin"),
            ),
            VerifyError::Root { expected, found } => {
                bad(chain::RECORDS, None, None, format!("the chain ends at root {found}, not at the kept root {expected}: records were made again"))
            }
        })
    };
    // The bodies read once, for the chain's check and for what follows.
    let reader = chain::BodyReader::new(src).map_err(chain_bad)?;
    let v = chain::verify_with(src, &reader, root).map_err(chain_bad)?;
    r.root = Some(v.root.clone());
    r.records = v.kinds.clone();
    let bodies = Bodies {
        reader,
        kinds: v.kinds.clone(),
    };
    let begin: BeginBody = bodies
        .get("begin")?
        .ok_or_else(|| Box::new(bad(chain::RECORDS, Some(0), None, "no begin record".into())))?;
    r.agent_id = Some(begin.agent.clone());
    r.session_id = Some(begin.session.clone());
    r.run_id = Some(begin.run.clone());
    r.protocol = Some(begin.protocol);
    if !v.closed && !v.faulted {
        return Err(Box::new(bad(
            chain::RECORDS,
            Some(v.kinds.len() as u64 - 1),
            v.kinds.last().map(String::as_str),
            "the chain is not closed: the run was cut off before its evidence closed".into(),
        )));
    }
    if v.faulted {
        // What was captured before the fault proves nothing complete.
        r.verdict = Some(EffectsVerdict::Incomplete);
        r.domains = EffectsDomain::ALL
            .iter()
            .map(|&d| {
                let v = if begin.scope.observes(d) {
                    EffectsVerdict::Incomplete
                } else {
                    EffectsVerdict::NotObserved
                };
                DomainCheck {
                    domain: d,
                    declared: v,
                    recomputed: v,
                }
            })
            .collect();
        return check_answer(
            src,
            &v.root,
            &begin,
            None,
            EffectsVerdict::Incomplete,
            None,
            r,
        );
    }
    // The history and the files beside the chain.
    let history: HistoryBody = bodies.get("history")?.ok_or_else(|| missing("history"))?;
    let hseq = bodies.seq("history");
    for (file, sha) in [
        (HISTORY_FILE, &history.sha256),
        (PROCESSES_FILE, &history.processes_sha256),
    ] {
        let bytes = src
            .read(file)
            .map_err(|e| Box::new(bad(file, None, None, format!("cannot be read: {e}"))))?;
        if chain::sha256_hex(&bytes) != *sha {
            return Err(Box::new(bad(
                file,
                None,
                None,
                format!(
                    "does not match the hash the history record ({}) holds",
                    hseq.unwrap_or_default()
                ),
            )));
        }
    }
    let a: Captures = bodies
        .get("capture_a")?
        .ok_or_else(|| missing("capture_a"))?;
    let b: Captures = bodies
        .get("capture_b")?
        .ok_or_else(|| missing("capture_b"))?;
    let verdict: VerdictBody = bodies.get("verdict")?.ok_or_else(|| missing("verdict"))?;
    let vseq = bodies.seq("verdict");
    let vname = bodies.file("verdict");
    let wrong = |why: String| Box::new(bad(&vname, vseq, Some("verdict"), why));
    let lost = history.counters.lost > 0 || history.counters.received < history.counters.emitted;
    let (checks, declared_overall, overall) = follows(
        &begin.scope,
        &verdict.domains,
        (&a.captures, &b.captures),
        &verdict.survivors,
        lost,
    )
    .map_err(wrong)?;
    r.domains = checks;
    if verdict.verdict != declared_overall {
        return Err(wrong(format!(
            "the run's verdict is declared {} but its domains make it {}",
            verdict.verdict.as_str(),
            declared_overall.as_str()
        )));
    }
    r.verdict = Some(overall);
    let recovery = match &begin.recovery {
        None if begin.protocol >= 3 => {
            return Err(Box::new(bad(
                bodies.file("begin"),
                Some(0),
                Some("begin"),
                format!("protocol {} without its recovery", begin.protocol),
            )))
        }
        None => None,
        Some(plan) => Some(check_recovery(&bodies, &begin, plan, &a, &b, lost, r)?),
    };
    check_answer(
        src,
        &v.root,
        &begin,
        Some((&verdict.domains, &history.counters, &verdict.survivors)),
        verdict.verdict,
        recovery.as_ref(),
        r,
    )
}

/// A v3 set's recovery: `recover`, `capture_c` and `recovery_verdict`
/// there, and B→C and A→C recomputed from the captures as A→B is.
fn check_recovery(
    bodies: &Bodies<'_>,
    begin: &BeginBody,
    plan: &crate::observer::RecoveryPlan,
    a: &Captures,
    b: &Captures,
    lost: bool,
    r: &mut Report,
) -> Result<RecoveryVerdictBody, Box<Bad>> {
    #[derive(Deserialize)]
    struct RecoverBody {
        checkpoint_id: String,
        restore: Result<allox_protocol::RestoreDone, String>,
    }
    let rec: RecoverBody = bodies.get("recover")?.ok_or_else(|| missing("recover"))?;
    let rseq = bodies.seq("recover");
    let rname = bodies.file("recover");
    if rec.checkpoint_id != plan.checkpoint_id {
        return Err(Box::new(bad(
            &rname,
            rseq,
            Some("recover"),
            format!(
                "restored checkpoint {}, the begin record names {}",
                rec.checkpoint_id, plan.checkpoint_id
            ),
        )));
    }
    if let Err(why) = &rec.restore {
        return Err(Box::new(bad(
            &rname,
            rseq,
            Some("recover"),
            format!("records a failed restore ({why}) yet the chain closed"),
        )));
    }
    let c: Captures = bodies
        .get("capture_c")?
        .ok_or_else(|| missing("capture_c"))?;
    let rv: RecoveryVerdictBody = bodies
        .get("recovery_verdict")?
        .ok_or_else(|| missing("recovery_verdict"))?;
    let seq = bodies.seq("recovery_verdict");
    let name = bodies.file("recovery_verdict");
    let wrong = |why: String| Box::new(bad(&name, seq, Some("recovery_verdict"), why));
    let (b_to_c, b_declared, _) = follows(
        &begin.scope,
        &rv.b_to_c,
        (&b.captures, &c.captures),
        &[],
        lost,
    )
    .map_err(|why| wrong(format!("B→C: {why}")))?;
    let (a_to_c, a_declared, _) = follows(
        &begin.scope,
        &rv.a_to_c,
        (&a.captures, &c.captures),
        &[],
        lost,
    )
    .map_err(|why| wrong(format!("A→C: {why}")))?;
    for (what, declared, made) in [
        ("B→C", rv.b_to_c_verdict, b_declared),
        ("A→C", rv.a_to_c_verdict, a_declared),
    ] {
        if declared != made {
            return Err(wrong(format!(
                "{what} is declared {} but its domains make it {}",
                declared.as_str(),
                made.as_str()
            )));
        }
    }
    let consistent = crate::observer::consistent(&rv.a_to_c);
    if rv.consistent != consistent {
        return Err(wrong(format!(
            "declares A→C {}consistent, its domains make it {}consistent",
            if rv.consistent { "" } else { "not " },
            if consistent { "" } else { "not " }
        )));
    }
    let recomputed = a_to_c.iter().all(|d| {
        matches!(
            d.recomputed,
            EffectsVerdict::Consistent | EffectsVerdict::NotObserved
        )
    });
    r.recovery = Some(RecoveryCheck {
        b_to_c,
        a_to_c,
        consistent: recomputed,
    });
    Ok(rv)
}

/// Each domain of `listed` against its captures `(from, to)`: its
/// checks, the worst declared verdict and the worst recomputed one; or
/// why a domain does not follow.
fn follows(
    scope: &crate::scope::Scope,
    listed: &[DomainEffects],
    (a, b): (
        &BTreeMap<EffectsDomain, Capture>,
        &BTreeMap<EffectsDomain, Capture>,
    ),
    survivors: &[Survivor],
    lost: bool,
) -> Result<(Vec<DomainCheck>, EffectsVerdict, EffectsVerdict), String> {
    let mut checks = Vec::new();
    let mut declared_overall = EffectsVerdict::NotObserved;
    let mut overall = EffectsVerdict::NotObserved;
    for d in EffectsDomain::ALL {
        let Some(de) = listed.iter().find(|x| x.domain == d) else {
            return Err(format!("no {} domain", d.as_str()));
        };
        if listed.iter().filter(|x| x.domain == d).count() > 1 {
            return Err(format!("the {} domain twice", d.as_str()));
        }
        let recomputed = if !scope.observes(d) {
            if !de.changes.is_empty() {
                return Err(format!(
                    "{} is not in the scope yet lists changes",
                    d.as_str()
                ));
            }
            EffectsVerdict::NotObserved
        } else {
            let r = match d {
                EffectsDomain::Workspace | EffectsDomain::Shared => {
                    for c in &de.changes {
                        form(c)
                            .map_err(|why| format!("{} change {:?}: {why}", d.as_str(), c.item))?;
                    }
                    if de.changes.is_empty() {
                        EffectsVerdict::Consistent
                    } else {
                        EffectsVerdict::Changed
                    }
                }
                _ => recompute(d, a, b, survivors, de)
                    .map_err(|why| format!("{}: {why}", d.as_str()))?,
            };
            if lost {
                EffectsVerdict::Incomplete
            } else {
                r
            }
        };
        let ok = de.verdict == recomputed
            || (de.verdict == EffectsVerdict::Incomplete
                && recomputed != EffectsVerdict::NotObserved);
        if !ok {
            return Err(format!(
                "the {} domain is declared {} but its captures make it {}",
                d.as_str(),
                de.verdict.as_str(),
                recomputed.as_str()
            ));
        }
        checks.push(DomainCheck {
            domain: d,
            declared: de.verdict,
            recomputed,
        });
        declared_overall = declared_overall.worst(de.verdict);
        overall = overall.worst(recomputed);
    }
    Ok((checks, declared_overall, overall))
}

fn missing(kind: &str) -> Box<Bad> {
    Box::new(bad(
        chain::RECORDS,
        None,
        None,
        format!("no {kind} record before close"),
    ))
}

/// An entry's change as the workspace and `shared` domains list it.
fn form(c: &allox_protocol::EffectChange) -> Result<(), String> {
    match (c.kind, &c.before, &c.after) {
        (EffectChangeKind::Added, None, Some(_)) => Ok(()),
        (EffectChangeKind::Removed, Some(_), None) => Ok(()),
        (EffectChangeKind::Modified, Some(x), Some(y)) if x != y => Ok(()),
        // Past the hashing budget two sides may be described alike (mode
        // and size) while their contents differ.
        (EffectChangeKind::Modified, Some(x), Some(_))
            if crate::observer::files::contents_unknown(x) =>
        {
            Ok(())
        }
        (EffectChangeKind::Modified, Some(_), Some(_)) => {
            Err("modified, yet the same on both sides".into())
        }
        (k, x, y) => Err(format!(
            "{k:?} with before {} and after {}",
            if x.is_some() { "given" } else { "missing" },
            if y.is_some() { "given" } else { "missing" }
        )),
    }
}

/// A captured domain's verdict from its captures at A and B, after
/// checking that what it lists is what they differ by.
fn recompute(
    d: EffectsDomain,
    a: &BTreeMap<EffectsDomain, Capture>,
    b: &BTreeMap<EffectsDomain, Capture>,
    survivors: &[Survivor],
    de: &DomainEffects,
) -> Result<EffectsVerdict, String> {
    let (Some(ca), Some(cb)) = (a.get(&d), b.get(&d)) else {
        return Ok(EffectsVerdict::Incomplete);
    };
    let mut want: Vec<Difference> = compare(ca, cb);
    if d == EffectsDomain::Processes {
        want.extend(
            survivors
                .iter()
                .map(crate::observer::domains::survivor_difference),
        );
    }
    let items = [ca.items.len() as u64, cb.items.len() as u64];
    if de.items != items {
        return Err(format!(
            "declares {:?} items captured, the captures hold {items:?}",
            de.items
        ));
    }
    let truncated = want.len() > MAX_LISTED;
    if de.truncated != truncated {
        return Err(format!(
            "declares its listing {}cut, the captures differ by {} items",
            if de.truncated { "" } else { "not " },
            want.len()
        ));
    }
    want.truncate(MAX_LISTED);
    if de.changes.len() != want.len() {
        return Err(format!(
            "lists {} changes, the captures differ by {}",
            de.changes.len(),
            want.len()
        ));
    }
    for (got, w) in de.changes.iter().zip(&want) {
        if got.item != w.key || got.kind != w.kind || got.before != w.before || got.after != w.after
        {
            return Err(format!(
                "lists {:?} ({:?}) where the captures differ by {:?} ({:?})",
                got.item, got.kind, w.key, w.kind
            ));
        }
    }
    Ok(if !ca.gaps.is_empty() || !cb.gaps.is_empty() {
        EffectsVerdict::Incomplete
    } else if want.is_empty() {
        EffectsVerdict::Consistent
    } else {
        EffectsVerdict::Changed
    })
}

/// `effects.json` (the run's answer as kept) against the chain.
fn check_answer(
    src: &dyn Source,
    root: &str,
    begin: &BeginBody,
    closed: Option<(&[DomainEffects], &HistoryCounters, &[Survivor])>,
    verdict: EffectsVerdict,
    recovery: Option<&RecoveryVerdictBody>,
    r: &mut Report,
) -> Result<(), Box<Bad>> {
    let f = EFFECTS_FILE;
    let bytes = src
        .read(f)
        .map_err(|e| Box::new(bad(f, None, None, format!("cannot be read: {e}"))))?;
    if bytes.is_empty() {
        return Err(Box::new(bad(
            f,
            None,
            None,
            "is empty: the run's answer was never kept".into(),
        )));
    }
    let e: RunEffects = serde_json::from_slice(&bytes)
        .map_err(|e| Box::new(bad(f, None, None, format!("not the run's effects: {e}"))))?;
    let wrong = |why: String| Err(Box::new(bad(f, None, None, why)));
    // Written as serde writes a `RunEffects`: anything else (a field
    // renamed, added or dropped, a number written otherwise) was changed.
    if serde_json::to_vec(&e).ok().as_deref() != Some(&bytes[..]) {
        return wrong(
            "is not the run's effects as written: a field was changed, added or dropped".into(),
        );
    }
    if (
        e.agent_id.as_str(),
        e.session_id.as_str(),
        e.run_id.as_str(),
    ) != (
        begin.agent.as_str(),
        begin.session.as_str(),
        begin.run.as_str(),
    ) {
        return wrong(format!(
            "names run {}/{}/{}, the chain {}/{}/{}",
            e.agent_id, e.session_id, e.run_id, begin.agent, begin.session, begin.run
        ));
    }
    if e.evidence_root != root {
        return wrong(format!(
            "gives the root {}, the chain ends at {root}",
            e.evidence_root
        ));
    }
    if let Some((d, counters, survivors)) = closed {
        // (A set that ends in a fault may have its answer written by the
        // supervisor, which knows less.)
        if u64::from(e.protocol) != begin.protocol || e.started_ms != begin.started_ms {
            return wrong(format!(
                "says protocol {} started at {}, the begin record {} at {}",
                e.protocol, e.started_ms, begin.protocol, begin.started_ms
            ));
        }
        if e.domains != d {
            return wrong("its domains are not the verdict record's".into());
        }
        if e.history != *counters {
            return wrong("its history counters are not the history record's".into());
        }
        if e.survivors != survivors {
            return wrong("its survivors are not the verdict record's".into());
        }
    }
    if e.verdict != verdict && e.verdict != EffectsVerdict::Incomplete {
        return wrong(format!(
            "says {}, the chain {}",
            e.verdict.as_str(),
            verdict.as_str()
        ));
    }
    if e.verdict == EffectsVerdict::Incomplete && !e.fenced {
        return wrong("INCOMPLETE, yet the session is not fenced".into());
    }
    match (recovery, &e.recovery) {
        (None, None) => {}
        (Some(_), None) => return wrong("has no recovery, the chain records one".into()),
        (None, Some(_)) => return wrong("has a recovery the chain does not record".into()),
        (Some(rv), Some(er)) => {
            if er.b_to_c != rv.b_to_c || er.a_to_c != rv.a_to_c {
                return wrong(
                    "its B→C or A→C domains are not the recovery_verdict record's".into(),
                );
            }
            if er.consistent != rv.consistent {
                return wrong(format!(
                    "says A→C {}consistent, the chain {}consistent",
                    if er.consistent { "" } else { "not " },
                    if rv.consistent { "" } else { "not " }
                ));
            }
            let plan = begin.recovery.as_ref();
            if plan.is_some_and(|p| p.require_consistent) && !rv.consistent && !e.fenced {
                return wrong(
                    "A→C is not CONSISTENT and the run requires it, yet the session is not fenced"
                        .into(),
                );
            }
        }
    }
    if r.verdict == Some(EffectsVerdict::Incomplete) && e.verdict != EffectsVerdict::Incomplete {
        return wrong(format!(
            "says {}, the evidence is INCOMPLETE",
            e.verdict.as_str()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::Chain;
    use crate::collect::tests::cap;
    use allox_protocol::{Attribution, EffectChange};
    use std::path::{Path, PathBuf};

    fn domain(
        d: EffectsDomain,
        v: EffectsVerdict,
        changes: Vec<EffectChange>,
        items: [u64; 2],
    ) -> DomainEffects {
        DomainEffects {
            domain: d,
            verdict: v,
            changes,
            truncated: false,
            note: None,
            items,
        }
    }

    /// A set as the observer writes it: the workspace gained a file, a
    /// sysctl changed; bpf and the rest unchanged, filesystem not in scope.
    fn write_set(dir: &Path) -> String {
        write_set_with(dir, false)
    }

    /// A sound set; `v3`: a run with recovery whose sysctl change is left
    /// (A→C CHANGED), so fenced.
    fn write_set_with(dir: &Path, v3: bool) -> String {
        let scope = crate::scope::Scope::parse(
            r#"{"domains": ["bpf", "sysctl", "mount", "network", "modules", "processes"]}"#,
        )
        .unwrap();
        let mut c = Chain::create(dir).unwrap();
        let a: BTreeMap<EffectsDomain, Capture> = [
            (EffectsDomain::Sysctl, cap(&[("net.x", "0"), ("vm.y", "1")])),
            (EffectsDomain::Bpf, cap(&[("prog 1 a", "x")])),
            (EffectsDomain::Mount, cap(&[])),
            (EffectsDomain::Network, cap(&[])),
            (EffectsDomain::Modules, cap(&[])),
            (EffectsDomain::Processes, cap(&[])),
        ]
        .into();
        let mut b = a.clone();
        b.get_mut(&EffectsDomain::Sysctl)
            .unwrap()
            .insert("net.x", "1");
        c.append_later(
            "begin",
            &serde_json::json!({"protocol": if v3 { 3 } else { 2 }, "agent": "a", "session": "s",
            "run": "r1", "argv": ["sh"], "scope": scope, "baseline": "x", "started_ms": 1,
            "recovery": v3.then(|| crate::observer::RecoveryPlan {
                checkpoint_id: "base".into(),
                baseline_made: true,
                scrub_runtime: false,
                require_consistent: true,
            })}),
        )
        .unwrap();
        c.append_later("capture_a", &serde_json::json!({"captures": a}))
            .unwrap();
        let history = b"[{\"seq\":0}]".to_vec();
        let processes = b"[]".to_vec();
        std::fs::write(dir.join(HISTORY_FILE), &history).unwrap();
        std::fs::write(dir.join(PROCESSES_FILE), &processes).unwrap();
        let counters = HistoryCounters {
            emitted: 1,
            received: 1,
            lost: 0,
            syscalls: 10,
            refused: 0,
        };
        c.append_later(
            "history",
            &serde_json::json!({"records": 1, "sha256": chain::sha256_hex(&history),
                "processes_sha256": chain::sha256_hex(&processes), "counters": counters}),
        )
        .unwrap();
        c.append_later("capture_b", &serde_json::json!({"captures": b}))
            .unwrap();
        let run = Attribution::run("r1");
        let mut domains = Vec::new();
        for d in EffectsDomain::ALL {
            domains.push(match d {
                EffectsDomain::Workspace => domain(
                    d,
                    EffectsVerdict::Changed,
                    vec![EffectChange {
                        item: "effect.txt".into(),
                        kind: EffectChangeKind::Added,
                        before: None,
                        after: Some("file 644 3 abc".into()),
                        by: run.clone(),
                    }],
                    [0, 0],
                ),
                EffectsDomain::Shared => domain(d, EffectsVerdict::Consistent, vec![], [0, 0]),
                EffectsDomain::Filesystem => domain(d, EffectsVerdict::NotObserved, vec![], [0, 0]),
                EffectsDomain::Sysctl => domain(
                    d,
                    EffectsVerdict::Changed,
                    vec![EffectChange {
                        item: "net.x".into(),
                        kind: EffectChangeKind::Modified,
                        before: Some("0".into()),
                        after: Some("1".into()),
                        by: run.clone(),
                    }],
                    [2, 2],
                ),
                EffectsDomain::Bpf => domain(d, EffectsVerdict::Consistent, vec![], [1, 1]),
                _ => domain(d, EffectsVerdict::Consistent, vec![], [0, 0]),
            });
        }
        c.append_later(
            "verdict",
            &serde_json::json!({"verdict": EffectsVerdict::Changed, "domains": domains,
                "survivors": [], "status": null}),
        )
        .unwrap();
        let recovery = v3.then(|| {
            let restore = allox_protocol::RestoreDone {
                tool_sha256: "t".into(),
                checkpoint_subvolume: 300,
                previous_subvolume: 301,
                restored_subvolume: 302,
                steps: vec!["snapshot".into(), "exchange".into()],
            };
            c.append_later(
                "recover",
                &serde_json::json!({"checkpoint_id": "base", "restore": {"Ok": restore},
                    "scrubbed": []}),
            )
            .unwrap();
            c.append_later("capture_c", &serde_json::json!({"captures": b}))
                .unwrap();
            let mut b_to_c = domains.clone();
            let mut a_to_c = domains.clone();
            for (i, d) in EffectsDomain::ALL.into_iter().enumerate() {
                match d {
                    EffectsDomain::Workspace => {
                        let mut ch = b_to_c[i].changes[0].clone();
                        ch.kind = EffectChangeKind::Removed;
                        ch.before = ch.after.take();
                        ch.by.by = allox_protocol::By::Recovery;
                        ch.by.run_id = None;
                        b_to_c[i].changes = vec![ch];
                        a_to_c[i].changes.clear();
                        a_to_c[i].verdict = EffectsVerdict::Consistent;
                    }
                    EffectsDomain::Sysctl => {
                        b_to_c[i].changes.clear();
                        b_to_c[i].verdict = EffectsVerdict::Consistent;
                    }
                    _ => {}
                }
            }
            let r = allox_protocol::RecoveryEffects {
                checkpoint_id: "base".into(),
                baseline_made: true,
                scrub_runtime: false,
                require_consistent: true,
                restore,
                b_to_c_verdict: EffectsVerdict::Changed,
                a_to_c_verdict: EffectsVerdict::Changed,
                b_to_c,
                a_to_c,
                consistent: false,
                scrubbed: vec![],
            };
            c.append_later(
                "recovery_verdict",
                &serde_json::json!({"b_to_c_verdict": r.b_to_c_verdict,
                    "a_to_c_verdict": r.a_to_c_verdict, "b_to_c": r.b_to_c, "a_to_c": r.a_to_c,
                    "consistent": r.consistent}),
            )
            .unwrap();
            Box::new(r)
        });
        let root = c
            .append("close", &serde_json::json!({"counters": counters}))
            .unwrap();
        let effects = RunEffects {
            protocol: if v3 { 3 } else { 2 },
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: "r1".into(),
            evidence_root: root.clone(),
            verdict: EffectsVerdict::Changed,
            domains,
            fenced: v3,
            fence_reason: v3.then(|| "residue".to_string()),
            survivors: vec![],
            history: counters,
            started_ms: 1,
            closed_ms: 2,
            recovery,
        };
        std::fs::write(
            dir.join(EFFECTS_FILE),
            serde_json::to_vec(&effects).unwrap(),
        )
        .unwrap();
        root
    }

    fn set() -> (tempfile::TempDir, PathBuf, String) {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("r1");
        let root = write_set(&dir);
        (d, dir, root)
    }

    fn flip(p: &Path, at: usize) {
        let mut b = std::fs::read(p).unwrap();
        let i = at.min(b.len() - 2);
        b[i] ^= 0x01;
        std::fs::write(p, b).unwrap();
    }

    #[test]
    fn a_sound_set_verifies_and_its_report_is_the_same_bytes_each_time() {
        let (_d, dir, root) = set();
        let r = verify_set(&chain::Dir(&dir), Some(&root));
        assert!(r.ok, "{:?}", r.first_bad);
        assert_eq!(r.verdict, Some(EffectsVerdict::Changed));
        assert_eq!(r.root.as_deref(), Some(root.as_str()));
        let sysctl = r
            .domains
            .iter()
            .find(|d| d.domain == EffectsDomain::Sysctl)
            .unwrap();
        assert_eq!(sysctl.recomputed, EffectsVerdict::Changed);
        assert_eq!(
            report_bytes(&r),
            report_bytes(&verify_set(&chain::Dir(&dir), Some(&root)))
        );
        // The export says the same.
        let tar = crate::export::tar_set(&dir, "a-s-r1").unwrap();
        let mem = crate::export::read_tar(tar.as_slice()).unwrap();
        assert_eq!(
            report_bytes(&r),
            report_bytes(&verify_set(&mem, Some(&root)))
        );
    }

    /// The first bad thing of the set in `dir`.
    fn first_bad(dir: &Path, root: Option<&str>) -> Bad {
        let r = verify_set(&chain::Dir(dir), root);
        assert!(!r.ok, "the tampered set verified");
        r.first_bad.unwrap()
    }

    /// A file modified in place is listed with differing sides, unless
    /// its contents were not hashed (past the budget): then its sides may
    /// be alike.
    #[test]
    fn a_modified_file_differs_on_its_sides_unless_they_are_unhashed() {
        let change = |before: &str, after: &str| EffectChange {
            item: "big".into(),
            kind: EffectChangeKind::Modified,
            before: Some(before.into()),
            after: Some(after.into()),
            by: Attribution::run("r1"),
        };
        assert!(form(&change("file 644 3 abc", "file 644 3 abd")).is_ok());
        let same = form(&change("file 644 3 abc", "file 644 3 abc")).unwrap_err();
        assert!(same.contains("the same on both sides"), "{same}");
        let unhashed = format!("file 644 {} -", 1u64 << 40);
        assert!(form(&change(&unhashed, &unhashed)).is_ok());
        assert!(form(&change("dir 755", "dir 755")).is_err());
    }

    #[test]
    fn a_flipped_byte_in_each_kind_of_file_is_named() {
        let mut cases: Vec<(&str, usize, Option<u64>)> = vec![
            ("chain.jsonl", 20, Some(0)),
            ("history.json", 20, None),
            ("processes.json", 20, None),
            ("effects.json", 20, None),
        ];
        // Each body, a line of one file: a byte 20 into its line.
        let (_d, dir, _root) = set();
        let bodies = std::fs::read_to_string(dir.join(chain::BODIES)).unwrap();
        let mut at = 0;
        for (seq, line) in bodies.lines().enumerate() {
            assert!(line.len() > 22, "{line}");
            cases.push((chain::BODIES, at + 20, Some(seq as u64)));
            at += line.len() + 1;
        }
        assert_eq!(cases.len(), 10, "six bodies");
        for (file, at, seq) in cases {
            let (_d, dir, root) = set();
            flip(&dir.join(file), at);
            let b = first_bad(&dir, Some(&root));
            assert_eq!(
                (b.file.as_str(), b.seq),
                (file, seq),
                "{file} at {at}: {b:?}"
            );
        }
    }

    /// `effects.json` is made empty with the chain: a set whose answer
    /// was never written is named for it.
    #[test]
    fn an_answer_never_written_is_named() {
        let (_d, dir, root) = set();
        std::fs::write(dir.join(EFFECTS_FILE), b"").unwrap();
        let b = first_bad(&dir, Some(&root));
        assert_eq!(b.file, EFFECTS_FILE, "{b:?}");
        assert!(b.why.contains("never kept"), "{b:?}");
    }

    fn lines(dir: &Path) -> Vec<String> {
        std::fs::read_to_string(dir.join(chain::RECORDS))
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn a_dropped_reordered_or_truncated_record_is_named() {
        let (_d, dir, root) = set();
        let l = lines(&dir);
        std::fs::write(
            dir.join(chain::RECORDS),
            format!("{}\n{}\n", l[0], l[2..].join("\n")),
        )
        .unwrap();
        let b = first_bad(&dir, Some(&root));
        assert_eq!(b.seq, Some(1), "dropped: {b:?}");

        let (_d, dir, root) = set();
        let mut l = lines(&dir);
        l.swap(2, 3);
        std::fs::write(dir.join(chain::RECORDS), l.join("\n") + "\n").unwrap();
        let b = first_bad(&dir, Some(&root));
        assert_eq!(b.seq, Some(2), "reordered: {b:?}");

        let (_d, dir, root) = set();
        let text = std::fs::read(dir.join(chain::RECORDS)).unwrap();
        std::fs::write(dir.join(chain::RECORDS), &text[..text.len() - 30]).unwrap();
        let b = first_bad(&dir, Some(&root));
        assert_eq!(b.seq, Some(5), "truncated: {b:?}");

        // The last record dropped whole: the chain does not close.
        let (_d, dir, _root) = set();
        let l = lines(&dir);
        std::fs::write(dir.join(chain::RECORDS), l[..5].join("\n") + "\n").unwrap();
        let b = first_bad(&dir, None);
        assert!(b.why.contains("not closed"), "{b:?}");
    }

    /// Rewrites body `kind` with `edit` and makes every hash of the chain
    /// again (what a forger with write access does), and `effects.json`
    /// to match; the new root.
    fn forge(dir: &Path, kind: &str, edit: &dyn Fn(&mut serde_json::Value)) -> String {
        let l = lines(dir);
        let bodies = std::fs::read_to_string(dir.join(chain::BODIES)).unwrap();
        let mut out = Vec::new();
        let mut out_bodies = Vec::new();
        let mut prev = chain::GENESIS.to_string();
        let mut verdict = serde_json::Value::Null;
        for (line, body) in l.iter().zip(bodies.lines()) {
            let mut rec: chain::Record = serde_json::from_str(line).unwrap();
            let mut body: serde_json::Value = serde_json::from_str(body).unwrap();
            if rec.kind == kind {
                edit(&mut body);
            }
            if rec.kind == "verdict" {
                verdict = body.clone();
            }
            let bytes = chain::canonical(&body).unwrap();
            out_bodies.push(String::from_utf8(bytes.clone()).unwrap());
            rec.prev = prev.clone();
            rec.body_sha256 = chain::sha256_hex(&bytes);
            let lb = chain::canonical(&rec).unwrap();
            prev = chain::sha256_hex(&lb);
            out.push(String::from_utf8(lb).unwrap());
        }
        std::fs::write(dir.join(chain::RECORDS), out.join("\n") + "\n").unwrap();
        std::fs::write(dir.join(chain::BODIES), out_bodies.join("\n") + "\n").unwrap();
        let ep = dir.join(EFFECTS_FILE);
        let mut e: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&ep).unwrap()).unwrap();
        e["evidence_root"] = prev.clone().into();
        e["domains"] = verdict["domains"].clone();
        e["verdict"] = verdict["verdict"].clone();
        if e["verdict"] == "INCOMPLETE" {
            e["fenced"] = true.into();
        }
        std::fs::write(&ep, as_written(e)).unwrap();
        prev
    }

    /// `effects.json` edited as a JSON value, written as the observer
    /// writes it.
    fn as_written(e: serde_json::Value) -> Vec<u8> {
        let e: RunEffects = serde_json::from_value(e).unwrap();
        serde_json::to_vec(&e).unwrap()
    }

    /// A forger rewrites the verdict to CONSISTENT and makes every hash
    /// again: the chain is sound, the captures and the kept root are not
    /// fooled.
    #[test]
    fn a_forged_set_with_its_chain_made_again_is_caught() {
        let (_d, dir, root) = set();
        // Sysctl declared consistent, its change dropped.
        let new_root = forge(&dir, "verdict", &|v| {
            let d = &mut v["domains"][4];
            assert_eq!(d["domain"], "sysctl");
            d["verdict"] = "CONSISTENT".into();
            d["changes"] = serde_json::json!([]);
        });
        assert_ne!(new_root, root);
        let b = first_bad(&dir, None);
        assert_eq!((b.file.as_str(), b.seq), (chain::BODIES, Some(4)), "{b:?}");
        assert!(b.why.contains("captures differ"), "{b:?}");
        // A forger who also rewrites the captures: the kept root.
        let b = first_bad(&dir, Some(&root));
        assert!(b.why.contains("kept root"), "{b:?}");
    }

    #[test]
    fn a_verdict_better_than_the_captures_is_refused_a_worse_one_is_not() {
        // Lost history: every observed domain must be INCOMPLETE.
        let (_d, dir, _root) = set();
        forge(&dir, "history", &|v| {
            v["counters"]["lost"] = 3.into();
            v["counters"]["emitted"] = 4.into();
        });
        let b = first_bad(&dir, None);
        assert_eq!(b.seq, Some(4), "{b:?}");
        assert!(b.why.contains("make it INCOMPLETE"), "{b:?}");
        // A capture with a gap: its domain must be INCOMPLETE.
        let (_d, dir, _root) = set();
        forge(&dir, "capture_b", &|v| {
            v["captures"]["bpf"]["gaps"] = serde_json::json!(["prog 9: cannot read"]);
        });
        let b = first_bad(&dir, None);
        assert!(b.why.contains("bpf domain is declared CONSISTENT"), "{b:?}");
        // Declared worse than the captures (a fault the set notes): sound.
        let (_d, dir, _root) = set();
        let root = forge(&dir, "verdict", &|v| {
            v["domains"][3]["verdict"] = "INCOMPLETE".into();
            v["verdict"] = "INCOMPLETE".into();
        });
        let r = verify_set(&chain::Dir(&dir), Some(&root));
        assert!(r.ok, "{:?}", r.first_bad);
        assert_eq!(r.verdict, Some(EffectsVerdict::Changed));
        // effects.json better than the chain: refused.
        let ep = dir.join(EFFECTS_FILE);
        let mut e: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&ep).unwrap()).unwrap();
        e["verdict"] = "CONSISTENT".into();
        std::fs::write(&ep, as_written(e)).unwrap();
        let b = first_bad(&dir, Some(&root));
        assert_eq!(b.file, EFFECTS_FILE, "{b:?}");
    }

    #[test]
    fn a_v3_set_has_its_b_to_c_and_a_to_c_recomputed_and_a_forged_consistent_is_caught() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("set");
        std::fs::create_dir(&dir).unwrap();
        let root = write_set_with(&dir, true);
        let r = verify_set(&chain::Dir(&dir), Some(&root));
        assert!(r.ok, "{:?}", r.first_bad);
        let rc = r.recovery.as_ref().expect("v3 is recomputed");
        assert!(!rc.consistent);
        let sysctl = |l: &[DomainCheck]| {
            l.iter()
                .find(|x| x.domain == EffectsDomain::Sysctl)
                .map(|x| x.recomputed)
        };
        assert_eq!(sysctl(&rc.a_to_c), Some(EffectsVerdict::Changed));
        assert_eq!(sysctl(&rc.b_to_c), Some(EffectsVerdict::Consistent));
        // A forger declares A→C consistent, the chain made again.
        let root = forge(&dir, "recovery_verdict", &|v| {
            v["a_to_c"][4]["changes"] = serde_json::json!([]);
            v["a_to_c"][4]["verdict"] = "CONSISTENT".into();
            v["a_to_c_verdict"] = "CONSISTENT".into();
            v["consistent"] = true.into();
        });
        let b = first_bad(&dir, Some(&root));
        assert_eq!(b.kind.as_deref(), Some("recovery_verdict"), "{b:?}");
        assert!(
            b.why
                .contains("A→C: sysctl: lists 0 changes, the captures differ by 1"),
            "{b:?}"
        );
        // The answer unfenced while the residue stays: refused.
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("set");
        std::fs::create_dir(&dir).unwrap();
        let root = write_set_with(&dir, true);
        let ep = dir.join(EFFECTS_FILE);
        let mut e: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&ep).unwrap()).unwrap();
        e["fenced"] = false.into();
        std::fs::write(&ep, as_written(e)).unwrap();
        let b = first_bad(&dir, Some(&root));
        assert!(b.why.contains("yet the session is not fenced"), "{b:?}");
    }
}
