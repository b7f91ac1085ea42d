//! What the services around a run give it before its sandbox is built
//! (the in-sandbox interface today): host files bound into the sandbox,
//! directories added to its `PATH`, and a guard the run holds until its
//! sandbox's init has been reaped — dropping the guard releases what was
//! made for the run (the in-sandbox interface closes its listener and removes
//! its socket file).

use allox_sandbox::Bind;

/// Who a run is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunIdentity {
    pub agent: String,
    pub session: String,
    pub run: String,
}

/// What a service made for one run.
pub struct Attachment {
    pub binds: Vec<Bind>,
    /// Directories inside the sandbox appended to its `PATH`.
    pub path: Vec<String>,
    /// Dropped once the run's sandbox is gone (or the start fails).
    pub guard: Box<dyn Send + Sync>,
}

impl Attachment {
    /// Nothing for this run.
    pub fn none() -> Attachment {
        Attachment {
            binds: Vec::new(),
            path: Vec::new(),
            guard: Box::new(()),
        }
    }
}

/// What a service puts in every session's root, once, for all its runs
/// (files that are the same for every run).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionFiles {
    /// Bound read-only.
    pub binds: Vec<Bind>,
    /// Symbolic links: path inside the sandbox, target.
    pub links: Vec<(String, String)>,
}

/// A service that attaches something to every run as it starts.
pub trait RunServices: Send + Sync {
    /// Called within the async runtime, before the run's sandbox exists.
    fn attach(
        &self,
        run: &RunIdentity,
    ) -> Result<Attachment, Box<dyn std::error::Error + Send + Sync>>;

    /// What every session's root holds for the runs (none by default).
    fn session_files(&self) -> SessionFiles {
        SessionFiles::default()
    }

    /// After a supervisor restart, within the async runtime: attaches
    /// again what can be to the runs an earlier supervisor left (`live`);
    /// returns a guard per run, held until its sandbox is gone. What was
    /// made for any other run is released.
    fn reattach(&self, live: &[RunIdentity]) -> Vec<(RunIdentity, Box<dyn Send + Sync>)> {
        let _ = live;
        Vec::new()
    }
}
