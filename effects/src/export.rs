//! An evidence set as one file (`effects.export`): a tar archive (ustar)
//! of the set's files under one directory named after the run, made the
//! same way every time (files in name order, mode 0644, owner 0, time 0),
//! so that a set exported twice gives the same bytes and a client can ask
//! for it in pieces.
//!
//! Only the set's own files travel: `chain.jsonl`, `bodies.jsonl`,
//! `history.json`, `processes.json`, `effects.json` (and `bodies/*.json`
//! of a set written before `bodies.jsonl`). [`read_tar`] takes
//! an archive back into memory for the verifier ([`crate::verify`]) and
//! refuses anything else: another name, a link, a device, a path that
//! leaves the directory, more than [`MAX_FILES`] files or [`MAX_BYTES`]
//! bytes, an archive that does not end.

use crate::chain::{self, Source};
use crate::observer::{EFFECTS_FILE, HISTORY_FILE, PROCESSES_FILE};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// Most files an archive may hold.
pub const MAX_FILES: usize = 10_000;
/// Most bytes of files an archive may hold.
pub const MAX_BYTES: u64 = 1 << 30;

/// Whether `name` (relative to a set) is one of a set's files.
pub fn is_set_file(name: &str) -> bool {
    if [
        chain::RECORDS,
        chain::BODIES,
        HISTORY_FILE,
        PROCESSES_FILE,
        EFFECTS_FILE,
    ]
    .contains(&name)
    {
        return true;
    }
    let Some(b) = name
        .strip_prefix(chain::BODIES_DIR)
        .and_then(|n| n.strip_prefix('/'))
    else {
        return false;
    };
    // `NNNNNN-kind.json`, the kind in lower case letters and `_`.
    let Some(stem) = b.strip_suffix(".json") else {
        return false;
    };
    let Some((seq, kind)) = stem.split_once('-') else {
        return false;
    };
    seq.len() == 6
        && seq.bytes().all(|c| c.is_ascii_digit())
        && !kind.is_empty()
        && kind.bytes().all(|c| c.is_ascii_lowercase() || c == b'_')
}

/// The set's files in `dir`, by name (relative), in name order.
pub fn set_files(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for top in std::fs::read_dir(dir)? {
        let top = top?;
        let name = top.file_name().to_string_lossy().into_owned();
        if name == chain::BODIES_DIR && top.file_type()?.is_dir() {
            for e in std::fs::read_dir(top.path())? {
                let n = format!("{}/{}", chain::BODIES_DIR, e?.file_name().to_string_lossy());
                if is_set_file(&n) {
                    names.push(n);
                }
            }
        } else if is_set_file(&name) && top.file_type()?.is_file() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// The archive of the set in `dir`, its files under `top/`.
pub fn tar_set(dir: &Path, top: &str) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    for name in set_files(dir)? {
        let data = std::fs::read(dir.join(&name))?;
        let mut h = tar::Header::new_ustar();
        h.set_path(format!("{top}/{name}"))?;
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        b.append(&h, data.as_slice())?;
    }
    b.into_inner()
}

/// A set held in memory (an export read back).
#[derive(Debug, Default, Clone)]
pub struct MemorySet {
    /// The directory the files were under.
    pub top: String,
    pub files: BTreeMap<String, Vec<u8>>,
}

impl Source for MemorySet {
    fn read(&self, name: &str) -> std::io::Result<Vec<u8>> {
        self.files.get(name).cloned().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{name} is not in the export"),
            )
        })
    }
}

/// Reads an archive made by [`tar_set`] (or anything shaped like one).
pub fn read_tar(r: impl Read) -> Result<MemorySet, String> {
    let mut set = MemorySet::default();
    let mut total = 0u64;
    let mut a = tar::Archive::new(Counted { r, n: 0 });
    let entries = a.entries().map_err(|e| format!("not a tar archive: {e}"))?;
    // Where the last entry's data ends, in bytes, padded to its block.
    let mut last_end = None;
    for e in entries {
        let mut e = e.map_err(|e| format!("a broken entry: {e}"))?;
        let size = e
            .header()
            .entry_size()
            .map_err(|e| format!("a broken entry: {e}"))?;
        last_end = Some(e.raw_file_position() + size.div_ceil(512) * 512);
        let path = e
            .path()
            .map_err(|e| format!("an entry's name: {e}"))?
            .to_string_lossy()
            .into_owned();
        let kind = e.header().entry_type();
        if kind.is_dir() {
            continue;
        }
        if !kind.is_file() {
            return Err(format!("{path}: not a plain file ({kind:?})"));
        }
        let (top, name) = path
            .split_once('/')
            .ok_or_else(|| format!("{path}: not under the set's directory"))?;
        if top.is_empty() || top == "." || top == ".." || top.contains('\\') {
            return Err(format!("{path}: not under the set's directory"));
        }
        if set.files.is_empty() && set.top.is_empty() {
            set.top = top.to_string();
        } else if top != set.top {
            return Err(format!("{path}: outside the set's directory {}", set.top));
        }
        if !is_set_file(name) {
            return Err(format!("{path}: not a file of an evidence set"));
        }
        if set.files.len() >= MAX_FILES {
            return Err(format!("more than {MAX_FILES} files"));
        }
        total = total.saturating_add(size);
        if total > MAX_BYTES {
            return Err(format!("more than {MAX_BYTES} bytes"));
        }
        let mut data = Vec::with_capacity(size as usize);
        e.read_to_end(&mut data)
            .map_err(|e| format!("{path}: cut short: {e}"))?;
        if data.len() as u64 != size {
            return Err(format!("{path}: cut short"));
        }
        if set.files.insert(name.to_string(), data).is_some() {
            return Err(format!("{path}: twice in the archive"));
        }
    }
    if set.files.is_empty() {
        return Err("the archive holds no file".into());
    }
    // The entries stop at a block of zeros (the archive's end) or where
    // the bytes stop: an archive cut between two entries has no such
    // block past its last one.
    let read = a.into_inner().n;
    if last_end.is_none_or(|end| read < end + 512) {
        return Err("the archive does not end: cut short after an entry".into());
    }
    Ok(set)
}

/// A reader that counts the bytes read through it.
struct Counted<R> {
    r: R,
    n: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.r.read(buf)?;
        self.n += k as u64;
        Ok(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_set_s_own_names_are_set_files() {
        for ok in [
            "chain.jsonl",
            "bodies.jsonl",
            "bodies/000000-begin.json",
            "bodies/000004-capture_b.json",
            "effects.json",
            "history.json",
            "processes.json",
        ] {
            assert!(is_set_file(ok), "{ok}");
        }
        for no in [
            "pending",
            "bodies/0-begin.json",
            "bodies/000000-Begin.json",
            "bodies/000000-../x.json",
            "../chain.jsonl",
            "bodies/000000-begin.json/x",
            "bodies.jsonl/x",
            "/chain.jsonl",
        ] {
            assert!(!is_set_file(no), "{no}");
        }
    }

    #[test]
    fn an_export_is_the_same_bytes_each_time_and_reads_back() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("run");
        let mut c = chain::Chain::create(&dir).unwrap();
        c.append("begin", &serde_json::json!({"run": "r"})).unwrap();
        c.append("close", &serde_json::json!({})).unwrap();
        std::fs::write(dir.join(HISTORY_FILE), b"[]").unwrap();
        std::fs::write(dir.join("pending"), b"x").unwrap();
        let one = tar_set(&dir, "a-s-r").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1100));
        std::fs::write(dir.join(HISTORY_FILE), b"[]").unwrap();
        assert_eq!(one, tar_set(&dir, "a-s-r").unwrap());
        let back = read_tar(one.as_slice()).unwrap();
        assert_eq!(back.top, "a-s-r");
        let names: Vec<&str> = back.files.keys().map(String::as_str).collect();
        assert_eq!(names, ["bodies.jsonl", "chain.jsonl", "history.json"]);
        assert!(chain::verify_in(&back, None).is_ok());
        // Cut short, in an entry or between two: refused.
        assert!(read_tar(&one[..one.len() / 2 + 100]).is_err());
        let e = read_tar(&one[..one.len() / 2]).unwrap_err();
        assert_eq!(one.len() / 2 % 512, 0, "between two entries");
        assert!(e.contains("does not end"), "{e}");
        // Every cut at a block before the end's first block of zeros:
        // refused.
        for cut in (512..one.len() - 1024).step_by(512) {
            assert!(read_tar(&one[..cut]).is_err(), "cut at {cut}");
        }
        assert!(read_tar(&one[..one.len() - 512]).is_ok());
    }

    #[test]
    fn an_archive_with_another_file_a_link_or_a_way_out_is_refused() {
        let mk = |path: &str, kind: tar::EntryType| {
            let mut b = tar::Builder::new(Vec::new());
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_size(if kind.is_file() { 2 } else { 0 });
            if !kind.is_file() {
                h.set_link_name("/etc/passwd").unwrap();
            }
            h.set_mode(0o644);
            // set_path refuses `..`: written as raw bytes.
            let raw = &mut h.as_old_mut().name;
            raw[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            b.append(&h, &b"{}"[..if kind.is_file() { 2 } else { 0 }])
                .unwrap();
            b.into_inner().unwrap()
        };
        for (p, k, why) in [
            ("r/pending", tar::EntryType::Regular, "not a file of"),
            ("r/../chain.jsonl", tar::EntryType::Regular, "not a file of"),
            ("r/chain.jsonl", tar::EntryType::Symlink, "not a plain file"),
            ("chain.jsonl", tar::EntryType::Regular, "not under"),
        ] {
            let e = read_tar(mk(p, k).as_slice()).unwrap_err();
            assert!(e.contains(why), "{p}: {e}");
        }
    }
}
