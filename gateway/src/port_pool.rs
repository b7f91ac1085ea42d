//! Idle HTTP/1.1 connections to sessions' exposed ports, kept for the
//! port's next request (`/v1/ports/…`, [`crate::ports`]): a few per port,
//! each reused only by a caller with the credential that opened it.

/// Idle connections kept per port, and in all.
pub const IDLE_PER_PORT: usize = 8;
pub const IDLE_ALL: usize = 256;

pub type Sender = hyper::client::conn::http1::SendRequest<hyper::body::Incoming>;

/// An idle connection to a port: what opened it (`None`: the gateway's
/// token) and its sender.
struct Idle {
    token: Option<String>,
    sender: Sender,
}

/// Idle connections to sessions' ports, by port (`agent/session/port`,
/// or the port's own host).
#[derive(Default)]
pub struct Pool {
    idle: std::sync::Mutex<std::collections::HashMap<String, Vec<Idle>>>,
}

impl Pool {
    /// An idle connection to the port that `authorized` or `token` may
    /// use, ready for a request.
    pub fn take(&self, key: &str, authorized: bool, token: Option<&str>) -> Option<Sender> {
        let mut all = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = all.get_mut(key)?;
        list.retain(|i| !i.sender.is_closed());
        let i = list.iter().position(|i| {
            i.sender.is_ready()
                && (authorized
                    || matches!((&i.token, token), (Some(a), Some(b)) if crate::token::same(a, b)))
        })?;
        let got = list.swap_remove(i);
        if list.is_empty() {
            all.remove(key);
        }
        Some(got.sender)
    }

    /// Keeps `sender` for the port's next request, if there is room.
    pub fn keep(&self, key: String, token: Option<String>, sender: Sender) {
        let mut all = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let total: usize = all.values().map(Vec::len).sum();
        let list = all.entry(key).or_default();
        list.retain(|i| !i.sender.is_closed());
        if list.len() < IDLE_PER_PORT && total < IDLE_ALL {
            list.push(Idle { token, sender });
        }
    }
}
