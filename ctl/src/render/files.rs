//! File API answers as people read them.

use super::{clean, clean_path, utc};
use allox_protocol::{FsChange, FsData, FsEntry, FsEvent, FsKind, FsListing, FsWritten};

fn kind(k: FsKind) -> char {
    match k {
        FsKind::File => '-',
        FsKind::Dir => 'd',
        FsKind::Symlink => 'l',
        FsKind::Other => '?',
    }
}

/// One `ls -l`-like line.
pub fn entry(e: &FsEntry) -> String {
    let link = e
        .link
        .as_deref()
        .map(|l| format!(" -> {}", clean(l)))
        .unwrap_or_default();
    format!(
        "{}{:04o} {:>12} {} {}{link}\n",
        kind(e.kind),
        e.mode,
        e.size,
        utc(e.mtime_ms),
        clean_path(&e.path, e.escaped)
    )
}

pub fn listing(l: &FsListing) -> String {
    let mut out: String = l.entries.iter().map(entry).collect();
    if l.truncated {
        out.push_str(&format!(
            "-- cut at {} entries; list a subdirectory\n",
            l.entries.len()
        ));
    }
    out
}

pub fn data(d: &FsData) -> String {
    format!(
        "{}: {} bytes from offset {} of {}{}\n",
        clean(&d.path),
        d.data.len(),
        d.offset,
        d.size,
        if d.eof { " (to the end)" } else { "" }
    )
}

pub fn copied(c: &allox_protocol::FsCopied) -> String {
    format!("{}: {} bytes ({})\n", clean(&c.path), c.size, by(c.by))
}

/// How a local copy moved its bytes, as `alloxctl cp -v` says it.
pub fn by(b: allox_protocol::CopiedBy) -> &'static str {
    match b {
        allox_protocol::CopiedBy::Reflink => "reflink",
        allox_protocol::CopiedBy::CopyFileRange => "copy_file_range",
        allox_protocol::CopiedBy::Sendfile => "sendfile",
    }
}

pub fn written(w: &FsWritten) -> String {
    format!(
        "{}: {} bytes{}\n",
        clean(&w.path),
        w.size,
        if w.committed {
            ""
        } else {
            " (upload not yet committed)"
        }
    )
}

/// One change of an `fs.watch`.
pub fn fs_event(e: &FsEvent) -> String {
    let what = match e.change {
        FsChange::Ready => return format!("watching {}\n", clean(&e.path)),
        FsChange::RolledBack => return "rolled back: the whole tree was replaced\n".to_string(),
        FsChange::Incomplete => {
            return format!(
                "incomplete: the watch covers as many directories as it may; {}/ and those made after it are not watched\n",
                clean_path(&e.path, e.escaped)
            )
        }
        FsChange::Created => "created",
        FsChange::Modified => "modified",
        FsChange::Removed => "removed",
        FsChange::Moved => "moved",
    };
    let slash = if e.dir { "/" } else { "" };
    let path = |p: &str| clean_path(p, e.escaped);
    match &e.to {
        Some(to) => format!(
            "{what:<8} {}{slash} -> {}{slash}\n",
            path(&e.path),
            path(to)
        ),
        None => format!("{what:<8} {}{slash}\n", path(&e.path)),
    }
}
