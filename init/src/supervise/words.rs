//! `supervise`'s command line as the guest's PID 1 writes it, read without
//! the parser.
//!
//! On a guest without KVM (TCG), building and running clap's parser for
//! the first time is the largest step between `/init` and a control port
//! that answers: about 60 ms, for work that takes under 1 ms natively
//! (TCG translates each code path the first time it runs, and the parser
//! touches a great deal of code once). The words PID 1 writes are few and
//! always of one shape ([`crate::guest::supervisor::command`]), so they are
//! read here, onto [`SuperviseArgs::at_defaults`].
//!
//! Anything else gives `None`, and the caller runs the parser, which
//! accepts it or says what is wrong: a flag not listed here (an
//! `allox.args=` setting, `--help`), a flag given twice, a value that is
//! empty, starts with `-` or is not plain decimal where a number is
//! expected, words that are not UTF-8. A test holds every answer of
//! [`parse`] equal to the parser's.

use super::SuperviseArgs;
use std::ffi::OsString;
use std::path::PathBuf;

/// The flags read here; each other word means "use the parser".
const ROOT: &str = "--root";
const STORE_MOUNTED_FD: &str = "--store-mounted-fd";
const LISTEN: &str = "--listen";
const CGROUP_ROOT: &str = "--cgroup-root";
const UNDER_INIT: &str = "--under-init";
const DEFAULT_PIDS_MAX: &str = "--default-pids-max";
const DEFAULT_MEMORY_MAX: &str = "--default-memory-max";
const SESSIONS_PIDS_MAX: &str = "--sessions-pids-max";
const SESSIONS_MEMORY_MAX: &str = "--sessions-memory-max";

/// The flags of `words` (what follows `supervise`), or `None` where only
/// the parser can say (see the module's documentation).
pub fn parse(words: &[OsString]) -> Option<SuperviseArgs> {
    // Every flag read here but `--root` and `--listen` is unset by
    // default, so "given twice" is "already set".
    let mut args = SuperviseArgs::at_defaults(PathBuf::new());
    let mut root = None;
    let mut listen: Vec<String> = Vec::new();
    let mut words = words.iter();
    while let Some(word) = words.next() {
        let word = word.to_str()?;
        let (flag, inline) = match word.split_once('=') {
            Some((flag, value)) => (flag, Some(value)),
            None => (word, None),
        };
        if flag == UNDER_INIT {
            if args.under_init || inline.is_some() {
                return None;
            }
            args.under_init = true;
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => words.next()?.to_str()?,
        };
        if value.is_empty() || value.starts_with('-') {
            return None;
        }
        match flag {
            ROOT => once(&mut root, PathBuf::from(value))?,
            CGROUP_ROOT => once(&mut args.cgroup_root, PathBuf::from(value))?,
            STORE_MOUNTED_FD => once(&mut args.store_mounted_fd, decimal(value)?)?,
            LISTEN => listen.push(value.to_string()),
            DEFAULT_PIDS_MAX => once(&mut args.default_pids_max, decimal(value)?)?,
            DEFAULT_MEMORY_MAX => once(&mut args.default_memory_max, decimal(value)?)?,
            SESSIONS_PIDS_MAX => once(&mut args.sessions_pids_max, decimal(value)?)?,
            SESSIONS_MEMORY_MAX => once(&mut args.sessions_memory_max, decimal(value)?)?,
            _ => return None,
        }
    }
    args.root = root?;
    if !listen.is_empty() {
        args.listen = listen;
    }
    Some(args)
}

/// The log filter and whether lines are JSON, from `ALLOX_LOG` and
/// `ALLOX_LOG_FORMAT` as `lookup` gives them (the parser's defaults:
/// `info`, text); `None` where only the parser can say (a variable set
/// but empty or not UTF-8, a format other than `text` or `json`).
pub fn log_settings(lookup: impl Fn(&str) -> Option<OsString>) -> Option<(String, bool)> {
    let var = |name| match lookup(name) {
        None => Some(None),
        Some(v) if v.is_empty() => None,
        Some(v) => v.into_string().ok().map(Some),
    };
    let log = var("ALLOX_LOG")?.unwrap_or_else(|| "info".to_string());
    let json = match var("ALLOX_LOG_FORMAT")?.as_deref() {
        None | Some("text") => false,
        Some("json") => true,
        Some(_) => return None,
    };
    Some((log, json))
}

/// Sets `slot` once; a second time is `None`.
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value);
    Some(())
}

/// Plain decimal digits only: a sign, a space or a suffix goes to the
/// parser.
fn decimal<T: std::str::FromStr>(value: &str) -> Option<T> {
    if !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, FromArgMatches};

    /// What clap makes of the same words.
    fn clap(words: &[&str]) -> Result<SuperviseArgs, clap::Error> {
        let cmd = SuperviseArgs::augment_args(clap::Command::new("supervise"));
        let m =
            cmd.try_get_matches_from(std::iter::once("supervise").chain(words.iter().copied()))?;
        SuperviseArgs::from_arg_matches(&m)
    }

    fn light(words: &[&str]) -> Option<SuperviseArgs> {
        let words: Vec<OsString> = words.iter().map(OsString::from).collect();
        parse(&words)
    }

    /// Both readings of `words`: where this one answers, the parser
    /// accepts the words and gives the same flags, field for field.
    fn same(words: &[&str]) -> bool {
        let Some(ours) = light(words) else {
            return false;
        };
        let theirs = clap(words).unwrap_or_else(|e| {
            panic!("{words:?}: read without the parser, but the parser refuses them: {e}")
        });
        assert_eq!(format!("{ours:?}"), format!("{theirs:?}"), "{words:?}");
        true
    }

    #[test]
    fn the_guests_command_line_is_read_as_the_parser_reads_it() {
        use crate::guest::{supervisor::command, Settings};
        for cmdline in [
            "",
            "allox.ctl=org.x allox.log=debug",
            "allox.session_pids_max=max allox.session_memory_max=max",
            "allox.session_pids_max=64 allox.reserve_memory=268435456 allox.log_format=json",
        ] {
            let s = Settings::parse(cmdline);
            let cmd = command(&s, 1 << 30, 32_768, None, 5);
            let words: Vec<&str> = cmd.get_args().map(|a| a.to_str().unwrap()).collect();
            assert_eq!(words[0], "supervise");
            assert!(
                same(&words[1..]),
                "{cmdline:?}: {words:?} went to the parser"
            );
        }
    }

    #[test]
    fn each_flag_in_each_form_and_the_defaults_match_the_parser() {
        // `supervise --root R` alone: every default, field for field.
        assert!(same(&["--root", "/r"]));
        assert!(same(&["--root=/r"]));
        assert!(same(&[
            "--root=/r",
            "--store-mounted-fd=7",
            "--listen",
            "unix:/a.sock",
            "--listen=virtio:org.x",
            "--cgroup-root",
            "/sys/fs/cgroup",
            "--under-init",
            "--default-pids-max",
            "64",
            "--default-memory-max=536870912",
            "--sessions-pids-max=32512",
            "--sessions-memory-max",
            "939524096",
        ]));
        // Order does not matter; the root may come last.
        assert!(same(&[
            "--under-init",
            "--listen",
            "unix:/b",
            "--root",
            "/r"
        ]));
    }

    #[test]
    fn anything_else_goes_to_the_parser() {
        for words in [
            &["--root", "/r", "--help"][..],
            &["--help"],
            &[],
            &["--listen", "unix:/a"],
            &["--root", "/r", "--root", "/s"],
            &["--root", "/r", "--under-init", "--under-init"],
            &["--root", "/r", "--under-init=true"],
            &["--root", "/r", "--plugin", "network"],
            &["--root", "/r", "--default-pids-max"],
            &["--root", "/r", "--default-pids-max", "+5"],
            &["--root", "/r", "--default-pids-max", "5k"],
            &["--root", "/r", "--default-pids-max", "-5"],
            &[
                "--root",
                "/r",
                "--default-pids-max",
                "99999999999999999999999",
            ],
            &["--root", "/r", "--store-mounted-fd", "4294967296"],
            &["--root", ""],
            &["--root=", "/r"],
            &["--root", "--listen"],
            &["--root", "/r", "--", "x"],
            &["--root", "/r", "extra"],
            &["--root", "/r", "-v"],
            &["--root", "/r", "--sessions-memory-max", "1G"],
        ] {
            assert!(
                light(words).is_none(),
                "{words:?} was read without the parser"
            );
        }
        use std::os::unix::ffi::OsStringExt;
        let not_utf8 = vec![
            OsString::from("--root"),
            OsString::from_vec(vec![b'/', 0xff]),
        ];
        assert!(parse(&not_utf8).is_none());
    }

    #[test]
    fn mixed_words_never_read_differently_from_the_parser() {
        // Every sequence of up to three words from this pool, after a
        // root: where the words are read here, the parser agrees.
        let pool = [
            "--root",
            "/s",
            "--listen",
            "unix:/x",
            "virtio:p",
            "--under-init",
            "--cgroup-root",
            "--default-pids-max",
            "12",
            "0",
            "--store-mounted-fd",
            "--sessions-memory-max=7",
            "--listen=",
            "=",
            "--",
            "-",
            "--plugin",
        ];
        let mut read = 0;
        for a in 0..pool.len() {
            for b in 0..=pool.len() {
                for c in 0..=pool.len() {
                    let mut words = vec!["--root", "/r", pool[a]];
                    words.extend(pool.get(b));
                    words.extend(pool.get(c));
                    if same(&words) {
                        read += 1;
                    }
                }
            }
        }
        // The check is not empty: many of these are read here.
        assert!(
            read > 50,
            "only {read} sequences were read without the parser"
        );
    }

    #[test]
    fn the_log_settings_come_from_the_environment_with_the_parsers_defaults() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        assert_eq!(log_settings(env(&[])), Some(("info".to_string(), false)));
        assert_eq!(
            log_settings(env(&[("ALLOX_LOG", "debug"), ("ALLOX_LOG_FORMAT", "json")])),
            Some(("debug".to_string(), true))
        );
        assert_eq!(
            log_settings(env(&[("ALLOX_LOG_FORMAT", "text")])),
            Some(("info".to_string(), false))
        );
        assert_eq!(log_settings(env(&[("ALLOX_LOG_FORMAT", "JSON")])), None);
        assert_eq!(log_settings(env(&[("ALLOX_LOG_FORMAT", "yaml")])), None);
        assert_eq!(log_settings(env(&[("ALLOX_LOG", "")])), None);
    }
}
