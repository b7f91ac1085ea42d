//! The names of a directory, or of one part of a large one, held compactly
//! and sorted, with what the walk budgets for them.

use crate::tree::TreeError;
use rustix::fd::OwnedFd;
use rustix::fs;
use std::collections::hash_map::RandomState;
use std::ffi::OsStr;
use std::hash::BuildHasher;
use std::os::unix::ffi::OsStrExt;

/// Bytes a name costs beside its own bytes (its place in the table).
pub const ENTRY_COST: usize = 16;

#[derive(Clone, Copy)]
struct Ent {
    off: u32,
    /// A name is at most 255 bytes (`NAME_MAX`).
    len: u16,
    /// What the entry says the name is ([`Names::is_dir`]).
    kind: Kind,
    ino: u64,
}

/// A directory entry's type, as `getdents` gives it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    Other,
    Unknown,
}

/// Names with the inode numbers their entries give, sorted by name.
#[derive(Default)]
pub struct Names {
    bytes: Vec<u8>,
    ents: Vec<Ent>,
}

impl Names {
    /// Bytes held, as budgeted.
    pub fn cost(&self) -> usize {
        self.bytes.len() + self.ents.len() * ENTRY_COST
    }

    pub fn len(&self) -> usize {
        self.ents.len()
    }

    pub fn name(&self, i: usize) -> &OsStr {
        let e = self.ents[i];
        OsStr::from_bytes(&self.bytes[e.off as usize..e.off as usize + e.len as usize])
    }

    /// Whether the entry says name `i` is a directory; `None` where the
    /// filesystem does not say (`DT_UNKNOWN`).
    pub fn is_dir(&self, i: usize) -> Option<bool> {
        match self.ents[i].kind {
            Kind::Dir => Some(true),
            Kind::Other => Some(false),
            Kind::Unknown => None,
        }
    }

    pub fn ino(&self, i: usize) -> u64 {
        self.ents[i].ino
    }

    fn push(&mut self, name: &[u8], ino: u64, kind: Kind) {
        self.ents.push(Ent {
            off: self.bytes.len() as u32,
            len: name.len() as u16,
            kind,
            ino,
        });
        self.bytes.extend_from_slice(name);
    }

    fn sort(&mut self) {
        let b = &self.bytes;
        let key = |e: &Ent| &b[e.off as usize..e.off as usize + e.len as usize];
        self.ents.sort_unstable_by(|x, y| key(x).cmp(key(y)));
    }
}

/// Which names of a directory to hold: those whose keyed hash falls in
/// part `part` of `parts` (the key is the diff's own, so an agent cannot
/// make one part large).
#[derive(Clone, Copy)]
pub struct Part<'a> {
    pub part: u64,
    pub parts: u64,
    pub key: &'a RandomState,
}

impl Part<'_> {
    fn holds(&self, name: &[u8]) -> bool {
        self.parts <= 1 || self.key.hash_one(name) % self.parts == self.part
    }
}

/// What a read gave: the names, or, past the limit, only what they would
/// cost (the read goes on counting, holding nothing more).
pub enum Read {
    Fit(Names),
    Over { cost: usize },
}

/// Reads the names of `dir` (without `.` and `..`) that fall in `part`,
/// holding at most `limit` bytes of them.
pub fn read(dir: &OwnedFd, part: Part<'_>, limit: usize, shown: &[u8]) -> Result<Read, TreeError> {
    let mut d = fs::Dir::read_from(dir).map_err(|e| TreeError::io("read", shown, e))?;
    let mut out = Names::default();
    let mut cost = 0usize;
    let mut over = false;
    while let Some(e) = d.read() {
        let e = e.map_err(|e| TreeError::io("read", shown, e))?;
        let n = e.file_name().to_bytes();
        if n == b"." || n == b".." || !part.holds(n) {
            continue;
        }
        cost += n.len() + ENTRY_COST;
        if cost > limit {
            if !over {
                over = true;
                out = Names::default();
            }
            continue;
        }
        let kind = match e.file_type() {
            fs::FileType::Directory => Kind::Dir,
            fs::FileType::Unknown => Kind::Unknown,
            _ => Kind::Other,
        };
        out.push(n, e.ino(), kind);
    }
    if over {
        return Ok(Read::Over { cost });
    }
    out.sort();
    Ok(Read::Fit(out))
}
