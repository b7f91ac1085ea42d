//! The records the programs put in the `EVENTS` ring buffer, and their
//! decoded form.
//!
//! # Layout
//!
//! `struct event` in `bpf/tracker.bpf.c`, native byte order, mirrored by
//! [`EventRecord`] (both sides assert the offsets):
//!
//! | offset | size | field         | meaning                                                   |
//! |-------:|-----:|---------------|-----------------------------------------------------------|
//! |      0 |    4 | `kind`        | 1 fork, 2 exec, 3 exit                                    |
//! |      4 |    4 | `pid`         | tgid in the initial pid namespace                         |
//! |      8 |    4 | `ppid`        | parent's tgid, initial namespace (fork: the forking process) |
//! |     12 |    4 | `ns_pid`      | tgid in the task's own innermost pid namespace            |
//! |     16 |    4 | `ns_ppid`     | parent's tgid in that same namespace, 0 if not visible    |
//! |     20 |    4 | `exit_status` | exit: wait status (signal in bits 0-6, code in 8-15)      |
//! |     24 |    8 | `owner`       | owner tag from `CGROUPS` / `PIDS`                         |
//! |     32 |    8 | `ts_ns`       | `CLOCK_BOOTTIME` nanoseconds                              |
//! |     40 |   16 | `comm`        | command name, NUL padded                                  |
//! |     56 |  256 | `filename`    | exec only: the path given to execve, NUL terminated       |
//!
//! Fork and exit records are 56 bytes (they stop before `filename`), exec
//! records 312, so a ring buffer holds five times more fork and exit
//! events than it would at full size.

use std::mem::{offset_of, size_of};

/// What happened to a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A new process (not a thread) was created.
    Fork,
    /// The process executed a new program.
    Exec,
    /// The last thread of the process exited.
    Exit,
}

/// One decoded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEvent {
    pub kind: EventKind,
    /// Thread group id in the initial pid namespace.
    pub pid: u32,
    /// Parent's thread group id in the initial pid namespace; for a fork,
    /// the process that forked.
    pub ppid: u32,
    /// The pid as the process itself sees it (its innermost namespace).
    pub ns_pid: u32,
    /// The parent's pid in the process's namespace, 0 if not visible there.
    pub ns_ppid: u32,
    /// Raw wait status, for [`EventKind::Exit`] only.
    pub exit_status: Option<i32>,
    pub owner: u64,
    /// `CLOCK_BOOTTIME`, nanoseconds.
    pub ts_ns: u64,
    pub comm: String,
    /// The path given to execve, for [`EventKind::Exec`] only.
    pub filename: Option<String>,
}

/// `struct event` of `bpf/tracker.bpf.c`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EventRecord {
    pub kind: u32,
    pub pid: u32,
    pub ppid: u32,
    pub ns_pid: u32,
    pub ns_ppid: u32,
    pub exit_status: i32,
    pub owner: u64,
    pub ts_ns: u64,
    pub comm: [u8; 16],
    pub filename: [u8; 256],
}

/// Size of a fork or exit record.
pub const SHORT_RECORD: usize = offset_of!(EventRecord, filename);
/// Size of an exec record.
pub const FULL_RECORD: usize = size_of::<EventRecord>();

const _: () = {
    assert!(offset_of!(EventRecord, owner) == 24);
    assert!(offset_of!(EventRecord, comm) == 40);
    assert!(SHORT_RECORD == 56);
    assert!(FULL_RECORD == 312);
};

/// Why a record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("event record of {0} bytes is shorter than the {SHORT_RECORD}-byte header")]
    Short(usize),
    #[error("unknown event kind {0}")]
    UnknownKind(u32),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The text up to the first NUL (the kernel's strings need not be UTF-8).
fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

impl RawEvent {
    /// Decodes one ring buffer record.
    pub fn decode(b: &[u8]) -> Result<RawEvent, DecodeError> {
        if b.len() < SHORT_RECORD {
            return Err(DecodeError::Short(b.len()));
        }
        let kind = match u32_at(b, offset_of!(EventRecord, kind)) {
            1 => EventKind::Fork,
            2 => EventKind::Exec,
            3 => EventKind::Exit,
            other => return Err(DecodeError::UnknownKind(other)),
        };
        let comm_at = offset_of!(EventRecord, comm);
        let filename = match kind {
            EventKind::Exec => Some(c_string(&b[SHORT_RECORD..b.len().min(FULL_RECORD)])),
            _ => None,
        };
        Ok(RawEvent {
            kind,
            pid: u32_at(b, offset_of!(EventRecord, pid)),
            ppid: u32_at(b, offset_of!(EventRecord, ppid)),
            ns_pid: u32_at(b, offset_of!(EventRecord, ns_pid)),
            ns_ppid: u32_at(b, offset_of!(EventRecord, ns_ppid)),
            exit_status: (kind == EventKind::Exit)
                .then(|| u32_at(b, offset_of!(EventRecord, exit_status)) as i32),
            owner: u64_at(b, offset_of!(EventRecord, owner)),
            ts_ns: u64_at(b, offset_of!(EventRecord, ts_ns)),
            comm: c_string(&b[comm_at..comm_at + 16]),
            filename,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as the kernel writes it on a little-endian machine.
    fn golden(kind: u32, filename: Option<&[u8]>) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&kind.to_le_bytes());
        b.extend_from_slice(&1234u32.to_le_bytes()); // pid
        b.extend_from_slice(&1200u32.to_le_bytes()); // ppid
        b.extend_from_slice(&7u32.to_le_bytes()); // ns_pid
        b.extend_from_slice(&1u32.to_le_bytes()); // ns_ppid
        b.extend_from_slice(&(3i32 << 8).to_le_bytes()); // exit_status
        b.extend_from_slice(&42u64.to_le_bytes()); // owner
        b.extend_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes()); // ts_ns
        b.extend_from_slice(b"cat\0\0\0\0\0\0\0\0\0\0\0\0\0");
        if let Some(f) = filename {
            let mut name = [0xAAu8; 256]; // after the NUL: unspecified
            name[..f.len()].copy_from_slice(f);
            b.extend_from_slice(&name);
        }
        b
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn decodes_the_golden_records() {
        let exit = golden(3, None);
        assert_eq!(exit.len(), 56);
        assert_eq!(
            RawEvent::decode(&exit).unwrap(),
            RawEvent {
                kind: EventKind::Exit,
                pid: 1234,
                ppid: 1200,
                ns_pid: 7,
                ns_ppid: 1,
                exit_status: Some(0x300),
                owner: 42,
                ts_ns: 0x0102_0304_0506_0708,
                comm: "cat".into(),
                filename: None,
            }
        );
        let exec = golden(2, Some(b"/usr/bin/cat\0"));
        assert_eq!(exec.len(), 312);
        let e = RawEvent::decode(&exec).unwrap();
        assert_eq!(e.kind, EventKind::Exec);
        assert_eq!(e.filename.as_deref(), Some("/usr/bin/cat"));
        assert_eq!(e.exit_status, None, "only exits carry a status");
        let fork = RawEvent::decode(&golden(1, None)).unwrap();
        assert_eq!(
            (fork.kind, fork.filename, fork.exit_status),
            (EventKind::Fork, None, None)
        );
    }

    #[test]
    fn refuses_short_and_unknown_records() {
        assert_eq!(RawEvent::decode(&[0; 55]), Err(DecodeError::Short(55)));
        let mut b = vec![0u8; 56];
        b[0] = 9;
        assert_eq!(
            RawEvent::decode(&b),
            Err(DecodeError::UnknownKind(u32::from_ne_bytes([9, 0, 0, 0])))
        );
    }

    #[test]
    fn strings_stop_at_nul_and_survive_bad_utf8() {
        assert_eq!(c_string(b"sh\0garbage"), "sh");
        assert_eq!(c_string(b"sixteen-chars-xx"), "sixteen-chars-xx");
        assert_eq!(c_string(b"a\xffb\0"), "a\u{fffd}b");
    }
}
