//! Each domain's capture, the differences beyond captures (processes left
//! behind), and who made each difference.

use super::wire::Begin;
use crate::collect::{Capture, Difference};
use allox_protocol::{Attribution, EffectsDomain, HistoryRecord, Survivor};

/// The filesystem watch (fanotify) from before A to B.
pub struct FsWatch {}

/// What the watch saw.
pub struct FsSeen {}

impl FsWatch {
    pub fn start(_begin: &Begin) -> Result<Option<FsWatch>, String> {
        Ok(None)
    }

    pub fn stop(self) -> FsSeen {
        FsSeen {}
    }
}

/// `d`'s capture now, for the domains captured as items (`None` for
/// `workspace` and `shared`, compared by their snapshots).
pub fn capture(d: EffectsDomain, _begin: &Begin, _fs: Option<&FsWatch>) -> Option<Capture> {
    match d {
        EffectsDomain::Workspace | EffectsDomain::Shared => None,
        _ => {
            let mut c = Capture::new();
            c.gap(format!("the {} collector is not attached", d.as_str()));
            Some(c)
        }
    }
}

/// Differences and gaps a domain has beyond its captures.
#[derive(Default)]
pub struct Extra {
    pub differences: Vec<Difference>,
    pub gaps: Vec<String>,
}

pub fn extra(
    _d: EffectsDomain,
    _begin: &Begin,
    _history: &[HistoryRecord],
    _fs: Option<&FsSeen>,
    _survivors: &[Survivor],
) -> Extra {
    Extra::default()
}

/// Who made `diff`.
pub fn attribute(
    d: EffectsDomain,
    begin: &Begin,
    _diff: &Difference,
    _history: &[HistoryRecord],
    _fs: Option<&FsSeen>,
) -> Attribution {
    match d {
        EffectsDomain::Workspace => Attribution::run(&begin.run),
        _ => Attribution::unknown(),
    }
}
