//! Compiles `bpf/tracker.bpf.c` into `$OUT_DIR/tracker.bpf.o` with clang
//! (`-target bpf`, CO-RE relocations in `.BTF.ext`). Needs clang and the
//! libbpf headers (`<bpf/bpf_helpers.h>`, Debian: `libbpf-dev`); `CLANG`
//! names another clang binary.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "bpf/tracker.bpf.c";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-env-changed=CLANG");

    let out =
        PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("tracker.bpf.o");
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

    let result = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-D__TARGET_ARCH_{arch}"))
        .args(["-c", SOURCE, "-o"])
        .arg(&out)
        .status();
    match result {
        Ok(status) if status.success() => {}
        Ok(status) => panic!(
            "`{clang}` failed to compile {SOURCE} ({status}); its errors are above. \
             The libbpf headers must be installed (Debian: apt-get install libbpf-dev)"
        ),
        Err(e) => panic!(
            "cannot run `{clang}` to compile the eBPF programs in {SOURCE}: {e}. \
             Install clang (Debian: apt-get install clang libbpf-dev) or set CLANG to a clang binary"
        ),
    }
}
