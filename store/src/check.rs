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
        self.crash_point("check.after_wait");
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
        // Not out of place: the scratch trees of the exports and imports
        // going on, trees whose removal is being tried again (a checkpoint
        // deleted while an export sent it); nor those of deletes that came
        // between the wait above and the lock, being removed now (they
        // were reported out of place by a check beside a busy daemon).
        let busy: std::collections::HashSet<std::path::PathBuf> = self
            .transfers_in_flight()
            .into_iter()
            .chain(self.reaper.retrying())
            .collect();
        // (Counted in `removing` already, by their journal entries.)
        let removing: std::collections::HashSet<std::path::PathBuf> =
            self.reaper.queued().into_iter().collect();
        let in_progress = |p: &Path, shown: String, r: &mut StoreCheckReport| {
            let yes = busy.iter().any(|b| b == p);
            if yes {
                r.in_progress.push(shown);
            }
            yes || removing.contains(p)
        };
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
                let p = l.agents_dir().join(&a);
                if !in_progress(&p, format!("agents/{a}"), &mut r) {
                    r.missing_in_index.push(format!("agents/{a}"));
                }
                continue;
            }
            for s in names(&l.sessions_dir(&a))? {
                if s.starts_with('.') || self.index.session(&a, &s)?.is_none() {
                    let p = l.sessions_dir(&a).join(&s);
                    if !in_progress(&p, format!("{a}/{s}"), &mut r) {
                        r.missing_in_index.push(format!("{a}/{s}"));
                    }
                    continue;
                }
                for n in names(&l.session_dir(&a, &s))? {
                    let p = l.session_dir(&a, &s).join(&n);
                    if n != "current"
                        && n != "checkpoints"
                        && !in_progress(&p, format!("{a}/{s}/{n}"), &mut r)
                    {
                        r.missing_in_index.push(format!("{a}/{s}/{n}"));
                    }
                }
                for c in names(&l.checkpoints_dir(&a, &s))? {
                    if c.starts_with('.') || self.index.checkpoint(&a, &s, &c)?.is_none() {
                        let p = l.checkpoints_dir(&a, &s).join(&c);
                        if !in_progress(&p, format!("{a}/{s}/checkpoints/{c}"), &mut r) {
                            r.missing_in_index.push(format!("{a}/{s}/checkpoints/{c}"));
                        }
                    }
                }
            }
        }
        Ok(r)
    }
}
