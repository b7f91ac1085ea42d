//! From a decoded request to a response: calls the store and writes the
//! audit record of every mutating request.

use crate::audit::Entry;
use crate::store::{Store, StoreError};
use allox_protocol::{
    AgentListing, ErrorBody, Pong, Request, Response, SessionListing, SessionRollback,
    PROTOCOL_VERSION,
};

/// Daemon-wide request policy.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// `--kill-session-processes-on-rollback`: the default of a rollback's
    /// `kill_processes`.
    pub kill_processes_on_rollback: bool,
}

pub struct Supervisor {
    pub store: Store,
    pub policy: Policy,
}

impl Supervisor {
    pub fn new(store: Store, policy: Policy) -> Self {
        Supervisor { store, policy }
    }

    /// Answers one request from `peer` and audits it if it changes state.
    pub fn handle(
        &self,
        peer: &str,
        request_id: u64,
        req: &Request,
    ) -> Result<Response, ErrorBody> {
        let out = self.answer(req).map_err(|e| {
            if matches!(e.code(), allox_protocol::ErrorCode::Internal) {
                tracing::error!(error = %e.chain(), action = req.action(), "request failed");
            }
            e.to_body()
        });
        if req.is_mutating() {
            let entry = Entry {
                request_id,
                peer: peer.to_string(),
                action: req.action().to_string(),
                target: req.target(),
                outcome: match &out {
                    Ok(_) => "ok".to_string(),
                    Err(e) => e.code.as_str().to_string(),
                },
                message: out.as_ref().err().map(|e| e.message.clone()),
            };
            if let Err(e) = self.store.audit().append(entry) {
                tracing::error!(error = %e, "cannot append audit record");
            }
        }
        out
    }

    fn answer(&self, req: &Request) -> Result<Response, StoreError> {
        let st = &self.store;
        Ok(match req {
            Request::Ping(_) => Response::Pong(Pong {
                version: PROTOCOL_VERSION,
                build: allox_protocol::build_identity(),
            }),
            Request::AgentCreate(r) => Response::Agent(st.agent_create(&r.agent_id)?),
            Request::AgentList(_) => Response::Agents(AgentListing {
                agents: st.agent_list()?,
            }),
            Request::AgentDelete(r) => Response::Deleted(st.agent_delete(&r.agent_id)?),
            Request::SessionCreate(r) => {
                Response::Session(st.session_create(&r.agent_id, &r.session_id)?)
            }
            Request::SessionList(r) => Response::Sessions(SessionListing {
                agent_id: r.agent_id.clone(),
                sessions: st.session_list(&r.agent_id)?,
            }),
            Request::SessionDelete(r) => {
                Response::Deleted(st.session_delete(&r.agent_id, &r.session_id)?)
            }
            Request::CheckpointCreate(r) => Response::Checkpoint(st.checkpoint_create(r)?),
            Request::CheckpointList(r) => {
                Response::Checkpoints(st.checkpoint_list(&r.agent_id, &r.session_id)?)
            }
            Request::CheckpointDelete(r) => Response::Deleted(st.checkpoint_delete(
                &r.agent_id,
                &r.session_id,
                &r.checkpoint_id,
            )?),
            Request::CheckpointPin(r) => Response::Checkpoint(st.checkpoint_pin(
                &r.agent_id,
                &r.session_id,
                &r.checkpoint_id,
                r.pinned,
            )?),
            Request::SessionRollback(r) => {
                let r = SessionRollback {
                    kill_processes: Some(
                        r.kill_processes
                            .unwrap_or(self.policy.kill_processes_on_rollback),
                    ),
                    ..r.clone()
                };
                Response::RolledBack(st.rollback(&r)?)
            }
            Request::ProcessStart(_)
            | Request::ProcessWait(_)
            | Request::ProcessKill(_)
            | Request::ProcessList(_)
            | Request::ProcessStdin(_) => {
                return Err(StoreError::Unsupported(
                    "process actions are not built into this supervisor yet".into(),
                ))
            }
            Request::AuditList(r) => {
                let limit = r.limit.unwrap_or(100).clamp(1, 10_000) as usize;
                Response::Audit(st.audit().read(r.after_seq.unwrap_or(0), limit)?)
            }
        })
    }
}
