//! `session.create`, `session.list`, `session.delete`, `session.fork`.

use super::{checkpoint_info, mkdir, with_fork, After, Result, Store, StoreError, MAX_LABEL};
use crate::btrfs;
use crate::index::{
    session_key, CheckpointRecord, ClockRecord, ForkRecord, NetworkRecord, PolicyRecord,
    SessionRecord,
};
use crate::journal::Op;
use allox_protocol::{
    validate_id, CheckpointInfo, Deleted, Origin, SessionFork, SessionInfo, FORK_BASELINE,
};

/// What a new session is made with ([`Store::session_create_with`]).
#[derive(Debug, Clone, Default)]
pub struct NewSession {
    pub network: NetworkRecord,
    /// Limits over time; the store sets their times to the creation's.
    pub clock: Option<ClockRecord>,
    /// The session's own checkpoint policy, if it has one.
    pub policy: Option<PolicyRecord>,
}

impl Store {
    pub fn session_create(&self, a: &str, s: &str) -> Result<SessionInfo> {
        self.session_create_with(a, s, &NewSession::default())
    }

    /// A session with its settings (its network mode and egress rules,
    /// its limits over time — whose times start at the creation — and its
    /// checkpoint policy), written in the transaction that begins the
    /// creation: a session never exists without them. (Left behind by a
    /// creation that failed, they are replaced by the next creation of
    /// that session; a clock of a session that does not exist is never
    /// read.)
    pub fn session_create_with(&self, a: &str, s: &str, new: &NewSession) -> Result<SessionInfo> {
        validate_id("agent_id", a)?;
        validate_id("session_id", s)?;
        crate::turn::check_keep_last(new.policy.as_ref().and_then(|p| p.keep_last))?;
        let _g = self.guard();
        self.need_agent(a)?;
        if self.index.session(a, s)?.is_some() {
            return Err(StoreError::Exists(format!("session {a}/{s}")));
        }
        let dir = self.layout.session_dir(a, s);
        if dir.exists() {
            return Err(StoreError::OnDiskNotIndexed(dir));
        }
        let rec = SessionRecord {
            created_ms: crate::clock::now_ms(),
            head: None,
        };
        let build = |w: &mut crate::index::Writer<'_>| {
            let key = session_key(a, s);
            w.put_network(&key, &new.network)?;
            match &new.policy {
                Some(pol) => w.put_policy(&key, pol)?,
                None => w.remove_policy(&key)?,
            }
            match &new.clock {
                Some(c) => w.put_clock(
                    a,
                    s,
                    &ClockRecord {
                        lifetime_from_ms: rec.created_ms,
                        last_active_ms: rec.created_ms,
                        expired_ms: None,
                        ..c.clone()
                    },
                )?,
                None => w.remove_clock(a, s)?,
            }
            Ok(Op::SessionCreate {
                agent: a.into(),
                session: s.into(),
                created_ms: rec.created_ms,
            })
        };
        self.check_space()?;
        self.journaled(build, |op_id, op| {
            mkdir(&dir)?;
            btrfs::create_subvolume(&self.layout.current(a, s))?;
            self.limit_session_tree(&self.layout.current(a, s))?;
            self.crash_point("session_create.after_subvolume");
            mkdir(&self.layout.checkpoints_dir(a, s))?;
            self.crash_point("session_create.before_commit");
            self.end(op_id, op, &After::Nothing)?;
            Ok(((), After::Nothing))
        })?;
        self.session_info(a, s, &rec)
    }

    /// `session.fork`: a new session from a checkpoint of `a/s` or from
    /// its `current/` as it is now. The baseline checkpoint is a read-only
    /// snapshot of the source and the new `current/` a writable snapshot of
    /// the baseline, so both hold the same tree even while the source is
    /// written. The source's network and checkpoint policy are copied in
    /// the transaction that begins the fork; a crash at any step leaves the
    /// whole session or none of it. Answers the new session and its
    /// baseline.
    pub fn session_fork(&self, p: &SessionFork) -> Result<(SessionInfo, CheckpointInfo)> {
        self.session_fork_with(p, None)
    }

    /// [`Store::session_fork`], the new session with its limits over time
    /// `clock` (their times counted from the fork), in the same
    /// transaction.
    pub fn session_fork_with(
        &self,
        p: &SessionFork,
        clock: Option<&ClockRecord>,
    ) -> Result<(SessionInfo, CheckpointInfo)> {
        let (a, s) = (&*p.agent_id, &*p.session_id);
        let na = p.new_agent_id.as_deref().unwrap_or(a);
        let ns = &*p.new_session_id;
        validate_id("agent_id", a)?;
        validate_id("session_id", s)?;
        validate_id("new_agent_id", na)?;
        validate_id("new_session_id", ns)?;
        let from = (p.from != "current").then_some(p.from.as_str());
        if let Some(c) = from {
            validate_id("from", c)?;
        }
        if let Some(l) = &p.label {
            if l.len() > MAX_LABEL || l.chars().any(char::is_control) {
                return Err(StoreError::BadLabel);
            }
        }
        let _g = self.guard();
        self.need_session(a, s)?;
        let source = match from {
            Some(c) => {
                self.need_checkpoint(a, s, c)?;
                let cp = self.layout.checkpoint(a, s, c);
                // One over the daemon's quota would make a session that
                // cannot take an empty file.
                self.fits_session_quota(
                    vec![(format!("checkpoint {c}"), cp.clone())],
                    false,
                    "nothing was made",
                )?;
                cp
            }
            None => self.layout.current(a, s),
        };
        self.need_agent(na)?;
        if self.index.session(na, ns)?.is_some() {
            return Err(StoreError::Exists(format!("session {na}/{ns}")));
        }
        let dir = self.layout.session_dir(na, ns);
        if dir.exists() {
            return Err(StoreError::OnDiskNotIndexed(dir));
        }
        let (src_key, new_key) = (session_key(a, s), session_key(na, ns));
        let network = self.index.network(&src_key)?;
        let policy = self.index.policy(&src_key)?;
        let now = crate::clock::now_ms();
        let build = |w: &mut crate::index::Writer<'_>| {
            // Settings left by an earlier fork or create of this name that
            // failed are replaced, or removed when the source has none.
            match &network {
                Some(n) => w.put_network(&new_key, n)?,
                None => w.remove_network(&new_key)?,
            }
            match &policy {
                Some(pol) => w.put_policy(&new_key, pol)?,
                None => w.remove_policy(&new_key)?,
            }
            match clock {
                Some(c) => w.put_clock(
                    na,
                    ns,
                    &ClockRecord {
                        lifetime_from_ms: now,
                        last_active_ms: now,
                        expired_ms: None,
                        ..c.clone()
                    },
                )?,
                None => w.remove_clock(na, ns)?,
            }
            Ok(Op::SessionFork {
                agent: na.into(),
                session: ns.into(),
                created_ms: now,
                record: CheckpointRecord {
                    created_ms: now,
                    seq: w.next_seq("checkpoint")?,
                    parent: None,
                    origin: Origin::Fork,
                    pinned: false,
                    label: p.label.clone(),
                    turn_id: None,
                },
                from: ForkRecord {
                    agent: a.into(),
                    session: s.into(),
                    checkpoint: from.map(str::to_string),
                    baseline: FORK_BASELINE.into(),
                    forked_ms: now,
                },
            })
        };
        self.check_space()?;
        let (record, fork) = self.journaled(build, |op_id, op| {
            mkdir(&dir)?;
            mkdir(&self.layout.checkpoints_dir(na, ns))?;
            self.crash_point("session_fork.after_journal");
            let baseline = self.layout.checkpoint(na, ns, FORK_BASELINE);
            let current = self.layout.current(na, ns);
            // Both snapshots of the source at once, which Btrfs makes in
            // one transaction commit when the second joins the first's: a
            // checkpoint does not change, and a live `current/` cannot
            // change within one commit (its writers wait for it), so then
            // both hold the same tree.
            // A live `current/` with uploads under way: both made without
            // their partial files (the baseline writable until then).
            let leave = if from.is_none() {
                self.left_out(a, s)
            } else {
                Vec::new()
            };
            let (b, c) = std::thread::scope(|t| {
                let b = t.spawn(|| btrfs::snapshot(&source, &baseline, leave.is_empty()));
                let c = btrfs::snapshot(&source, &current, false);
                (b.join(), c)
            });
            b.unwrap_or_else(|p| std::panic::resume_unwind(p))?;
            c?;
            if !leave.is_empty() {
                crate::leave_out::remove_below(&baseline, &leave);
                crate::leave_out::remove_below(&current, &leave);
                btrfs::set_read_only(&baseline, true)?;
            }
            self.crash_point("session_fork.after_baseline");
            if from.is_none()
                && btrfs::root_info(&baseline)?.otransid != btrfs::root_info(&current)?.otransid
                && !same_tree(&baseline, &current)
            {
                // Made in two commits of a tree written in between: the
                // new tree again, from the baseline.
                tracing::debug!(
                    agent = na,
                    session = ns,
                    "fork: the source changed between the snapshots, the new tree again"
                );
                btrfs::delete_subvolume(&current)?;
                btrfs::snapshot(&baseline, &current, false)?;
            }
            self.limit_session_tree(&current)?;
            self.crash_point("session_fork.after_current");
            self.end(op_id, op, &After::Nothing)?;
            self.crash_point("session_fork.after_commit");
            let Op::SessionFork { record, from, .. } = op else {
                unreachable!("built above")
            };
            Ok(((record.clone(), from.clone()), After::Nothing))
        })?;
        let info = self.session_info_of(na, ns)?;
        let baseline = with_fork(checkpoint_info(na, ns, FORK_BASELINE, &record), Some(&fork));
        Ok((info, baseline))
    }

    pub fn session_list(&self, a: &str) -> Result<Vec<SessionInfo>> {
        self.need_agent(a)?;
        let mut out = Vec::new();
        for (s, r) in self.index.sessions(a)? {
            out.push(self.session_info(a, &s, &r)?);
        }
        Ok(out)
    }

    /// When session `a/s` was made (`not_found` if there is none): its
    /// existence, without counting its checkpoints.
    pub fn session_created(&self, a: &str, s: &str) -> Result<u64> {
        Ok(self.need_session(a, s)?.created_ms)
    }

    pub fn session_info_of(&self, a: &str, s: &str) -> Result<SessionInfo> {
        let r = self.need_session(a, s)?;
        self.session_info(a, s, &r)
    }

    /// Deletes a session with its `current/` and all its checkpoints.
    /// Refuses (`conflict`) to delete a session that holds pinned
    /// checkpoints, naming them, unless `force`.
    pub fn session_delete_allowed(&self, a: &str, s: &str, force: bool) -> Result<()> {
        self.need_session(a, s)?;
        if force {
            return Ok(());
        }
        let pinned: Vec<String> = self
            .index
            .checkpoints(a, s)?
            .into_iter()
            .filter(|(_, c)| c.pinned)
            .map(|(id, _)| id)
            .collect();
        if pinned.is_empty() {
            return Ok(());
        }
        Err(StoreError::SessionHasPinned {
            agent: a.into(),
            session: s.into(),
            pinned,
        })
    }

    /// Deletes a session unless [`Store::session_delete_allowed`] refuses.
    pub fn session_delete_guarded(&self, a: &str, s: &str, force: bool) -> Result<Deleted> {
        // After any turn.begin or turn.end under way (which take the turn
        // lock first): none writes a turn of a session deleted under it.
        let _t = self.turn_lock.lock().unwrap_or_else(|p| p.into_inner());
        let _g = self.guard();
        self.session_delete_allowed(a, s, force)?;
        self.session_delete_locked(a, s)
    }

    /// Deletes a session, whatever it holds.
    pub fn session_delete(&self, a: &str, s: &str) -> Result<Deleted> {
        // After any turn.begin or turn.end under way (which take the turn
        // lock first): none writes a turn of a session deleted under it.
        let _t = self.turn_lock.lock().unwrap_or_else(|p| p.into_inner());
        let _g = self.guard();
        self.session_delete_locked(a, s)
    }

    fn session_delete_locked(&self, a: &str, s: &str) -> Result<Deleted> {
        self.need_session(a, s)?;
        // Removals still running inside this tree would race the rename.
        let dir = self.layout.session_dir(a, s);
        self.reaper.wait_under(&dir);
        let subvolume = btrfs::subvolume_id(&self.layout.current(a, s))?;
        let op = Op::SessionDelete {
            agent: a.into(),
            session: s.into(),
            subvolume,
        };
        self.delete_committed(
            op,
            &dir,
            &self.layout.sessions_dir(a),
            ["session_delete.after_commit", "session_delete.after_rename"],
        )?;
        Ok(Deleted {
            deleted: format!("{a}/{s}"),
        })
    }
}

/// Whether two snapshots of one tree, made in different transaction
/// commits, hold the same tree: the store's diff, which reads only the
/// tree blocks written since the earlier one (none but the later root's
/// when nothing was written in between). A diff that fails (a tree past
/// the diff's limits) says no.
fn same_tree(a: &std::path::Path, b: &std::path::Path) -> bool {
    use crate::diff::{compare, DiffMethod, Limits};
    let limits = Limits {
        changes: 1,
        ..Limits::default()
    };
    compare(a, b, DiffMethod::Btrfs, &limits, false).is_ok_and(|d| d.counts.iter().all(|&n| n == 0))
}

/// At most ten names, then how many more.
pub(crate) fn shown_list(names: &[String]) -> String {
    let mut out = names
        .iter()
        .take(10)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > 10 {
        out.push_str(&format!(" and {} more", names.len() - 10));
    }
    out
}

impl Store {
    /// Session `a/s`'s limits over time, if it has any.
    pub fn clock(&self, a: &str, s: &str) -> Result<Option<crate::index::ClockRecord>> {
        Ok(self.index.clock(a, s)?)
    }

    /// Agent `a`'s defaults for its sessions' limits over time.
    pub fn agent_clock(&self, a: &str) -> Result<Option<crate::index::ClockRecord>> {
        Ok(self.index.agent_clock(a)?)
    }

    /// Sets agent `a`'s defaults for its new sessions' limits over time.
    pub fn set_agent_clock(&self, a: &str, r: &crate::index::ClockRecord) -> Result<()> {
        let _g = self.guard();
        self.need_agent(a)?;
        self.index.write(|w| w.put_agent_clock(a, r))?;
        Ok(())
    }

    /// Keeps session `a/s`'s own cgroup limits (none, or all unset:
    /// forgets them), durably.
    pub fn keep_limits(&self, a: &str, s: &str, r: &crate::rows::LimitsRecord) -> Result<()> {
        let _g = self.guard();
        self.need_session(a, s)?;
        let r = (*r != Default::default()).then_some(r);
        self.index.write(|w| w.put_limits(a, s, r))?;
        Ok(())
    }

    /// Every session's own cgroup limits, as `(agent, session, record)`.
    pub fn kept_limits(&self) -> Result<Vec<(String, String, crate::rows::LimitsRecord)>> {
        Ok(by_session(self.index.all_limits()?))
    }

    /// Every session with limits over time, as `(agent, session, record)`.
    pub fn clocks(&self) -> Result<Vec<(String, String, crate::index::ClockRecord)>> {
        Ok(by_session(self.index.clocks()?))
    }

    /// Writes session `a/s`'s limits over time (durably: an expiry or a
    /// new lifetime survives a power cut).
    pub fn set_clock(&self, a: &str, s: &str, r: &crate::index::ClockRecord) -> Result<()> {
        let _g = self.guard();
        self.need_session(a, s)?;
        self.index.write(|w| w.put_clock(a, s, r))?;
        Ok(())
    }

    /// Records that session `a/s`'s lifetime ended at `now`, durably, if its
    /// record is still `seen` (the one the clock judged by): answers the
    /// record written, or `None` when a `session.update` changed it
    /// meanwhile (its new lifetime is then judged again).
    pub fn expire_clock(
        &self,
        a: &str,
        s: &str,
        seen: &crate::index::ClockRecord,
        now: u64,
    ) -> Result<Option<crate::index::ClockRecord>> {
        let _g = self.guard();
        self.need_session(a, s)?;
        let out = self.index.write(|w| {
            let Some(mut r) = w.clock(a, s)? else {
                return Ok(None);
            };
            let same = r.expired_ms.is_none()
                && (r.max_lifetime_ms, r.lifetime_from_ms)
                    == (seen.max_lifetime_ms, seen.lifetime_from_ms);
            if !same {
                return Ok(None);
            }
            r.expired_ms = Some(now);
            w.put_clock(a, s, &r)?;
            Ok(Some(r))
        })?;
        Ok(out)
    }

    /// Writes the last-active times of several sessions in one commit that
    /// need not be durable by itself (lost, the idle clocks start a little
    /// earlier).
    pub fn touch_clocks(&self, seen: &[(String, String, u64)]) -> Result<()> {
        let _g = self.guard();
        self.index.write_quick(|w| {
            for (a, s, at) in seen {
                if let Some(mut r) = w.clock(a, s)? {
                    r.last_active_ms = r.last_active_ms.max(*at);
                    w.put_clock(a, s, &r)?;
                }
            }
            Ok(())
        })?;
        Ok(())
    }
}

/// Records keyed `agent/session` as `(agent, session, record)` (those
/// keyed by an agent alone left out).
fn by_session<T>(rows: Vec<(String, T)>) -> Vec<(String, String, T)> {
    rows.into_iter()
        .filter_map(|(k, r)| {
            let (a, s) = k.split_once('/')?;
            Some((a.to_string(), s.to_string(), r))
        })
        .collect()
}
