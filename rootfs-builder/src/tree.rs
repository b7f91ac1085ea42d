//! The image as a tree of paths, and its serialisation to a cpio archive.
//!
//! Everything that could make two builds differ is fixed here: entries are
//! written in byte order of their paths (a parent always sorts before its
//! children), inode numbers are 1, 2, 3… in that order, owner is 0:0, every
//! mtime is the one given, and file modes are normalised (0755 when the
//! source has any execute bit, 0644 otherwise). Only file contents, symlink
//! targets and the layout come from the inputs.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::cpio::{self, CpioError, Meta, S_IFCHR, S_IFDIR, S_IFLNK, S_IFREG};

#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    #[error("{path:?}: not a valid image path (absolute, no `.`, `..` or empty parts)")]
    BadPath { path: String },
    #[error("{path}: already in the image as {existing}")]
    Conflict {
        path: String,
        existing: &'static str,
    },
    #[error("{path}: its parent {parent} is a {kind} in the image, not a directory")]
    ParentNotDir {
        path: String,
        parent: String,
        kind: &'static str,
    },
    #[error("{path}: too many symlinks to follow")]
    SymlinkLoop { path: String },
    #[error("{}: cannot read", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a regular file", path.display())]
    NotFile { path: PathBuf },
    #[error("{}: not valid UTF-8", path.display())]
    NotUtf8 { path: PathBuf },
    #[error("cannot write the archive entry {name}")]
    Write {
        name: String,
        #[source]
        source: CpioError,
    },
}

/// Where a file's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Data {
    /// Read when the archive is written.
    Path(PathBuf),
    Bytes(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir { perm: u32 },
    File { perm: u32, data: Data },
    Symlink { target: String },
    CharDev { perm: u32, major: u32, minor: u32 },
}

impl Node {
    fn kind(&self) -> &'static str {
        match self {
            Node::Dir { .. } => "directory",
            Node::File { .. } => "file",
            Node::Symlink { .. } => "symlink",
            Node::CharDev { .. } => "device",
        }
    }
}

/// The image: relative paths ("usr/bin/ls") to nodes, sorted.
#[derive(Debug, Default, Clone)]
pub struct Tree {
    nodes: BTreeMap<String, Node>,
}

/// Counts of what [`Tree::write_cpio`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub entries: u32,
    /// Uncompressed archive size.
    pub bytes: u64,
}

/// "/usr/bin/ls" → "usr/bin/ls"; refuses `.`, `..`, empty parts and NUL.
pub fn normalise(path: &str) -> Result<String, TreeError> {
    let bad = || TreeError::BadPath { path: path.into() };
    let rel = path.strip_prefix('/').ok_or_else(bad)?;
    let rel = rel.strip_suffix('/').unwrap_or(rel);
    if rel.is_empty()
        || rel.contains('\0')
        || rel
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(bad());
    }
    Ok(rel.to_string())
}

fn parent(rel: &str) -> Option<&str> {
    rel.rsplit_once('/').map(|(p, _)| p)
}

impl Tree {
    pub fn new() -> Self {
        Tree::default()
    }

    pub fn get(&self, path: &str) -> Option<&Node> {
        normalise(path).ok().and_then(|p| self.nodes.get(&p))
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Paths in archive order, with a leading `/`.
    pub fn paths(&self) -> impl Iterator<Item = String> + '_ {
        self.nodes.keys().map(|k| format!("/{k}"))
    }

    /// Relative paths ("usr/bin/ls") and their nodes, in archive order.
    pub fn nodes(&self) -> impl Iterator<Item = (&str, &Node)> + '_ {
        self.nodes.iter().map(|(k, n)| (k.as_str(), n))
    }

    /// Files whose bytes come from the host: image path and source.
    pub fn host_files(&self) -> impl Iterator<Item = (String, &Path)> + '_ {
        self.nodes.iter().filter_map(|(k, n)| match n {
            Node::File {
                data: Data::Path(p),
                ..
            } => Some((format!("/{k}"), p.as_path())),
            _ => None,
        })
    }

    /// Adds a directory and its missing parents; an existing directory is
    /// left as it is.
    pub fn dir(&mut self, path: &str, perm: u32) -> Result<(), TreeError> {
        let rel = self.resolve_parent(&normalise(path)?)?;
        match self.nodes.get(&rel) {
            Some(Node::Dir { .. }) => Ok(()),
            // A symlink to a directory will do (`/bin` → `usr/bin`).
            Some(Node::Symlink { .. }) if self.is_dir_through_symlinks(&rel) => Ok(()),
            Some(other) => Err(TreeError::Conflict {
                path: format!("/{rel}"),
                existing: other.kind(),
            }),
            None => {
                self.parents(&rel)?;
                self.nodes.insert(rel, Node::Dir { perm });
                Ok(())
            }
        }
    }

    /// Adds a file with the bytes given.
    pub fn bytes(&mut self, path: &str, perm: u32, data: Vec<u8>) -> Result<(), TreeError> {
        let data = Data::Bytes(data);
        self.insert(path, Node::File { perm, data }, false)
    }

    /// Adds a file read from `src` when the archive is written; its mode is
    /// 0755 when `src` has any execute bit and 0644 otherwise.
    pub fn file(&mut self, path: &str, src: &Path) -> Result<(), TreeError> {
        let perm = source_perm(src)?;
        let data = Data::Path(src.into());
        self.insert(path, Node::File { perm, data }, false)
    }

    /// Like [`Tree::file`], but replaces a file or symlink already there.
    pub fn file_replacing(&mut self, path: &str, src: &Path) -> Result<(), TreeError> {
        let perm = source_perm(src)?;
        let data = Data::Path(src.into());
        self.insert(path, Node::File { perm, data }, true)
    }

    /// Adds a symlink.
    pub fn symlink(&mut self, path: &str, target: &str) -> Result<(), TreeError> {
        let node = Node::Symlink {
            target: target.into(),
        };
        self.insert(path, node, false)
    }

    pub fn char_dev(
        &mut self,
        path: &str,
        perm: u32,
        major: u32,
        minor: u32,
    ) -> Result<(), TreeError> {
        self.insert(path, Node::CharDev { perm, major, minor }, false)
    }

    /// Adding the very same node twice is not a conflict.
    fn insert(&mut self, path: &str, node: Node, replace: bool) -> Result<(), TreeError> {
        let rel = self.resolve_parent(&normalise(path)?)?;
        if let Some(existing) = self.nodes.get(&rel) {
            if existing == &node {
                return Ok(());
            }
            let replaceable = !matches!(existing, Node::Dir { .. });
            if !(replace && replaceable) {
                return Err(TreeError::Conflict {
                    path: format!("/{rel}"),
                    existing: existing.kind(),
                });
            }
        }
        self.parents(&rel)?;
        self.nodes.insert(rel, node);
        Ok(())
    }

    /// Creates every missing parent of `rel` as a 0755 directory.
    fn parents(&mut self, rel: &str) -> Result<(), TreeError> {
        let mut p = parent(rel);
        let mut missing = Vec::new();
        while let Some(dir) = p {
            match self.nodes.get(dir) {
                Some(Node::Dir { .. }) => break,
                Some(other) => {
                    return Err(TreeError::ParentNotDir {
                        path: format!("/{rel}"),
                        parent: format!("/{dir}"),
                        kind: other.kind(),
                    })
                }
                None => missing.push(dir.to_string()),
            }
            p = parent(dir);
        }
        for dir in missing {
            self.nodes.insert(dir, Node::Dir { perm: 0o755 });
        }
        Ok(())
    }

    fn is_dir_through_symlinks(&self, rel: &str) -> bool {
        // Resolving a child resolves every component of `rel`.
        self.resolve_parent(&format!("{rel}/child"))
            .ok()
            .and_then(|c| parent(&c).map(str::to_string))
            .is_some_and(|d| matches!(self.nodes.get(&d), Some(Node::Dir { .. })))
    }

    /// Follows symlinks of the image in the parent part of `rel`, so that
    /// adding `/bin/x` when `/bin` → `usr/bin` adds `/usr/bin/x`, as the
    /// kernel's unpacker would.
    fn resolve_parent(&self, rel: &str) -> Result<String, TreeError> {
        let mut parts: Vec<String> = rel.split('/').map(String::from).collect();
        let mut hops = 0;
        let mut i = 0;
        // Walk every component but the last.
        while i + 1 < parts.len() {
            let prefix = parts[..=i].join("/");
            if let Some(Node::Symlink { target }) = self.nodes.get(&prefix) {
                hops += 1;
                if hops > 40 {
                    return Err(TreeError::SymlinkLoop {
                        path: format!("/{rel}"),
                    });
                }
                let mut base: Vec<String> = if target.starts_with('/') {
                    Vec::new()
                } else {
                    parts[..i].to_vec()
                };
                for c in target.split('/') {
                    match c {
                        "" | "." => {}
                        ".." => {
                            base.pop();
                        }
                        c => base.push(c.into()),
                    }
                }
                let rest = parts.split_off(i + 1);
                base.extend(rest);
                parts = base;
                // Start again: the target may itself go through symlinks.
                i = 0;
                continue;
            }
            i += 1;
        }
        normalise(&format!("/{}", parts.join("/")))
    }

    /// Writes the archive; file sources are read now, one at a time.
    pub fn write_cpio<W: Write>(&self, out: W, mtime: u32) -> Result<(W, Written), TreeError> {
        let mut subdirs: BTreeMap<&str, u32> = BTreeMap::new();
        for (path, node) in &self.nodes {
            if let (Node::Dir { .. }, Some(p)) = (node, parent(path)) {
                *subdirs.entry(p).or_default() += 1;
            }
        }
        let mut w = cpio::Writer::new(out);
        let mut ino = 0u32;
        for (name, node) in &self.nodes {
            ino += 1;
            let mut meta = Meta {
                ino,
                nlink: 1,
                mtime,
                ..Meta::default()
            };
            let owned;
            let data: &[u8] = match node {
                Node::Dir { perm } => {
                    meta.mode = S_IFDIR | perm;
                    meta.nlink = 2 + subdirs.get(name.as_str()).copied().unwrap_or(0);
                    &[]
                }
                Node::File { perm, data } => {
                    meta.mode = S_IFREG | perm;
                    match data {
                        Data::Bytes(b) => b,
                        Data::Path(p) => {
                            owned = read_file(p)?;
                            &owned
                        }
                    }
                }
                Node::Symlink { target } => {
                    meta.mode = S_IFLNK | 0o777;
                    target.as_bytes()
                }
                Node::CharDev { perm, major, minor } => {
                    meta.mode = S_IFCHR | perm;
                    meta.rdev_major = *major;
                    meta.rdev_minor = *minor;
                    &[]
                }
            };
            w.entry(name, &meta, data)
                .map_err(|source| TreeError::Write {
                    name: name.clone(),
                    source,
                })?;
        }
        let bytes_before_trailer = w.offset();
        let out = w.finish().map_err(|source| TreeError::Write {
            name: cpio::TRAILER.into(),
            source,
        })?;
        let trailer = (cpio::HEADER_LEN + cpio::TRAILER.len() + 1) as u64;
        let trailer = trailer + cpio::pad4(trailer as usize) as u64;
        Ok((
            out,
            Written {
                entries: ino,
                bytes: bytes_before_trailer + trailer,
            },
        ))
    }
}

/// Copies a host file to the same path in the image, keeping each symlink
/// on the way as a symlink (so `ld.so` finds a library by its soname).
/// Returns the host path of the file itself.
pub fn copy_preserving(t: &mut Tree, path: &Path) -> Result<PathBuf, TreeError> {
    let read = |p: &Path| {
        let p = p.to_path_buf();
        move |source| TreeError::Read { path: p, source }
    };
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        let md = std::fs::symlink_metadata(&p).map_err(read(&p))?;
        if !md.file_type().is_symlink() {
            // The same file may be reached as /lib/x or /usr/lib/x.
            let real = std::fs::canonicalize(&p).map_err(read(&p))?;
            t.file(utf8(&real)?, &real)?;
            return Ok(real);
        }
        let target = std::fs::read_link(&p).map_err(read(&p))?;
        t.symlink(utf8(&p)?, utf8(&target)?)?;
        let parent = p.parent().unwrap_or(Path::new("/"));
        let parent = std::fs::canonicalize(parent).map_err(read(parent))?;
        p = parent.join(target);
        // Fold "dir/../x" so the next image path is plain.
        if let Ok(dir) = std::fs::canonicalize(p.parent().unwrap_or(Path::new("/"))) {
            if let Some(name) = p.file_name() {
                p = dir.join(name);
            }
        }
    }
    Err(TreeError::SymlinkLoop {
        path: path.display().to_string(),
    })
}

impl Data {
    /// The bytes: read now if they come from the host.
    pub fn read(&self) -> Result<std::borrow::Cow<'_, [u8]>, TreeError> {
        match self {
            Data::Bytes(b) => Ok(b.into()),
            Data::Path(p) => read_file(p).map(Into::into),
        }
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, TreeError> {
    std::fs::read(path).map_err(|source| TreeError::Read {
        path: path.into(),
        source,
    })
}

/// 0755 or 0644 from a regular file's execute bits (following symlinks).
fn source_perm(src: &Path) -> Result<u32, TreeError> {
    use std::os::unix::fs::PermissionsExt;
    let md = std::fs::metadata(src).map_err(|source| TreeError::Read {
        path: src.into(),
        source,
    })?;
    if !md.is_file() {
        return Err(TreeError::NotFile { path: src.into() });
    }
    Ok(if md.permissions().mode() & 0o111 != 0 {
        0o755
    } else {
        0o644
    })
}

/// A path on the host as UTF-8, for symlink targets read from disk.
pub fn utf8(path: &Path) -> Result<&str, TreeError> {
    path.to_str()
        .ok_or_else(|| TreeError::NotUtf8 { path: path.into() })
}

/// Copies a host file, symlink or directory tree to `dest`. The top-level
/// `src` is followed if it is a symlink; symlinks inside a directory are
/// copied as symlinks. Directory entries for which `skip(name)` is true are
/// left out. With `replace`, a file replaces a file or symlink already in
/// the image.
pub fn add_host_path(
    t: &mut Tree,
    src: &Path,
    dest: &str,
    skip: &dyn Fn(&str) -> bool,
    replace: bool,
) -> Result<(), TreeError> {
    let md = std::fs::metadata(src).map_err(|source| TreeError::Read {
        path: src.into(),
        source,
    })?;
    if md.is_dir() {
        t.dir(dest, 0o755)?;
        copy_dir(t, src, dest, skip, replace)
    } else if replace {
        t.file_replacing(dest, src)
    } else {
        t.file(dest, src)
    }
}

fn copy_dir(
    t: &mut Tree,
    src: &Path,
    dest: &str,
    skip: &dyn Fn(&str) -> bool,
    replace: bool,
) -> Result<(), TreeError> {
    let read_err = |source| TreeError::Read {
        path: src.into(),
        source,
    };
    let mut names = Vec::new();
    for e in std::fs::read_dir(src).map_err(read_err)? {
        names.push(e.map_err(read_err)?.file_name());
    }
    names.sort();
    for name in names {
        let path = src.join(&name);
        let name = utf8(Path::new(&name))?;
        if skip(name) {
            continue;
        }
        let to = format!("{}/{name}", dest.trim_end_matches('/'));
        let md = std::fs::symlink_metadata(&path).map_err(|source| TreeError::Read {
            path: path.clone(),
            source,
        })?;
        if md.file_type().is_symlink() {
            let target = std::fs::read_link(&path).map_err(|source| TreeError::Read {
                path: path.clone(),
                source,
            })?;
            t.symlink(&to, utf8(&target)?)?;
        } else if md.is_dir() {
            t.dir(&to, 0o755)?;
            copy_dir(t, &path, &to, skip, replace)?;
        } else if replace {
            t.file_replacing(&to, &path)?;
        } else {
            t.file(&to, &path)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(t: &Tree) -> Vec<String> {
        t.paths().collect()
    }

    #[test]
    fn parents_are_created_and_order_is_bytewise() {
        let mut t = Tree::new();
        t.bytes("/usr/bin2/x", 0o644, vec![]).unwrap();
        t.bytes("/usr/bin/ls", 0o755, vec![]).unwrap();
        t.bytes("/usr/bin-x", 0o644, vec![]).unwrap();
        t.dir("/a/b/c", 0o700).unwrap();
        assert_eq!(
            names(&t),
            [
                "/a",
                "/a/b",
                "/a/b/c",
                "/usr",
                "/usr/bin",
                "/usr/bin-x",
                "/usr/bin/ls",
                "/usr/bin2",
                "/usr/bin2/x"
            ]
        );
        assert_eq!(t.get("/a/b/c"), Some(&Node::Dir { perm: 0o700 }));
        assert_eq!(t.get("/a/b"), Some(&Node::Dir { perm: 0o755 }));
    }

    #[test]
    fn bad_paths_and_conflicts_are_refused() {
        let mut t = Tree::new();
        for p in ["", "/", "rel", "/a/../b", "/a/./b", "/a//b", "/a\0"] {
            assert!(
                matches!(t.dir(p, 0o755), Err(TreeError::BadPath { .. })),
                "{p:?}"
            );
        }
        t.bytes("/etc/hostname", 0o644, b"x".to_vec()).unwrap();
        let err = t.bytes("/etc/hostname", 0o644, vec![]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/etc/hostname: already in the image as file"
        );
        let err = t.bytes("/etc/hostname/x", 0o644, vec![]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/etc/hostname/x: its parent /etc/hostname is a file in the image, not a directory"
        );
        assert!(t.dir("/etc", 0o755).is_ok());
        t.symlink("/bin/sh", "busybox").unwrap();
        t.symlink("/bin/sh", "busybox").unwrap();
        assert!(t.symlink("/bin/sh", "dash").is_err());
    }

    #[test]
    fn symlinked_parents_are_followed() {
        let mut t = Tree::new();
        t.dir("/usr/bin", 0o755).unwrap();
        t.symlink("/bin", "usr/bin").unwrap();
        t.symlink("/usr/sbin", "bin").unwrap();
        t.symlink("/abs", "/usr/bin").unwrap();
        t.bytes("/bin/a", 0o644, vec![]).unwrap();
        t.bytes("/usr/sbin/b", 0o644, vec![]).unwrap();
        t.bytes("/abs/c", 0o644, vec![]).unwrap();
        assert!(t.get("/usr/bin/a").is_some());
        assert!(t.get("/usr/bin/b").is_some());
        assert!(t.get("/usr/bin/c").is_some());
        // A directory through a symlink is that directory.
        t.dir("/bin", 0o755).unwrap();
        t.symlink("/dangling", "nowhere").unwrap();
        assert!(t.dir("/dangling", 0o755).is_err());
        t.symlink("/loop", "loop").unwrap();
        assert!(matches!(
            t.bytes("/loop/x", 0o644, vec![]),
            Err(TreeError::SymlinkLoop { .. })
        ));
    }

    #[test]
    fn replacing_a_file_but_never_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::write(&src, "new").unwrap();
        let mut t = Tree::new();
        t.symlink("/usr/bin/sh", "busybox").unwrap();
        t.file_replacing("/usr/bin/sh", &src).unwrap();
        assert!(matches!(t.get("/usr/bin/sh"), Some(Node::File { .. })));
        assert!(t.file_replacing("/usr/bin", &src).is_err());
    }

    #[test]
    fn modes_inodes_and_links_are_fixed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("exe");
        std::fs::write(&exe, "x").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o700)).unwrap();
        let doc = dir.path().join("doc");
        std::fs::write(&doc, "y").unwrap();
        std::fs::set_permissions(&doc, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut t = Tree::new();
        t.file("/a/exe", &exe).unwrap();
        t.file("/a/doc", &doc).unwrap();
        t.dir("/a/sub", 0o755).unwrap();
        t.char_dev("/dev/console", 0o600, 5, 1).unwrap();
        let (bytes, written) = t.write_cpio(Vec::new(), 7).unwrap();
        assert_eq!(written.bytes as usize, bytes.len());
        assert_eq!(written.entries, 6);
        let back = cpio::read_all(&bytes[..]).unwrap();
        let got: Vec<(String, u32, u32, u32)> = back
            .iter()
            .map(|e| (e.name.clone(), e.meta.ino, e.meta.mode, e.meta.nlink))
            .collect();
        assert_eq!(
            got,
            [
                ("a".into(), 1, S_IFDIR | 0o755, 3),
                ("a/doc".into(), 2, S_IFREG | 0o644, 1),
                ("a/exe".into(), 3, S_IFREG | 0o755, 1),
                ("a/sub".into(), 4, S_IFDIR | 0o755, 2),
                ("dev".into(), 5, S_IFDIR | 0o755, 2),
                ("dev/console".into(), 6, S_IFCHR | 0o600, 1),
            ]
        );
        assert!(back
            .iter()
            .all(|e| e.meta.mtime == 7 && e.meta.uid == 0 && e.meta.gid == 0));
        assert_eq!((back[5].meta.rdev_major, back[5].meta.rdev_minor), (5, 1));
    }

    #[test]
    fn a_missing_source_is_named() {
        let mut t = Tree::new();
        let err = t.file("/x", Path::new("/no/such/file")).unwrap_err();
        assert_eq!(err.to_string(), "/no/such/file: cannot read");
        // A source removed after it was added is named when writing.
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("gone");
        std::fs::write(&src, "x").unwrap();
        t.file("/x", &src).unwrap();
        std::fs::remove_file(&src).unwrap();
        let err = t.write_cpio(Vec::new(), 0).err().unwrap();
        assert_eq!(err.to_string(), format!("{}: cannot read", src.display()));
    }
}
