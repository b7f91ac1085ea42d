//! The network audit: one JSON line per connection attempt in
//! `state/network-audit.log` (outside every workspace: no rollback touches
//! it), numbered from 1; `network.audit` pages through it or follows it.

use crate::plugin_api::{PluginError, RouteContext};
use crate::plugins::records::{Numbered, Records};
use allox_protocol::{NetworkAudit, NetworkAuditListing, NetworkAuditRecord, Response};
use std::time::Duration;

/// The network plugin's record file.
pub(super) type AuditLog = Records<NetworkAuditRecord>;

impl Numbered for NetworkAuditRecord {
    fn seq(&self) -> u64 {
        self.seq
    }
    fn set_seq(&mut self, seq: u64) {
        self.seq = seq;
    }
}

/// The records after `q.cursor` that match `q`, oldest first, at most
/// `q.limit`.
fn query(log: &AuditLog, q: &NetworkAudit) -> std::io::Result<NetworkAuditListing> {
    let limit = q.limit.unwrap_or(1000).clamp(1, 10_000) as usize;
    let page = log.page(q.cursor.unwrap_or(0), limit, |r| {
        q.agent_id.as_ref().is_none_or(|a| *a == r.agent_id)
            && q.session_id.as_ref().is_none_or(|s| *s == r.session_id)
    })?;
    Ok(NetworkAuditListing {
        records: page.records,
        next_cursor: page.next_cursor,
    })
}

/// `network.audit`: a page, or with `follow` the backlog and then new
/// records as stream events until the subscriber goes.
pub(super) async fn serve(
    log: &AuditLog,
    q: &NetworkAudit,
    ctx: RouteContext<'_>,
) -> Result<Response, PluginError> {
    if let Some(a) = &q.agent_id {
        match &q.session_id {
            Some(s) => drop(ctx.store.session_info_of(a, s)?),
            None => drop(ctx.store.session_list(a)?),
        }
    }
    let io = |e: std::io::Error| PluginError::Run {
        plugin: super::NAME,
        source: Box::new(e),
    };
    if !q.follow {
        return Ok(Response::NetworkAudit(query(log, q).map_err(io)?));
    }
    let Some(sink) = ctx.events else {
        return Err(PluginError::FollowNeedsStream);
    };
    let mut cursor = q.cursor;
    loop {
        let page = query(
            log,
            &NetworkAudit {
                cursor,
                follow: false,
                ..q.clone()
            },
        )
        .map_err(io)?;
        for r in page.records {
            if sink.send(allox_protocol::Event::Network(r)).await.is_err() {
                return Err(PluginError::SubscriberGone);
            }
        }
        cursor = Some(page.next_cursor);
        if sink.is_closed() {
            return Err(PluginError::SubscriberGone);
        }
        log.wait_newer(page.next_cursor, Duration::from_secs(1))
            .await;
    }
}
