//! Why the tracker could not be loaded or used.

use std::io;
use std::path::PathBuf;

use aya::maps::MapError;
use aya::programs::ProgramError;
use aya::sys::SyscallError;
use aya::{BtfError, EbpfError};

/// Why [`Tracker::load`](crate::Tracker::load) failed; each variant names
/// the cause a person has to fix.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("no kernel BTF at {path} (the kernel needs CONFIG_DEBUG_INFO_BTF=y)")]
    NoBtf {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot parse the kernel BTF at {path}")]
    BadBtf {
        path: PathBuf,
        #[source]
        source: BtfError,
    },
    #[error(
        "missing capability: {what} needs CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN \
         (the kernel answered EPERM; before Linux 5.11 a low RLIMIT_MEMLOCK does too)"
    )]
    Permission {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("kernel too old: {what}")]
    KernelTooOld {
        what: String,
        #[source]
        source: Option<io::Error>,
    },
    #[error(
        "the kernel rejected program {program} for tracepoint {tracepoint} (kernel too old, \
         or the verifier refused it); verifier log:\n{verifier_log}"
    )]
    Rejected {
        program: &'static str,
        tracepoint: &'static str,
        verifier_log: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot attach program {program} to tracepoint {tracepoint}")]
    Attach {
        program: &'static str,
        tracepoint: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("cannot create map {name}")]
    Map {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("the embedded eBPF object does not load on this kernel")]
    Object(#[source] EbpfError),
    #[error("the embedded eBPF object has no {what}")]
    Missing { what: String },
    #[error("invalid ring buffer size {0}: it must be a power of two and at least 4096 bytes")]
    RingSize(u32),
}

/// Why an operation on a loaded tracker failed.
#[derive(Debug, thiserror::Error)]
pub enum TrackerError {
    #[error("cannot update map {map}")]
    Map {
        map: &'static str,
        #[source]
        source: MapError,
    },
    #[error("cannot enable BPF run-time statistics")]
    Stats(#[source] SyscallError),
}

// Linux errno values (part of the ABI), so that no libc binding is needed.
const EPERM: i32 = 1;
const EINVAL: i32 = 22;

fn is_eperm(e: &io::Error) -> bool {
    e.raw_os_error() == Some(EPERM)
}

impl LoadError {
    /// Creating the maps and loading the object's BTF.
    pub(crate) fn from_object(e: EbpfError) -> LoadError {
        match e {
            EbpfError::MapError(MapError::CreateError { name, io_error }) => {
                if is_eperm(&io_error) {
                    LoadError::Permission {
                        what: format!("creating map {name}"),
                        source: io_error,
                    }
                } else if name == "EVENTS" && io_error.raw_os_error() == Some(EINVAL) {
                    LoadError::KernelTooOld {
                        what: "cannot create the BPF ring buffer EVENTS (needs Linux 5.8)".into(),
                        source: Some(io_error),
                    }
                } else {
                    LoadError::Map {
                        name,
                        source: io_error,
                    }
                }
            }
            EbpfError::BtfError(BtfError::LoadError { io_error, .. }) if is_eperm(&io_error) => {
                LoadError::Permission {
                    what: "loading the programs' BTF".into(),
                    source: io_error,
                }
            }
            other => LoadError::Object(other),
        }
    }

    /// Loading (verifying) one program.
    pub(crate) fn from_load(
        program: &'static str,
        tracepoint: &'static str,
        e: ProgramError,
    ) -> LoadError {
        match e {
            ProgramError::LoadError { io_error, .. } if is_eperm(&io_error) => {
                LoadError::Permission {
                    what: format!("loading program {program}"),
                    source: io_error,
                }
            }
            ProgramError::LoadError {
                io_error,
                verifier_log,
            } => LoadError::Rejected {
                program,
                tracepoint,
                verifier_log: verifier_log.to_string(),
                source: io_error,
            },
            ProgramError::Btf(BtfError::UnknownBtfTypeName { .. }) => LoadError::KernelTooOld {
                what: format!(
                    "its BTF has no tracepoint btf_trace_{tracepoint} (tp_btf needs Linux 5.5)"
                ),
                source: None,
            },
            ProgramError::SyscallError(SyscallError { io_error, .. }) if is_eperm(&io_error) => {
                LoadError::Permission {
                    what: format!("loading program {program}"),
                    source: io_error,
                }
            }
            other => LoadError::Attach {
                program,
                tracepoint,
                source: other,
            },
        }
    }

    /// Attaching one loaded program.
    pub(crate) fn from_attach(
        program: &'static str,
        tracepoint: &'static str,
        e: ProgramError,
    ) -> LoadError {
        match e {
            ProgramError::SyscallError(SyscallError { io_error, .. }) if is_eperm(&io_error) => {
                LoadError::Permission {
                    what: format!("attaching program {program} to tracepoint {tracepoint}"),
                    source: io_error,
                }
            }
            other => LoadError::Attach {
                program,
                tracepoint,
                source: other,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    fn eperm() -> io::Error {
        io::Error::from_raw_os_error(EPERM)
    }

    #[test]
    fn eperm_anywhere_means_a_missing_capability() {
        let map = LoadError::from_object(EbpfError::MapError(MapError::CreateError {
            name: "PIDS".into(),
            io_error: eperm(),
        }));
        assert!(matches!(map, LoadError::Permission { .. }), "{map:?}");
        assert!(map.to_string().contains("CAP_BPF"), "{map}");
        assert!(map.to_string().contains("creating map PIDS"), "{map}");

        let prog = LoadError::from_load(
            "allox_fork",
            "sched_process_fork",
            ProgramError::LoadError {
                io_error: eperm(),
                verifier_log: aya_obj_log(""),
            },
        );
        assert!(matches!(prog, LoadError::Permission { .. }), "{prog:?}");
    }

    fn aya_obj_log(s: &str) -> aya_obj::VerifierLog {
        aya_obj::VerifierLog::new(s.to_owned())
    }

    #[test]
    fn a_rejected_program_carries_the_verifier_log() {
        let e = LoadError::from_load(
            "allox_exit",
            "sched_process_exit",
            ProgramError::LoadError {
                io_error: io::Error::from_raw_os_error(13),
                verifier_log: aya_obj_log("R1 invalid mem access 'scalar'"),
            },
        );
        let text = e.to_string();
        assert!(
            text.contains("allox_exit") && text.contains("sched_process_exit"),
            "{text}"
        );
        assert!(text.contains("R1 invalid mem access 'scalar'"), "{text}");
        assert!(e.source().is_some());
    }

    #[test]
    fn a_missing_tracepoint_means_an_old_kernel() {
        let e = LoadError::from_load(
            "allox_fork",
            "sched_process_fork",
            ProgramError::Btf(BtfError::UnknownBtfTypeName {
                type_name: "btf_trace_sched_process_fork".into(),
            }),
        );
        assert!(e.to_string().starts_with("kernel too old"), "{e}");
        let ring = LoadError::from_object(EbpfError::MapError(MapError::CreateError {
            name: "EVENTS".into(),
            io_error: io::Error::from_raw_os_error(EINVAL),
        }));
        assert!(ring.to_string().contains("Linux 5.8"), "{ring}");
    }
}
