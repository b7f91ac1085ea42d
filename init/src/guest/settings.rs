//! The init's settings: the `allox.*=` words of the kernel command line.

use crate::limits::LimitSettings;
use std::path::PathBuf;
use std::time::Duration;

/// Settings from the kernel command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `allox.store=`: the store's block device.
    pub store: PathBuf,
    /// `allox.ctl=`: the virtio-serial port name of the control port.
    pub ctl: String,
    /// `allox.log=`: log filter for init and supervisor.
    pub log: String,
    /// `allox.log_format=json`: init's and the supervisor's logs as one
    /// JSON object per line (`text` by default).
    pub log_json: bool,
    /// `allox.format=1`: format the store device if it is blank.
    pub format: bool,
    /// `allox.args=`: extra `supervise` options, comma-separated.
    pub args: Vec<String>,
    /// `allox.stop_timeout_ms=`: how long the supervisor gets to stop.
    pub stop_timeout: Duration,
    /// `allox.failpoints=`: crash points for tests, armed in the first
    /// supervisor only (its restart must come up clean).
    pub failpoints: Option<String>,
    /// `allox.net=ADDRESS/PREFIX[,GATEWAY]`: the VM's uplink
    /// ([`super::uplink`]); none unless given.
    pub net: Option<super::uplink::Uplink>,
    /// `allox.session_pids_max=` and the other limits ([`crate::limits`]).
    pub limits: LimitSettings,
    /// Settings that were not understood, to be reported.
    pub unknown: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            store: PathBuf::from("/dev/vda"),
            ctl: "org.allox.ctl".into(),
            log: "info".into(),
            log_json: false,
            format: false,
            args: Vec::new(),
            stop_timeout: Duration::from_secs(10),
            failpoints: None,
            net: None,
            limits: LimitSettings::default(),
            unknown: Vec::new(),
        }
    }
}

impl Settings {
    /// Reads the `allox.*` words of `cmdline` (the contents of
    /// `/proc/cmdline`); other words are the kernel's and are skipped.
    pub fn parse(cmdline: &str) -> Settings {
        let mut s = Settings::default();
        for word in cmdline.split_whitespace() {
            let Some(kv) = word.strip_prefix("allox.") else {
                continue;
            };
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match k {
                "store" if v.starts_with("/dev/") => s.store = PathBuf::from(v),
                "ctl" if !v.is_empty() => s.ctl = v.to_string(),
                "log" if !v.is_empty() => s.log = v.to_string(),
                "log_format" if matches!(v, "json" | "text") => s.log_json = v == "json",
                "format" if matches!(v, "0" | "1") => s.format = v == "1",
                "args" => {
                    s.args = v
                        .split(',')
                        .filter(|a| !a.is_empty())
                        .map(str::to_string)
                        .collect()
                }
                "failpoints" if !v.is_empty() => s.failpoints = Some(v.to_string()),
                "net" => match super::uplink::Uplink::parse(v) {
                    Ok(u) => s.net = Some(u),
                    Err(e) => s.unknown.push(format!("{word} ({e})")),
                },
                "stop_timeout_ms" if v.parse::<u64>().is_ok() => {
                    s.stop_timeout = Duration::from_millis(v.parse().unwrap_or(10_000))
                }
                _ if s.limits.take(k, v) => {}
                _ => s.unknown.push(word.to_string()),
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Limit;

    #[test]
    fn settings_come_from_the_command_line() {
        let s = Settings::parse(
            "console=ttyS0 quiet allox.store=/dev/vdb allox.ctl=org.x allox.log=debug allox.log_format=json \
             allox.format=1 allox.args=--default-pids-max=64,--sandbox-network=isolated \
             allox.stop_timeout_ms=2500 allox.bogus=1 allox.store=relative \
             allox.net=10.0.2.15/24,10.0.2.2",
        );
        assert_eq!(
            s.net.map(|n| (n.addr.to_string(), n.prefix)),
            Some(("10.0.2.15".to_string(), 24))
        );
        assert_eq!(s.store, PathBuf::from("/dev/vdb"));
        assert_eq!(s.ctl, "org.x");
        assert_eq!(s.log, "debug");
        assert!(s.log_json);
        assert!(!Settings::parse("allox.log_format=text").log_json);
        assert_eq!(
            Settings::parse("allox.log_format=xml").unknown,
            ["allox.log_format=xml"]
        );
        assert!(s.format);
        assert_eq!(
            s.args,
            ["--default-pids-max=64", "--sandbox-network=isolated"]
        );
        assert_eq!(s.stop_timeout, Duration::from_millis(2500));
        assert_eq!(s.unknown, ["allox.bogus=1", "allox.store=relative"]);
        assert_eq!(Settings::parse("console=ttyS0"), Settings::default());
    }

    #[test]
    fn malformed_values_keep_the_default_and_are_reported() {
        let s = Settings::parse(
            "allox.format=yes allox.stop_timeout_ms=soon allox.ctl= allox.failpoints=a=1 \
             allox.session_pids_max=max allox.reserve_pids=max allox.net=10.0.2.15",
        );
        assert_eq!(s.net, None);
        assert!(!s.format);
        assert_eq!(s.stop_timeout, Duration::from_secs(10));
        assert_eq!(s.ctl, "org.allox.ctl");
        assert_eq!(s.failpoints.as_deref(), Some("a=1"));
        assert_eq!(s.limits.session_pids_max, Limit::Max);
        assert_eq!(
            s.unknown,
            [
                "allox.format=yes",
                "allox.stop_timeout_ms=soon",
                "allox.ctl=",
                "allox.reserve_pids=max",
                "allox.net=10.0.2.15 (\"10.0.2.15\": expected ADDRESS/PREFIX[,GATEWAY])"
            ]
        );
    }
}
