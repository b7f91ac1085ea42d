//! The VM manager: each guest of this host as one directory, and its VMM
//! (QEMU) started, paused, resumed, saved, restored and cloned from here.
//!
//! * [`manager`]: the operations (`alloxctl vm …`).
//! * [`backend`]: what the manager needs of a VMM; [`qemu`] implements it
//!   over [`qmp`].
//! * [`transport`]: how the host reaches the guest's control port
//!   (virtio-serial behind a Unix socket; hybrid vsock for other VMMs).
//! * [`disk`]: copies of a store image (a reflink where the filesystem
//!   has them, else a sparse copy).
//!
//! A VM's directory (`/var/lib/allox/vms/NAME/` by default):
//!
//! | file | what |
//! |---|---|
//! | `vm.json` | its configuration ([`VmConfig`]) |
//! | `store.img` | the store disk |
//! | `ctl.sock` | the control port's host socket (`alloxctl --vm NAME`) |
//! | `qmp.sock`, `qemu.pid`, `qemu.log` | the VMM's |
//! | `console.log` | the guest's console, appended to across restores |
//! | `snapshots/SNAP/` | `state` (memory and devices), `store.img`, `vm.json`, `snapshot.json` |

pub mod backend;
pub mod disk;
pub mod manager;
pub mod qemu;
pub mod qmp;
pub mod relay;
pub mod transport;

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;

pub use manager::Manager;

/// Where VMs live unless told otherwise.
pub const DEFAULT_ROOT: &str = "/var/lib/allox/vms";

/// Why an operation failed. Each names what is wrong.
#[derive(Debug, Error)]
pub enum VmError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    /// The VM is not in a state the operation can start from.
    #[error("{0}")]
    Conflict(String),
    /// The guest cannot answer now (paused, and the caller would not wait).
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Backend(String),
    #[error(transparent)]
    Qmp(#[from] qmp::QmpError),
    #[error("the guest's control port: {0}")]
    Guest(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl VmError {
    /// The protocol's error code for it (what `--json` prints).
    pub fn code(&self) -> &'static str {
        match self {
            VmError::Invalid(_) => "invalid_request",
            VmError::NotFound(_) => "not_found",
            VmError::Conflict(_) => "conflict",
            VmError::Unavailable(_) => "unavailable",
            _ => "internal",
        }
    }
}

/// A VM's configuration, as `vm create` made it (`vm.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    pub name: String,
    /// The kernel build (`vmlinux`, `config`) of kernel/build.sh.
    pub kernel_dir: PathBuf,
    /// The guest's initramfs.
    pub initrd: PathBuf,
    pub memory_mib: u32,
    pub cpus: u32,
    /// `allox.KEY=VALUE` settings for the kernel command line.
    #[serde(default)]
    pub settings: Vec<String>,
    /// More of the kernel command line, as it is.
    #[serde(default)]
    pub append: Option<String>,
    /// `auto`, `kvm` or `tcg`.
    pub accel: String,
    /// TCP forwards of QEMU's user networking, `ADDR:PORT=HOSTPORT`: a
    /// connection from the guest to ADDR:PORT (in 10.0.2.0/24) reaches
    /// 127.0.0.1:HOSTPORT, and nothing else is reachable. `None`: the
    /// guest has no network device.
    #[serde(default)]
    pub net_user: Option<Vec<String>>,
    /// Milliseconds since the epoch.
    pub created_ms: u64,
}

/// Addresses of QEMU's user network a forward may not take: the network
/// itself, its gateway (the host, 10.0.2.2), its name server (10.0.2.3),
/// the guest's own (10.0.2.15) and the broadcast address.
const TAKEN: [(u8, &str); 5] = [
    (0, "the network's own address"),
    (2, "the gateway's (the host as the guest sees it)"),
    (3, "the name server's"),
    (15, "the guest's own"),
    (255, "the broadcast address"),
];

/// Checks a forward `ADDR:PORT=HOSTPORT` (ADDR in 10.0.2.0/24, not an
/// address QEMU's user network has taken; neither port 0).
pub fn check_forward(f: &str) -> Result<(std::net::Ipv4Addr, u16, u16), VmError> {
    let bad = || {
        VmError::Invalid(format!(
            "forward {f:?}: expected ADDR:PORT=HOSTPORT with ADDR in 10.0.2.0/24"
        ))
    };
    let (guest, host) = f.split_once('=').ok_or_else(bad)?;
    let (addr, port) = guest.split_once(':').ok_or_else(bad)?;
    let addr: std::net::Ipv4Addr = addr.parse().map_err(|_| bad())?;
    if addr.octets()[..3] != [10, 0, 2] {
        return Err(bad());
    }
    if let Some((_, what)) = TAKEN.iter().find(|(o, _)| *o == addr.octets()[3]) {
        return Err(VmError::Invalid(format!(
            "forward {f:?}: {addr} is {what} in QEMU's user network; pick another \
             address in 10.0.2.0/24 (10.0.2.100, say)"
        )));
    }
    let port: u16 = port.parse().map_err(|_| bad())?;
    let host: u16 = host.parse().map_err(|_| bad())?;
    if port == 0 || host == 0 {
        return Err(VmError::Invalid(format!(
            "forward {f:?}: port 0 is no port; both ports are 1 to 65535"
        )));
    }
    Ok((addr, port, host))
}

/// Checks every forward, and that no two take the same guest address and
/// port.
pub fn check_forwards(forwards: &[String]) -> Result<(), VmError> {
    let mut seen = std::collections::HashSet::new();
    for f in forwards {
        let (addr, port, _) = check_forward(f)?;
        if !seen.insert((addr, port)) {
            return Err(VmError::Invalid(format!(
                "forward {f:?}: {addr}:{port} is forwarded twice; give each guest address and port once"
            )));
        }
    }
    Ok(())
}

/// The files of one VM.
#[derive(Debug, Clone)]
pub struct VmPaths {
    pub dir: PathBuf,
}

impl VmPaths {
    pub fn config(&self) -> PathBuf {
        self.dir.join("vm.json")
    }
    pub fn store(&self) -> PathBuf {
        self.dir.join("store.img")
    }
    pub fn ctl(&self) -> PathBuf {
        self.dir.join("ctl.sock")
    }
    pub fn qmp(&self) -> PathBuf {
        self.dir.join("qmp.sock")
    }
    pub fn pid(&self) -> PathBuf {
        self.dir.join("qemu.pid")
    }
    /// QEMU's messages while it runs (`-D`: a daemonized QEMU sends its
    /// standard error to /dev/null otherwise, and a failed restore's
    /// reason with it).
    pub fn qemu_log(&self) -> PathBuf {
        self.dir.join("qemu.log")
    }
    /// What QEMU's first process said, until it daemonized.
    pub fn qemu_start_log(&self) -> PathBuf {
        self.dir.join("qemu-start.log")
    }
    pub fn console(&self) -> PathBuf {
        self.dir.join("console.log")
    }
    pub fn snapshots(&self) -> PathBuf {
        self.dir.join("snapshots")
    }
    pub fn snapshot(&self, name: &str) -> PathBuf {
        self.snapshots().join(name)
    }
}

/// A VM's or snapshot's name: a letter or digit, then up to 63 letters,
/// digits, `-`, `_` or `.`.
pub fn check_name(what: &str, name: &str) -> Result<(), VmError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(VmError::Invalid(format!(
            "{what} name {name:?}: expected a letter or digit, then up to 63 letters, digits, '-', '_' or '.'"
        )))
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Writes `bytes` to `path` aside, synced, then renamed in.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Makes a directory's entries durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for good in ["a", "vm-1", "snap_2.b", "A9"] {
            check_name("VM", good).unwrap();
        }
        for bad in [
            "",
            ".hidden",
            "-x",
            "a/b",
            "a b",
            &"x".repeat(65),
            "..",
            "é",
        ] {
            let e = check_name("VM", bad).unwrap_err();
            assert!(e.to_string().starts_with("VM name"), "{e}");
        }
    }

    #[test]
    fn forwards_are_checked() {
        let (a, p, h) = check_forward("10.0.2.100:80=8094").unwrap();
        assert_eq!((a.to_string().as_str(), p, h), ("10.0.2.100", 80, 8094));
        for bad in [
            "10.0.3.1:80=1",
            "10.0.2.1:80",
            "10.0.2.1=5",
            "x:1=2",
            "10.0.2.1:99999=1",
        ] {
            let e = check_forward(bad).unwrap_err();
            assert!(e.to_string().contains("ADDR:PORT=HOSTPORT"), "{e}");
        }
        // What QEMU refuses at start is refused here, saying why.
        for (bad, why) in [
            ("10.0.2.2:80=8080", "the gateway's"),
            ("10.0.2.15:80=8080", "the guest's own"),
            ("10.0.2.3:53=5353", "the name server's"),
            ("10.0.2.100:0=8080", "port 0"),
            ("10.0.2.100:80=0", "port 0"),
        ] {
            let e = check_forward(bad).unwrap_err();
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
        let twice = ["10.0.2.100:80=1".to_string(), "10.0.2.100:80=2".to_string()];
        let e = check_forwards(&twice).unwrap_err();
        assert!(e.to_string().contains("forwarded twice"), "{e}");
        check_forwards(&twice[..1]).unwrap();
    }
}
