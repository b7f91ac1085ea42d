//! The `bpf` domain: every BPF program, map and link in the kernel, and
//! every pin in every bpf filesystem.
//!
//! Objects are listed by `BPF_{PROG,MAP,LINK}_GET_NEXT_ID`, opened by id
//! and described by `BPF_OBJ_GET_INFO_BY_FD` (aya's `loaded_programs`,
//! `loaded_maps`, `loaded_links`). Keys `prog ID`, `map ID`, `link ID`;
//! values: a program's type, name and tag (the hash of its instructions);
//! a map's type, name, key and value size, max entries and flags; a link's
//! type and program id. Left out: run counts and times, memory locked and
//! anything else that moves while the object is unchanged. An object that
//! vanished between its id being listed and being opened is skipped (it is
//! not there); any other failure is a gap.
//!
//! Pins: each bpf filesystem in `/proc/self/mountinfo` (one mount per
//! superblock) is walked; key `pin PATH`, value the pinned object's kind
//! and id (`BPF_OBJ_GET`, then the fd's `fdinfo`), or `pinned` when it
//! cannot be opened.
#![allow(unsafe_code)]

use super::Capture;
use aya::maps::loaded_maps;
use aya::programs::{loaded_links, loaded_programs};
use aya::sys::SyscallError;
use std::collections::BTreeSet;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// Captures the BPF objects and pins.
pub fn capture() -> Capture {
    let mut c = Capture::new();
    for p in loaded_programs() {
        match p {
            Ok(p) => c.insert(
                format!("prog {}", p.id()),
                format!(
                    "{:?} name={} tag={:016x}",
                    p.program_type(),
                    String::from_utf8_lossy(p.name()),
                    p.tag()
                ),
            ),
            Err(aya::programs::ProgramError::SyscallError(e)) => syscall_failed(&mut c, "prog", &e),
            Err(e) => c.gap(format!("bpf: a program: {e}")),
        }
    }
    for m in loaded_maps() {
        match m {
            Ok(m) => {
                let kind = match m.map_type() {
                    Ok(t) => format!("{t:?}"),
                    Err(e) => format!("unknown ({e})"),
                };
                c.insert(
                    format!("map {}", m.id()),
                    format!(
                        "{kind} name={} key={} value={} max_entries={} flags={:#x}",
                        String::from_utf8_lossy(m.name()),
                        m.key_size(),
                        m.value_size(),
                        m.max_entries(),
                        m.map_flags()
                    ),
                )
            }
            Err(aya::maps::MapError::SyscallError(e)) => syscall_failed(&mut c, "map", &e),
            Err(e) => c.gap(format!("bpf: a map: {e}")),
        }
    }
    for l in loaded_links() {
        match l {
            Ok(l) => {
                let kind = match l.link_type() {
                    Ok(t) => format!("{t:?}"),
                    Err(e) => format!("unknown ({e})"),
                };
                c.insert(
                    format!("link {}", l.id()),
                    format!("{kind} prog={}", l.program_id()),
                )
            }
            Err(aya::programs::links::LinkError::SyscallError(e)) => {
                syscall_failed(&mut c, "link", &e)
            }
            Err(e) => c.gap(format!("bpf: a link: {e}")),
        }
    }
    match std::fs::read_to_string("/proc/self/mountinfo") {
        Ok(text) => {
            for dir in bpffs_mounts(&text) {
                walk_pins(Path::new(&dir), &mut c);
            }
        }
        Err(e) => c.gap(format!("bpf: /proc/self/mountinfo: {e}")),
    }
    c
}

/// An object that vanished after listing (`ENOENT` opening it by id) is
/// not there; anything else is a gap.
fn syscall_failed(c: &mut Capture, kind: &str, e: &SyscallError) {
    let vanished = e.io_error.raw_os_error() == Some(libc::ENOENT) && e.call.contains("fd_by_id");
    if !vanished {
        c.gap(format!("bpf: {kind}: {}: {}", e.call, e.io_error));
    }
}

/// The mount points of the bpf filesystems in a `mountinfo` text, one per
/// superblock (device number), unescaped.
pub fn bpffs_mounts(mountinfo: &str) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        if right.split(' ').next() != Some("bpf") {
            continue;
        }
        let f: Vec<&str> = left.split(' ').collect();
        if f.len() < 5 || !seen.insert(f[2].to_string()) {
            continue;
        }
        out.push(unescape(f[4]));
    }
    out
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|d| (b'0'..=b'7').contains(d))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn walk_pins(dir: &Path, c: &mut Capture) {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => return c.gap(format!("bpf: {}: cannot list: {e}", dir.display())),
    };
    for entry in entries {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                c.gap(format!("bpf: {}: cannot list: {e}", dir.display()));
                continue;
            }
        };
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => walk_pins(&path, c),
            Ok(_) => {
                if let Some(v) = pinned_object(&path) {
                    c.insert(format!("pin {}", path.display()), v);
                }
            }
            Err(e) => c.gap(format!("bpf: {}: {e}", path.display())),
        }
    }
}

/// What is pinned at `path`: `prog ID`, `map ID`, `link ID`, or `pinned`
/// when it cannot be opened; `None` when it vanished.
fn pinned_object(path: &Path) -> Option<String> {
    let fd = match obj_get(path) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return None,
        Err(_) => return Some("pinned".into()),
    };
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
        .unwrap_or_default();
    Some(kind_of_fdinfo(&info).unwrap_or_else(|| "pinned".into()))
}

/// A BPF fd's kind and id from its `fdinfo` (a link's names its program
/// too, so `link_id` is looked for first).
pub fn kind_of_fdinfo(info: &str) -> Option<String> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    for (name, kind) in [
        ("link_id:", "link"),
        ("map_id:", "map"),
        ("prog_id:", "prog"),
    ] {
        if let Some(id) = field(name) {
            return Some(format!("{kind} {id}"));
        }
    }
    None
}

/// `BPF_OBJ_GET`: an fd for the object pinned at `path`.
fn obj_get(path: &Path) -> std::io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let cpath = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    /// The `BPF_OBJ_GET` member of `union bpf_attr`.
    #[repr(C)]
    #[derive(Default)]
    struct ObjGet {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
        path_fd: i32,
        _pad: u32,
    }
    const BPF_OBJ_GET: libc::c_long = 7;
    let attr = ObjGet {
        pathname: cpath.as_ptr() as u64,
        ..ObjGet::default()
    };
    // SAFETY: `attr` is a valid, zero-padded `bpf_attr` prefix for
    // BPF_OBJ_GET, its size passed along; `pathname` points at `cpath`,
    // a NUL-terminated string alive for the call. The kernel reads only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET,
            &attr as *const ObjGet,
            std::mem::size_of::<ObjGet>(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: BPF_OBJ_GET returned a new fd, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bpffs_mounts_are_found_once_per_superblock() {
        let mi = "\
22 1 0:21 / /proc rw - proc proc rw
30 22 0:28 / /sys/fs/bpf rw,nosuid shared:9 - bpf bpf rw,mode=700
31 1 0:28 / /other rw - bpf bpf rw
32 1 0:40 / /my\\040pins rw - bpf none rw
";
        assert_eq!(bpffs_mounts(mi), vec!["/sys/fs/bpf", "/my pins"]);
    }

    #[test]
    fn fdinfo_names_the_kind_and_id() {
        let link = "pos:\t0\nflags:\t02000000\nmnt_id:\t15\nlink_type:\ttracing\nlink_id:\t7\nprog_tag:\tab\nprog_id:\t42\n";
        assert_eq!(kind_of_fdinfo(link).as_deref(), Some("link 7"));
        let map = "map_type:\t1\nkey_size:\t4\nmap_id:\t12\n";
        assert_eq!(kind_of_fdinfo(map).as_deref(), Some("map 12"));
        let prog = "prog_type:\t2\nprog_tag:\tab\nprog_id:\t5\n";
        assert_eq!(kind_of_fdinfo(prog).as_deref(), Some("prog 5"));
        assert_eq!(kind_of_fdinfo("pos:\t0\n"), None);
    }
}
