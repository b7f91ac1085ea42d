//! `store.check`: the index held against the disk, read-only.
//!
//! What start-up recovery promises, checked at any later moment: the
//! journal holds no operation that is neither finished nor undone, every
//! record has its subvolume, every subvolume its record, and no in-flight
//! name is left behind. Background removals are waited for first, and the
//! store lock is held while looking, so no operation is caught half-way.

use super::{Result, Store};
use crate::btrfs;
use crate::journal::Stage;
use allox_protocol::StoreCheckReport;
use std::path::Path;

/// Names in `dir`, sorted; a directory that is not there has none.
fn names(dir: &Path) -> Result<Vec<String>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(super::StoreError::io("read", dir, e)),
    };
    let mut v = Vec::new();
    for e in rd {
        let e = e.map_err(|e| super::StoreError::io("read", dir, e))?;
        v.push(e.file_name().to_string_lossy().into_owned());
    }
    v.sort();
    Ok(v)
}

impl Store {
    pub fn check(&self) -> Result<StoreCheckReport> {
        self.reaper.wait_idle();
        let _g = self.guard();
        let l = &self.layout;
        let mut r = StoreCheckReport {
            read_only: self.read_only_reason(),
            ..StoreCheckReport::default()
        };
        for (op_id, e) in self.index.pending()? {
            match e.stage {
                Stage::Committed => r.removing += 1,
                Stage::Begun | Stage::Aborting => r
                    .unfinished
                    .push(format!("{op_id}: {:?} ({:?})", e.op, e.stage)),
            }
        }
        let probe = |p: &Path| -> Result<bool> { Ok(btrfs::probe_subvolume(p)?) };
        let agents = self.index.agents()?;
        for (a, _) in &agents {
            if !probe(&l.workspace(a))? {
                r.missing_on_disk.push(a.clone());
            }
            for (s, _) in self.index.sessions(a)? {
                if !probe(&l.current(a, &s))? {
                    r.missing_on_disk.push(format!("{a}/{s}"));
                }
                for (c, _) in self.index.checkpoints(a, &s)? {
                    if !probe(&l.checkpoint(a, &s, &c))? {
                        r.missing_on_disk.push(format!("{a}/{s}/{c}"));
                    }
                }
            }
        }
        for a in names(&l.agents_dir())? {
            if a.starts_with('.') || self.index.agent(&a)?.is_none() {
                r.missing_in_index.push(format!("agents/{a}"));
                continue;
            }
            for s in names(&l.sessions_dir(&a))? {
                if s.starts_with('.') || self.index.session(&a, &s)?.is_none() {
                    r.missing_in_index.push(format!("{a}/{s}"));
                    continue;
                }
                for n in names(&l.session_dir(&a, &s))? {
                    if n != "current" && n != "checkpoints" {
                        r.missing_in_index.push(format!("{a}/{s}/{n}"));
                    }
                }
                for c in names(&l.checkpoints_dir(&a, &s))? {
                    if c.starts_with('.') || self.index.checkpoint(&a, &s, &c)?.is_none() {
                        r.missing_in_index.push(format!("{a}/{s}/checkpoints/{c}"));
                    }
                }
            }
        }
        Ok(r)
    }
}
