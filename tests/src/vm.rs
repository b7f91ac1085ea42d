//! The booted guest: the real kernel, the real initramfs with `allox-init`
//! as PID 1, under QEMU (TCG here), driven over the virtio-serial control
//! port through its host socket — exactly as `scripts/run-vm.sh` boots it.
//!
//! The guest image comes from `scripts/build-guest.sh`, which
//! `scripts/test.sh` runs first and which leaves `ALLOX_KERNEL_DIR` and
//! `ALLOX_INITRD` for these tests.

use allox_ctl::client::Client;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Kernel and initramfs of the guest.
#[derive(Clone, Debug)]
pub struct GuestImage {
    pub kernel_dir: PathBuf,
    pub initrd: PathBuf,
}

/// The guest image, or why there is none (QEMU or the image missing).
pub fn guest_image() -> Result<GuestImage, String> {
    let mut miss = Vec::new();
    if crate::which("qemu-system-x86_64").is_none() {
        miss.push("qemu-system-x86_64 (apt-get install qemu-system-x86)".to_string());
    }
    let env = |k: &str| std::env::var_os(k).map(PathBuf::from);
    let (kdir, initrd) = (env("ALLOX_KERNEL_DIR"), env("ALLOX_INITRD"));
    match (&kdir, &initrd) {
        (Some(k), Some(i)) if k.join("vmlinux").is_file() && i.is_file() => {}
        _ => miss.push(
            "the guest image: ALLOX_KERNEL_DIR and ALLOX_INITRD from scripts/build-guest.sh"
                .to_string(),
        ),
    }
    if !miss.is_empty() {
        return Err(miss.join(", "));
    }
    Ok(GuestImage {
        kernel_dir: kdir.unwrap(),
        initrd: initrd.unwrap(),
    })
}

/// The guest image, or `None` after saying the test is skipped (or failing
/// it under `ALLOX_REQUIRE_PRIVILEGED=1`).
pub fn require_vm(test: &str) -> Option<GuestImage> {
    if !crate::require(test) {
        return None;
    }
    match guest_image() {
        Ok(i) => Some(i),
        Err(what) => {
            crate::needs(test, Some(what));
            None
        }
    }
}

/// The kernel command line that starts the guest with [`ESCAPE_HELPER`]
/// beside its init (with an image from [`with_escape_helper`]).
pub const ESCAPE_RDINIT: &str = "rdinit=/test/escape-init";

/// The first program of a guest booted with [`ESCAPE_RDINIT`]: starts the
/// helper, then becomes the guest's own init (PID 1 stays PID 1).
const ESCAPE_INIT: &str = "#!/usr/bin/sh
/usr/bin/sh /test/escape &
exec /init \"$@\"
";

/// Started before the init, the helper's root is the initramfs as the
/// kernel mounted it, under the bind mount the init moves over `/` (where
/// the store is mounted): it works from the init's root once that is set.
const ESCAPE_START: &str = "mkdir -p /test/proc && mount -t proc proc /test/proc || exit 1
while [ ! -e /test/proc/1/root/proc/self ]; do sleep 0.05; done
exec chroot /test/proc/1/root /usr/bin/sh /test/escape-run
";

/// Stands in for an agent that escaped its sandbox: a root process outside
/// every sandbox that, when a run of session `a/s` asks (the file
/// `.escape-module` in its workspace), joins that run's cgroup and loads
/// the tests' kernel module, then answers with insmod's exit status in
/// `.escape-done`.
pub const ESCAPE_HELPER: &str = r#"ws=/mnt/store/allox/agents/a/workspace/sessions/s/current
echo "escape helper: waiting for $ws/.escape-module"
while [ ! -e "$ws/.escape-module" ]; do sleep 0.05; done
for cg in $(find /sys/fs/cgroup -type d -name 'run-*'); do
    case $cg in */a/s/run-*) ;; *) continue ;; esac
    if grep -q . "$cg/cgroup.procs"; then
        echo $$ > "$cg/cgroup.procs" && echo "escape helper: in $cg" && break
    fi
done
insmod /test/dummy.ko
st=$?
echo "escape helper: insmod exited $st"
echo $st > "$ws/.escape-done"
"#;

/// `img` with a second archive appended to its initramfs (the kernel
/// unpacks each in turn): `/test/escape-init`, [`ESCAPE_HELPER`] (with
/// what starts it) and the kernel's `modules/dummy.ko` (kernel/build.sh).
/// The guest's own image carries no module and no such helper; only a
/// test adds them.
pub fn with_escape_helper(img: &GuestImage, dir: &Path) -> GuestImage {
    use allox_rootfs_builder::cpio::{Meta, Writer};
    let module = img.kernel_dir.join("modules/dummy.ko");
    let ko = std::fs::read(&module).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the kernel was built before CONFIG_DUMMY=m: run kernel/build.sh)",
            module.display()
        )
    });
    let mut bytes = std::fs::read(&img.initrd).expect("read the initramfs");
    // Each archive starts on a 4-byte boundary; the kernel skips the NULs.
    bytes.resize(bytes.len().next_multiple_of(512), 0);
    let mut w = Writer::new(bytes);
    let meta = |mode: u32, ino: u32| Meta {
        ino,
        mode,
        nlink: 1,
        ..Meta::default()
    };
    // The shell opens /dev/null for a job it starts in the background,
    // before the init mounts devtmpfs over /dev.
    w.entry("dev", &meta(0o040755, 900_005), &[]).unwrap();
    let null = Meta {
        rdev_major: 1,
        rdev_minor: 3,
        ..meta(0o020666, 900_006)
    };
    w.entry("dev/null", &null, &[]).unwrap();
    w.entry("test", &meta(0o040755, 900_001), &[]).unwrap();
    let files = [
        ("test/escape-init", 0o100755, ESCAPE_INIT),
        ("test/escape", 0o100644, ESCAPE_START),
        ("test/escape-run", 0o100644, ESCAPE_HELPER),
    ];
    for (ino, (name, mode, text)) in (900_002..).zip(files) {
        w.entry(name, &meta(mode, ino), text.as_bytes()).unwrap();
    }
    w.entry("test/dummy.ko", &meta(0o100644, 900_010), &ko)
        .unwrap();
    let out = dir.join("initrd-escape.img");
    std::fs::write(&out, w.finish().unwrap()).expect("write the initramfs");
    GuestImage {
        kernel_dir: img.kernel_dir.clone(),
        initrd: out,
    }
}

/// A store disk image: a sparse file, formatted or not.
pub fn store_image(dir: &Path, format: bool) -> PathBuf {
    let img = dir.join("store.img");
    let f = std::fs::File::create(&img).expect("create store image");
    f.set_len(1 << 30).expect("size store image");
    drop(f);
    if format {
        let ok = Command::new("mkfs.btrfs")
            .args(["-q", "-f", "-L", "allox-store"])
            .arg(&img)
            .stdout(Stdio::null())
            .status()
            .expect("run mkfs.btrfs");
        assert!(ok.success(), "mkfs.btrfs failed");
    }
    img
}

/// One booted guest; QEMU is killed when it is dropped.
pub struct Vm {
    child: Child,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub console: PathBuf,
    pub started: Instant,
}

impl Vm {
    /// Boots the guest with `store` as its disk (or none) and `settings`
    /// (`allox.KEY=VALUE`) on the kernel command line.
    pub fn boot(img: &GuestImage, store: Option<&Path>, settings: &[&str]) -> Vm {
        Self::boot_with(img, store, settings, None)
    }

    /// [`Vm::boot`] with `append` added to the kernel command line as it
    /// is (e.g. `rdinit=` of a fixture).
    pub fn boot_with(
        img: &GuestImage,
        store: Option<&Path>,
        settings: &[&str],
        append: Option<&str>,
    ) -> Vm {
        let dir = tempfile::Builder::new()
            .prefix("allox-vm-")
            .tempdir_in("/var/tmp")
            .expect("temp dir");
        let socket = dir.path().join("ctl.sock");
        let console = dir.path().join("console.log");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/run-vm.sh");
        let mut cmd = Command::new(script);
        cmd.arg("--kernel-dir")
            .arg(&img.kernel_dir)
            .arg("--initrd")
            .arg(&img.initrd)
            .arg("--ctl-socket")
            .arg(&socket)
            .arg("--console-log")
            .arg(&console)
            .args(settings);
        if let Some(a) = append {
            cmd.arg("--append").arg(a);
        }
        if let Some(s) = store {
            cmd.arg("--store").arg(s);
        }
        let started = Instant::now();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("qemu.log")).expect("qemu log"))
            .spawn()
            .expect("start run-vm.sh");
        Vm {
            child,
            dir,
            socket,
            console,
            started,
        }
    }

    /// The guest's console so far.
    pub fn console(&self) -> String {
        std::fs::read_to_string(&self.console).unwrap_or_default()
    }

    /// Connects and says Hello, retrying until the supervisor answers.
    /// Returns the client and the time from QEMU's start.
    pub fn connect(&mut self, timeout: Duration) -> (Client, Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            // A handshake that gets no Welcome within 5 s is tried again
            // (a new zero byte and Hello), as a host on a serial port must.
            if let Ok(stream) = std::os::unix::net::UnixStream::connect(&self.socket) {
                stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
                match Client::handshake(stream) {
                    Ok(mut c) => {
                        c.set_timeout(Some(Duration::from_secs(60))).ok();
                        return (c, self.started.elapsed());
                    }
                    Err(e) => eprintln!("handshake with the guest failed ({e}); trying again"),
                }
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "QEMU ended ({st}) before the control port answered; console:\n{}",
                    self.console()
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "no Hello from the guest in {timeout:?}; console:\n{}",
                    self.console()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// QEMU's process id (run-vm.sh execs it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Pulls the plug: SIGKILL to QEMU, which takes the guest with it
    /// before it can write anything more to its disk.
    pub fn power_cut(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for QEMU to end by itself (the guest powered off).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // run-vm.sh execs QEMU, so this is QEMU itself.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
