//! The share plugin's answers as people read them.

use super::{clean, utc, Table};
use allox_protocol::{ShareAgentInfo, ShareInfo, ShareListing, ShareOrigin};

fn origin(o: ShareOrigin) -> &'static str {
    match o {
        ShareOrigin::Default => "default",
        ShareOrigin::Session => "session",
        ShareOrigin::Host => "host",
        ShareOrigin::Agent => "agent default",
        ShareOrigin::AgentDenied => "agent not allowed",
    }
}

pub fn info(i: &ShareInfo) -> String {
    let who = format!("{}/{}", clean(&i.agent_id), clean(&i.session_id));
    match (&i.scope, i.permission) {
        (Some(scope), Some(p)) if i.enabled => format!(
            "{who} shares {} ({p}; set by {})\n",
            clean(scope),
            origin(i.origin)
        ),
        _ => format!("{who} does not share (set by {})\n", origin(i.origin)),
    }
}

pub fn agent(a: &ShareAgentInfo) -> String {
    format!(
        "agent {}: sharing {}; by default {}{}\n",
        clean(&a.agent_id),
        if a.allowed { "allowed" } else { "not allowed" },
        if a.default_on { "on" } else { "off" },
        if a.default_on {
            format!(
                " (scope {}, {})",
                clean(&a.default_scope),
                a.default_permission
            )
        } else {
            String::new()
        }
    )
}

pub fn listing(l: &ShareListing) -> String {
    let mut out = if l.shares.is_empty() {
        "no session shares\n".to_string()
    } else {
        let mut t = Table::with_header(&["SESSION", "SCOPE", "PERMISSION", "SET BY", "SINCE"]);
        for i in &l.shares {
            t.row(vec![
                format!("{}/{}", clean(&i.agent_id), clean(&i.session_id)),
                clean(i.scope.as_deref().unwrap_or("-")),
                i.permission.map(|p| p.to_string()).unwrap_or_default(),
                origin(i.origin).to_string(),
                i.since_ms.map(utc).unwrap_or_else(|| "-".into()),
            ]);
        }
        t.render()
    };
    for a in &l.agents {
        out.push_str(&agent(a));
    }
    out
}
