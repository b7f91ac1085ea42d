//! `session.export` (an archive streamed as events) and `session.import`
//! (an archive received in pieces, each import under an id its client
//! chose): the store does the work ([`allox_store::Import`]); this keeps
//! the imports under way, their budget and their idle limit.

use crate::error::RequestError;
use crate::plugin_api::EventSink;
use allox_protocol::{
    validate_id, ArchiveChunk, Bytes, ErrorCode, Event, SessionExport, SessionExported,
    SessionImport, SessionImported,
};
use allox_store::{Import, Imported, Store};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most imports under way at once.
pub const MAX_IMPORTS: usize = 4;
/// An import without a piece for this long is dropped.
pub const IMPORT_IDLE: Duration = Duration::from_secs(300);
/// An import without a piece for this long, whose last piece's client has
/// gone (killed outright, it could not abort it), is dropped: it held one
/// of the few import slots for five idle minutes.
pub const ORPHAN_IDLE: Duration = Duration::from_secs(10);
/// The bytes of one export event.
const CHUNK: usize = 512 * 1024;

/// What one piece of an import did.
pub struct Piece {
    pub answer: SessionImported,
    /// For a session an archive made whole: the limits it carries.
    pub limits: Option<allox_sandbox::cgroup::Limits>,
}

impl Piece {
    fn plain(answer: SessionImported) -> Piece {
        Piece {
            answer,
            limits: None,
        }
    }
}

struct Under {
    agent: String,
    session: Option<String>,
    import: Import,
    last: Instant,
    /// Whether the client of its last piece has gone.
    client_gone: Option<crate::passed::Gone>,
}

impl Under {
    fn idle(&self) -> bool {
        let gone = self
            .client_gone
            .as_ref()
            .is_some_and(|g| g.load(std::sync::atomic::Ordering::SeqCst));
        self.last.elapsed() >= IMPORT_IDLE || (gone && self.last.elapsed() >= ORPHAN_IDLE)
    }
}

/// The imports under way.
#[derive(Default)]
pub struct Imports {
    table: Mutex<HashMap<String, Arc<Mutex<Under>>>>,
}

fn refused(code: ErrorCode, why: String) -> RequestError {
    RequestError::Transfer { code, why }
}

/// Runs an import's commit that changes an existing session `(agent,
/// session)` (an archive made `since` a checkpoint) while its runs are
/// kept out.
pub type Fence<'a> = dyn Fn(
        &str,
        &str,
        &mut dyn FnMut() -> Result<Imported, RequestError>,
    ) -> Result<Imported, RequestError>
    + 'a;

/// The answer to an import's abort.
fn aborted(import_id: String) -> Piece {
    Piece::plain(SessionImported {
        import_id,
        received: 0,
        session: None,
        checkpoints: 0,
        privileges_dropped: 0,
    })
}

impl Imports {
    /// One piece of an import.
    pub fn piece(
        &self,
        store: &Arc<Store>,
        r: &SessionImport,
        fence: &Fence<'_>,
        serves: impl FnOnce() -> Box<allox_store::NetworkCheck>,
        clock_default: Option<allox_store::index::ClockRecord>,
    ) -> Result<Piece, RequestError> {
        validate_id("import_id", &r.import_id).map_err(allox_store::StoreError::from)?;
        let id = r.import_id.clone();
        self.drop_idle();
        let entry = {
            let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
            match t.get(&id) {
                Some(e) => e.clone(),
                None if r.abort => {
                    return Err(refused(ErrorCode::NotFound, format!("no import {id} is under way")))
                }
                None if r.offset != 0 => {
                    return Err(refused(
                        ErrorCode::NotFound,
                        format!(
                            "no import {id} is under way (it ended, failed, or was idle for {} s): begin it again at offset 0",
                            IMPORT_IDLE.as_secs()
                        ),
                    ))
                }
                None => {
                    if t.len() >= MAX_IMPORTS {
                        return Err(refused(
                            ErrorCode::Unavailable,
                            format!(
                                "{MAX_IMPORTS} imports are under way; finish or abort one first (one idle {} s is dropped)",
                                IMPORT_IDLE.as_secs()
                            ),
                        ));
                    }
                    let import = store
                        .import_begin(&r.agent_id, r.session_id.as_deref())?
                        .serving(serves())
                        .with_clock_default(clock_default);
                    let e = Arc::new(Mutex::new(Under {
                        agent: r.agent_id.clone(),
                        session: r.session_id.clone(),
                        import,
                        last: Instant::now(),
                        client_gone: crate::passed::current_gone(),
                    }));
                    t.insert(id.clone(), e.clone());
                    e
                }
            }
        };
        let drop_it = || {
            self.table
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        };
        let Ok(mut u) = entry.try_lock() else {
            if r.abort {
                // Dropped now, whatever piece is being written (an
                // interrupted client's own abort comes while its last
                // piece is in flight): the import goes with that piece.
                drop_it();
                return Ok(aborted(id));
            }
            return Err(refused(
                ErrorCode::Conflict,
                format!(
                    "a piece of import {id} is being written; send the pieces one after another"
                ),
            ));
        };
        if r.abort {
            drop(u);
            drop_it();
            return Ok(aborted(id));
        }
        if u.agent != r.agent_id || u.session != r.session_id {
            return Err(refused(
                ErrorCode::InvalidRequest,
                format!(
                    "import {id} was begun for {}/{}",
                    u.agent,
                    u.session.as_deref().unwrap_or("-")
                ),
            ));
        }
        if r.offset != u.import.read() {
            return Err(refused(
                ErrorCode::InvalidRequest,
                format!(
                    "a piece at offset {} of import {id}, which has {} bytes: send the piece at {}",
                    r.offset,
                    u.import.read(),
                    u.import.read()
                ),
            ));
        }
        u.last = Instant::now();
        u.client_gone = crate::passed::current_gone();
        if let Err(e) = u.import.push(&r.data.0) {
            drop(u);
            drop_it();
            return Err(e.into());
        }
        let received = u.import.read();
        if !r.commit {
            return Ok(Piece::plain(SessionImported {
                import_id: id,
                received,
                session: None,
                checkpoints: 0,
                privileges_dropped: 0,
            }));
        }
        drop(u);
        drop_it();
        let under = Arc::try_unwrap(entry)
            .map_err(|_| {
                refused(
                    ErrorCode::Conflict,
                    format!("import {id} is still being written"),
                )
            })?
            .into_inner()
            .unwrap_or_else(|p| p.into_inner());
        let changes = under.import.changes();
        let mut once = Some(under.import);
        let mut commit = || {
            once.take()
                .ok_or_else(|| {
                    refused(ErrorCode::Internal, "the import was committed twice".into())
                })?
                .commit()
                .map_err(RequestError::from)
        };
        let done = match &changes {
            Some((a, s)) => fence(a, s, &mut commit)?,
            None => commit()?,
        };
        if done.privileges_dropped > 0 {
            tracing::warn!(
                import = %id,
                agent = %done.session.agent_id,
                session = %done.session.session_id,
                dropped = done.privileges_dropped,
                "the archive's setuid and setgid bits and privileged attributes were dropped on import"
            );
        }
        Ok(Piece {
            // An archive that adds to a session leaves its limits there
            // as they are.
            limits: changes.is_none().then(|| carried(&done.limits)),
            answer: SessionImported {
                import_id: id,
                received,
                session: Some(Box::new(done.session)),
                checkpoints: done.checkpoints as u32,
                privileges_dropped: done.privileges_dropped,
            },
        })
    }

    /// Drops the imports idle for [`IMPORT_IDLE`] (their staging trees
    /// go with them); at each piece and each tick of the clocks.
    pub fn drop_idle(&self) {
        let idle: Vec<_> = {
            let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
            let ids: Vec<String> = t
                .iter()
                .filter(|(_, u)| u.try_lock().map(|u| u.idle()).unwrap_or(false))
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter().filter_map(|id| t.remove(&id)).collect()
        };
        // Removed outside the table's lock: a staging tree takes a while.
        drop(idle);
    }

    /// How many imports are under way.
    pub fn len(&self) -> usize {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A session's limits as an archive carries them.
fn archived(l: &allox_sandbox::cgroup::Limits) -> allox_store::archive::Limits {
    allox_store::archive::Limits {
        pids_max: l.pids_max,
        memory_max: l.memory_max,
        cpu_max: l.cpu_max,
    }
}

/// The limits an archive carries, to apply to the session it made.
pub fn carried(l: &allox_store::archive::Limits) -> allox_sandbox::cgroup::Limits {
    // An archive's limits are another daemon's word: one this daemon
    // would refuse is left out (the daemon's own default holds), and said.
    let mut kept = allox_sandbox::cgroup::Limits {
        pids_max: l.pids_max,
        memory_max: l.memory_max,
        cpu_max: l.cpu_max,
    };
    while let Some(why) = kept.refused() {
        tracing::warn!(%why, "an imported session's limit is refused; the daemon's default holds");
        if why.starts_with("pids_max") {
            kept.pids_max = None;
        } else {
            kept.memory_max = None;
        }
    }
    kept
}

/// Sends what is written to it as [`Event::Archive`] events.
struct Events {
    sink: EventSink,
    buf: Vec<u8>,
}

impl Events {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let data = Bytes(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.sink
            .blocking_send(Event::Archive(ArchiveChunk { data }))
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")
            })
    }
}

impl std::io::Write for Events {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = b.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&b[..n]);
        if self.buf.len() == CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// `session.export`: the archive as events on `sink` (on a blocking
/// thread: it waits for `btrfs send` and for the client).
pub async fn export(
    store: Arc<Store>,
    r: SessionExport,
    limits: allox_sandbox::cgroup::Limits,
    sink: Option<EventSink>,
) -> Result<SessionExported, RequestError> {
    let Some(sink) = sink else {
        return Err(refused(
            ErrorCode::InvalidRequest,
            "session.export streams its archive as events: ask for it on a connection that takes them".into(),
        ));
    };
    tokio::task::spawn_blocking(move || {
        let mut out = Events {
            sink,
            buf: Vec::with_capacity(CHUNK),
        };
        let limits = archived(&limits);
        let done = store.session_export(
            &r.agent_id,
            &r.session_id,
            r.since.as_deref(),
            &limits,
            &mut out,
        )?;
        Ok(SessionExported {
            agent_id: r.agent_id,
            session_id: r.session_id,
            bytes: done.bytes,
            checkpoints: done.checkpoints as u32,
        })
    })
    .await
    .map_err(|e| refused(ErrorCode::Internal, format!("session.export failed: {e}")))?
}
