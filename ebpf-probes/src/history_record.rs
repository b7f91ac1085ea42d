//! The records the history programs put in their ring buffer, and their
//! decoded form.
//!
//! # Layout
//!
//! `struct hrec` in `bpf/history.bpf.c`, native byte order, mirrored by
//! [`HistoryRecordRaw`] (both sides assert the offsets):
//!
//! | offset | size | field     | meaning                                                    |
//! |-------:|-----:|-----------|------------------------------------------------------------|
//! |      0 |    8 | `seq`     | the record's sequence number (0, 1, 2, …)                  |
//! |      8 |    8 | `time_ns` | `CLOCK_BOOTTIME` nanoseconds                               |
//! |     16 |    8 | `tag`     | the run's tag                                              |
//! |     24 |    4 | `kind`    | see [`HistoryKind`]                                        |
//! |     28 |    4 | `pid`     | thread id, initial pid namespace                           |
//! |     32 |    4 | `tgid`    | process id, initial pid namespace                          |
//! |     36 |    4 | `ppid`    | the parent's process id (0: unknown, sysctl records)        |
//! |     40 |    8 | `ret`     | syscall: return value; exit: wait status                   |
//! |     48 |    4 | `nr`      | syscall number, -1 for the other kinds                     |
//! |     52 |    4 | `flags`   | file_open: `f_flags`; sysctl: 1 for a write; syscall: a    |
//! |        |      |           | string argument not read ([`TEXT1_UNREAD`], [`TEXT2_UNREAD`]) |
//! |     56 |   48 | `args`    | six u64 arguments (per kind)                               |
//! |    104 |   16 | `comm`    | command name, NUL padded                                   |
//! |    120 |  256 | `str1`    | first text, NUL terminated (full records only)             |
//! |    376 |  128 | `str2`    | second text, NUL terminated (full records only)            |
//!
//! Records without text are 120 bytes long, the others 504.

use std::mem::{offset_of, size_of};

use crate::syscalls;

/// `struct hrec` of `bpf/history.bpf.c`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HistoryRecordRaw {
    pub seq: u64,
    pub time_ns: u64,
    pub tag: u64,
    pub kind: u32,
    pub pid: u32,
    pub tgid: u32,
    pub ppid: u32,
    pub ret: i64,
    pub nr: i32,
    pub flags: u32,
    pub args: [u64; 6],
    pub comm: [u8; 16],
    pub str1: [u8; 256],
    pub str2: [u8; 128],
}

/// A syscall record's `flags`: its first string argument could not be read
/// (a bad pointer, or a page not present: its text is empty, which is not
/// the empty string).
pub const TEXT1_UNREAD: u32 = 1;
/// A syscall record's `flags`: its second string argument could not be
/// read.
pub const TEXT2_UNREAD: u32 = 2;

/// A string argument as a call's line shows it: quoted, `NULL`, or its
/// address and that it was not read.
fn text_arg(text: &str, ptr: u64, unread: bool) -> String {
    if unread && ptr == 0 {
        "NULL".into()
    } else if unread {
        format!("{ptr:#x} (not read)")
    } else {
        format!("{text:?}")
    }
}

/// Size of a record without text.
pub const SHORT_RECORD: usize = offset_of!(HistoryRecordRaw, str1);
/// Size of a record with text.
pub const FULL_RECORD: usize = size_of::<HistoryRecordRaw>();

const _: () = {
    assert!(offset_of!(HistoryRecordRaw, kind) == 24);
    assert!(offset_of!(HistoryRecordRaw, ret) == 40);
    assert!(offset_of!(HistoryRecordRaw, args) == 56);
    assert!(offset_of!(HistoryRecordRaw, comm) == 104);
    assert!(SHORT_RECORD == 120);
    assert!(offset_of!(HistoryRecordRaw, str2) == 376);
    assert!(FULL_RECORD == 504);
};

/// What a record is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HistoryKind {
    /// A new process (not a thread); `ppid` forked it.
    Fork,
    /// The process executed `text` (the path given to execve).
    Exec,
    /// The last thread of the process exited; `ret` is the wait status.
    Exit,
    /// A recorded system call (`nr`) and its result `ret`.
    Syscall,
    /// A file opened for writing (`lsm.s/file_open`); `text`: its path.
    FileOpenWrite,
    /// `lsm/path_unlink`: `text` in directory `text2`.
    PathUnlink,
    /// `lsm/path_mkdir`: `text` in directory `text2`, mode `args[0]`.
    PathMkdir,
    /// `lsm/path_rmdir`: `text` in directory `text2`.
    PathRmdir,
    /// `lsm/path_rename`: `text` to `text2`.
    PathRename,
    /// `lsm/bpf`: command `args[0]`.
    Bpf,
    /// `lsm/sb_mount`: source `text`, type `text2`, flags `args[0]`.
    Mount,
    /// `lsm.s/kernel_read_file`: a file the kernel reads (a module for
    /// `finit_module`, `args[0]` = 2); `text`: its path.
    KernelReadFile,
    /// `lsm/kernel_load_data`: data the kernel loads from memory (a module
    /// for `init_module`, `args[0]` = 2).
    KernelLoadData,
    /// `lsm/netlink_send`: protocol `args[0]`, message type `args[1]`,
    /// flags `args[2]`.
    NetlinkSend,
    /// `lsm/task_kill`: signal `args[1]` to process `args[0]` (`text`: its
    /// comm), after the permission check allowed it.
    TaskKill,
    /// `cgroup/sysctl`: `text` read, or written with `text2` (`flags` 1).
    Sysctl,
}

impl HistoryKind {
    fn from_raw(k: u32) -> Option<HistoryKind> {
        Some(match k {
            1 => HistoryKind::Fork,
            2 => HistoryKind::Exec,
            3 => HistoryKind::Exit,
            4 => HistoryKind::Syscall,
            10 => HistoryKind::FileOpenWrite,
            11 => HistoryKind::PathUnlink,
            12 => HistoryKind::PathMkdir,
            13 => HistoryKind::PathRmdir,
            14 => HistoryKind::PathRename,
            15 => HistoryKind::Bpf,
            16 => HistoryKind::Mount,
            17 => HistoryKind::KernelReadFile,
            18 => HistoryKind::KernelLoadData,
            19 => HistoryKind::NetlinkSend,
            20 => HistoryKind::TaskKill,
            30 => HistoryKind::Sysctl,
            _ => return None,
        })
    }

    /// The name the protocol's `HistoryRecord::kind` carries.
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryKind::Fork => "fork",
            HistoryKind::Exec => "exec",
            HistoryKind::Exit => "exit",
            HistoryKind::Syscall => "syscall",
            HistoryKind::FileOpenWrite => "open_write",
            HistoryKind::PathUnlink => "unlink",
            HistoryKind::PathMkdir => "mkdir",
            HistoryKind::PathRmdir => "rmdir",
            HistoryKind::PathRename => "rename",
            HistoryKind::Bpf => "bpf",
            HistoryKind::Mount => "mount",
            HistoryKind::KernelReadFile => "kernel_read_file",
            HistoryKind::KernelLoadData => "kernel_load_data",
            HistoryKind::NetlinkSend => "netlink_send",
            HistoryKind::TaskKill => "kill",
            HistoryKind::Sysctl => "sysctl",
        }
    }
}

/// One decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRecord {
    /// The kernel's sequence number: records are numbered 0, 1, 2, … in
    /// the order their numbers were taken, lost ones included.
    pub seq: u64,
    /// `CLOCK_BOOTTIME`, nanoseconds.
    pub time_ns: u64,
    pub tag: u64,
    pub kind: HistoryKind,
    /// Thread id (initial pid namespace).
    pub pid: u32,
    /// Process id (initial pid namespace).
    pub tgid: u32,
    /// The parent's process id; 0 when unknown (sysctl records).
    pub ppid: u32,
    pub comm: String,
    /// The system call's number ([`HistoryKind::Syscall`]).
    pub syscall: Option<i32>,
    /// Syscall: the return value; exit: the wait status; else 0.
    pub ret: i64,
    /// Per kind (see [`HistoryKind`]).
    pub flags: u32,
    pub args: [u64; 6],
    /// The record's texts (paths, names, values), empty when none.
    pub text: String,
    pub text2: String,
}

/// Why a record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HistoryDecodeError {
    #[error("history record of {0} bytes is shorter than the {SHORT_RECORD}-byte header")]
    Short(usize),
    #[error("unknown history record kind {0}")]
    UnknownKind(u32),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

impl HistoryRecord {
    /// Decodes one ring buffer record.
    pub fn decode(b: &[u8]) -> Result<HistoryRecord, HistoryDecodeError> {
        if b.len() < SHORT_RECORD {
            return Err(HistoryDecodeError::Short(b.len()));
        }
        let raw_kind = u32_at(b, offset_of!(HistoryRecordRaw, kind));
        let kind =
            HistoryKind::from_raw(raw_kind).ok_or(HistoryDecodeError::UnknownKind(raw_kind))?;
        let text_at = |off: usize, len: usize| {
            if b.len() >= off + len {
                c_string(&b[off..off + len])
            } else {
                String::new()
            }
        };
        let mut args = [0u64; 6];
        for (i, a) in args.iter_mut().enumerate() {
            *a = u64_at(b, offset_of!(HistoryRecordRaw, args) + 8 * i);
        }
        let nr = u32_at(b, offset_of!(HistoryRecordRaw, nr)) as i32;
        let comm_at = offset_of!(HistoryRecordRaw, comm);
        Ok(HistoryRecord {
            seq: u64_at(b, offset_of!(HistoryRecordRaw, seq)),
            time_ns: u64_at(b, offset_of!(HistoryRecordRaw, time_ns)),
            tag: u64_at(b, offset_of!(HistoryRecordRaw, tag)),
            kind,
            pid: u32_at(b, offset_of!(HistoryRecordRaw, pid)),
            tgid: u32_at(b, offset_of!(HistoryRecordRaw, tgid)),
            ppid: u32_at(b, offset_of!(HistoryRecordRaw, ppid)),
            comm: c_string(&b[comm_at..comm_at + 16]),
            syscall: (kind == HistoryKind::Syscall).then_some(nr),
            ret: u64_at(b, offset_of!(HistoryRecordRaw, ret)) as i64,
            flags: u32_at(b, offset_of!(HistoryRecordRaw, flags)),
            args,
            text: text_at(offset_of!(HistoryRecordRaw, str1), 256),
            text2: text_at(offset_of!(HistoryRecordRaw, str2), 128),
        })
    }

    /// A system call that returned an error.
    pub fn refused(&self) -> bool {
        self.kind == HistoryKind::Syscall && self.ret < 0
    }

    /// The system call's name, for [`HistoryKind::Syscall`].
    pub fn syscall_name(&self) -> Option<&'static str> {
        self.syscall.and_then(syscalls::recorded).map(|s| s.name)
    }

    /// What happened, in one line: `mount(target="/mnt", fstype="tmpfs",
    /// 0x0, 0x0) = -1 EPERM`, `open for write /tmp/f`, `net/ipv4/ip_forward
    /// = "1"`.
    pub fn detail(&self) -> String {
        let a = &self.args;
        match self.kind {
            HistoryKind::Fork => format!("forked by {}", self.ppid),
            HistoryKind::Exec => self.text.clone(),
            HistoryKind::Exit => exit_status(self.ret),
            HistoryKind::Syscall => self.syscall_detail(),
            HistoryKind::FileOpenWrite => {
                format!("open for write {} (flags {:#o})", self.text, self.flags)
            }
            HistoryKind::PathUnlink => format!("unlink {} in {}", self.text, self.text2),
            HistoryKind::PathMkdir => {
                format!("mkdir {} in {} mode {:#o}", self.text, self.text2, a[0])
            }
            HistoryKind::PathRmdir => format!("rmdir {} in {}", self.text, self.text2),
            HistoryKind::PathRename => format!("rename {} to {}", self.text, self.text2),
            HistoryKind::Bpf => match syscalls::bpf_cmd(a[0]) {
                Some(c) => format!("bpf {c}"),
                None => format!("bpf cmd {}", a[0]),
            },
            HistoryKind::Mount => {
                format!("mount {} type {} flags {:#x}", self.text, self.text2, a[0])
            }
            HistoryKind::KernelReadFile => {
                format!("kernel reads {} ({})", self.text, read_file_id(a[0]))
            }
            HistoryKind::KernelLoadData => format!("kernel loads {}", read_file_id(a[0])),
            HistoryKind::NetlinkSend => format!(
                "netlink protocol {} message type {} flags {:#x}",
                a[0], a[1], a[2]
            ),
            HistoryKind::TaskKill => format!("signal {} to {} ({})", a[1], a[0], self.text),
            HistoryKind::Sysctl if self.flags & 1 != 0 => {
                format!("write {} = {:?}", self.text, self.text2.trim_end())
            }
            HistoryKind::Sysctl => format!("read {}", self.text),
        }
    }

    fn syscall_detail(&self) -> String {
        let nr = self.syscall.unwrap_or(-1);
        let Some(spec) = syscalls::recorded(nr) else {
            return format!("syscall {nr} = {}", result(self.ret));
        };
        let mut args = Vec::new();
        for i in 0..spec.nargs {
            let v = self.args[usize::from(i)];
            args.push(if spec.str1 == Some(i) {
                text_arg(&self.text, v, self.flags & TEXT1_UNREAD != 0)
            } else if spec.str2 == Some(i) {
                text_arg(&self.text2, v, self.flags & TEXT2_UNREAD != 0)
            } else if i == 0 && spec.name == "bpf" {
                syscalls::bpf_cmd(v).map_or(v.to_string(), str::to_owned)
            } else if i == 0 && spec.name == "socket" {
                syscalls::family(v).map_or(v.to_string(), str::to_owned)
            } else if v <= 0xffff_ffff && (v as u32 as i32) < 0 {
                // An int argument (AT_FDCWD is -100).
                (v as u32 as i32).to_string()
            } else if v > 0xffff && v < 0xffff_ffff_0000_0000 {
                format!("{v:#x}")
            } else {
                (v as i64).to_string()
            });
        }
        format!("{}({}) = {}", spec.name, args.join(", "), result(self.ret))
    }

    /// The protocol's form, for `effects.history`.
    pub fn to_protocol(&self) -> allox_protocol::HistoryRecord {
        allox_protocol::HistoryRecord {
            seq: self.seq,
            time_ns: self.time_ns,
            kind: self.kind.as_str().to_owned(),
            pid: self.tgid,
            ppid: (self.ppid != 0).then_some(self.ppid),
            comm: self.comm.clone(),
            detail: Some(self.detail()),
            refused: self.refused(),
        }
    }
}

fn result(ret: i64) -> String {
    if (-4095..0).contains(&ret) {
        let e = std::io::Error::from_raw_os_error(-ret as i32);
        format!("-1 ({e})")
    } else {
        ret.to_string()
    }
}

fn exit_status(status: i64) -> String {
    let sig = status & 0x7f;
    if sig == 0 {
        format!("exited {}", (status >> 8) & 0xff)
    } else {
        format!("killed by signal {sig}")
    }
}

/// `enum kernel_read_file_id` and `enum kernel_load_data_id`
/// (include/linux/kernel_read_file.h): the same numbers.
fn read_file_id(id: u64) -> &'static str {
    match id {
        1 => "firmware",
        2 => "module",
        3 => "kexec image",
        4 => "kexec initramfs",
        5 => "policy",
        6 => "x509 certificate",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(
        kind: u32,
        nr: i32,
        ret: i64,
        args: [u64; 6],
        texts: Option<(&str, &str)>,
    ) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&7u64.to_ne_bytes()); // seq
        b.extend_from_slice(&1_000u64.to_ne_bytes()); // time
        b.extend_from_slice(&42u64.to_ne_bytes()); // tag
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(&101u32.to_ne_bytes()); // pid
        b.extend_from_slice(&100u32.to_ne_bytes()); // tgid
        b.extend_from_slice(&99u32.to_ne_bytes()); // ppid
        b.extend_from_slice(&ret.to_ne_bytes());
        b.extend_from_slice(&nr.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes()); // flags
        for a in args {
            b.extend_from_slice(&a.to_ne_bytes());
        }
        b.extend_from_slice(b"python3\0\0\0\0\0\0\0\0\0");
        assert_eq!(b.len(), SHORT_RECORD);
        if let Some((t1, t2)) = texts {
            let mut s1 = [0xAAu8; 256];
            s1[..t1.len()].copy_from_slice(t1.as_bytes());
            s1[t1.len()] = 0;
            let mut s2 = [0xAAu8; 128];
            s2[..t2.len()].copy_from_slice(t2.as_bytes());
            s2[t2.len()] = 0;
            b.extend_from_slice(&s1);
            b.extend_from_slice(&s2);
            assert_eq!(b.len(), FULL_RECORD);
        }
        b
    }

    #[test]
    fn a_refused_mount_decodes_and_describes_itself() {
        let b = record(
            4,
            165,
            -1,
            [0, 0x7ff0_0000, 0x7ff1_0000, 0, 0, 0],
            Some(("/mnt", "tmpfs")),
        );
        let r = HistoryRecord::decode(&b).unwrap();
        assert_eq!(r.seq, 7);
        assert_eq!(r.kind, HistoryKind::Syscall);
        assert_eq!((r.pid, r.tgid, r.ppid, r.tag), (101, 100, 99, 42));
        assert_eq!(r.syscall_name(), Some("mount"));
        assert!(r.refused());
        let d = r.detail();
        assert!(
            d.starts_with("mount(0, \"/mnt\", \"tmpfs\", 0, 0) = -1 ("),
            "{d}"
        );
        let p = r.to_protocol();
        assert_eq!(p.kind, "syscall");
        assert_eq!(p.pid, 100);
        assert_eq!(p.ppid, Some(99));
        assert!(p.refused);
        assert_eq!(p.detail.as_deref(), Some(d.as_str()));
    }

    #[test]
    fn a_string_argument_not_read_shows_its_address_not_an_empty_string() {
        let mut b = record(
            4,
            165,
            -1,
            [0, 0x7ff0_0000, 0x7ff1_0000, 0, 0, 0],
            Some(("", "tmpfs")),
        );
        b[52..56].copy_from_slice(&TEXT1_UNREAD.to_ne_bytes());
        let d = HistoryRecord::decode(&b).unwrap().detail();
        assert!(
            d.starts_with("mount(0, 0x7ff00000 (not read), \"tmpfs\", 0, 0) = -1 ("),
            "{d}"
        );
        // No string at all.
        b[64..72].copy_from_slice(&0u64.to_ne_bytes());
        let d = HistoryRecord::decode(&b).unwrap().detail();
        assert!(d.starts_with("mount(0, NULL, \"tmpfs\""), "{d}");
        b[64..72].copy_from_slice(&0x7ff0_0000u64.to_ne_bytes());
        // Read, and empty: the empty string.
        b[52..56].copy_from_slice(&0u32.to_ne_bytes());
        let d = HistoryRecord::decode(&b).unwrap().detail();
        assert!(d.starts_with("mount(0, \"\", \"tmpfs\", 0, 0)"), "{d}");
    }

    #[test]
    fn short_records_have_no_text_and_bad_ones_are_refused() {
        let b = record(15, -1, 0, [0, 0, 0, 0, 0, 0], None);
        let r = HistoryRecord::decode(&b).unwrap();
        assert_eq!(r.kind, HistoryKind::Bpf);
        assert_eq!(r.syscall, None);
        assert_eq!(r.text, "");
        assert_eq!(r.detail(), "bpf BPF_MAP_CREATE");
        assert!(!r.refused());
        assert_eq!(
            HistoryRecord::decode(&b[..50]),
            Err(HistoryDecodeError::Short(50))
        );
        let mut bad = b.clone();
        bad[24..28].copy_from_slice(&99u32.to_ne_bytes());
        assert_eq!(
            HistoryRecord::decode(&bad),
            Err(HistoryDecodeError::UnknownKind(99))
        );
    }

    #[test]
    fn sysctl_writes_and_exits_read_well() {
        let mut b = record(30, -1, 0, [0; 6], Some(("net/ipv4/ip_forward", "1\n")));
        b[52..56].copy_from_slice(&1u32.to_ne_bytes());
        let r = HistoryRecord::decode(&b).unwrap();
        assert_eq!(r.detail(), "write net/ipv4/ip_forward = \"1\"");
        let e = HistoryRecord::decode(&record(3, -1, 3 << 8, [0; 6], None)).unwrap();
        assert_eq!(e.detail(), "exited 3");
        assert_eq!(e.to_protocol().kind, "exit");
    }
}
