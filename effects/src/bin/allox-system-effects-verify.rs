//! `allox-system-effects-verify`: the independent verifier of an observed
//! run's closed evidence set (see `allox_effects::verify`).
//!
//! ```text
//! allox-system-effects-verify [--root HEX] DIR
//! allox-system-effects-verify [--root HEX] --export FILE   (`-`: stdin)
//! ```
//!
//! Writes its report (canonical JSON, one line) on standard output: the
//! same bytes for the same set, wherever it runs. Exits 0 when the set is
//! sound and its verdict follows from its captures, 1 when it is not (the
//! report names the first bad file and record), 2 when it was not asked
//! right.

use allox_effects::verify::{verify_set, Report};
use std::io::Write;

const USAGE: &str = "usage: allox-system-effects-verify [--root HEX] (DIR | --export FILE)";

fn main() {
    let mut root = None;
    let mut export = None;
    let mut dir = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--root" => root = args.next(),
            "--export" => export = args.next(),
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            s if s.starts_with('-') => usage(&format!("unknown option {s}")),
            _ if dir.is_none() => dir = Some(a),
            _ => usage("one set at a time"),
        }
    }
    if let Some(r) = &root {
        if r.len() != 64 || !r.bytes().all(|c| c.is_ascii_hexdigit()) {
            usage(&format!("--root {r:?} is not a sha256 in hex"));
        }
    }
    let report = match (dir, export) {
        (Some(d), None) => verify_set(&allox_effects::chain::Dir(d.as_ref()), root.as_deref()),
        (None, Some(f)) => {
            let read = if f == "-" {
                allox_effects::export::read_tar(std::io::stdin().lock())
            } else {
                match std::fs::File::open(&f) {
                    Ok(file) => allox_effects::export::read_tar(std::io::BufReader::new(file)),
                    Err(e) => {
                        eprintln!("allox-system-effects-verify: open {f}: {e}");
                        std::process::exit(2);
                    }
                }
            };
            match read {
                Ok(set) => {
                    let mut r = verify_set(&set, root.as_deref());
                    // An export names its set's run (`effects-A-S-RUN/`):
                    // another run's set under that name is not that run's.
                    let named = format!(
                        "effects-{}-{}-{}",
                        r.agent_id.as_deref().unwrap_or("?"),
                        r.session_id.as_deref().unwrap_or("?"),
                        r.run_id.as_deref().unwrap_or("?")
                    );
                    if r.ok && set.top != named {
                        allox_effects::verify::not_the_run(
                            &mut r,
                            &format!("the export is named {}/", set.top),
                        );
                    }
                    r
                }
                Err(why) => Report::broken("export", why),
            }
        }
        _ => usage("give a set's directory or --export FILE"),
    };
    let mut out = std::io::stdout().lock();
    if out
        .write_all(&allox_effects::verify::report_bytes(&report))
        .and_then(|_| out.flush())
        .is_err()
    {
        std::process::exit(2);
    }
    std::process::exit(if report.ok { 0 } else { 1 });
}

fn usage(why: &str) -> ! {
    eprintln!("allox-system-effects-verify: {why}\n{USAGE}");
    std::process::exit(2);
}
