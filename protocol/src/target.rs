//! What a request acts on, as the audit log names it: each params type
//! says its own, beside its definition, and [`Request::target`] asks it.
//!
//! Most targets are the request's ids joined with `/` (`agent/session`,
//! `agent/session/run`, ...), an id left out when the request leaves it
//! out: the [`target!`] rows say which fields, in order. The few other
//! shapes (a checkpoint diff's `from..to`, a file's `:path`) are written
//! out where their type is.
//!
//! [`Request::target`]: crate::Request::target

/// What a request acts on, as `agent[/session[/...]]`; empty for a request
/// about the whole supervisor.
pub trait Target {
    fn target(&self) -> String;
}

/// The agent and session a target names (`agent/session[/...]`, a file's
/// `agent/session:path`), for log lines that name them and nothing more.
pub fn agent_and_session(target: &str) -> (Option<&str>, Option<&str>) {
    let mut parts = target.splitn(3, '/');
    let agent = parts.next().filter(|a| !a.is_empty());
    let session = parts
        .next()
        .map(|s| s.split(':').next().unwrap_or(s))
        .filter(|s| !s.is_empty());
    (agent, session)
}

/// One id of a target: always there, or there when it is given.
pub(crate) trait Part {
    fn push_to<'a>(&'a self, parts: &mut Vec<&'a str>);
}

impl Part for String {
    fn push_to<'a>(&'a self, parts: &mut Vec<&'a str>) {
        parts.push(self);
    }
}

impl Part for Option<String> {
    fn push_to<'a>(&'a self, parts: &mut Vec<&'a str>) {
        if let Some(s) = self {
            parts.push(s);
        }
    }
}

/// `target!(Type: a, b, c)`: the target of `Type` is its fields `a`, `b`
/// and `c` joined with `/`, each `Option` left out when it is `None`;
/// `target!(Type)` has none (the empty target). `target!(Type, |r| ...)`
/// writes out any other shape.
macro_rules! target {
    ($ty:ty $(: $($field:ident),+)?) => {
        impl $crate::target::Target for $ty {
            fn target(&self) -> String {
                #[allow(unused_mut)]
                let mut parts: Vec<&str> = Vec::new();
                $($( $crate::target::Part::push_to(&self.$field, &mut parts); )+)?
                parts.join("/")
            }
        }
    };
    ($ty:ty, |$r:ident| $e:expr) => {
        impl $crate::target::Target for $ty {
            fn target(&self) -> String {
                let $r = self;
                $e
            }
        }
    };
}
pub(crate) use target;

#[cfg(test)]
mod tests {
    use super::agent_and_session;

    #[test]
    fn a_target_names_its_agent_and_session() {
        assert_eq!(agent_and_session("a/s/r"), (Some("a"), Some("s")));
        assert_eq!(agent_and_session("a/s:dir/f.txt"), (Some("a"), Some("s")));
        assert_eq!(agent_and_session("a"), (Some("a"), None));
        assert_eq!(agent_and_session(""), (None, None));
        assert_eq!(agent_and_session("a/s/c->b/t"), (Some("a"), Some("s")));
    }
}
