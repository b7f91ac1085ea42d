//! ELF checks: the guest runs x86-64 only, and `/init` and busybox must be
//! static (no program interpreter, no `DT_NEEDED`), since the image has no
//! loader or shared libraries unless a profile adds them.
//!
//! A glibc static-pie binary (what this workspace builds) is `ET_DYN` with a
//! `PT_DYNAMIC` segment for its own relocations, but has neither an
//! interpreter nor needed libraries, so it counts as static.

use std::path::{Path, PathBuf};

use goblin::elf::header::{EM_X86_64, ET_DYN, ET_EXEC};
use goblin::elf::Elf;

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("{}: cannot read", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not an ELF file", path.display())]
    NotElf { path: PathBuf },
    #[error("{}: built for {machine}, not x86-64", path.display())]
    WrongMachine { path: PathBuf, machine: String },
    #[error("{}: cannot parse the ELF file", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: goblin::error::Error,
    },
    #[error("{}: not an executable ({kind})", path.display())]
    NotExecutable { path: PathBuf, kind: &'static str },
    #[error("{}: not statically linked: {reason}", path.display())]
    NotStatic { path: PathBuf, reason: String },
}

/// What the loader needs to know about one ELF file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ElfInfo {
    /// `PT_INTERP`, e.g. `/lib64/ld-linux-x86-64.so.2`.
    pub interpreter: Option<String>,
    /// `DT_NEEDED` entries in file order.
    pub needed: Vec<String>,
    /// `DT_RUNPATH`, then `DT_RPATH`, split on `:`.
    pub search: Vec<String>,
    /// `e_type` is `ET_EXEC` or `ET_DYN` with a non-zero entry point.
    pub executable: bool,
}

/// Reads and inspects an x86-64 ELF file.
pub fn inspect(path: &Path) -> Result<ElfInfo, ElfError> {
    let bytes = std::fs::read(path).map_err(|source| ElfError::Read {
        path: path.into(),
        source,
    })?;
    inspect_bytes(path, &bytes)
}

pub fn inspect_bytes(path: &Path, bytes: &[u8]) -> Result<ElfInfo, ElfError> {
    if bytes.len() < 20 || &bytes[..4] != b"\x7fELF" {
        return Err(ElfError::NotElf { path: path.into() });
    }
    // Check the class and machine by hand first, so a 32-bit or foreign
    // binary gets a plain answer rather than a parser error.
    let little = bytes[5] == 1;
    let machine = if little {
        u16::from_le_bytes([bytes[18], bytes[19]])
    } else {
        u16::from_be_bytes([bytes[18], bytes[19]])
    };
    if bytes[4] != 2 || machine != EM_X86_64 {
        let mut name = machine_name(machine);
        if bytes[4] != 2 {
            name.push_str(" (32-bit)");
        }
        return Err(ElfError::WrongMachine {
            path: path.into(),
            machine: name,
        });
    }
    let elf = Elf::parse(bytes).map_err(|source| ElfError::Parse {
        path: path.into(),
        source,
    })?;
    let search = elf
        .runpaths
        .iter()
        .chain(&elf.rpaths)
        .flat_map(|s| s.split(':'))
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    Ok(ElfInfo {
        interpreter: elf.interpreter.map(String::from),
        needed: elf.libraries.iter().map(|s| s.to_string()).collect(),
        search,
        executable: matches!(elf.header.e_type, ET_EXEC | ET_DYN) && elf.entry != 0,
    })
}

fn machine_name(machine: u16) -> String {
    use goblin::elf::header::{EM_386, EM_AARCH64, EM_ARM, EM_PPC64, EM_RISCV, EM_S390};
    match machine {
        EM_386 => "i386".into(),
        EM_ARM => "arm".into(),
        EM_AARCH64 => "aarch64".into(),
        EM_PPC64 => "ppc64".into(),
        EM_RISCV => "riscv".into(),
        EM_S390 => "s390".into(),
        m => format!("machine {m:#x}"),
    }
}

/// Accepts an x86-64 executable that needs no loader and no libraries.
pub fn check_static(path: &Path) -> Result<(), ElfError> {
    let info = inspect(path)?;
    static_reason(&info).map_or(Ok(()), |reason| {
        Err(ElfError::NotStatic {
            path: path.into(),
            reason,
        })
    })?;
    if !info.executable {
        return Err(ElfError::NotExecutable {
            path: path.into(),
            kind: "no entry point",
        });
    }
    Ok(())
}

/// Why `info` is not static, or None when it is.
fn static_reason(info: &ElfInfo) -> Option<String> {
    let mut why = Vec::new();
    if let Some(interp) = &info.interpreter {
        why.push(format!("it asks for the program interpreter {interp}"));
    }
    if !info.needed.is_empty() {
        why.push(format!("it needs {}", info.needed.join(", ")));
    }
    (!why.is_empty()).then(|| why.join(" and "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::skip;

    #[test]
    fn a_dynamic_binary_is_refused_with_its_reason() {
        let ls = Path::new("/bin/ls");
        let Ok(info) = inspect(ls) else {
            return skip("a_dynamic_binary_is_refused", "/bin/ls (coreutils)");
        };
        if info.interpreter.is_none() {
            return skip(
                "a_dynamic_binary_is_refused",
                "a dynamically linked /bin/ls",
            );
        }
        let err = check_static(ls).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ElfError::NotStatic { .. }), "{msg}");
        assert!(msg.starts_with("/bin/ls: not statically linked"), "{msg}");
        assert!(msg.contains("program interpreter /lib64/ld-linux-x86-64.so.2"));
        assert!(msg.contains("libc.so.6"), "{msg}");
    }

    #[test]
    fn this_test_binary_is_static() {
        // The workspace links every target binary statically
        // (.cargo/config.toml), this one included.
        let exe = std::env::current_exe().unwrap();
        let info = inspect(&exe).unwrap();
        if info.interpreter.is_some() {
            return skip(
                "this_test_binary_is_static",
                "a +crt-static build (.cargo/config.toml)",
            );
        }
        check_static(&exe).unwrap();
    }

    #[test]
    fn debian_busybox_static_is_static() {
        let bb = Path::new("/bin/busybox");
        if !bb.exists() {
            return skip(
                "debian_busybox_static_is_static",
                "/bin/busybox (apt-get install busybox-static)",
            );
        }
        check_static(bb).unwrap();
    }

    #[test]
    fn missing_and_non_elf_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-init");
        let msg = check_static(&missing).unwrap_err().to_string();
        assert_eq!(msg, format!("{}: cannot read", missing.display()));

        let text = dir.path().join("script");
        std::fs::write(&text, "#!/bin/sh\necho hi\n").unwrap();
        let msg = check_static(&text).unwrap_err().to_string();
        assert_eq!(msg, format!("{}: not an ELF file", text.display()));
    }

    /// A bare ELF header for another machine or class.
    fn header(class: u8, machine: u16) -> Vec<u8> {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = class;
        h[5] = 1; // little endian
        h[6] = 1; // version
        h[16..18].copy_from_slice(&ET_EXEC.to_le_bytes());
        h[18..20].copy_from_slice(&machine.to_le_bytes());
        h
    }

    #[test]
    fn foreign_machines_are_refused() {
        let p = Path::new("init");
        let err = inspect_bytes(p, &header(2, goblin::elf::header::EM_AARCH64)).unwrap_err();
        assert_eq!(err.to_string(), "init: built for aarch64, not x86-64");
        let err = inspect_bytes(p, &header(1, goblin::elf::header::EM_386)).unwrap_err();
        assert_eq!(err.to_string(), "init: built for i386 (32-bit), not x86-64");
    }
}
