//! Compiles the eBPF programs with clang (`-target bpf`, CO-RE relocations
//! in `.BTF.ext`): `bpf/tracker.bpf.c` into `$OUT_DIR/tracker.bpf.o` and
//! `bpf/history.bpf.c` into `$OUT_DIR/history.bpf.o`. Needs clang and the
//! libbpf headers (`<bpf/bpf_helpers.h>`, Debian: `libbpf-dev`); `CLANG`
//! names another clang binary.

use std::env;
use std::path::PathBuf;
use std::process::Command;

/// (source, object, extra flags). The history's sequence number is an
/// atomic fetch-and-add whose result is used, which needs BPF ISA v3
/// (Linux 5.12; the guest kernel is 6.1).
const OBJECTS: [(&str, &str, &[&str]); 2] = [
    ("bpf/tracker.bpf.c", "tracker.bpf.o", &[]),
    ("bpf/history.bpf.c", "history.bpf.o", &["-mcpu=v3"]),
];

fn main() {
    for (source, _, _) in OBJECTS {
        println!("cargo:rerun-if-changed={source}");
    }
    println!("cargo:rerun-if-env-changed=CLANG");

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // Only the PT_REGS macros of bpf_tracing.h care; tp_btf programs read
    // their arguments from the context array on every architecture.
    let arch = match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("aarch64") => "arm64",
        Ok("riscv64") => "riscv",
        Ok("s390x") => "s390",
        Ok("powerpc64") => "powerpc",
        _ => "x86",
    };
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());

    for (source, object, extra) in OBJECTS {
        let result = Command::new(&clang)
            .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
            .args(extra)
            .arg(format!("-D__TARGET_ARCH_{arch}"))
            .args(["-c", source, "-o"])
            .arg(out_dir.join(object))
            .status();
        match result {
            Ok(status) if status.success() => {}
            Ok(status) => panic!(
                "`{clang}` failed to compile {source} ({status}); its errors are above. \
                 The libbpf headers must be installed (Debian: apt-get install libbpf-dev)"
            ),
            Err(e) => panic!(
                "cannot run `{clang}` to compile the eBPF programs in {source}: {e}. \
                 Install clang (Debian: apt-get install clang libbpf-dev) or set CLANG to a clang binary"
            ),
        }
    }
}
