//! `agent.create`, `agent.list`, `agent.delete`.

use super::{mkdir, After, Result, Store, StoreError};
use crate::btrfs;
use crate::index::{AgentRecord, NetworkRecord};
use crate::journal::Op;
use allox_protocol::{validate_id, AgentInfo, Deleted};

impl Store {
    pub fn agent_create(&self, a: &str) -> Result<AgentInfo> {
        self.agent_create_with(a, &NetworkRecord::default())
    }

    /// An agent with its network defaults, written in the transaction
    /// that begins the creation (see [`Store::session_create_with`]).
    pub fn agent_create_with(&self, a: &str, network: &NetworkRecord) -> Result<AgentInfo> {
        validate_id("agent_id", a)?;
        let _g = self.guard();
        if self.index.agent(a)?.is_some() {
            return Err(StoreError::Exists(format!("agent {a}")));
        }
        let dir = self.layout.agent_dir(a);
        if dir.exists() {
            return Err(StoreError::OnDiskNotIndexed(dir));
        }
        let rec = AgentRecord {
            created_ms: crate::clock::now_ms(),
        };
        let build = |w: &mut crate::index::Writer<'_>| {
            w.put_network(a, network)?;
            Ok(Op::AgentCreate {
                agent: a.into(),
                created_ms: rec.created_ms,
            })
        };
        self.check_space()?;
        self.journaled(build, |op_id, op| {
            mkdir(&dir)?;
            self.crash_point("agent_create.after_mkdir");
            btrfs::create_subvolume(&self.layout.workspace(a))?;
            // A new subvolume's root is 0755.
            crate::private::keep_private_dir(&self.layout.workspace(a));
            // The agent's own, handed to the sandbox's user at its first run.
            let shared = self.layout.shared(a);
            std::fs::create_dir(&shared).map_err(|e| StoreError::io("create", &shared, e))?;
            mkdir(&self.layout.sessions_dir(a))?;
            self.crash_point("agent_create.before_commit");
            self.end(op_id, op, &After::Nothing)?;
            Ok(((), After::Nothing))
        })?;
        self.agent_info(a, &rec)
    }

    pub fn agent_list(&self) -> Result<Vec<AgentInfo>> {
        let mut out = Vec::new();
        for (a, r) in self.index.agents()? {
            out.push(self.agent_info(&a, &r)?);
        }
        out.sort_by(|x, y| (x.created_ms, &x.agent_id).cmp(&(y.created_ms, &y.agent_id)));
        Ok(out)
    }

    /// Deletes an agent with all its sessions and checkpoints (pinned ones
    /// too: pinning guards a checkpoint against `checkpoint.delete` and
    /// retention, not against deleting its owner).
    /// Refuses (`conflict`) to delete an agent that has sessions, naming
    /// them, unless `force`.
    pub fn agent_delete_allowed(&self, a: &str, force: bool) -> Result<()> {
        self.need_agent(a)?;
        if force {
            return Ok(());
        }
        let sessions: Vec<String> = self
            .index
            .sessions(a)?
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        if sessions.is_empty() {
            return Ok(());
        }
        Err(StoreError::AgentHasSessions {
            agent: a.into(),
            sessions,
        })
    }

    /// Deletes an agent unless [`Store::agent_delete_allowed`] refuses.
    pub fn agent_delete_guarded(&self, a: &str, force: bool) -> Result<Deleted> {
        // After any turn.begin or turn.end under way (which take the turn
        // lock first): none writes a turn of a session deleted under it.
        let _t = self.turn_lock.lock().unwrap_or_else(|p| p.into_inner());
        let _g = self.guard();
        self.agent_delete_allowed(a, force)?;
        self.agent_delete_locked(a)
    }

    /// Deletes an agent, whatever it holds.
    pub fn agent_delete(&self, a: &str) -> Result<Deleted> {
        // After any turn.begin or turn.end under way (which take the turn
        // lock first): none writes a turn of a session deleted under it.
        let _t = self.turn_lock.lock().unwrap_or_else(|p| p.into_inner());
        let _g = self.guard();
        self.agent_delete_locked(a)
    }

    fn agent_delete_locked(&self, a: &str) -> Result<Deleted> {
        self.need_agent(a)?;
        // Removals still running inside this tree would race the rename.
        let dir = self.layout.agent_dir(a);
        self.reaper.wait_under(&dir);
        let subvolume = btrfs::subvolume_id(&self.layout.workspace(a))?;
        let op = Op::AgentDelete {
            agent: a.into(),
            subvolume,
        };
        self.delete_committed(
            op,
            &dir,
            &self.layout.agents_dir(),
            ["agent_delete.after_commit", "agent_delete.after_rename"],
        )?;
        Ok(Deleted {
            deleted: a.to_string(),
        })
    }
}
