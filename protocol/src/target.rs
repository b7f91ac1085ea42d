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
