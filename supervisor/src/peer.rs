//! Who may use the control socket.
//!
//! Two gates. The socket file's mode is the first: 0600 (the daemon's user
//! only) unless other users are allowed, when it is 0666 and the second
//! gate does the choosing — a file mode names one user and one group, the
//! allow lists name many. The second is the peer's credentials as the
//! kernel took them at `connect` (`SO_PEERCRED`): root, the daemon's own
//! user, and the uids and (primary) gids given with `--allow-uid` /
//! `--allow-gid` are served. Anyone else gets one
//! `Refused(unauthorized)` frame and is closed before a byte of theirs is
//! read; each refusal is logged and audited (`connection.refused`), both
//! rate-limited, since any local user can knock as often as they like.

use crate::ratelimit::RateLimit;
use crate::supervisor::Supervisor;
use allox_protocol::{encode, ErrorBody, ErrorCode, ServerFrame};
use allox_store::audit::Entry;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::UnixStream;

/// Refusals audited at once, then one per [`AUDIT_EVERY`].
pub const AUDIT_BURST: u32 = 100;
pub const AUDIT_EVERY: Duration = Duration::from_millis(100);
/// Refusals logged at once, then one per [`LOG_EVERY`].
pub const LOG_BURST: u32 = 10;
pub const LOG_EVERY: Duration = Duration::from_secs(1);

/// The users and groups served besides root and the daemon's own user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerPolicy {
    pub uids: Vec<u32>,
    pub gids: Vec<u32>,
}

impl PeerPolicy {
    /// Whether a peer with these credentials is served; `owner` is the
    /// daemon's effective uid.
    pub fn allows(&self, owner: u32, uid: u32, gid: u32) -> bool {
        uid == 0 || uid == owner || self.uids.contains(&uid) || self.gids.contains(&gid)
    }

    /// The socket file's mode: 0600 unless others are allowed in.
    pub fn socket_mode(&self) -> u32 {
        if self.uids.is_empty() && self.gids.is_empty() {
            0o600
        } else {
            0o666
        }
    }
}

/// A connected peer's credentials (`None` where the kernel gave none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub pid: Option<i32>,
}

impl Peer {
    pub fn of(stream: &UnixStream) -> Peer {
        match stream.peer_cred() {
            Ok(c) => Peer {
                uid: Some(c.uid()),
                gid: Some(c.gid()),
                pid: c.pid(),
            },
            Err(_) => Peer {
                uid: None,
                gid: None,
                pid: None,
            },
        }
    }

    /// `uid=U pid=P`, as requests and audit records name their peer.
    pub fn label(&self) -> String {
        let show = |v: Option<String>| v.unwrap_or_else(|| "?".into());
        format!(
            "uid={} pid={}",
            show(self.uid.map(|u| u.to_string())),
            show(self.pid.map(|p| p.to_string()))
        )
    }

    /// Whether `policy` serves this peer; one without credentials is not.
    pub fn admitted(&self, policy: &PeerPolicy) -> bool {
        let owner = rustix::process::geteuid().as_raw();
        match (self.uid, self.gid) {
            (Some(uid), Some(gid)) => policy.allows(owner, uid, gid),
            _ => false,
        }
    }

    fn refusal(&self) -> String {
        match (self.uid, self.gid) {
            (Some(uid), Some(gid)) => format!(
                "uid {uid} (gid {gid}) may not use this control socket: the daemon serves root, its own user and those given with --allow-uid / --allow-gid"
            ),
            _ => "the kernel gave no credentials for this connection; refused".into(),
        }
    }
}

/// The refusals of one listener: answered, logged and audited, the last
/// two rate-limited.
#[derive(Debug)]
pub struct Refusals {
    log: RateLimit,
    audit: RateLimit,
}

impl Default for Refusals {
    fn default() -> Self {
        let now = Instant::now();
        Refusals {
            log: RateLimit::new(LOG_BURST, LOG_EVERY, now),
            audit: RateLimit::new(AUDIT_BURST, AUDIT_EVERY, now),
        }
    }
}

impl Refusals {
    /// Tells `peer` it is refused (without waiting: the frame fits in the
    /// socket's buffer, or is lost), closes the connection, logs and
    /// audits the refusal.
    pub fn refuse(&mut self, stream: UnixStream, peer: &Peer, sup: &Arc<Supervisor>) {
        let why = peer.refusal();
        let frame = ServerFrame::Refused(ErrorBody::new(ErrorCode::Unauthorized, why.clone()));
        if let Ok(bytes) = encode(&frame) {
            let _ = stream.try_write(&bytes);
        }
        drop(stream);
        let now = Instant::now();
        if let Some(held_back) = self.log.allow(now) {
            tracing::warn!(
                uid = ?peer.uid,
                gid = ?peer.gid,
                pid = ?peer.pid,
                held_back,
                "control connection refused: peer not allowed"
            );
        }
        // A refused peer's knocking is not the host's word: its records do
        // not take the room the audit log keeps for the host on a full
        // disk (about three minutes of knocks spent it, and every change
        // of the host's was then refused).
        let room = sup.store.audit().guest_may_record().is_ok();
        if let Some(held_back) = self.audit.allow(now).filter(|_| room) {
            let mut message = why;
            if held_back > 0 {
                message.push_str(&format!(
                    "; {held_back} refusals before this one were not recorded (rate limit)"
                ));
            }
            let entry = Entry {
                request_id: 0,
                peer: peer.label(),
                action: "connection.refused".into(),
                target: peer.gid.map(|g| format!("gid={g}")).unwrap_or_default(),
                outcome: ErrorCode::Unauthorized.as_str().into(),
                message: Some(message),
            };
            let sup = sup.clone();
            tokio::task::spawn_blocking(move || {
                if let Err(e) = sup.store.audit().append(entry) {
                    tracing::error!(error = %e, "cannot append audit record");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_the_owner_and_the_allowed_are_served() {
        let none = PeerPolicy::default();
        assert!(none.allows(1000, 0, 0));
        assert!(none.allows(1000, 1000, 1000));
        assert!(!none.allows(0, 65534, 65534));
        assert_eq!(none.socket_mode(), 0o600);
        let some = PeerPolicy {
            uids: vec![1001],
            gids: vec![2000],
        };
        assert!(some.allows(0, 1001, 9));
        assert!(some.allows(0, 9, 2000));
        assert!(!some.allows(0, 9, 9));
        assert_eq!(some.socket_mode(), 0o666);
    }

    #[test]
    fn a_peer_without_credentials_is_refused() {
        let p = Peer {
            uid: None,
            gid: None,
            pid: None,
        };
        assert!(!p.admitted(&PeerPolicy {
            uids: vec![0],
            gids: vec![0],
        }));
        assert_eq!(p.label(), "uid=? pid=?");
    }
}
