//! A [`Host`] for tests: a cgroup2 mount (or none) and a known binary.

use super::Host;
use std::path::PathBuf;

pub struct FakeHost {
    pub cgroup2: Option<&'static str>,
}

/// Where [`FakeHost`] has no cgroup2 filesystem.
pub const PLAIN: &str = "/plain";

impl Host for FakeHost {
    fn cgroup2_mount(&self) -> Option<PathBuf> {
        self.cgroup2.map(PathBuf::from)
    }
    fn in_cgroup2(&self, dir: &std::path::Path) -> bool {
        !dir.starts_with(PLAIN)
    }
    fn exe(&self) -> std::io::Result<PathBuf> {
        Ok(PathBuf::from("/usr/bin/allox-init"))
    }
}
