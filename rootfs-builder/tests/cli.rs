//! The `rootfs-builder` binary end to end. Tests that need busybox
//! (`busybox-static`) or GNU cpio print `SKIPPED <test>: needs <what>`
//! when this machine lacks them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use allox_rootfs_builder::{cpio, output};

const BIN: &str = env!("CARGO_BIN_EXE_rootfs-builder");
const BUSYBOX: &str = "/bin/busybox";

fn skip(test: &str, what: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: needs {what}");
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env_remove("SOURCE_DATE_EPOCH");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn ok(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = run(args, env);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let out = run(args, &[]);
    assert_eq!(out.status.code(), Some(1), "{args:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

/// Copies of the inputs in a temp dir: busybox, twice (as `/init` too: it
/// is static, and small enough that unoptimised sha256 and gzip stay
/// quick). None when busybox is missing.
fn inputs(test: &str) -> Option<(tempfile::TempDir, PathBuf, PathBuf)> {
    if !Path::new(BUSYBOX).exists() {
        skip(test, "/bin/busybox (apt-get install busybox-static)");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let init = dir.path().join("allox-init");
    let bb = dir.path().join("busybox");
    std::fs::copy(BUSYBOX, &init).unwrap();
    std::fs::copy(BUSYBOX, &bb).unwrap();
    Some((dir, init, bb))
}

fn build(init: &Path, bb: &Path, out: &Path, extra: &[&str], env: &[(&str, &str)]) -> String {
    let mut args = vec![
        "initramfs",
        "--init",
        init.to_str().unwrap(),
        "--busybox",
        bb.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    ok(&args, env)
}

fn set_mtime(path: &Path, t: SystemTime) {
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(t).unwrap();
}

#[test]
fn same_inputs_same_bytes_whatever_the_mtimes() {
    let Some((dir, init, bb)) = inputs("same_inputs_same_bytes_whatever_the_mtimes") else {
        return;
    };
    let a = dir.path().join("a.cpio");
    let b = dir.path().join("b.cpio");
    let said = build(&init, &bb, &a, &[], &[]);
    set_mtime(
        &init,
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000),
    );
    set_mtime(&bb, SystemTime::now());
    build(&init, &bb, &b, &[], &[]);
    let (ba, bb_) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert!(ba == bb_, "two builds differ");
    // The printed hash and size are the file's.
    let entries = cpio::read_all(&ba[..]).unwrap();
    assert!(
        said.contains(&format!("{} entries, {} bytes", entries.len(), ba.len())),
        "{said}"
    );
    let hash_line = said.lines().nth(1).unwrap();
    let sha = Command::new("sha256sum").arg(&a).output();
    match sha {
        Ok(o) if o.status.success() => {
            assert_eq!(String::from_utf8(o.stdout).unwrap().trim(), hash_line);
        }
        _ => skip(
            "same_inputs_same_bytes_whatever_the_mtimes (sha256sum check)",
            "sha256sum",
        ),
    }
    assert!(entries
        .iter()
        .all(|e| e.meta.mtime == 0 && e.meta.uid == 0 && e.meta.gid == 0));
}

#[test]
fn source_date_epoch_sets_every_mtime() {
    let Some((dir, init, bb)) = inputs("source_date_epoch_sets_every_mtime") else {
        return;
    };
    let out = dir.path().join("x.cpio");
    build(
        &init,
        &bb,
        &out,
        &[],
        &[("SOURCE_DATE_EPOCH", "1700000000")],
    );
    let entries = cpio::read_all(&std::fs::read(&out).unwrap()[..]).unwrap();
    assert!(entries.iter().all(|e| e.meta.mtime == 1_700_000_000));
}

#[test]
fn the_default_image_is_sorted_and_complete() {
    let Some((dir, init, bb)) = inputs("the_default_image_is_sorted_and_complete") else {
        return;
    };
    let out = dir.path().join("x.cpio");
    build(&init, &bb, &out, &[], &[]);
    let bytes = std::fs::read(&out).unwrap();
    let entries = cpio::read_all(&bytes[..]).unwrap();
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e.meta.ino as usize, i + 1, "{}", e.name);
        // Every parent is there, before its child.
        if let Some((parent, _)) = e.name.rsplit_once('/') {
            let p = names.iter().position(|n| *n == parent);
            assert!(p.is_some_and(|p| p < i), "{}: parent missing", e.name);
        }
    }
    let get = |n: &str| entries.iter().find(|e| e.name == n).unwrap();
    assert_eq!(get("init").data, std::fs::read(&init).unwrap());
    assert_eq!(get("usr/bin/busybox").data, std::fs::read(&bb).unwrap());
    assert_eq!(get("usr/bin/sh").data, b"busybox");
    assert_eq!(get("bin").data, b"usr/bin");
    for d in ["proc", "sys", "dev", "run", "tmp", "mnt/store", "etc"] {
        assert_eq!(get(d).meta.mode & cpio::S_IFMT, cpio::S_IFDIR, "{d}");
    }
    let passwd = String::from_utf8(get("etc/passwd").data.clone()).unwrap();
    assert!(passwd.starts_with("root:x:0:0:"));
    assert!(passwd.contains("nobody:x:65534:65534:"));
}

#[test]
fn gzip_holds_the_same_archive() {
    let Some((dir, init, bb)) = inputs("gzip_holds_the_same_archive") else {
        return;
    };
    let plain = dir.path().join("x.cpio");
    let gz = dir.path().join("x.cpio.gz");
    let gz2 = dir.path().join("y.cpio.gz");
    build(&init, &bb, &plain, &[], &[]);
    build(&init, &bb, &gz, &["--compress", "gzip"], &[]);
    build(&init, &bb, &gz2, &["--compress", "gzip"], &[]);
    let gz_bytes = std::fs::read(&gz).unwrap();
    assert!(
        gz_bytes == std::fs::read(&gz2).unwrap(),
        "two gzip builds differ"
    );
    let mut unpacked = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(&gz_bytes[..]),
        &mut unpacked,
    )
    .unwrap();
    assert!(
        unpacked == std::fs::read(&plain).unwrap(),
        "gzip content differs from the plain archive"
    );
    assert!(gz_bytes.len() < unpacked.len());
}

#[test]
fn gnu_cpio_reads_it() {
    let Some((dir, init, bb)) = inputs("gnu_cpio_reads_it") else {
        return;
    };
    let out = dir.path().join("x.cpio");
    build(&init, &bb, &out, &[], &[]);
    let listed = Command::new("cpio")
        .args(["-i", "-t", "--quiet", "-F"])
        .arg(&out)
        .output();
    let listed = match listed {
        Ok(o) if o.status.success() => o,
        Ok(o) => panic!("cpio -t failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(_) => return skip("gnu_cpio_reads_it", "cpio (apt-get install cpio)"),
    };
    let theirs: Vec<String> = String::from_utf8(listed.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let ours: Vec<String> = output::read_archive(&std::fs::read(&out).unwrap())
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(theirs, ours);
}

#[test]
fn additions_replace_and_add() {
    let Some((dir, init, bb)) = inputs("additions_replace_and_add") else {
        return;
    };
    let tool = dir.path().join("tool.sh");
    std::fs::write(&tool, "#!/bin/sh\necho tool\n").unwrap();
    let out = dir.path().join("x.cpio");
    let add1 = format!("{}:/bin/sh", tool.display());
    let add2 = format!("{}:/opt/tool", tool.display());
    build(&init, &bb, &out, &["--add", &add1, "--add", &add2], &[]);
    let entries = cpio::read_all(&std::fs::read(&out).unwrap()[..]).unwrap();
    let get = |n: &str| entries.iter().find(|e| e.name == n).unwrap();
    assert_eq!(get("usr/bin/sh").data, b"#!/bin/sh\necho tool\n");
    assert_eq!(get("opt/tool").meta.mode, cpio::S_IFREG | 0o644);
    assert_eq!(get("opt").meta.mode & cpio::S_IFMT, cpio::S_IFDIR);
}

#[test]
fn the_observer_lies_beside_init_with_the_machine_scope() {
    let Some((dir, init, bb)) = inputs("the_observer_lies_beside_init_with_the_machine_scope")
    else {
        return;
    };
    let out = dir.path().join("x.cpio");
    // busybox stands in for allox-observe: static, as it must be.
    // (and for the verifier and the recover tool).
    let b = bb.to_str().unwrap();
    build(
        &init,
        &bb,
        &out,
        &["--observer", b, "--verifier", b, "--recover", b],
        &[],
    );
    let entries = cpio::read_all(&std::fs::read(&out).unwrap()[..]).unwrap();
    let get = |n: &str| entries.iter().find(|e| e.name == n);
    let obs = get("allox-observe").expect("/allox-observe");
    assert_eq!(obs.data, std::fs::read(&bb).unwrap());
    assert_eq!(obs.meta.mode, cpio::S_IFREG | 0o755);
    let ver = get("allox-system-effects-verify").expect("/allox-system-effects-verify");
    assert_eq!(ver.data, obs.data);
    let rec = get("allox-system-effects-recover").expect("/allox-system-effects-recover");
    assert_eq!(rec.data, obs.data);
    let scope = get("etc/allox/effects-scope.json").expect("the scope file");
    let v: serde_json::Value = serde_json::from_slice(&scope.data).unwrap();
    assert_eq!(v["domains"].as_array().map(Vec::len), Some(6), "{v}");
    // Without --observer, neither.
    let plain = dir.path().join("y.cpio");
    build(&init, &bb, &plain, &[], &[]);
    let entries = cpio::read_all(&std::fs::read(&plain).unwrap()[..]).unwrap();
    assert!(!entries
        .iter()
        .any(|e| e.name == "allox-observe" || e.name.starts_with("etc/allox")));
    // A dynamic observer is refused, named.
    if Path::new("/bin/ls").exists() {
        let err = fails(&[
            "initramfs",
            "--init",
            init.to_str().unwrap(),
            "--busybox",
            bb.to_str().unwrap(),
            "--observer",
            "/bin/ls",
            "--verifier",
            bb.to_str().unwrap(),
            "--recover",
            bb.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(
            err.contains("/allox-observe: /bin/ls: not statically linked"),
            "{err}"
        );
    }
}

#[test]
fn bad_inputs_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.cpio");
    let out_s = out.to_str().unwrap();
    let err = fails(&["initramfs", "--init", "/no/such/init", "--out", out_s]);
    assert!(err.contains("/init: /no/such/init: cannot read"), "{err}");

    let ls = Path::new("/bin/ls");
    if ls.exists() {
        let err = fails(&["initramfs", "--init", "/bin/ls", "--out", out_s]);
        assert!(
            err.contains("/bin/ls: not statically linked: it asks for the program interpreter"),
            "{err}"
        );
    } else {
        skip("bad_inputs_are_named (dynamic /init)", "/bin/ls");
    }
    let err = fails(&[
        "initramfs",
        "--init",
        BIN,
        "--busybox",
        "/no/busybox",
        "--out",
        out_s,
    ]);
    assert!(err.contains("busybox: /no/busybox: cannot read"), "{err}");
    if Path::new(BUSYBOX).exists() {
        let err = fails(&[
            "initramfs",
            "--init",
            BIN,
            "--add",
            "/no/file:/x",
            "--out",
            out_s,
        ]);
        assert!(
            err.contains("--add /no/file:/x: /no/file: cannot read"),
            "{err}"
        );
    } else {
        skip(
            "bad_inputs_are_named (--add)",
            "/bin/busybox (apt-get install busybox-static)",
        );
    }
    assert!(!out.exists());
}

#[test]
fn store_image_cli() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("store.img");
    let img_s = img.to_str().unwrap();
    let said = ok(&["store-image", "--out", img_s, "--size", "64M"], &[]);
    assert!(said.contains("blank, 67108864 bytes"), "{said}");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20);
    std::fs::write(&img, "precious").unwrap();
    let err = fails(&["store-image", "--out", img_s, "--size", "64M"]);
    assert!(
        err.contains("exists and is not empty (use --force"),
        "{err}"
    );
    assert_eq!(std::fs::read(&img).unwrap(), b"precious");
    ok(
        &["store-image", "--out", img_s, "--size", "1M", "--force"],
        &[],
    );
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 1 << 20);
    let err = fails(&["store-image", "--out", img_s, "--size", "lots", "--force"]);
    assert!(err.contains("\"lots\": not a size"), "{err}");
}
