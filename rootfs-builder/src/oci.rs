//! The OCI image: the guest's tree as a container image whose entrypoint is
//! `allox-init container`, written as an OCI image layout directory and,
//! optionally, as one tar of that directory (`podman load`, `ctr images
//! import`, `skopeo copy oci-archive:` take it without a registry).
//!
//! ```text
//! DIR/oci-layout                    {"imageLayoutVersion":"1.0.0"}
//! DIR/index.json                    one manifest, named by --tag
//! DIR/blobs/sha256/<manifest>       config + one layer
//! DIR/blobs/sha256/<config>         entrypoint, env, diff_id, created
//! DIR/blobs/sha256/<layer>          the tree as a gzip'd tar
//! ```
//!
//! Same inputs, same bytes: the layer is the [`Tree`] in its byte order,
//! every entry owned by 0:0 with the one mtime (`SOURCE_DATE_EPOCH` or 0),
//! no user or group names, no extended headers but GNU long names; the
//! gzip is flate2's pure-Rust backend with a fixed header (as the
//! initramfs's); JSON objects have sorted keys; `created` is the mtime.
//! Device nodes are left out of the layer (the runtime makes `/dev`).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::output::Hashing;
use crate::tree::{Node, Tree, TreeError};

pub const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// The entrypoint: the container's PID 1.
pub const ENTRYPOINT: [&str; 2] = ["/init", "container"];
/// Its default arguments: the store where the manifests put it.
pub const CMD: [&str; 2] = ["--store", "/dev/allox-store"];
pub const PATH_ENV: &str = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("--tag {0:?}: expected NAME[:TAG] of lowercase letters, digits and ._-/: (e.g. localhost/allox:dev)")]
    Tag(String),
    #[error("{}: cannot write", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: exists and is not an empty directory; remove it or choose another --out", .0.display())]
    NotEmpty(PathBuf),
    #[error("the layer")]
    Tree(#[from] TreeError),
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// `sha256:<hex>` of the manifest: the image's digest.
    pub digest: String,
    /// `sha256:<hex>` of the uncompressed layer.
    pub diff_id: String,
    pub layer_size: u64,
    pub entries: usize,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks a `NAME[:TAG]` reference loosely (what registries and podman
/// take): lowercase name components, an optional tag.
pub fn check_tag(tag: &str) -> Result<(), OciError> {
    let bad = || OciError::Tag(tag.to_string());
    let (name, t) = match tag.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, Some(t)),
        _ => (tag, None),
    };
    let parts: Vec<&str> = name.split('/').collect();
    let name_ok = parts.iter().enumerate().all(|(i, c)| {
        // A registry's host may have a port: `reg.test:5000/...`.
        let host = i == 0 && parts.len() > 1;
        !c.is_empty()
            && c.bytes().all(|b| {
                b.is_ascii_lowercase()
                    || b.is_ascii_digit()
                    || b"._-".contains(&b)
                    || (host && b == b':')
            })
    });
    let tag_ok = t.is_none_or(|t| {
        (1..=128).contains(&t.len())
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    });
    if name_ok && tag_ok {
        Ok(())
    } else {
        Err(bad())
    }
}

/// `1970-01-01T00:00:00Z` for `secs` since the epoch (UTC).
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Writes the tree as a tar to `out` (GNU headers, fixed metadata).
pub fn write_tar<W: Write>(tree: &Tree, out: W, mtime: u64) -> Result<(W, usize), OciError> {
    let io_err = |source| OciError::Io {
        path: PathBuf::from("<layer>"),
        source,
    };
    let mut b = tar::Builder::new(out);
    b.mode(tar::HeaderMode::Deterministic);
    let mut entries = 0;
    for (name, node) in tree.nodes() {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(mtime);
        match node {
            Node::Dir { perm } => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(*perm);
                h.set_size(0);
                b.append_data(&mut h, format!("{name}/"), io::empty())
                    .map_err(io_err)?;
            }
            Node::File { perm, data } => {
                let bytes = data.read()?;
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*perm);
                h.set_size(bytes.len() as u64);
                b.append_data(&mut h, name, &bytes[..]).map_err(io_err)?;
            }
            Node::Symlink { target } => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, name, target).map_err(io_err)?;
            }
            // The runtime makes /dev.
            Node::CharDev { .. } => continue,
        }
        entries += 1;
    }
    Ok((b.into_inner().map_err(io_err)?, entries))
}

/// The image's description: entrypoint, default arguments, environment.
pub fn config(diff_id: &str, created: &str, profile: &str) -> Value {
    json!({
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "Entrypoint": ENTRYPOINT,
            "Cmd": CMD,
            "Env": [PATH_ENV],
            "WorkingDir": "/",
            "StopSignal": "SIGTERM",
            "Labels": {
                "org.opencontainers.image.title": "allox",
                "org.opencontainers.image.description":
                    "Allox OS supervisor as a container's PID 1 (allox-init container)",
                "dev.allox.profile": profile,
            },
        },
        "rootfs": { "type": "layers", "diff_ids": [diff_id] },
        "history": [{ "created": created, "created_by": "rootfs-builder oci" }],
    })
}

/// The JSON bytes of `v` (serde_json's maps are sorted: the same value,
/// the same bytes).
fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("a JSON value serialises")
}

fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(data)))
}

/// Writes the OCI image layout of `tree` to `dir` (created; it must not
/// exist or be empty) under `tag`. Blobs are written under temporary names
/// and renamed, `index.json` last: a layout with an index is whole.
pub fn write_layout(
    tree: &Tree,
    dir: &Path,
    tag: &str,
    profile: &str,
    mtime: u64,
) -> Result<Written, OciError> {
    check_tag(tag)?;
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| OciError::Io { path, source }
    };
    if dir.exists() {
        let empty = std::fs::read_dir(dir)
            .map_err(io_err(dir))?
            .next()
            .is_none();
        if !empty {
            return Err(OciError::NotEmpty(dir.to_path_buf()));
        }
    }
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).map_err(io_err(&blobs))?;

    // The layer: tar → hash (diff_id) → gzip → hash (digest) → file.
    let tmp = blobs.join(".layer.partial");
    let file = File::create(&tmp).map_err(io_err(&tmp))?;
    let gz = flate2::GzBuilder::new()
        .operating_system(255)
        .mtime(0)
        .write(
            Hashing::new(BufWriter::new(file)),
            flate2::Compression::new(6),
        );
    let (tar_out, entries) = write_tar(tree, Hashing::new(gz), mtime)?;
    let diff_id = tar_out.digest();
    let gz_out = tar_out.inner.finish().map_err(io_err(&tmp))?;
    let layer_digest = gz_out.digest();
    let layer_size = gz_out.len;
    gz_out
        .inner
        .into_inner()
        .map_err(|e| io_err(&tmp)(e.into_error()))?
        .sync_all()
        .map_err(io_err(&tmp))?;
    let layer_path = blobs.join(&layer_digest["sha256:".len()..]);
    std::fs::rename(&tmp, &layer_path).map_err(io_err(&layer_path))?;

    let config = bytes(&config(&diff_id, &rfc3339(mtime), profile));
    let config_digest = put_blob(&blobs, &config)?;
    let manifest = bytes(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": { "mediaType": MEDIA_CONFIG, "digest": config_digest, "size": config.len() },
        "layers": [{ "mediaType": MEDIA_LAYER, "digest": layer_digest, "size": layer_size }],
    }));
    let digest = put_blob(&blobs, &manifest)?;
    let full_name = if tag.contains('/') {
        tag.to_string()
    } else {
        format!("localhost/{tag}")
    };
    let full_name = if full_name
        .rsplit_once(':')
        .is_some_and(|(_, t)| !t.contains('/'))
    {
        full_name
    } else {
        format!("{full_name}:latest")
    };
    put_file(
        dir,
        "oci-layout",
        &bytes(&json!({ "imageLayoutVersion": "1.0.0" })),
    )?;
    put_file(
        dir,
        "index.json",
        &bytes(&json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [{
                "mediaType": MEDIA_MANIFEST,
                "digest": digest,
                "size": manifest.len(),
                "annotations": {
                    // podman and skopeo name the image by this; containerd
                    // by the next.
                    "org.opencontainers.image.ref.name": full_name,
                    "io.containerd.image.name": full_name,
                },
            }],
        })),
    )?;
    Ok(Written {
        digest,
        diff_id,
        layer_size,
        entries,
    })
}

/// Writes a blob under its digest; returns the digest.
fn put_blob(blobs: &Path, data: &[u8]) -> Result<String, OciError> {
    let digest = sha256(data);
    put_file(blobs, &digest["sha256:".len()..], data)?;
    Ok(digest)
}

fn put_file(dir: &Path, name: &str, data: &[u8]) -> Result<(), OciError> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.partial"));
    let io_err = |source| OciError::Io {
        path: path.clone(),
        source,
    };
    let mut f = File::create(&tmp).map_err(io_err)?;
    f.write_all(data).map_err(io_err)?;
    f.sync_all().map_err(io_err)?;
    std::fs::rename(&tmp, &path).map_err(io_err)
}

/// Writes the layout directory `dir` as one tar (an "oci-archive"), with
/// the same fixed metadata as the layer; renamed into place when whole.
pub fn write_archive(dir: &Path, archive: &Path, mtime: u64) -> Result<u64, OciError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| OciError::Io { path, source }
    };
    let mut t = Tree::new();
    for e in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let name = e.map_err(io_err(dir))?.file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".partial") {
            continue;
        }
        crate::tree::add_host_path(
            &mut t,
            &dir.join(&*name),
            &format!("/{name}"),
            &|n| n.ends_with(".partial"),
            false,
        )?;
    }
    let tmp = archive.with_extension("partial");
    let file = File::create(&tmp).map_err(io_err(&tmp))?;
    let (out, _) = write_tar(&t, Hashing::new(BufWriter::new(file)), mtime)?;
    let size = out.len;
    out.inner
        .into_inner()
        .map_err(|e| io_err(&tmp)(e.into_error()))?
        .sync_all()
        .map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, archive).map_err(io_err(archive))?;
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_798_761_599), "2026-12-31T23:59:59Z");
    }

    #[test]
    fn tags_are_checked() {
        for ok in ["allox", "localhost/allox:dev", "reg.test:5000/a/b:1.0"] {
            assert!(check_tag(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Allox", "a//b", "a:", "a:b c", "allox:dev/x:"] {
            assert!(check_tag(bad).is_err(), "{bad:?}");
        }
    }

    fn small_tree(dir: &Path) -> Tree {
        let f = dir.join("f");
        std::fs::write(&f, "hello").unwrap();
        let mut t = Tree::new();
        t.dir("/etc", 0o755).unwrap();
        t.bytes("/etc/hostname", 0o644, b"allox\n".to_vec())
            .unwrap();
        t.file("/usr/bin/tool", &f).unwrap();
        t.symlink("/bin", "usr/bin").unwrap();
        t.char_dev("/dev/console", 0o600, 5, 1).unwrap();
        let long = format!("/usr/lib/{}/x", "d".repeat(120));
        t.bytes(&long, 0o644, b"x".to_vec()).unwrap();
        t
    }

    #[test]
    fn the_layer_holds_the_tree_with_fixed_owners_and_times() {
        let dir = tempfile::tempdir().unwrap();
        let t = small_tree(dir.path());
        let (bytes, n) = write_tar(&t, Vec::new(), 1234).unwrap();
        assert_eq!(n, t.len() - 1, "all but the device node");
        let mut a = tar::Archive::new(&bytes[..]);
        let mut seen = Vec::new();
        for e in a.entries().unwrap() {
            let e = e.unwrap();
            let h = e.header();
            assert_eq!((h.uid().unwrap(), h.gid().unwrap()), (0, 0));
            assert_eq!(h.mtime().unwrap(), 1234);
            assert_eq!(h.username_bytes(), Some(&b""[..]));
            seen.push(e.path().unwrap().display().to_string());
        }
        assert!(seen.contains(&"usr/bin/tool".to_string()), "{seen:?}");
        assert!(seen.iter().any(|p| p.len() > 120), "long names survive");
        assert!(!seen.iter().any(|p| p.starts_with("dev/console")));
    }

    #[test]
    fn the_same_tree_gives_the_same_digest_and_another_mtime_another() {
        let dir = tempfile::tempdir().unwrap();
        let t = small_tree(dir.path());
        let a = write_layout(
            &t,
            &dir.path().join("a"),
            "localhost/allox:dev",
            "default",
            0,
        )
        .unwrap();
        let b = write_layout(
            &t,
            &dir.path().join("b"),
            "localhost/allox:dev",
            "default",
            0,
        )
        .unwrap();
        assert_eq!(a, b);
        let c = write_layout(
            &t,
            &dir.path().join("c"),
            "localhost/allox:dev",
            "default",
            1,
        )
        .unwrap();
        assert_ne!(a.digest, c.digest);
        let index: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("a/index.json")).unwrap())
                .unwrap();
        assert_eq!(index["manifests"][0]["digest"], a.digest);
        // Every blob is named by its digest.
        for e in std::fs::read_dir(dir.path().join("a/blobs/sha256")).unwrap() {
            let e = e.unwrap();
            let data = std::fs::read(e.path()).unwrap();
            assert_eq!(
                sha256(&data),
                format!("sha256:{}", e.file_name().to_str().unwrap())
            );
        }
        let ra = write_archive(&dir.path().join("a"), &dir.path().join("a.tar"), 0).unwrap();
        let rb = write_archive(&dir.path().join("b"), &dir.path().join("b.tar"), 0).unwrap();
        assert_eq!(ra, rb);
        assert_eq!(
            std::fs::read(dir.path().join("a.tar")).unwrap(),
            std::fs::read(dir.path().join("b.tar")).unwrap()
        );
        let e = write_layout(&t, &dir.path().join("a"), "allox", "default", 0).unwrap_err();
        assert!(e.to_string().contains("is not an empty directory"), "{e}");
    }
}
