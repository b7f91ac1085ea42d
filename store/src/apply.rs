//! The index effect of each operation, written once and used both by the
//! operation's End commit and by recovery when it finishes an operation
//! whose End commit was lost. Each is idempotent.

use crate::index::{AgentRecord, IndexError, SessionRecord, Writer};
use crate::journal::Op;
use allox_protocol::TurnStatus;

pub fn apply(w: &mut Writer<'_>, op: &Op) -> Result<(), IndexError> {
    match op {
        Op::AgentCreate { agent, created_ms } => w.put_agent(
            agent,
            &AgentRecord {
                created_ms: *created_ms,
            },
        ),
        Op::AgentDelete { agent, .. } => w.remove_agent(agent),
        Op::SessionCreate {
            agent,
            session,
            created_ms,
        } => w.put_session(
            agent,
            session,
            &SessionRecord {
                created_ms: *created_ms,
                head: None,
            },
        ),
        Op::SessionDelete { agent, session, .. } => w.remove_session(agent, session),
        Op::CheckpointCreate {
            agent,
            session,
            checkpoint,
            record,
        } => {
            w.put_checkpoint(agent, session, checkpoint, record)?;
            // A turn's automatic checkpoint ends the turn in this commit.
            if let Some(t) = &record.turn_id {
                if let Some(mut turn) = w.turn(agent, session, t)? {
                    if turn.ended_ms.is_none() {
                        turn.ended_ms = Some(record.created_ms);
                        turn.status = Some(TurnStatus::Ok);
                        turn.checkpoint_id = Some(checkpoint.clone());
                        w.put_turn(agent, session, t, &turn)?;
                    }
                }
            }
            set_head(w, agent, session, Some(checkpoint.clone()))
        }
        Op::CheckpointDelete {
            agent,
            session,
            checkpoint,
            ..
        } => {
            let Some(gone) = w.checkpoint(agent, session, checkpoint)? else {
                return Ok(());
            };
            // Children take the deleted checkpoint's parent, and so does the
            // head, so the DAG stays connected.
            for (child, mut r) in w.checkpoints(agent, session)? {
                if r.parent.as_deref() == Some(checkpoint.as_str()) {
                    r.parent = gone.parent.clone();
                    w.put_checkpoint(agent, session, &child, &r)?;
                }
            }
            if let Some(sess) = w.session(agent, session)? {
                if sess.head.as_deref() == Some(checkpoint.as_str()) {
                    set_head(w, agent, session, gone.parent.clone())?;
                }
            }
            w.remove_checkpoint(agent, session, checkpoint)
        }
        Op::Rollback {
            agent,
            session,
            checkpoint,
            ..
        } => set_head(w, agent, session, Some(checkpoint.clone())),
        Op::SessionFork {
            agent,
            session,
            created_ms,
            record,
            from,
        } => {
            w.put_session(
                agent,
                session,
                &SessionRecord {
                    created_ms: *created_ms,
                    head: Some(from.baseline.clone()),
                },
            )?;
            w.put_checkpoint(agent, session, &from.baseline, record)?;
            w.put_fork(agent, session, from)
        }
        Op::SessionImport {
            agent,
            session,
            created_ms,
            head,
            checkpoints,
            turns,
            fork,
            ..
        } => {
            w.put_session(
                agent,
                session,
                &SessionRecord {
                    created_ms: *created_ms,
                    head: head.clone(),
                },
            )?;
            put_history(w, agent, session, checkpoints, turns)?;
            match fork {
                Some(f) => w.put_fork(agent, session, f),
                None => Ok(()),
            }
        }
        Op::SessionImportSince {
            agent,
            session,
            head,
            checkpoints,
            turns,
            ..
        } => {
            put_history(w, agent, session, checkpoints, turns)?;
            set_head(w, agent, session, head.clone())
        }
    }
}

/// An imported session's checkpoints and turns.
fn put_history(
    w: &mut Writer<'_>,
    agent: &str,
    session: &str,
    checkpoints: &[(String, crate::rows::CheckpointRecord)],
    turns: &[(String, crate::rows::TurnRecord)],
) -> Result<(), IndexError> {
    for (c, r) in checkpoints {
        w.put_checkpoint(agent, session, c, r)?;
    }
    for (t, r) in turns {
        w.put_turn(agent, session, t, r)?;
    }
    Ok(())
}

fn set_head(
    w: &mut Writer<'_>,
    agent: &str,
    session: &str,
    head: Option<String>,
) -> Result<(), IndexError> {
    if let Some(mut sess) = w.session(agent, session)? {
        sess.head = head;
        w.put_session(agent, session, &sess)?;
    }
    Ok(())
}
