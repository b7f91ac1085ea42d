//! Turns and the automatic-checkpoint policy.
//!
//! With `auto_checkpoint` on (per agent as the default of its sessions, per
//! session as an override), a session gets a `baseline` checkpoint when it
//! is created and a `turn-<n>` checkpoint after every turn that ends `ok`;
//! `keep_last` bounds how many turn checkpoints are kept (pinned and
//! manual ones are never collected). Every automatic checkpoint and every
//! collection is an ordinary journaled checkpoint operation.

use super::{Result, Store, StoreError, MAX_LABEL};
use crate::index::{session_key, PolicyRecord, TurnRecord};
use allox_protocol::{
    validate_id, CheckpointCreate, Origin, PolicyInfo, PolicySet, TurnBegin, TurnEnd, TurnInfo,
    TurnStatus,
};

fn turn_info(a: &str, s: &str, t: &str, r: &TurnRecord) -> TurnInfo {
    TurnInfo {
        agent_id: a.to_string(),
        session_id: s.to_string(),
        turn_id: t.to_string(),
        number: r.number,
        began_ms: r.began_ms,
        ended_ms: r.ended_ms,
        status: r.status,
        checkpoint_id: r.checkpoint_id.clone(),
        checkpoint_error: r.checkpoint_error.clone(),
    }
}

/// The one rule of a `keep_last` given: at least 1 (an agent's, a
/// session's, at creation or set later).
pub fn check_keep_last(keep_last: Option<u32>) -> Result<()> {
    match keep_last {
        Some(0) => Err(StoreError::KeepLastZero),
        _ => Ok(()),
    }
}

impl Store {
    /// The policy in force for a session (or for an agent's new sessions).
    pub fn effective_policy(&self, a: &str, s: Option<&str>) -> Result<(bool, Option<u32>)> {
        let agent = self.index.policy(a)?.unwrap_or_default();
        let sess = match s {
            Some(s) => self.index.policy(&session_key(a, s))?.unwrap_or_default(),
            None => PolicyRecord::default(),
        };
        Ok((
            sess.auto_checkpoint
                .or(agent.auto_checkpoint)
                .unwrap_or(false),
            sess.keep_last.or(agent.keep_last),
        ))
    }

    pub fn policy_set(&self, p: &PolicySet) -> Result<PolicyInfo> {
        let a = p.agent_id.as_str();
        let key = self.level_key(a, p.session_id.as_deref())?;
        check_keep_last(p.keep_last)?;
        let _g = self.guard();
        let mut rec = self.index.policy(&key)?.unwrap_or_default();
        if p.auto_checkpoint.is_some() {
            rec.auto_checkpoint = p.auto_checkpoint;
        }
        if p.keep_last.is_some() {
            rec.keep_last = p.keep_last;
        }
        self.index.write(|w| w.put_policy(&key, &rec))?;
        drop(_g);
        let (auto_checkpoint, keep_last) = self.effective_policy(a, p.session_id.as_deref())?;
        Ok(PolicyInfo {
            agent_id: a.to_string(),
            session_id: p.session_id.clone(),
            auto_checkpoint,
            keep_last,
        })
    }

    /// Takes the session-start checkpoint if the policy says so.
    pub fn baseline_if_on(&self, a: &str, s: &str) -> Result<Option<String>> {
        if !self.effective_policy(a, Some(s))?.0 {
            return Ok(None);
        }
        let c = self.checkpoint_create_as(
            &CheckpointCreate {
                agent_id: a.into(),
                session_id: s.into(),
                checkpoint_id: "baseline".into(),
                pinned: false,
                label: Some("session start".into()),
            },
            Origin::Baseline,
            None,
        )?;
        Ok(Some(c.checkpoint_id))
    }

    pub fn turn_begin(&self, p: &TurnBegin) -> Result<TurnInfo> {
        let (a, s) = (p.agent_id.as_str(), p.session_id.as_str());
        let asked = self.need_session(a, s)?;
        if let Some(t) = &p.turn_id {
            validate_id("turn_id", t)?;
        }
        self.crash_point("turn_begin.before_lock");
        let _t = self.turn_lock.lock().unwrap_or_else(|p| p.into_inner());
        let _g = self.guard();
        self.still_the_session(a, s, &asked)?;
        let turns = self.index.turns(a, s)?;
        if let Some((open, _)) = turns.iter().find(|(_, r)| r.ended_ms.is_none()) {
            return Err(StoreError::TurnOpen {
                agent: a.into(),
                session: s.into(),
                turn: open.clone(),
            });
        }
        let number = turns.last().map(|(_, r)| r.number).unwrap_or(0) + 1;
        let taken = |id: &str| turns.iter().any(|(t, _)| t == id);
        // The default id is `turn-N`, or, where a turn was given that id
        // by hand, `turn-N-2`, `turn-N-3`, ...: never one in use.
        let t = p.turn_id.clone().unwrap_or_else(|| {
            let plain = format!("turn-{number}");
            (1..)
                .map(|k| match k {
                    1 => plain.clone(),
                    k => format!("{plain}-{k}"),
                })
                .find(|id| !taken(id))
                .unwrap_or(plain)
        });
        if taken(&t) {
            return Err(StoreError::Exists(format!("turn {a}/{s}/{t}")));
        }
        let rec = TurnRecord {
            number,
            began_ms: crate::clock::now_ms(),
            ended_ms: None,
            status: None,
            checkpoint_id: None,
            checkpoint_error: None,
        };
        // The oldest ended turns beyond what a session keeps go in the
        // same transaction (none is open: a begin is refused then).
        let keep = self.opts.turns_kept.max(1);
        let gone = (turns.len() + 1).saturating_sub(keep);
        self.index.write(|w| {
            for (old, _) in &turns[..gone] {
                w.remove_turn(a, s, old)?;
            }
            w.put_turn(a, s, &t, &rec)
        })?;
        Ok(turn_info(a, s, &t, &rec))
    }

    /// Refuses a turn's change when session `a/s` is no longer the one the
    /// request found (deleted, or deleted and made again, meanwhile: a
    /// request of a run the delete killed wrote a turn for a session that
    /// no longer existed, which the next one of its name then had). Called
    /// under the turn lock, which deletes take too.
    fn still_the_session(
        &self,
        a: &str,
        s: &str,
        asked: &crate::index::SessionRecord,
    ) -> Result<()> {
        match self.index.session(a, s)? {
            Some(now) if now.created_ms == asked.created_ms => Ok(()),
            _ => Err(StoreError::NotFound(format!(
                "session {a}/{s} (deleted while the request was under way)"
            ))),
        }
    }

    /// The session's turn that has begun and not ended, if any (a session
    /// has at most one).
    pub fn open_turn(&self, a: &str, s: &str) -> Result<Option<String>> {
        self.need_session(a, s)?;
        Ok(self
            .index
            .turns(a, s)?
            .into_iter()
            .find(|(_, r)| r.ended_ms.is_none())
            .map(|(t, _)| t))
    }

    pub fn turn_end(&self, p: &TurnEnd) -> Result<TurnInfo> {
        let (a, s) = (p.agent_id.as_str(), p.session_id.as_str());
        let asked = self.need_session(a, s)?;
        // No turn named: the session's open turn.
        let open;
        let t = if p.turn_id.is_empty() {
            open = self
                .open_turn(a, s)?
                .ok_or_else(|| StoreError::NoOpenTurn {
                    agent: a.into(),
                    session: s.into(),
                })?;
            open.as_str()
        } else {
            p.turn_id.as_str()
        };
        validate_id("turn_id", t)?;
        if let Some(l) = &p.label {
            if l.len() > MAX_LABEL || l.chars().any(char::is_control) {
                return Err(StoreError::BadLabel);
            }
        }
        let (auto, keep_last) = self.effective_policy(a, Some(s))?;
        let checkpointing = auto && p.status == TurnStatus::Ok;
        // One turn.end at a time; the checkpoint below takes the store
        // lock inside this one, never the other way round.
        let _t = self.turn_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.still_the_session(a, s, &asked)?;
        let mut rec = self
            .index
            .turn(a, s, t)?
            .ok_or_else(|| StoreError::NotFound(format!("turn {a}/{s}/{t}")))?;
        if rec.ended_ms.is_some() {
            return Err(StoreError::TurnEnded {
                agent: a.into(),
                session: s.into(),
                turn: t.into(),
            });
        }
        let mut failed = None;
        if checkpointing {
            // The checkpoint's journaled operation ends the turn in the
            // same commit that records the checkpoint (see `apply`): after
            // a crash the turn has ended with its checkpoint, or not at all.
            match self.turn_checkpoint(a, s, t, &rec, p.label.clone()) {
                Ok(_) => {
                    rec = self
                        .index
                        .turn(a, s, t)?
                        .ok_or_else(|| StoreError::NotFound(format!("turn {a}/{s}/{t}")))?
                }
                Err(e) => failed = Some(e.chain()),
            }
        }
        if rec.ended_ms.is_none() {
            rec.ended_ms = Some(crate::clock::now_ms());
            rec.status = Some(p.status);
            rec.checkpoint_error = failed;
            // Durable before the answer.
            let _g = self.guard();
            self.index.write(|w| w.put_turn(a, s, t, &rec))?;
        }
        if let (true, Some(n)) = (checkpointing, keep_last) {
            if let Err(e) = self.collect_turn_checkpoints(a, s, n as usize) {
                let msg = format!("retention: {}", e.chain());
                rec.checkpoint_error = Some(match rec.checkpoint_error.take() {
                    Some(prev) => format!("{prev}; {msg}"),
                    None => msg,
                });
                let _g = self.guard();
                self.index.write(|w| w.put_turn(a, s, t, &rec))?;
            }
        }
        Ok(turn_info(a, s, t, &rec))
    }

    fn turn_checkpoint(
        &self,
        a: &str,
        s: &str,
        t: &str,
        turn: &TurnRecord,
        label: Option<String>,
    ) -> Result<String> {
        let mut id = format!("turn-{}", turn.number);
        if self.index.checkpoint(a, s, &id)?.is_some() {
            id = format!("turn-{}-{}", turn.number, crate::clock::now_ms());
        }
        let label = label.unwrap_or_else(|| format!("turn {}", turn.number));
        let c = self.checkpoint_create_as(
            &CheckpointCreate {
                agent_id: a.into(),
                session_id: s.into(),
                checkpoint_id: id,
                pinned: false,
                label: Some(label),
            },
            Origin::Turn,
            Some(t.to_string()),
        )?;
        Ok(c.checkpoint_id)
    }

    /// Deletes the oldest unpinned turn checkpoints beyond the last `keep`.
    fn collect_turn_checkpoints(&self, a: &str, s: &str, keep: usize) -> Result<()> {
        let turns: Vec<String> = self
            .index
            .checkpoints(a, s)?
            .into_iter()
            .filter(|(_, r)| r.origin == Origin::Turn && !r.pinned)
            .map(|(c, _)| c)
            .collect();
        let extra = turns.len().saturating_sub(keep);
        for c in &turns[..extra] {
            self.checkpoint_delete(a, s, c)?;
        }
        Ok(())
    }
}
