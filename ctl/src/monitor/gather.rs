//! What a session's report and an export need, asked of the daemon:
//! every record page by page, the timeline, the summaries by tool and by
//! turn, and the session's rollbacks from the audit log.

use super::MonitorError;
use allox_client::client::Client;
use allox_protocol::{
    AuditList, GroupBy, MonitorRecord, MonitorRecords, MonitorSummary, MonitorSummaryRequest,
    MonitorTimeline, MonitorTimelineRequest, Request, Response,
};

/// Every record `q` names, page by page.
pub fn records(c: &mut Client, mut q: MonitorRecords) -> Result<Vec<MonitorRecord>, MonitorError> {
    let mut out = Vec::new();
    q.limit = Some(10_000);
    q.follow = false;
    loop {
        let page = match c.call(Request::MonitorRecords(q.clone())) {
            Ok(Ok(Response::MonitorRecords(l))) => l,
            other => return Err(MonitorError::of("monitor.records", other)),
        };
        let done = page.next_cursor == q.cursor.unwrap_or(0);
        out.extend(page.records);
        if done {
            return Ok(out);
        }
        q.cursor = Some(page.next_cursor);
    }
}

/// What a session's report shows.
pub struct ReportData {
    pub agent: String,
    pub session: String,
    pub records: Vec<MonitorRecord>,
    pub timeline: MonitorTimeline,
    pub by_tool: MonitorSummary,
    pub by_turn: MonitorSummary,
    /// Rollbacks of the session that succeeded: when, and to which
    /// checkpoint.
    pub rollbacks: Vec<(u64, String)>,
}

/// Asks the daemon for everything the report of `a/s` shows.
pub fn gather(c: &mut Client, a: &str, s: &str) -> Result<ReportData, MonitorError> {
    let records = records(
        c,
        MonitorRecords {
            agent_id: Some(a.into()),
            session_id: Some(s.into()),
            ..Default::default()
        },
    )?;
    let timeline = match c.call(Request::MonitorTimeline(MonitorTimelineRequest {
        agent_id: a.into(),
        session_id: s.into(),
    })) {
        Ok(Ok(Response::MonitorTimeline(t))) => *t,
        other => return Err(MonitorError::of("monitor.timeline", other)),
    };
    let mut summary = |group_by| match c.call(Request::MonitorSummary(MonitorSummaryRequest {
        agent_id: Some(a.into()),
        session_id: Some(s.into()),
        group_by,
    })) {
        Ok(Ok(Response::MonitorSummary(m))) => Ok(m),
        other => Err(MonitorError::of("monitor.summary", other)),
    };
    let by_tool = summary(GroupBy::Tool)?;
    let by_turn = summary(GroupBy::Turn)?;
    // Rollbacks are in the audit log, after the session was made.
    let prefix = format!("{a}/{s}/");
    let since = timeline
        .checkpoints
        .first()
        .map(|c| c.created_ms)
        .unwrap_or(0)
        .min(
            timeline
                .turns
                .first()
                .map(|t| t.began_ms)
                .unwrap_or(u64::MAX),
        );
    let mut rollbacks = Vec::new();
    let mut after = 0;
    loop {
        let page = match c.call(Request::AuditList(AuditList {
            after_seq: Some(after),
            limit: Some(10_000),
            before_seq: None,
        })) {
            Ok(Ok(Response::Audit(l))) => l,
            other => return Err(MonitorError::of("audit.list", other)),
        };
        let Some(last) = page.records.last().map(|r| r.seq) else {
            break;
        };
        for r in page.records {
            if r.action == "session.rollback" && r.outcome == "ok" && r.time_ms >= since {
                if let Some(cp) = r.target.strip_prefix(&prefix) {
                    rollbacks.push((r.time_ms, cp.to_string()));
                }
            }
        }
        after = last;
    }
    Ok(ReportData {
        agent: a.into(),
        session: s.into(),
        records,
        timeline,
        by_tool,
        by_turn,
        rollbacks,
    })
}
