//! Plugins: the loaded ones in load order, then every installed one.

use super::table::{clean, Table};
use allox_protocol::PluginListing;

/// `alloxctl plugins`.
pub(super) fn plugins(l: &PluginListing) -> String {
    let mut out = String::new();
    if l.loaded.is_empty() {
        out.push_str("no plugins loaded\n");
    } else {
        out.push_str("loaded, in load order (stopped in the reverse):\n");
        let mut t = Table::with_header(&["#", "NAME", "API", "ROUTES", "CONFLICTS"]);
        for (i, p) in l.loaded.iter().enumerate() {
            let list = |v: &[String]| match v.is_empty() {
                true => "-".to_string(),
                false => clean(&v.join(", ")),
            };
            t.row(vec![
                (i + 1).to_string(),
                clean(&p.name),
                format!("v{}", p.api_version),
                list(&p.routes),
                list(&p.conflicts),
            ]);
        }
        out.push_str(&t.render());
    }
    out.push_str("installed:\n");
    let mut t = Table::with_header(&["NAME", "API", "ENABLED", "WHAT"]);
    for p in &l.installed {
        t.row(vec![
            clean(&p.name),
            format!("v{}", p.api_version),
            if p.enabled { "yes" } else { "no" }.into(),
            clean(&p.summary),
        ]);
    }
    out.push_str(&t.render());
    out
}

/// The `plugins:` line of `alloxctl info`.
pub(super) fn loaded_line(names: &[String]) -> String {
    let names = match names.is_empty() {
        true => "none".to_string(),
        false => clean(&names.join(", ")),
    };
    format!("plugins:         {names}\n")
}

/// `system.info`: in the guest, the machine's uptime and PID 1's figures
/// too; on a host, the daemon's own uptime and nothing of the machine's
/// PID 1.
pub fn info(i: &allox_protocol::SystemInfo) -> String {
    let secs = |ms: u64| format!("{}.{:03} s", ms / 1000, ms % 1000);
    let store = match &i.store_read_only {
        None => "store:           takes changes\n".to_string(),
        Some(why) => format!("store:           READ-ONLY: {}\n", clean(why)),
    };
    if i.under_init {
        format!(
            "uptime:          {}\nsupervisor:      pid {} (child of PID 1), up {}\ninit RSS:        {} KiB\nsupervisor RSS:  {} KiB\nprocesses:       {}\nunreaped by init: {}\n{store}{}",
            secs(i.uptime_ms),
            i.supervisor_pid,
            secs(i.supervisor_uptime_ms),
            i.init_rss_kib,
            i.supervisor_rss_kib,
            i.processes,
            i.init_zombies,
            loaded_line(&i.plugins)
        )
    } else {
        format!(
            "daemon uptime:   {}\ndaemon:          pid {}\ndaemon RSS:      {} KiB\nprocesses:       {}\n{store}{}",
            secs(i.supervisor_uptime_ms),
            i.supervisor_pid,
            i.supervisor_rss_kib,
            i.processes,
            loaded_line(&i.plugins)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::render;
    use allox_protocol::{InstalledPlugin, PluginInfo, PluginListing, Response, SystemInfo};

    #[test]
    fn loaded_plugins_come_in_load_order_then_the_installed_ones() {
        let l = PluginListing {
            loaded: vec![PluginInfo {
                name: "process-tree".into(),
                api_version: 1,
                routes: vec!["process.events".into(), "process.tree".into()],
                conflicts: vec![],
            }],
            installed: vec![
                InstalledPlugin {
                    name: "process-tree".into(),
                    api_version: 1,
                    enabled: true,
                    summary: "tracks".into(),
                },
                InstalledPlugin {
                    name: "x\u{1b}".into(),
                    api_version: 1,
                    enabled: false,
                    summary: String::new(),
                },
            ],
        };
        assert_eq!(
            render(&Response::Plugins(l)),
            "loaded, in load order (stopped in the reverse):\n\
             #  NAME          API  ROUTES                        CONFLICTS\n\
             1  process-tree  v1   process.events, process.tree  -\n\
             installed:\n\
             NAME          API  ENABLED  WHAT\n\
             process-tree  v1   yes      tracks\n\
             x\\u{1b}       v1   no\n"
        );
        let none = PluginListing {
            loaded: vec![],
            installed: vec![],
        };
        assert!(render(&Response::Plugins(none)).starts_with("no plugins loaded\n"));
    }

    #[test]
    fn info_names_the_loaded_plugins() {
        let mut i = SystemInfo {
            uptime_ms: 1500,
            supervisor_pid: 7,
            under_init: false,
            init_rss_kib: 1,
            supervisor_rss_kib: 2,
            processes: 3,
            init_zombies: 0,
            plugins: vec![],
            supervisor_uptime_ms: 2500,
            store_read_only: None,
        };
        assert!(render(&Response::System(i.clone())).ends_with("plugins:         none\n"));
        // A host daemon: its own uptime, none of PID 1's figures.
        let host = render(&Response::System(i.clone()));
        assert!(host.starts_with("daemon uptime:   2.500 s\n"), "{host}");
        assert!(!host.contains("init") && !host.contains("1.500"), "{host}");
        assert!(host.contains("store:           takes changes\n"), "{host}");
        let mut ro = i.clone();
        ro.store_read_only = Some("the index cannot be opened".into());
        let ro = render(&Response::System(ro));
        assert!(
            ro.contains("store:           READ-ONLY: the index cannot be opened\n"),
            "{ro}"
        );
        let mut guest = i.clone();
        guest.under_init = true;
        let guest = render(&Response::System(guest));
        assert!(
            guest.starts_with("uptime:          1.500 s\n") && guest.contains("init RSS"),
            "{guest}"
        );
        i.plugins = vec!["process-tree".into(), "b".into()];
        assert!(render(&Response::System(i)).ends_with("plugins:         process-tree, b\n"));
    }
}
