//! The recover tool (`allox-system-effects-recover`): protocol v3's
//! workspace restore, and nothing else. The supervisor runs it from its
//! sealed, pinned copy inside the store's journaled rollback
//! (`Store::rollback_with`): it makes a writable snapshot of the
//! checkpoint beside `current/` and exchanges the two in one step. What
//! it did (the subvolume ids, the steps) goes to the supervisor on its
//! standard output and into the evidence chain's `recover` record; a
//! crash at any step is finished or undone by the store's recovery as a
//! rollback's is.
//!
//! ```text
//! allox-system-effects-recover --checkpoint DIR --fresh DIR --current DIR
//! ```
//!
//! Exits 0 with the account (JSON, one line) when both steps are done, 1
//! with why (one line) when a step failed (what it made is left for the
//! journal's undo), 2 when it was not asked right.

use allox_protocol::RestoreDone;
use allox_store::btrfs;
use std::path::{Path, PathBuf};

const USAGE: &str =
    "usage: allox-system-effects-recover --checkpoint DIR --fresh DIR --current DIR";

/// What the tool keeps of root's capabilities: snapshots (`SYS_ADMIN`),
/// and reading and renaming trees the sandbox's user owns.
pub const CAPABILITIES: [caps::Capability; 4] = [
    caps::Capability::CAP_SYS_ADMIN,
    caps::Capability::CAP_DAC_OVERRIDE,
    caps::Capability::CAP_DAC_READ_SEARCH,
    caps::Capability::CAP_FOWNER,
];

/// The three paths it is given.
#[derive(Debug, PartialEq, Eq)]
pub struct Args {
    pub checkpoint: PathBuf,
    pub fresh: PathBuf,
    pub current: PathBuf,
}

impl Args {
    pub fn parse(args: impl Iterator<Item = String>) -> Result<Args, String> {
        let (mut checkpoint, mut fresh, mut current) = (None, None, None);
        let mut args = args;
        while let Some(a) = args.next() {
            let slot = match a.as_str() {
                "--checkpoint" => &mut checkpoint,
                "--fresh" => &mut fresh,
                "--current" => &mut current,
                other => return Err(format!("unknown argument {other:?}")),
            };
            let v = args.next().ok_or_else(|| format!("{a} needs a value"))?;
            if !v.starts_with('/') {
                return Err(format!("{a} {v:?} is not an absolute path"));
            }
            *slot = Some(PathBuf::from(v));
        }
        match (checkpoint, fresh, current) {
            (Some(checkpoint), Some(fresh), Some(current)) => Ok(Args {
                checkpoint,
                fresh,
                current,
            }),
            _ => Err("--checkpoint, --fresh and --current are all needed".into()),
        }
    }
}

/// Checks what it is given, then snapshots and exchanges.
pub fn restore(a: &Args) -> Result<RestoreDone, String> {
    let e = |what: &str, p: &Path, err: btrfs::BtrfsError| format!("{what} {}: {err}", p.display());
    if a.fresh.parent() != a.current.parent() {
        return Err(format!(
            "{} is not beside {}",
            a.fresh.display(),
            a.current.display()
        ));
    }
    if a.fresh.symlink_metadata().is_ok() {
        return Err(format!("{} exists already", a.fresh.display()));
    }
    let cp = btrfs::root_info(&a.checkpoint).map_err(|x| e("read", &a.checkpoint, x))?;
    let dir = std::fs::File::open(&a.checkpoint)
        .map_err(|x| format!("open {}: {x}", a.checkpoint.display()))?;
    if !btrfs::is_read_only(&dir, &a.checkpoint).map_err(|x| e("read", &a.checkpoint, x))? {
        return Err(format!(
            "{} is not a read-only checkpoint",
            a.checkpoint.display()
        ));
    }
    let previous = btrfs::subvolume_id(&a.current).map_err(|x| e("read", &a.current, x))?;
    btrfs::snapshot(&a.checkpoint, &a.fresh, false).map_err(|x| e("snapshot into", &a.fresh, x))?;
    let restored = btrfs::subvolume_id(&a.fresh).map_err(|x| e("read", &a.fresh, x))?;
    btrfs::exchange(&a.fresh, &a.current).map_err(|x| e("exchange", &a.current, x))?;
    Ok(RestoreDone {
        tool_sha256: String::new(),
        checkpoint_subvolume: cp.id,
        previous_subvolume: previous,
        restored_subvolume: restored,
        steps: vec!["snapshot".into(), "exchange".into()],
    })
}

/// The tool's main.
pub fn main() -> i32 {
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(why) => {
            eprintln!("allox-system-effects-recover: {why}\n{USAGE}");
            return 2;
        }
    };
    if let Err(e) = crate::observer::keep_only(&CAPABILITIES) {
        println!("drop the capabilities it does not need: {e}");
        return 1;
    }
    match restore(&args) {
        Ok(done) => match serde_json::to_string(&done) {
            Ok(line) => {
                println!("{line}");
                0
            }
            Err(e) => {
                println!("write the account: {e}");
                1
            }
        },
        Err(why) => {
            println!("{why}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Args;

    fn parse(a: &[&str]) -> Result<Args, String> {
        Args::parse(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn it_takes_exactly_three_absolute_paths() {
        assert_eq!(
            parse(&[
                "--checkpoint",
                "/c",
                "--fresh",
                "/s/f",
                "--current",
                "/s/cur"
            ]),
            Ok(Args {
                checkpoint: "/c".into(),
                fresh: "/s/f".into(),
                current: "/s/cur".into(),
            })
        );
        for bad in [
            &["--checkpoint", "/c", "--fresh", "/f"][..],
            &["--checkpoint", "c", "--fresh", "/f", "--current", "/x"][..],
            &["--checkpoint"][..],
            &["--other", "/x"][..],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
