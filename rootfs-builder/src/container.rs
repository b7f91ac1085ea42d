//! What the container image adds to the guest's tree: `alloxctl` (the
//! probes' and the gateway's client, static), `mkfs.btrfs` with the shared
//! libraries it loads (a blank store device is formatted inside the
//! container), and `/usr/bin/allox-init` naming `/init`.

use std::path::{Path, PathBuf};

use crate::elf::{self, ElfError};
use crate::libs::{self, LibError};
use crate::tree::{Tree, TreeError};

/// Where the image has them; `/usr/sbin/mkfs.btrfs` is the first place
/// `allox-init` looks.
pub const ALLOXCTL: &str = "/usr/bin/alloxctl";
pub const MKFS: &str = "/usr/sbin/mkfs.btrfs";

#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error("alloxctl")]
    Alloxctl(#[source] ElfError),
    #[error("{} is missing (apt-get install btrfs-progs, or name it with --mkfs)", .0.display())]
    NoMkfs(PathBuf),
    #[error("mkfs.btrfs's shared libraries")]
    Libs(#[source] LibError),
    #[error(transparent)]
    Tree(#[from] TreeError),
}

/// Adds `alloxctl`, `mkfs.btrfs` (from the host's `mkfs`) and its
/// libraries to `t`.
pub fn add(t: &mut Tree, alloxctl: &Path, mkfs: &Path) -> Result<(), ContainerError> {
    elf::check_static(alloxctl).map_err(ContainerError::Alloxctl)?;
    if !mkfs.is_file() {
        return Err(ContainerError::NoMkfs(mkfs.to_path_buf()));
    }
    t.file_replacing(ALLOXCTL, alloxctl)?;
    t.file_replacing(MKFS, mkfs)?;
    t.symlink("/usr/bin/allox-init", "../../init")?;
    libs::install(t, &[mkfs.to_path_buf()]).map_err(ContainerError::Libs)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Node;

    #[test]
    fn mkfs_comes_with_its_loader_and_libraries() {
        let mkfs = Path::new("/usr/sbin/mkfs.btrfs");
        let Ok(exe) = std::env::current_exe() else {
            return;
        };
        if !mkfs.is_file() {
            return crate::test_support::skip(
                "mkfs_comes_with_its_loader_and_libraries",
                "/usr/sbin/mkfs.btrfs (apt-get install btrfs-progs)",
            );
        }
        let mut t = Tree::new();
        // The test binary is static as every binary of the workspace.
        add(&mut t, &exe, mkfs).unwrap();
        assert!(matches!(t.get(MKFS), Some(Node::File { .. })));
        assert!(matches!(t.get(ALLOXCTL), Some(Node::File { .. })));
        assert!(t.get("/usr/lib/x86_64-linux-gnu/libc.so.6").is_some());
        assert!(t.get("/usr/lib/x86_64-linux-gnu/libblkid.so.1").is_some());
        assert!(matches!(
            t.get("/usr/lib64/ld-linux-x86-64.so.2"),
            Some(Node::Symlink { .. })
        ));
        let e = add(&mut Tree::new(), &exe, Path::new("/nonexistent/mkfs.btrfs")).unwrap_err();
        assert!(e.to_string().contains("apt-get install btrfs-progs"), "{e}");
    }
}
