//! Guest image assembly for Allox OS: a reproducible initramfs (newc cpio,
//! optionally gzip) holding `/init` = allox-init, busybox and a minimal
//! system, the blank store disk, and the same tree as an OCI container
//! image ([`oci`], with [`container`]'s additions) whose entrypoint is
//! `allox-init container`.
//!
//! Reproducible means the same inputs give the same bytes: entries are
//! sorted by path, inode numbers assigned in that order, owners are 0:0,
//! every mtime is one fixed value (0, or `SOURCE_DATE_EPOCH`), modes are
//! normalised, and host metadata other than the execute bit is ignored.
//! See [`tree`] for the rules and [`cpio`] for the format.

pub mod busybox;
pub mod container;
pub mod cpio;
pub mod elf;
pub mod image;
pub mod libs;
pub mod oci;
pub mod output;
pub mod python;
pub mod store;
pub mod tree;

pub use image::{assemble, Addition, ImageSpec, Profile};
pub use output::{write_file, Compression, Summary};

#[cfg(test)]
pub(crate) mod test_support {
    use std::io::Write;

    /// Says, past the test harness's capture, that a test did not run.
    pub fn skip(test: &str, what: &str) {
        let _ = writeln!(std::io::stderr(), "SKIPPED {test}: needs {what}");
    }
}
