//! `alloxctl monitor`: spans and runs as OTLP JSON (`export`), and a
//! session's timeline as one self-contained HTML page (`report`).
//!
//! * [`gather`](mod@gather): what the daemon is asked for, page by page.
//! * [`otlp`](mod@otlp): the records as an OTLP/JSON export.
//! * [`report`]: the HTML page.

pub mod gather;
pub mod otlp;
pub mod report;

pub use gather::{gather, records, ReportData};
pub use otlp::otlp;
pub use report::report_html;

use allox_client::{Answer, ClientError};
use allox_protocol::ErrorBody;
use thiserror::Error;

/// Why the daemon did not give what a report or an export needs; each
/// names the call (`monitor.records`, `audit.list`, ...).
#[derive(Debug, Error)]
pub enum MonitorError {
    /// The daemon answered with an error.
    #[error("{what}: {}: {}", .body.code, .body.message)]
    Refused { what: &'static str, body: ErrorBody },
    /// The call did not reach the daemon, or its answer did not come.
    #[error("{what}")]
    Call {
        what: &'static str,
        #[source]
        source: ClientError,
    },
    /// The daemon answered with another response than the call's.
    #[error("{what}: unexpected answer {answer}")]
    Unexpected { what: &'static str, answer: String },
}

impl MonitorError {
    /// The error of a call `what` whose answer was not the one wanted.
    fn of(what: &'static str, answer: Result<Answer, ClientError>) -> MonitorError {
        match answer {
            Ok(Err(body)) => MonitorError::Refused { what, body },
            Err(source) => MonitorError::Call { what, source },
            Ok(Ok(r)) => MonitorError::Unexpected {
                what,
                answer: crate::render::render(&r),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_protocol::{error_chain, Deleted, ErrorCode, Response};

    #[test]
    fn each_error_names_the_call_then_says_why() {
        let refused = Ok(Err(ErrorBody::new(ErrorCode::NotFound, "no agent a")));
        assert_eq!(
            error_chain(&MonitorError::of("monitor.records", refused)),
            "monitor.records: not_found: no agent a"
        );
        assert_eq!(
            error_chain(&MonitorError::of("audit.list", Err(ClientError::Closed))),
            "audit.list: the daemon closed the connection"
        );
        let odd = Ok(Ok(Response::Deleted(Deleted {
            deleted: "x".into(),
        })));
        assert_eq!(
            error_chain(&MonitorError::of("monitor.timeline", odd)),
            "monitor.timeline: unexpected answer deleted x\n"
        );
    }
}
