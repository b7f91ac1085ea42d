//! The sandbox's own user database, so that programs that look their user
//! up (a shell's prompt, `id -un`, `whoami`, the OpenSSH client, which
//! refuses to run without one) find it: `/etc/passwd` with root, the
//! sandbox's user [`NAME`] (its uid and gid the daemon's `--sandbox-uid`
//! and `--sandbox-gid`, its home the session's `current/` as the sandbox
//! sees it) and nobody; `/etc/group` with their groups; and the host's
//! `/etc/nsswitch.conf` with these databases read from those files only.
//!
//! The session's context writes them on a tmpfs of its own and binds them
//! over the host's files in the session's root (its own mount namespace):
//! the host's `/etc` is never written, and a file the host lacks is not
//! added (its `/etc` is bound read-only; see `init::bind_users`).

use crate::spec::SESSION_MOUNT;

/// The name of the user sandboxed programs run as.
pub const NAME: &str = "agent";

/// The login shell of root and of the sandbox's user.
const SHELL: &str = "/bin/sh";

/// nobody, and nogroup as Debian names its group.
const NOBODY: u32 = 65_534;

/// The databases nsswitch.conf is made to read from `/etc` only: a host's
/// other sources (systemd, sss, LDAP) have nothing for the sandbox's user,
/// and would be asked from inside the sandbox.
const FROM_FILES: [&str; 4] = ["passwd", "group", "shadow", "gshadow"];

/// `/etc/passwd` for a sandbox whose programs run as `uid`:`gid`. An entry
/// of root or nobody whose uid is the sandbox's is left out: a lookup of
/// that uid finds the sandbox's user.
pub fn passwd(uid: u32, gid: u32) -> String {
    let mut out = String::new();
    if uid != 0 {
        out.push_str(&format!("root:x:0:0:root:/root:{SHELL}\n"));
    }
    out.push_str(&format!(
        "{NAME}:x:{uid}:{gid}:{NAME}:{SESSION_MOUNT}:{SHELL}\n"
    ));
    if uid != NOBODY {
        out.push_str(&format!(
            "nobody:x:{NOBODY}:{NOBODY}:nobody:/nonexistent:/usr/sbin/nologin\n"
        ));
    }
    out
}

/// `/etc/group` for a sandbox whose programs run with group `gid`: root,
/// the sandbox's user's group (of its name) and nogroup, less the fixed
/// ones whose gid is the sandbox's.
pub fn group(gid: u32) -> String {
    let mut out = String::new();
    if gid != 0 {
        out.push_str("root:x:0:\n");
    }
    out.push_str(&format!("{NAME}:x:{gid}:\n"));
    if gid != NOBODY {
        out.push_str(&format!("nogroup:x:{NOBODY}:\n"));
    }
    out
}

/// The host's nsswitch.conf `host`, with the user and group databases read
/// from files only; every other line as it was.
pub fn nsswitch(host: &str) -> String {
    let mut out = String::new();
    let mut seen = Vec::new();
    for line in host.lines() {
        let db = line
            .split_once(':')
            .map(|(db, _)| db.trim())
            .filter(|db| FROM_FILES.contains(db) && !line.trim_start().starts_with('#'));
        match db {
            Some(db) => {
                if !seen.contains(&db) {
                    out.push_str(&format!("{db}: files\n"));
                    seen.push(db);
                }
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    for db in FROM_FILES.iter().filter(|db| !seen.contains(db)) {
        out.push_str(&format!("{db}: files\n"));
    }
    out
}

/// What is bound over the file of the same name in the sandbox's `/etc`,
/// with its content; `host_nsswitch` is the host's nsswitch.conf (`None`
/// when it has none: glibc then reads the files anyway).
pub fn files(uid: u32, gid: u32, host_nsswitch: Option<&str>) -> Vec<(&'static str, String)> {
    let mut out = vec![("passwd", passwd(uid, gid)), ("group", group(gid))];
    if let Some(host) = host_nsswitch {
        out.push(("nsswitch.conf", nsswitch(host)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry's fields, by its name.
    fn entry<'a>(db: &'a str, name: &str) -> Option<Vec<&'a str>> {
        db.lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f[0] == name)
    }

    #[test]
    fn the_sandbox_user_has_the_daemon_s_ids_and_the_session_as_home() {
        let p = passwd(10_000, 10_001);
        assert_eq!(
            entry(&p, "agent").unwrap(),
            [
                "agent",
                "x",
                "10000",
                "10001",
                "agent",
                "/allox/session",
                "/bin/sh"
            ]
        );
        assert_eq!(entry(&p, "root").unwrap()[2..4], ["0", "0"]);
        assert_eq!(entry(&p, "nobody").unwrap()[2..4], ["65534", "65534"]);
        // Every line has the seven fields.
        assert!(p.lines().all(|l| l.split(':').count() == 7), "{p}");
        let g = group(10_001);
        assert_eq!(entry(&g, "agent").unwrap(), ["agent", "x", "10001", ""]);
        assert_eq!(entry(&g, "root").unwrap()[2], "0");
        assert_eq!(entry(&g, "nogroup").unwrap()[2], "65534");
    }

    #[test]
    fn the_sandbox_user_takes_the_place_of_nobody_when_it_has_its_ids() {
        let p = passwd(65_534, 65_534);
        assert!(entry(&p, "nobody").is_none(), "{p}");
        assert_eq!(p.lines().filter(|l| l.contains(":65534:")).count(), 1);
        assert_eq!(entry(&p, "agent").unwrap()[2], "65534");
        let g = group(65_534);
        assert!(entry(&g, "nogroup").is_none(), "{g}");
        assert_eq!(entry(&g, "agent").unwrap()[2], "65534");
    }

    #[test]
    fn nsswitch_reads_users_from_files_and_keeps_the_rest() {
        let host = "# a comment: passwd: ldap\n\
                    passwd:         files systemd\n\
                    group: sss files\n\
                    hosts:          files mdns4_minimal [NOTFOUND=return] dns\n\
                    passwd: compat\n\
                    netgroup:       nis\n";
        let n = nsswitch(host);
        assert_eq!(
            n,
            "# a comment: passwd: ldap\n\
             passwd: files\n\
             group: files\n\
             hosts:          files mdns4_minimal [NOTFOUND=return] dns\n\
             netgroup:       nis\n\
             shadow: files\n\
             gshadow: files\n"
        );
        // Without one, the files need nothing more.
        let names: Vec<_> = files(1, 1, None).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["passwd", "group"]);
    }
}
