//! The network audit: one JSON line per connection attempt in
//! `state/network-audit.log` (outside every workspace: no rollback touches
//! it), numbered from 1; `network.audit` pages through it or follows it.

use crate::error::RequestError;
use crate::plugins::RouteContext;
use allox_protocol::{NetworkAudit, NetworkAuditListing, NetworkAuditRecord, Response};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

pub(super) struct AuditLog {
    path: PathBuf,
    file: Mutex<std::fs::File>,
    /// The newest record's number, for followers to wait on.
    newest: tokio::sync::watch::Sender<u64>,
}

impl AuditLog {
    /// Opens (or makes) the log; its records so far are counted.
    pub fn open(path: &Path) -> std::io::Result<AuditLog> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)?;
        let mut newest = 0;
        for line in std::io::BufReader::new(std::fs::File::open(path)?).lines() {
            if let Ok(r) = serde_json::from_str::<NetworkAuditRecord>(&line?) {
                newest = newest.max(r.seq);
            }
        }
        Ok(AuditLog {
            path: path.to_path_buf(),
            file: Mutex::new(file),
            newest: tokio::sync::watch::channel(newest).0,
        })
    }

    /// Numbers and appends one record.
    pub fn append(&self, mut r: NetworkAuditRecord) {
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        r.seq = *self.newest.borrow() + 1;
        let Ok(line) = serde_json::to_string(&r) else {
            return;
        };
        match writeln!(f, "{line}") {
            Ok(()) => {
                self.newest.send_replace(r.seq);
            }
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "cannot append to the network audit")
            }
        }
    }

    /// The records after `q.cursor` that match `q`, oldest first, at most
    /// `q.limit`.
    pub fn query(&self, q: &NetworkAudit) -> std::io::Result<NetworkAuditListing> {
        let limit = q.limit.unwrap_or(1000).clamp(1, 10_000) as usize;
        let after = q.cursor.unwrap_or(0);
        let mut records = Vec::new();
        let mut next_cursor = after;
        let newest = *self.newest.borrow();
        for line in std::io::BufReader::new(std::fs::File::open(&self.path)?).lines() {
            let Ok(r) = serde_json::from_str::<NetworkAuditRecord>(&line?) else {
                continue;
            };
            if r.seq <= after || r.seq > newest {
                continue;
            }
            if records.len() == limit {
                break;
            }
            next_cursor = r.seq;
            let matches = q.agent_id.as_ref().is_none_or(|a| *a == r.agent_id)
                && q.session_id.as_ref().is_none_or(|s| *s == r.session_id);
            if matches {
                records.push(r);
            }
        }
        Ok(NetworkAuditListing {
            records,
            next_cursor,
        })
    }

    /// Waits until a record newer than `seq` exists, or `timeout` passes.
    async fn wait_newer(&self, seq: u64, timeout: Duration) {
        let mut rx = self.newest.subscribe();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|n| *n > seq)).await;
    }
}

/// `network.audit`: a page, or with `follow` the backlog and then new
/// records as stream events until the subscriber goes.
pub(super) async fn serve(
    log: &AuditLog,
    q: &NetworkAudit,
    ctx: RouteContext<'_>,
) -> Result<Response, RequestError> {
    if let Some(a) = &q.agent_id {
        match &q.session_id {
            Some(s) => drop(ctx.store.session_info_of(a, s)?),
            None => drop(ctx.store.session_list(a)?),
        }
    }
    let io = |e: std::io::Error| {
        RequestError::from(crate::plugins::PluginError::Run {
            plugin: super::NAME,
            source: Box::new(e),
        })
    };
    if !q.follow {
        return Ok(Response::NetworkAudit(log.query(q).map_err(io)?));
    }
    let Some(sink) = ctx.events else {
        return Err(RequestError::FollowNeedsStream);
    };
    let mut cursor = q.cursor;
    loop {
        let page = log
            .query(&NetworkAudit {
                cursor,
                follow: false,
                ..q.clone()
            })
            .map_err(io)?;
        for r in page.records {
            if sink.send(allox_protocol::Event::Network(r)).await.is_err() {
                return Err(RequestError::SubscriberGone);
            }
        }
        cursor = Some(page.next_cursor);
        if sink.is_closed() {
            return Err(RequestError::SubscriberGone);
        }
        log.wait_newer(page.next_cursor, Duration::from_secs(1))
            .await;
    }
}
