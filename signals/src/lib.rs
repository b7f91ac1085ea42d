//! SIGTERM and SIGINT, from the moment they are installed, for the
//! processes that run until told to stop: the supervisor's daemon and the
//! HTTP gateway.
//!
//! tokio's listener for a signal is made in two steps: the handler is
//! installed, then the listener subscribes; a signal whose handler ran in
//! between is taken by the runtime's driver with nobody to tell, and is
//! lost (a daemon stopped by a test the moment it was ready, under load,
//! ran on). A flag set by a handler of its own, installed first, keeps
//! such a signal: [`StopSignals::wait`] looks at it once the listeners
//! exist. Before [`StopSignals::install`] a signal does what the process
//! inherited (SIGTERM ends it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// SIGTERM and SIGINT, from the moment they are installed.
pub struct StopSignals {
    /// Set by every SIGTERM or SIGINT from the installation on.
    caught: Arc<AtomicBool>,
    /// `None` if they could not be installed (said in the log).
    listeners: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl StopSignals {
    /// Installs both, in the runtime's context; `who` names the process in
    /// the log should that fail ("the daemon").
    pub fn install(who: &str) -> StopSignals {
        use tokio::signal::unix::{signal, SignalKind};
        let caught = Arc::new(AtomicBool::new(false));
        let flagged = [libc::SIGTERM, libc::SIGINT]
            .into_iter()
            .all(|s| signal_hook::flag::register(s, caught.clone()).is_ok());
        if !flagged {
            tracing::warn!("cannot install the flag of SIGTERM and SIGINT: one sent as {who} starts may be missed");
        }
        let listeners = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Some((term, int)),
            _ => {
                tracing::error!(
                    "cannot install the handlers of SIGTERM and SIGINT of {who}; stop it with SIGKILL"
                );
                None
            }
        };
        StopSignals { caught, listeners }
    }

    /// Until SIGTERM or SIGINT has come (at once if one came already).
    pub async fn wait(&mut self) {
        let Some((term, int)) = &mut self.listeners else {
            return std::future::pending().await;
        };
        if self.caught.load(Ordering::SeqCst) {
            return;
        }
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A signal that came before the wait ends it at once; so does one
    /// that comes during it. Neither ends the process (this test's).
    #[tokio::test]
    async fn a_stop_signal_before_or_during_the_wait_ends_it() {
        let mut stop = StopSignals::install("the test");
        for sig in [rustix::process::Signal::TERM, rustix::process::Signal::INT] {
            rustix::process::kill_process(rustix::process::getpid(), sig).unwrap();
            tokio::time::timeout(Duration::from_secs(20), stop.wait())
                .await
                .unwrap_or_else(|_| panic!("{sig:?} before the wait was lost"));
            stop.caught.store(false, Ordering::SeqCst);
        }
        let mut again = StopSignals::install("the test");
        let waiting = tokio::spawn(async move { again.wait().await });
        tokio::task::yield_now().await;
        rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::TERM)
            .unwrap();
        tokio::time::timeout(Duration::from_secs(20), waiting)
            .await
            .expect("SIGTERM during the wait was lost")
            .unwrap();
    }
}
