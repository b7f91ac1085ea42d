//! A [`Host`] for tests: a cgroup2 mount (or none) and a known binary.

use super::Host;
use std::path::PathBuf;

pub struct FakeHost {
    pub cgroup2: Option<&'static str>,
}

impl Host for FakeHost {
    fn cgroup2_mount(&self) -> Option<PathBuf> {
        self.cgroup2.map(PathBuf::from)
    }
    fn exe(&self) -> std::io::Result<PathBuf> {
        Ok(PathBuf::from("/usr/bin/allox-init"))
    }
}
