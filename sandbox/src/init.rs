//! The sandbox, built in two halves: what a session's runs share (built
//! once by the session's context, [`crate::zygote`]) and what each run has
//! of its own (built by the run's PID 1 before it starts the program).
//!
//! The context, single-threaded in its own mount, IPC and UTS namespaces
//! (and network namespace when isolated), as root of the supervisor's user
//! namespace, [`build_context_root`]:
//!
//! 1. assembles the root on a tmpfs: system directories bound read-only,
//!    nosuid, nodev, with the sandbox's own passwd, group and
//!    nsswitch.conf bound over the host's in /etc ([`users`]); a minimal
//!    /dev (null, zero, full, random, urandom, tty, and the mount points
//!    of pts and shm), then read-only; empty mount points for /proc, /tmp,
//!    `/allox/session` and `/allox/shared`;
//! 2. `pivot_root` and detaches the old root, so nothing else of the host —
//!    other workspaces, `state/`, the control socket — is reachable; the
//!    root becomes read-only; the hostname is set, `lo` brought up.
//!
//! A run's PID 1 ([`run`]), cloned by the context into new PID, mount and
//! IPC namespaces inside the run's cgroup:
//!
//! 1. mounts its own /proc, /dev/pts (a new instance), /dev/shm and
//!    private /tmp; attaches the session's `current/` at `/allox/session`
//!    and the agent's `shared/` at `/allox/shared` (detached mounts the
//!    supervisor made and sent), then the spec's binds, in order;
//! 2. starts the program (a clone sharing its memory until the exec:
//!    [`program`]), which closes every descriptor above 2, empties its
//!    capability sets (the bounding set came empty from the context),
//!    switches to the unprivileged uid/gid, sets no_new_privs, installs the
//!    seccomp filter, resets its signals and execs;
//! 3. forwards termination signals to the program, reaps every process of
//!    the namespace, and when the program ends copies the private /tmp's
//!    regular files to `current/.allox-tmp/` (on normal exit, within
//!    budgets, see [`tmp_sync`]) and writes the program's status on its
//!    status pipe; it exits when the namespace is empty.
#![allow(unsafe_code)]

mod error;
mod program;

use super::seccomp;
use super::spec::{
    Bind, ContextSpec, InitStatus, SandboxSpec, TermSize, SESSION_MOUNT, SHARED_MOUNT,
};
use super::{sys, tmp_sync, users};
use rustix::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use rustix::mount::{self as m, MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::process::{Pid, WaitOptions};
use std::ffi::CString;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path};
use std::sync::atomic::{AtomicI32, Ordering};

use error::{BindProblem, InitError, TargetError};

/// The program's PID, for the signal forwarder.
static CHILD: AtomicI32 = AtomicI32::new(0);

/// What a run's PID 1 receives from the supervisor, through the context.
pub(crate) struct RunFds {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub status: OwnedFd,
    /// Detached mounts (`open_tree(OPEN_TREE_CLONE)`) of the session's
    /// `current/`, the agent's `shared/`, and each bind, in order.
    pub session: OwnedFd,
    pub shared: OwnedFd,
    pub binds: Vec<OwnedFd>,
    /// The supervisor's ends of the program's stdout, stderr and the
    /// status pipe (a terminal run: of the status pipe), kept open at
    /// [`crate::KEPT_FDS`] for as long as the run lives, so that a
    /// supervisor that restarts takes them up again (`pidfd_getfd`) and the
    /// program's output never meets a pipe without a reader.
    pub kept: Vec<OwnedFd>,
}

/// The run's PID 1, in the child of the context's `clone3`; never returns.
/// `own` is how [`own_mounts`] went: made just now for this run, or ahead
/// of it by a PID 1 that waited for its run.
pub(crate) fn run(
    spec: SandboxSpec,
    fds: RunFds,
    filter: &seccomp::Filters,
    own: Result<(), InitError>,
) -> ! {
    let RunFds {
        stdin,
        stdout,
        stderr,
        status,
        session,
        shared,
        binds,
        kept,
    } = fds;
    // The context's descriptors are all at 3 or above.
    let _ = rustix::stdio::dup2_stdin(&stdin);
    let _ = rustix::stdio::dup2_stdout(&stdout);
    let _ = rustix::stdio::dup2_stderr(&stderr);
    drop((stdin, stdout, stderr));
    let mut status = std::fs::File::from(status);
    let report = |status: &mut std::fs::File, s: InitStatus| {
        if let Ok(b) = postcard::to_stdvec(&s) {
            let _ = status.write_all(&b);
        }
    };
    let built = own.and_then(|()| attach_workspace(&spec, session, shared, binds));
    // The supervisor's ends, where a later supervisor looks for them.
    let at = if spec.pty.is_some() {
        crate::KEPT_FDS.status
    } else {
        crate::KEPT_FDS.stdout
    };
    let kept_at = keep_at(&kept, at);
    drop(kept);
    // Nothing of the context (its control socket) stays open here.
    let mut keep = vec![status.as_fd()];
    keep.extend(kept_at.iter().map(|f| f.as_fd()));
    let _ = sys::close_all_above_stdio_except(&keep);
    drop(keep);
    if let Err(e) = built {
        report(&mut status, InitStatus::SetupFailed(e.chain()));
        std::process::exit(1);
    }
    if let Some(size) = spec.pty {
        if let Err(e) = terminal(size, &spec) {
            report(&mut status, InitStatus::SetupFailed(e.chain()));
            std::process::exit(1);
        }
    }
    let program = program::Program::new(&spec, filter);
    let Some((pid, exec_errno)) = program.start() else {
        report(
            &mut status,
            InitStatus::SetupFailed(InitError::Fork.chain()),
        );
        std::process::exit(1);
    };
    drop(program);
    // Before it answers "started", the supervisor waits for this: a run
    // said to be started has its program's process (in `process.list`).
    report(&mut status, InitStatus::ProgramStarted);
    // The init keeps no end of the program's pipes, so the supervisor sees
    // end-of-output as soon as the program (and what it started) is done.
    sys::stdio_to_null();
    reap(pid, exec_errno, &spec, status)
}

/// Each of `fds` duplicated, close-on-exec, at `first`, `first + 1`, …
/// (descriptors the run's PID 1 keeps for a later supervisor). One that
/// cannot be placed is left out: a later supervisor then finds nothing
/// there.
fn keep_at(fds: &[OwnedFd], first: i32) -> Vec<OwnedFd> {
    fds.iter()
        .zip(first..)
        .filter_map(|(fd, at)| {
            // SAFETY: `at` is a number this process does not use (the
            // context's descriptors are closed just after, but these).
            let rc = unsafe { libc::dup3(fd.as_raw_fd(), at, libc::O_CLOEXEC) };
            // SAFETY: dup3 returned a descriptor of this process's own.
            (rc == at).then(|| unsafe { OwnedFd::from_raw_fd(at) })
        })
        .collect()
}

/// A terminal run: makes a terminal on the run's own devpts (mounted
/// above), of `size`, its slave side owned by the sandbox's user, sends the
/// master side to the supervisor on the socket that is stdin, stdout and
/// stderr until then, and puts the slave side in their place. Besides the
/// supervisor, only this PID 1 holds the master, at
/// [`crate::KEPT_FDS`]`.terminal`, for a supervisor that restarts (the
/// program never gets it: it is closed on exec).
fn terminal(size: TermSize, spec: &SandboxSpec) -> Result<(), InitError> {
    use rustix::pty::OpenptFlags;
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    // The run's devpts instance, not the context's or the host's.
    let master = tty(
        "open /dev/pts/ptmx",
        rustix::fs::open(
            "/dev/pts/ptmx",
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ),
    )?;
    tty("unlockpt", rustix::pty::unlockpt(&master))?;
    let slave = tty(
        "open the terminal",
        rustix::pty::ioctl_tiocgptpeer(&master, flags),
    )?;
    tty(
        "chown the terminal",
        rustix::fs::fchown(
            &slave,
            Some(rustix::fs::Uid::from_raw(spec.uid)),
            Some(rustix::fs::Gid::from_raw(spec.gid)),
        ),
    )?;
    tty(
        "set the terminal's size",
        rustix::termios::tcsetwinsize(
            &slave,
            rustix::termios::Winsize {
                ws_row: size.rows,
                ws_col: size.cols,
                ws_xpixel: 0,
                ws_ypixel: 0,
            },
        ),
    )?;
    // SAFETY: descriptor 0 is the socket `Context::spawn` sent, open for
    // the whole of this call.
    let sock = unsafe { rustix::fd::BorrowedFd::borrow_raw(0) };
    tty(
        "send the terminal",
        super::wire::send(sock, b"pty", &[master.as_fd()]),
    )?;
    // Kept too, where a later supervisor looks for it: the terminal lives
    // on if the supervisor's copy closes with it.
    std::mem::forget(keep_at(
        std::slice::from_ref(&master),
        crate::KEPT_FDS.terminal,
    ));
    drop(master);
    tty("dup2 stdin", rustix::stdio::dup2_stdin(&slave))?;
    tty("dup2 stdout", rustix::stdio::dup2_stdout(&slave))?;
    tty("dup2 stderr", rustix::stdio::dup2_stderr(&slave))?;
    Ok(())
}

/// A step of [`terminal`].
fn tty<T, E: Into<std::io::Error>>(step: &'static str, r: Result<T, E>) -> Result<T, InitError> {
    r.map_err(|e| InitError::Terminal {
        step,
        source: e.into(),
    })
}

/// A mount of the sandbox's own.
fn mount(what: &'static str, r: rustix::io::Result<()>) -> Result<(), InitError> {
    r.map_err(|source| InitError::Mount { what, source })
}

/// A step of the switch to the new root.
fn switch(step: &'static str, r: rustix::io::Result<()>) -> Result<(), InitError> {
    r.map_err(|source| InitError::SwitchRoot { step, source })
}

/// A file operation `op` on `path`.
fn file<T>(op: &'static str, path: &Path, r: std::io::Result<T>) -> Result<T, InitError> {
    r.map_err(|source| InitError::File {
        op,
        path: path.to_path_buf(),
        source,
    })
}

/// `mount(2)` with string options.
fn mnt(
    src: &str,
    dst: impl AsRef<Path>,
    fstype: &str,
    flags: MountFlags,
    data: &str,
) -> rustix::io::Result<()> {
    let data = CString::new(data).unwrap_or_default();
    m::mount(src, dst.as_ref(), fstype, flags, Some(data.as_c_str()))
}

fn mkdir(p: &Path) -> Result<(), InitError> {
    file("mkdir", p, std::fs::create_dir_all(p))
}

fn bind_ro(src: &Path, dst: &Path) -> Result<(), InitError> {
    m::mount_bind_recursive(src, dst).map_err(|source| InitError::BindMount {
        src: src.to_path_buf(),
        source,
    })?;
    m::mount_remount(
        dst,
        MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
        "",
    )
    .map_err(|source| InitError::RemountReadOnly {
        dst: dst.to_path_buf(),
        source,
    })?;
    // Mounts nested below it too (one remount covers only the top).
    set_attr_recursive(dst)
}

/// Read-only, nosuid, nodev on the whole tree at `dst`.
fn set_attr_recursive(dst: &Path) -> Result<(), InitError> {
    match sys::set_tree_read_only(dst) {
        // Kernels before 5.12 lack it: the top mount is read-only anyway.
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => Ok(()),
        Err(source) => Err(InitError::ReadOnlyTree {
            dst: dst.to_path_buf(),
            source,
        }),
        Ok(()) => Ok(()),
    }
}

/// Attaches the detached mount `tree` at `dst`, then gives it the flags of
/// a bind made by `mount(2)` and remounted: nosuid, nodev, read-only
/// unless `writable`.
fn attach(tree: OwnedFd, dst: &str, writable: bool) -> Result<(), InitError> {
    m::move_mount(
        tree.as_fd(),
        "",
        rustix::fs::CWD,
        dst,
        m::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|source| InitError::Attach {
        dst: dst.into(),
        source,
    })?;
    let ro = if writable {
        MountFlags::empty()
    } else {
        MountFlags::RDONLY
    };
    m::mount_remount(
        dst,
        MountFlags::BIND | ro | MountFlags::NOSUID | MountFlags::NODEV,
        "",
    )
    .map_err(|source| InitError::Remount {
        dst: dst.into(),
        source,
    })
}

/// Options of the root tmpfs, at its mount and at each remount.
const ROOT_DATA: &str = "mode=0755,size=8m";
const DEV_DATA: &str = "mode=0755,size=64k";

/// The session's part of the sandbox, in the context's own mount
/// namespace; ends with the context in the new root.
pub(crate) fn build_context_root(spec: &ContextSpec) -> Result<(), InitError> {
    mount(
        "make mounts private",
        m::mount_change(
            "/",
            MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
        ),
    )?;
    let root = &spec.stage;
    mount(
        "mount root tmpfs",
        mnt(
            "tmpfs",
            root,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            ROOT_DATA,
        ),
    )?;
    let inside = |p: &str| root.join(p.trim_start_matches('/'));
    for dir in &spec.system_dirs {
        let dst = inside(&dir.to_string_lossy());
        match std::fs::symlink_metadata(dir) {
            Ok(md) if md.file_type().is_symlink() => {
                let target = std::fs::read_link(dir).map_err(InitError::Readlink)?;
                file("symlink", &dst, std::os::unix::fs::symlink(target, &dst))?;
            }
            Ok(md) if md.is_dir() => {
                mkdir(&dst)?;
                bind_ro(dir, &dst)?;
            }
            _ => {}
        }
    }
    bind_users(root, &inside("/etc"), spec.uid, spec.gid)?;
    // Mount points of what each run mounts for itself.
    for p in ["/proc", "/tmp", SESSION_MOUNT, SHARED_MOUNT] {
        mkdir(&inside(p))?;
    }
    // A minimal /dev.
    let dev = inside("/dev");
    mkdir(&dev)?;
    mount(
        "mount /dev tmpfs",
        mnt(
            "tmpfs",
            &dev,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NOEXEC,
            DEV_DATA,
        ),
    )?;
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        let dst = dev.join(node);
        file("create", &dst, std::fs::File::create(&dst))?;
        let src = Path::new("/dev").join(node);
        m::mount_bind(&src, &dst).map_err(|source| InitError::BindMount { src, source })?;
    }
    mkdir(&dev.join("pts"))?;
    mkdir(&dev.join("shm"))?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let made = std::os::unix::fs::symlink(target, dev.join(link));
        file("symlink", &Path::new("/dev").join(link), made)?;
    }
    mount(
        "remount /dev read-only",
        m::mount_remount(
            &dev,
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NOEXEC,
            DEV_DATA,
        ),
    )?;
    // What every run of the session sees besides the system: links, then
    // read-only binds, with their parents made on the root tmpfs.
    for (path, target) in &spec.links {
        check_dst(path).map_err(|why| InitError::Link {
            dst: path.clone(),
            why,
        })?;
        let p = inside(path);
        if let Some(parent) = p.parent() {
            mkdir(parent)?;
        }
        file("symlink", &p, std::os::unix::fs::symlink(target, &p))?;
    }
    for b in &spec.binds {
        check_dst(&b.dst).map_err(|why| InitError::Bind {
            dst: b.dst.clone(),
            why: why.into(),
        })?;
        let dst = inside(&b.dst);
        if let Some(parent) = dst.parent() {
            mkdir(parent)?;
        }
        let made = if b.src.is_dir() {
            std::fs::create_dir(&dst)
        } else {
            std::fs::File::create(&dst).map(drop)
        };
        file("create", &dst, made)?;
        bind_ro(&b.src, &dst)?;
    }
    // Switch roots and drop the old one.
    switch("chdir new root", rustix::process::chdir(root))?;
    switch("pivot_root", rustix::process::pivot_root(".", "."))?;
    switch("detach old root", m::unmount(".", UnmountFlags::DETACH))?;
    switch("chdir /", rustix::process::chdir("/"))?;
    root_writable(false)?;
    rustix::system::sethostname(spec.hostname.as_bytes()).map_err(InitError::Hostname)?;
    if spec.isolate_network {
        sys::loopback_up().map_err(InitError::Loopback)?;
    }
    Ok(())
}

/// The sandbox's user database ([`users`]) over the host's files in the
/// bound `/etc` at `etc`, in this mount namespace only. Written on a tmpfs
/// mounted beside the root's contents for the moment, then detached: the
/// binds keep it. A file the host's `/etc` lacks (or has as anything but a
/// regular file) is left out; so is all of it if `/etc` is not bound.
fn bind_users(root: &Path, etc: &Path, uid: u32, gid: u32) -> Result<(), InitError> {
    let regular = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|md| md.is_file());
    if !std::fs::symlink_metadata(etc).is_ok_and(|md| md.is_dir()) {
        return Ok(());
    }
    let host_nsswitch = etc.join("nsswitch.conf");
    let host_nsswitch = regular(&host_nsswitch)
        .then(|| std::fs::read_to_string(&host_nsswitch).ok())
        .flatten();
    let staging = root.join(".users");
    mkdir(&staging)?;
    mount(
        "mount the user database's tmpfs",
        mnt(
            "tmpfs",
            &staging,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            "mode=0755,size=64k",
        ),
    )?;
    for (name, text) in users::files(uid, gid, host_nsswitch.as_deref()) {
        let (src, dst) = (staging.join(name), etc.join(name));
        if !regular(&dst) {
            continue;
        }
        let written = std::fs::write(&src, text).and_then(|()| {
            std::fs::set_permissions(&src, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        });
        file("write", &src, written)?;
        bind_ro(&src, &dst)?;
    }
    mount(
        "detach the user database's tmpfs",
        m::unmount(&staging, UnmountFlags::DETACH),
    )?;
    file("rmdir", &staging, std::fs::remove_dir(&staging))
}

/// Remounts the root tmpfs (its super block and the context's mount of
/// it) read-write or read-only. Runs already made keep their own,
/// read-only, mounts of it whatever this does.
fn root_writable(writable: bool) -> Result<(), InitError> {
    let ro = if writable {
        MountFlags::empty()
    } else {
        MountFlags::RDONLY
    };
    mount(
        if writable {
            "remount / read-write"
        } else {
            "remount / read-only"
        },
        m::mount_remount("/", ro | MountFlags::NOSUID | MountFlags::NODEV, ROOT_DATA),
    )
}

/// Where binds may not go: what every run mounts for itself.
const RESERVED: [&str; 5] = ["/proc", "/dev", "/tmp", SESSION_MOUNT, SHARED_MOUNT];

/// Whether `dst` may be where a bind or link goes inside the sandbox.
fn check_dst(dst: &str) -> Result<(), TargetError> {
    let p = Path::new(dst);
    if !p.is_absolute()
        || p.components()
            .any(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
        || dst.ends_with('/')
    {
        return Err(TargetError::NotNormal);
    }
    if p == Path::new("/") || RESERVED.iter().any(|r| p.starts_with(r)) {
        return Err(TargetError::Reserved);
    }
    Ok(())
}

/// In the context, before a run is made: the mount point of each bind
/// (with its parents) on the root tmpfs, created if missing. `trees` are
/// the binds' detached mounts (a file is bound on a file, anything else on
/// a directory). Never through a symlink or onto another file system.
pub(crate) fn prepare_binds(binds: &[Bind], trees: &[OwnedFd]) -> Result<(), InitError> {
    if binds.is_empty() {
        return Ok(());
    }
    let root_dev = file("stat", Path::new("/"), std::fs::symlink_metadata("/"))?.dev();
    let mut missing: Vec<(std::path::PathBuf, bool)> = Vec::new();
    for (b, tree) in binds.iter().zip(trees) {
        let bad = |why: BindProblem| InitError::Bind {
            dst: b.dst.clone(),
            why,
        };
        check_dst(&b.dst).map_err(|e| bad(e.into()))?;
        let dst = Path::new(&b.dst);
        let is_file = rustix::fs::fstat(tree)
            .map(|st| !rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir())
            .map_err(|e| bad(BindProblem::StatSource(e.into())))?;
        if crate::binds::is_system_file(&b.dst) {
            // Over a file of a bound system directory, as it is: one that
            // is there, reached through no symlink; nothing is made.
            let mut p = std::path::PathBuf::from("/");
            for c in dst.components().skip(1) {
                p.push(c);
                match std::fs::symlink_metadata(&p) {
                    Ok(md) if md.file_type().is_symlink() => {
                        return Err(bad(BindProblem::NotOnRoot(p)));
                    }
                    Ok(_) => {}
                    Err(source) => return Err(bad(BindProblem::Stat { path: p, source })),
                }
            }
            if !is_file || !std::fs::symlink_metadata(dst).is_ok_and(|m| m.is_file()) {
                return Err(bad(BindProblem::KindMismatch));
            }
            continue;
        }
        let mut p = std::path::PathBuf::from("/");
        let parts: Vec<_> = dst.components().skip(1).collect();
        for (i, c) in parts.iter().enumerate() {
            p.push(c);
            let last = i + 1 == parts.len();
            match std::fs::symlink_metadata(&p) {
                Ok(md) if md.file_type().is_symlink() || md.dev() != root_dev => {
                    return Err(bad(BindProblem::NotOnRoot(p)));
                }
                Ok(md) if !last && !md.is_dir() => {
                    return Err(bad(BindProblem::NotDirectory(p)));
                }
                Ok(md) if last && md.is_dir() == is_file => {
                    return Err(bad(BindProblem::KindMismatch));
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if !missing.iter().any(|(m, _)| *m == p) {
                        missing.push((p.clone(), last && is_file));
                    }
                }
                Err(source) => return Err(bad(BindProblem::Stat { path: p, source })),
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    root_writable(true)?;
    let made = missing.iter().try_for_each(|(p, is_file)| {
        let r = if *is_file {
            std::fs::File::create(p).map(drop)
        } else {
            std::fs::create_dir(p)
        };
        file("create", p, r)
    });
    root_writable(false)?;
    made
}

/// The run's own mounts, in its own mount namespace (a copy of the
/// context's, whose root is read-only): what no request decides, so a PID 1
/// made ahead makes them before its run is asked for.
pub(crate) fn own_mounts() -> Result<(), InitError> {
    // /proc of the new PID namespace.
    mount(
        "mount proc",
        mnt(
            "proc",
            "/proc",
            "proc",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            "",
        ),
    )?;
    mount(
        "mount devpts",
        mnt(
            "devpts",
            "/dev/pts",
            "devpts",
            MountFlags::NOSUID | MountFlags::NOEXEC,
            "newinstance,ptmxmode=0666,mode=0620",
        ),
    )?;
    mount(
        "mount /dev/shm",
        mnt(
            "tmpfs",
            "/dev/shm",
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            "mode=1777,size=64m",
        ),
    )?;
    mount(
        "mount /tmp",
        mnt(
            "tmpfs",
            "/tmp",
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            "mode=1777,size=512m",
        ),
    )?;
    Ok(())
}

/// The run's workspace: this session's `current/` and the agent's shared
/// files only, then the request's binds (detached mounts made for this
/// run).
fn attach_workspace(
    spec: &SandboxSpec,
    session: OwnedFd,
    shared: OwnedFd,
    binds: Vec<OwnedFd>,
) -> Result<(), InitError> {
    attach(session, SESSION_MOUNT, true)?;
    attach(shared, SHARED_MOUNT, true)?;
    for (b, tree) in spec.binds.iter().zip(binds) {
        attach(tree, &b.dst, b.writable)?;
    }
    Ok(())
}

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// PID 1 of a namespace ignores signals it has no handler for; these are
/// passed on to the program instead. Installed once in the context (where
/// they do nothing: it has no program) and inherited by each run's PID 1.
pub(crate) fn forward_signals() {
    let all = (1..=31).chain(libc::SIGRTMIN()..=libc::SIGRTMAX());
    for sig in all.filter(|s| ![libc::SIGKILL, libc::SIGSTOP, libc::SIGCHLD].contains(s)) {
        // SAFETY: installing an async-signal-safe handler.
        unsafe {
            libc::signal(sig, forward as *const () as libc::sighandler_t);
        }
    }
}

/// Reaps until the namespace is empty; reports the program's end.
fn reap(child: i32, exec_errno: Option<i32>, spec: &SandboxSpec, mut status: std::fs::File) -> ! {
    let mut reported = false;
    if let Some(errno) = exec_errno {
        if let Ok(b) = postcard::to_stdvec(&InitStatus::ExecFailed(errno)) {
            let _ = status.write_all(&b);
        }
        reported = true;
    }
    let mut status = Some(status);
    let child = Pid::from_raw(child);
    loop {
        // Blocking: `None` (only with WNOHANG) and ECHILD both mean done.
        let (pid, ws) = match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some(reaped)) => reaped,
            Err(rustix::io::Errno::INTR) => continue,
            Ok(None) | Err(_) => break,
        };
        if Some(pid) == child && !reported {
            reported = true;
            CHILD.store(0, Ordering::SeqCst);
            let st = match ws.exit_status() {
                Some(code) => InitStatus::Exited(code),
                None => InitStatus::Signaled(ws.terminating_signal().unwrap_or(0)),
            };
            let note = match st {
                InitStatus::Exited(_) => sync_tmp(spec),
                _ => None,
            };
            if let Some(mut f) = status.take() {
                for s in note.map(InitStatus::Note).iter().chain([&st]) {
                    if let Ok(b) = postcard::to_stdvec(s) {
                        let _ = f.write_all(&b);
                    }
                }
            }
        }
    }
    std::process::exit(0)
}

/// Copies the private /tmp's regular files to `current/.allox-tmp/`, as the
/// unprivileged user, within the size cap (see [`tmp_sync`]); what was not
/// kept, as a line for the end of the run's stderr.
fn sync_tmp(spec: &SandboxSpec) -> Option<String> {
    if spec.tmp_sync_cap == 0 {
        return None;
    }
    // From here on this process needs no privilege at all; without the
    // whole drop it copies nothing.
    if sys::drop_credentials(spec.uid, spec.gid).is_err() {
        return None;
    }
    // Now of the agent's uid, without its seccomp filter or no_new_privs:
    // still not dumpable, so the agent's processes cannot ptrace it,
    // whatever `fs.suid_dumpable` made of the uid change.
    if rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .is_err()
    {
        return None;
    }
    let session = CString::new(SESSION_MOUNT).ok()?;
    let synced = tmp_sync::sync(
        c"/tmp",
        &session,
        c".allox-tmp",
        tmp_sync::Budget::with_bytes(spec.tmp_sync_cap),
    );
    // What was not kept is said (a copy that met a full quota or disk
    // kept nothing, and said nothing, before).
    match synced {
        Ok(s) if s.skipped == 0 && !s.truncated => None,
        Ok(s) => Some(format!(
            "allox: /tmp was not kept whole in .allox-tmp/: {} file(s) kept, {} left out{} \
             (too large for what is left of the {} MiB cap, changed meanwhile, or no room: \
             the session's quota or the disk is full)\n",
            s.files,
            s.skipped,
            if s.truncated {
                ", and the walk stopped at a budget"
            } else {
                ""
            },
            spec.tmp_sync_cap >> 20,
        )),
        Err(e) => Some(format!("allox: /tmp was not kept in .allox-tmp/: {e}\n")),
    }
}
