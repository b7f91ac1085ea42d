//! What goes in the initramfs: the layout every profile shares, `/init`,
//! busybox and its applets, the profile's extras, then `--add` entries.
//!
//! Layout (Debian's merged /usr, so paths that programs expect resolve):
//!
//! ```text
//! /init                 allox-init (static, checked)
//! /bin -> usr/bin       /sbin -> usr/sbin
//! /usr/bin/busybox      static, checked; applets link to it from
//!                       /usr/bin and /usr/sbin
//! /dev/console          c 5 1, so the kernel can give /init its stdio
//!                       before /dev is mounted
//! /etc/passwd, group    root, sandbox (10000, the supervisor's default
//!                       --sandbox-uid), nobody (65534)
//! /etc/hostname, hosts  "allox"
//! /proc /sys /dev /run /tmp (1777) /root (0700) /mnt/store
//! /var/lib/allox        where the store is mounted (DESIGN.md)
//! /usr/bin/btrfs        the host's btrfs-progs, with its loader and
//!                       libraries under /usr/lib (merged /usr: /lib →
//!                       usr/lib): the store's send and receive, by which
//!                       sessions move (`session.export`/`import`)
//! ```
//!
//! With an observer (`--observer`), the system-effects plugin's:
//!
//! ```text
//! /allox-observe        the observer (static, checked), beside /init,
//!                       where the supervisor looks for it by default
//! /allox-system-effects-verify
//!                       the verifier (static, checked), beside it
//! /allox-system-effects-recover
//!                       the recover tool (static, checked), beside it
//! /etc/allox/effects-scope.json
//!                       a scope of the machine's domains, for
//!                       `--system-effects-scope`
//! ```

use std::path::{Path, PathBuf};

use crate::busybox::{self, BusyboxError};
use crate::elf::{self, ElfError};
use crate::libs::{self, LibError};
use crate::python::{self, PythonError};
use crate::tree::{self, copy_preserving, Tree, TreeError};

/// The uid and gid sandboxed programs run as by default (`allox-init
/// supervise --sandbox-uid`).
pub const SANDBOX_ID: u32 = 10_000;

pub const PASSWD: &str = "\
root:x:0:0:root:/root:/bin/sh
sandbox:x:10000:10000:sandbox:/tmp:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
";

pub const GROUP: &str = "\
root:x:0:
sandbox:x:10000:
nogroup:x:65534:
";

pub const HOSTNAME: &str = "allox\n";

pub const HOSTS: &str = "\
127.0.0.1 localhost allox
::1 localhost ip6-localhost ip6-loopback
";

/// Where the system-effects observer is installed: beside `/init`, where
/// the supervisor looks for `allox-observe` when
/// `--system-effects-observer` is not given.
/// The store's tool in every image.
pub const BTRFS: &str = "/usr/bin/btrfs";

pub const OBSERVER: &str = "/allox-observe";

/// Where the system-effects verifier is installed: beside `/init` too
/// (`--system-effects-verifier` by default).
pub const VERIFIER: &str = "/allox-system-effects-verify";

/// Where the system-effects recover tool is installed: beside `/init` too
/// (`--system-effects-recover` by default).
pub const RECOVER: &str = "/allox-system-effects-recover";

/// The scope file the image carries with an observer, for
/// `--system-effects-scope` (`allox.args=--plugin=system-effects,
/// --system-effects-scope=/etc/allox/effects-scope.json`).
pub const EFFECTS_SCOPE: &str = "/etc/allox/effects-scope.json";

/// Every domain of the machine, confirmed at S0/S1; `filesystem` is left
/// out (its paths are the deployment's to choose).
pub const EFFECTS_SCOPE_JSON: &str =
    "{\"domains\": [\"bpf\", \"sysctl\", \"mount\", \"network\", \"modules\", \"processes\"]}\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Profile {
    /// allox-init, busybox and the base layout.
    #[default]
    Default,
    /// Default plus python3 and git with their shared libraries, copied
    /// from this host's Debian packages.
    Python,
}

/// A host file or directory to copy to a path in the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addition {
    pub src: PathBuf,
    pub dest: String,
}

impl std::str::FromStr for Addition {
    type Err = String;

    /// `SRC:DEST`, split at the last `:`; DEST is absolute.
    fn from_str(s: &str) -> Result<Self, String> {
        let (src, dest) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("{s:?}: expected SRC:DEST"))?;
        if src.is_empty() || !dest.starts_with('/') {
            return Err(format!("{s:?}: expected SRC:DEST with an absolute DEST"));
        }
        Ok(Addition {
            src: src.into(),
            dest: dest.into(),
        })
    }
}

/// Inputs of one image.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    /// The allox-init binary, installed as `/init`.
    pub init: PathBuf,
    /// The system-effects observer (`allox-observe`), installed as
    /// [`OBSERVER`] with the scope file [`EFFECTS_SCOPE`].
    pub observer: Option<PathBuf>,
    /// The system-effects verifier (`allox-system-effects-verify`),
    /// installed as [`VERIFIER`]; given with the observer.
    pub verifier: Option<PathBuf>,
    /// The recover tool (`allox-system-effects-recover`), installed as
    /// [`RECOVER`]; given with the observer.
    pub recover: Option<PathBuf>,
    /// A static busybox, e.g. `/bin/busybox` from `busybox-static`.
    pub busybox: PathBuf,
    pub profile: Profile,
    /// Copied last; a file here replaces a file or symlink of the profile.
    pub additions: Vec<Addition>,
}

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("/init")]
    Init(#[source] ElfError),
    #[error("{OBSERVER}")]
    Observer(#[source] ElfError),
    #[error("{VERIFIER}")]
    Verifier(#[source] ElfError),
    #[error("{RECOVER}")]
    Recover(#[source] ElfError),
    #[error("busybox")]
    Busybox(#[source] ElfError),
    #[error("busybox applets")]
    Applets(#[source] BusyboxError),
    #[error("python profile")]
    Python(#[source] PythonError),
    #[error("{BTRFS} is missing (apt-get install btrfs-progs)")]
    NoBtrfs,
    #[error("{BTRFS}'s shared libraries")]
    BtrfsLibs(#[source] LibError),
    #[error("--add {}:{dest}", src.display())]
    Add {
        src: PathBuf,
        dest: String,
        #[source]
        source: TreeError,
    },
    #[error("image layout")]
    Layout(#[source] TreeError),
}

/// Checks the inputs and assembles the tree. Runs `busybox --list-full`.
pub fn assemble(spec: &ImageSpec) -> Result<Tree, ImageError> {
    elf::check_static(&spec.init).map_err(ImageError::Init)?;
    elf::check_static(&spec.busybox).map_err(ImageError::Busybox)?;
    let applets = busybox::list_applets(&spec.busybox).map_err(ImageError::Applets)?;
    let mut t = base(&spec.init, &spec.busybox, &applets).map_err(ImageError::Layout)?;
    add_store_tools(&mut t)?;
    if let Some(observer) = &spec.observer {
        elf::check_static(observer).map_err(ImageError::Observer)?;
        add_observer(&mut t, observer).map_err(ImageError::Layout)?;
    }
    if let Some(verifier) = &spec.verifier {
        elf::check_static(verifier).map_err(ImageError::Verifier)?;
        t.file(VERIFIER, verifier).map_err(ImageError::Layout)?;
    }
    if let Some(recover) = &spec.recover {
        elf::check_static(recover).map_err(ImageError::Recover)?;
        t.file(RECOVER, recover).map_err(ImageError::Layout)?;
    }
    if spec.profile == Profile::Python {
        python::add(&mut t).map_err(ImageError::Python)?;
    }
    add_all(&mut t, &spec.additions)?;
    Ok(t)
}

/// Copies `--add` entries into `t`; a file replaces a file or symlink.
pub fn add_all(t: &mut Tree, additions: &[Addition]) -> Result<(), ImageError> {
    for a in additions {
        tree::add_host_path(t, &a.src, &a.dest, &|_| false, true).map_err(|source| {
            ImageError::Add {
                src: a.src.clone(),
                dest: a.dest.clone(),
                source,
            }
        })?;
    }
    Ok(())
}

/// `btrfs` (send and receive, for moving sessions) with what it loads.
pub fn add_store_tools(t: &mut Tree) -> Result<(), ImageError> {
    let btrfs = Path::new(BTRFS);
    if !btrfs.is_file() {
        return Err(ImageError::NoBtrfs);
    }
    let real = copy_preserving(t, btrfs).map_err(ImageError::Layout)?;
    libs::install(t, &[real]).map_err(ImageError::BtrfsLibs)
}

/// The observer as [`OBSERVER`] and the scope file [`EFFECTS_SCOPE`].
pub fn add_observer(t: &mut Tree, observer: &Path) -> Result<(), TreeError> {
    t.file(OBSERVER, observer)?;
    t.dir("/etc/allox", 0o755)?;
    t.bytes(EFFECTS_SCOPE, 0o644, EFFECTS_SCOPE_JSON.into())
}

/// The default profile from already checked inputs and an applet list
/// (as `busybox --list-full` prints it).
pub fn base(init: &Path, busybox: &Path, applets: &[String]) -> Result<Tree, TreeError> {
    let mut t = Tree::new();
    for d in [
        "/dev",
        "/etc",
        "/mnt/store",
        "/proc",
        "/run",
        "/sys",
        "/usr/bin",
        "/usr/sbin",
        "/var/lib/allox",
    ] {
        t.dir(d, 0o755)?;
    }
    t.dir("/root", 0o700)?;
    t.dir("/tmp", 0o1777)?;
    t.symlink("/bin", "usr/bin")?;
    t.symlink("/sbin", "usr/sbin")?;
    t.char_dev("/dev/console", 0o600, 5, 1)?;
    t.bytes("/etc/passwd", 0o644, PASSWD.into())?;
    t.bytes("/etc/group", 0o644, GROUP.into())?;
    t.bytes("/etc/hostname", 0o644, HOSTNAME.into())?;
    t.bytes("/etc/hosts", 0o644, HOSTS.into())?;
    t.file("/init", init)?;
    t.file(busybox::IMAGE_PATH, busybox)?;
    for (path, target) in busybox::applet_links(applets) {
        t.symlink(&path, target)?;
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Node;

    fn applets() -> Vec<String> {
        ["bin/sh", "bin/ls", "sbin/poweroff", "sbin/init", "linuxrc"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn inputs(dir: &Path) -> (PathBuf, PathBuf) {
        let init = dir.join("allox-init");
        let bb = dir.join("busybox");
        std::fs::write(&init, "init bytes").unwrap();
        std::fs::write(&bb, "busybox bytes").unwrap();
        (init, bb)
    }

    #[test]
    fn base_layout() {
        let dir = tempfile::tempdir().unwrap();
        let (init, bb) = inputs(dir.path());
        let t = base(&init, &bb, &applets()).unwrap();
        let paths: Vec<String> = t.paths().collect();
        for want in [
            "/init",
            "/bin",
            "/sbin",
            "/usr/bin/busybox",
            "/usr/bin/sh",
            "/usr/bin/ls",
            "/usr/sbin/poweroff",
            "/dev/console",
            "/etc/passwd",
            "/etc/group",
            "/etc/hostname",
            "/proc",
            "/sys",
            "/run",
            "/tmp",
            "/mnt/store",
            "/var/lib/allox",
        ] {
            assert!(
                paths.iter().any(|p| p == want),
                "{want} missing from {paths:?}"
            );
        }
        assert!(t.get("/usr/sbin/init").is_none());
        assert!(t.get("/linuxrc").is_none());
        assert_eq!(
            t.get("/usr/sbin/poweroff"),
            Some(&Node::Symlink {
                target: "../bin/busybox".into()
            })
        );
        assert_eq!(t.get("/tmp"), Some(&Node::Dir { perm: 0o1777 }));
        assert!(PASSWD.contains(&format!("sandbox:x:{SANDBOX_ID}:{SANDBOX_ID}:")));
    }

    #[test]
    fn the_observer_lies_beside_init_with_a_scope_of_the_machine() {
        let dir = tempfile::tempdir().unwrap();
        let (init, bb) = inputs(dir.path());
        let mut t = base(&init, &bb, &applets()).unwrap();
        assert!(t.get(OBSERVER).is_none() && t.get(EFFECTS_SCOPE).is_none());
        add_observer(&mut t, &init).unwrap();
        assert!(matches!(t.get(OBSERVER), Some(Node::File { .. })));
        assert_eq!(
            Path::new(OBSERVER).parent(),
            Path::new("/init").parent(),
            "the supervisor looks beside its own executable"
        );
        let scope: serde_json::Value = serde_json::from_str(EFFECTS_SCOPE_JSON).unwrap();
        let domains: Vec<&str> = scope["domains"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap())
            .collect();
        assert_eq!(
            domains,
            ["bpf", "sysctl", "mount", "network", "modules", "processes"]
        );
        assert!(matches!(t.get(EFFECTS_SCOPE), Some(Node::File { .. })));
    }

    #[test]
    fn btrfs_comes_with_its_loader_and_libraries_beside_the_base() {
        if !Path::new(BTRFS).is_file() {
            return crate::test_support::skip(
                "btrfs_comes_with_its_loader_and_libraries_beside_the_base",
                "/usr/bin/btrfs (apt-get install btrfs-progs)",
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let (init, bb) = inputs(dir.path());
        let mut t = base(&init, &bb, &applets()).unwrap();
        add_store_tools(&mut t).unwrap();
        assert!(matches!(t.get(BTRFS), Some(Node::File { .. })));
        for lib in ["libc.so.6", "libuuid.so.1", "libzstd.so.1"] {
            let p = format!("/usr/lib/x86_64-linux-gnu/{lib}");
            assert!(t.get(&p).is_some(), "{p} is missing");
        }
        assert!(matches!(
            t.get("/usr/lib64/ld-linux-x86-64.so.2"),
            Some(Node::Symlink { .. })
        ));
        // The python profile and the container image lay out the same
        // merged /usr over it without a conflict.
        libs::install(&mut t, &[PathBuf::from(BTRFS)]).unwrap();
    }

    #[test]
    fn additions_copy_trees_and_replace_applets() {
        let dir = tempfile::tempdir().unwrap();
        let (init, bb) = inputs(dir.path());
        let mut t = base(&init, &bb, &applets()).unwrap();
        let src = dir.path().join("tools");
        std::fs::create_dir_all(src.join("sub")).unwrap();
        std::fs::write(src.join("sub/f"), "f").unwrap();
        std::os::unix::fs::symlink("sub/f", src.join("link")).unwrap();
        std::fs::write(src.join("__pycache__"), "x").unwrap();
        tree::add_host_path(&mut t, &src, "/opt/tools", &|n| n == "__pycache__", true).unwrap();
        assert!(matches!(t.get("/opt/tools/sub/f"), Some(Node::File { .. })));
        assert_eq!(
            t.get("/opt/tools/link"),
            Some(&Node::Symlink {
                target: "sub/f".into()
            })
        );
        assert!(t.get("/opt/tools/__pycache__").is_none());
        // Through the /bin symlink, over busybox's `sh` link.
        tree::add_host_path(&mut t, &src.join("sub/f"), "/bin/sh", &|_| false, true).unwrap();
        assert!(matches!(t.get("/usr/bin/sh"), Some(Node::File { .. })));
        // A directory copied onto a symlinked directory goes through it.
        tree::add_host_path(&mut t, &src.join("sub"), "/bin", &|_| false, true).unwrap();
        assert!(matches!(t.get("/usr/bin/f"), Some(Node::File { .. })));
        // A directory is never replaced.
        let err =
            tree::add_host_path(&mut t, &src.join("sub/f"), "/etc", &|_| false, true).unwrap_err();
        assert_eq!(err.to_string(), "/etc: already in the image as directory");
    }

    #[test]
    fn addition_syntax() {
        let a: Addition = "/a/b:c:/opt/x".parse().unwrap();
        assert_eq!(a.src, Path::new("/a/b:c"));
        assert_eq!(a.dest, "/opt/x");
        assert!("nocolon".parse::<Addition>().is_err());
        assert!("src:relative".parse::<Addition>().is_err());
        assert!(":/x".parse::<Addition>().is_err());
    }
}
