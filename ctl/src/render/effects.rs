//! The system-effects plugin's answers as people read them: per domain,
//! its verdict, what changed and who did it.

use super::clean;
use allox_protocol::{
    Attribution, By, EffectChangeKind, EffectsHistoryListing, EffectsListing, EffectsStatus,
    EffectsUnfenced, EffectsVerdict, EffectsVerified, RunEffects,
};

fn who(a: &Attribution) -> String {
    let id = |v: &Option<String>| clean(v.as_deref().unwrap_or("?"));
    match a.by {
        By::Run => format!("run {}", id(&a.run_id)),
        By::Session => match &a.run_id {
            Some(r) => format!(
                "session {}/{} (run {})",
                id(&a.agent_id),
                id(&a.session_id),
                clean(r)
            ),
            None => format!("session {}/{}", id(&a.agent_id), id(&a.session_id)),
        },
        By::Unknown => "unknown".to_string(),
        By::Recovery => "recovery".to_string(),
    }
}

fn sign(k: EffectChangeKind) -> &'static str {
    match k {
        EffectChangeKind::Added => "+",
        EffectChangeKind::Removed => "-",
        EffectChangeKind::Modified => "~",
    }
}

/// A run's effects: the verdict, then each observed domain.
pub fn effects(e: &RunEffects) -> String {
    let mut out = format!(
        "run {} of {}/{}: {}{}\nevidence root {}\n",
        clean(&e.run_id),
        clean(&e.agent_id),
        clean(&e.session_id),
        e.verdict.as_str(),
        if e.fenced {
            format!(
                "; session FENCED ({})",
                clean(e.fence_reason.as_deref().unwrap_or("a fault"))
            )
        } else {
            String::new()
        },
        clean(&e.evidence_root),
    );
    for d in &e.domains {
        out.push_str(&format!(
            "  {:<11} {}",
            d.domain.as_str(),
            d.verdict.as_str()
        ));
        if d.verdict == EffectsVerdict::NotObserved {
            out.push('\n');
            continue;
        }
        if let Some(n) = &d.note {
            out.push_str(&format!(" ({})", clean(n)));
        }
        out.push('\n');
        for c in &d.changes {
            let value = match (&c.before, &c.after) {
                (Some(b), Some(a)) => format!(": {} -> {}", clean(b), clean(a)),
                (None, Some(a)) => format!(": {}", clean(a)),
                (Some(b), None) => format!(": was {}", clean(b)),
                (None, None) => String::new(),
            };
            out.push_str(&format!(
                "    {} {}{value}  [by {}]\n",
                sign(c.kind),
                clean(&c.item),
                who(&c.by)
            ));
        }
        if d.truncated {
            out.push_str("    … more changes not listed\n");
        }
    }
    if let Some(r) = &e.recovery {
        out.push_str(&format!(
            "  recovery (protocol v3): workspace restored to checkpoint {}{}; B→C {}, A→C {}{}\n",
            clean(&r.checkpoint_id),
            if r.baseline_made {
                " (baseline made for the run)"
            } else {
                ""
            },
            r.b_to_c_verdict.as_str(),
            r.a_to_c_verdict.as_str(),
            if r.consistent { "" } else { ": RESIDUE" },
        ));
        for d in &r.a_to_c {
            for c in &d.changes {
                out.push_str(&format!(
                    "    residue {} {} {}  [by {}]\n",
                    d.domain.as_str(),
                    sign(c.kind),
                    clean(&c.item),
                    who(&c.by)
                ));
            }
        }
        for x in &r.scrubbed {
            out.push_str(&format!("    scrubbed: {}\n", clean(x)));
        }
    }
    for s in &e.survivors {
        out.push_str(&format!(
            "  left behind: pid {} {} (lineage {}), killed before B\n",
            s.pid,
            clean(&s.comm),
            s.lineage
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(" < ")
        ));
    }
    let h = &e.history;
    out.push_str(&format!(
        "  history: {} records ({} lost), {} system calls, {} refused\n",
        h.received, h.lost, h.syscalls, h.refused
    ));
    out
}

pub fn listing(l: &EffectsListing) -> String {
    if l.runs.is_empty() {
        return "no observed runs\n".to_string();
    }
    let mut out = String::new();
    for r in &l.runs {
        let odd: Vec<String> = r
            .not_consistent
            .iter()
            .map(|(d, v)| format!("{} {}", d.as_str(), v.as_str()))
            .collect();
        out.push_str(&format!(
            "{} {}{}{} {}\n",
            clean(&r.run_id),
            r.verdict.as_str(),
            if r.fenced { " FENCED" } else { "" },
            if odd.is_empty() {
                String::new()
            } else {
                format!(" ({})", odd.join(", "))
            },
            clean(&r.evidence_root)
        ));
    }
    out
}

pub fn history(h: &EffectsHistoryListing) -> String {
    let mut out = String::new();
    for r in &h.records {
        out.push_str(&format!(
            "{:>8} {:<8} pid {:<7} {:<16} {}{}\n",
            r.seq,
            clean(&r.kind),
            r.pid,
            clean(&r.comm),
            clean(r.detail.as_deref().unwrap_or("")),
            if r.refused { "  REFUSED" } else { "" }
        ));
    }
    let c = &h.counters;
    out.push_str(&format!(
        "-- {} records; emitted {}, received {}, lost {}{}\n",
        h.records.len(),
        c.emitted,
        c.received,
        c.lost,
        h.next
            .map(|n| format!("; next cursor {n}"))
            .unwrap_or_default()
    ));
    out
}

pub fn status(s: &EffectsStatus) -> String {
    let mut out = format!(
        "system effects: protocol v{} (v3 with process.start's recovery), observer sha256 {}, verifier sha256 {}, recover tool sha256 {}\ndomains observed: {}{}\n",
        s.protocol,
        clean(&s.observer_sha256),
        clean(&s.verifier_sha256),
        clean(&s.recover_sha256),
        s.domains
            .iter()
            .map(|d| d.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        s.scope_file
            .as_deref()
            .map(|f| format!(" (scope {})", clean(f)))
            .unwrap_or_default()
    );
    if !s.lsm_hooks {
        out.push_str("history without its BPF LSM hooks (--system-effects-without-lsm)\n");
    }
    out.push_str(&format!("observed runs going on: {}\n", s.observing));
    if s.fences.is_empty() {
        out.push_str("no session is fenced\n");
    }
    for f in &s.fences {
        out.push_str(&format!(
            "FENCED {}/{} by run {}: {} (evidence root {})\n",
            clean(&f.agent_id),
            clean(&f.session_id),
            clean(&f.run_id),
            clean(&f.reason),
            clean(&f.evidence_root)
        ));
    }
    out
}

pub fn unfenced(u: &EffectsUnfenced) -> String {
    format!(
        "session {}/{} is no longer fenced (run {})\n",
        clean(&u.agent_id),
        clean(&u.session_id),
        clean(&u.run_id)
    )
}

pub fn verified(v: &EffectsVerified) -> String {
    let report: Option<allox_protocol::effects_report::Report> =
        serde_json::from_str(&v.report).ok();
    if v.ok {
        let (verdict, root) = report
            .as_ref()
            .map(|r| {
                (
                    r.verdict.map(|v| v.as_str()).unwrap_or("?"),
                    r.root.clone().unwrap_or_default(),
                )
            })
            .unwrap_or(("?", String::new()));
        format!(
            "sound: the chain ends at {}; every domain's verdict follows from its captures (the run: {verdict})\n",
            clean(&root)
        )
    } else {
        format!(
            "NOT SOUND: {}\n",
            clean(v.first_bad.as_deref().unwrap_or("the verifier says no"))
        )
    }
}
