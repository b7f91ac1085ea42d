//! `allox share ...`: the share plugin's routes from inside a sandbox
//! (docs/share.md). Each command is one or more `plugin.call`s through the
//! guest socket; a file is read in parts that must all come from one tree
//! of the target's files, and written whole (beside the target, renamed
//! into place) or, past one call's size, as an upload committed at its
//! end.

use allox_protocol::sandbox_api::{PluginCall, SandboxRequest, SandboxResponse};
use allox_protocol::{
    Bytes, ErrorBody, FsEntry, FsKind, FsListing, FsWritten, ShareData, ShareEnable, ShareInfo,
    SharePath, SharePermission, ShareRead, ShareStatus, ShareWrite, SHARE_WRITE_MAX,
};
use clap::{Subcommand, ValueEnum};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

#[derive(Subcommand, Debug)]
pub enum ShareCmd {
    /// Offer this session's files to the other sessions that share.
    Enable {
        /// A directory of this session's files (default: all of them).
        #[arg(long)]
        scope: Option<String>,
        #[arg(long, value_enum, default_value = "read")]
        permission: Permission,
    },
    /// Stop offering them: every request decided from now on is refused.
    Disable,
    /// This session's sharing, and the sessions it can reach.
    Status,
    /// The entries of a directory in TARGET's scope (TARGET is
    /// agent/session).
    List {
        target: String,
        path: Option<String>,
        #[arg(long)]
        depth: Option<u32>,
    },
    /// One entry in TARGET's scope.
    Stat { target: String, path: String },
    /// A file in TARGET's scope, to standard output (or --out).
    Read {
        target: String,
        path: String,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Replace a file in TARGET's scope with standard input (or --from);
    /// TARGET must share with write permission and have no live run.
    Write {
        target: String,
        path: String,
        #[arg(long)]
        from: Option<PathBuf>,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum Permission {
    Read,
    Write,
}

impl From<Permission> for SharePermission {
    fn from(p: Permission) -> SharePermission {
        match p {
            Permission::Read => SharePermission::Read,
            Permission::Write => SharePermission::Write,
        }
    }
}

/// One route called; its JSON answer decoded as `T`.
fn call<T: serde::de::DeserializeOwned>(
    socket: &Path,
    route: &str,
    params: &impl serde::Serialize,
) -> Result<T, ErrorBody> {
    let params = serde_json::to_string(params).map_err(|e| ErrorBody::invalid(e.to_string()))?;
    let req = SandboxRequest::PluginCall(PluginCall {
        route: route.into(),
        params,
    });
    match crate::sandbox_call::ask(socket, req)? {
        SandboxResponse::Plugin(p) => serde_json::from_str(&p.result)
            .map_err(|e| ErrorBody::invalid(format!("{route} answered what does not read: {e}"))),
        other => Err(ErrorBody::invalid(format!(
            "{route} answered {}",
            other.to_json()
        ))),
    }
}

fn io_err(what: &str, e: std::io::Error) -> ErrorBody {
    ErrorBody::invalid(format!("{what}: {e}"))
}

/// Runs a share command; what it prints goes to `out`.
pub fn run(
    socket: &Path,
    cmd: &ShareCmd,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), ErrorBody> {
    let print = |out: &mut dyn Write, human: String, v: &dyn erased::Json| {
        let text = if json {
            format!("{}\n", v.json())
        } else {
            human
        };
        out.write_all(text.as_bytes())
            .map_err(|e| io_err("cannot write the answer", e))
    };
    match cmd {
        ShareCmd::Enable { scope, permission } => {
            let i: ShareInfo = call(
                socket,
                "share.enable",
                &ShareEnable {
                    scope: scope.clone(),
                    permission: Some((*permission).into()),
                },
            )?;
            print(out, info_line(&i), &i)
        }
        ShareCmd::Disable => {
            let i: ShareInfo = call(socket, "share.disable", &serde_json::json!({}))?;
            print(out, info_line(&i), &i)
        }
        ShareCmd::Status => {
            let st: ShareStatus = call(socket, "share.status", &serde_json::json!({}))?;
            let mut h = info_line(&st.own);
            for p in &st.peers {
                h.push_str(&format!("  reachable: {}\n", info_line(p).trim_end()));
            }
            print(out, h, &st)
        }
        ShareCmd::List {
            target,
            path,
            depth,
        } => {
            let l: FsListing = call(
                socket,
                "share.list",
                &SharePath {
                    target: target.clone(),
                    path: path.clone(),
                    depth: *depth,
                },
            )?;
            let mut h: String = l.entries.iter().map(entry_line).collect();
            if l.truncated {
                h.push_str("(more entries than one answer holds)\n");
            }
            print(out, h, &l)
        }
        ShareCmd::Stat { target, path } => {
            let e: FsEntry = call(
                socket,
                "share.stat",
                &SharePath {
                    target: target.clone(),
                    path: Some(path.clone()),
                    depth: None,
                },
            )?;
            print(out, entry_line(&e), &e)
        }
        ShareCmd::Read {
            target,
            path,
            out: file,
        } => {
            let data = read_all(socket, target, path)?;
            match file {
                Some(f) => std::fs::write(f, &data)
                    .map_err(|e| io_err(&format!("cannot write {}", f.display()), e)),
                None => out
                    .write_all(&data)
                    .map_err(|e| io_err("cannot write to standard output", e)),
            }
        }
        ShareCmd::Write { target, path, from } => {
            let mut data = Vec::new();
            match from {
                Some(f) => {
                    data = std::fs::read(f)
                        .map_err(|e| io_err(&format!("cannot read {}", f.display()), e))?
                }
                None => {
                    std::io::stdin()
                        .read_to_end(&mut data)
                        .map_err(|e| io_err("cannot read standard input", e))?;
                }
            }
            let w = write_all(socket, target, path, data)?;
            print(
                out,
                format!("wrote {} bytes to {target}:{}\n", w.size, w.path),
                &w,
            )
        }
    }
}

/// The whole file, its parts from one tree (a rollback of the target in
/// between is `conflict`, never a mix).
fn read_all(socket: &Path, target: &str, path: &str) -> Result<Vec<u8>, ErrorBody> {
    let mut data = Vec::new();
    let mut tree = None;
    loop {
        let d: ShareData = call(
            socket,
            "share.read",
            &ShareRead {
                target: target.into(),
                path: path.into(),
                offset: Some(data.len() as u64),
                length: None,
                tree,
            },
        )?;
        tree = Some(d.tree);
        let n = d.file.data.len();
        data.extend_from_slice(&d.file.data);
        if d.file.eof || n == 0 {
            return Ok(data);
        }
    }
}

/// The file becomes `data`: in one call, or as an upload committed with
/// its last chunk.
fn write_all(
    socket: &Path,
    target: &str,
    path: &str,
    data: Vec<u8>,
) -> Result<FsWritten, ErrorBody> {
    if data.len() <= SHARE_WRITE_MAX {
        return call(
            socket,
            "share.write",
            &ShareWrite {
                target: target.into(),
                path: path.into(),
                data: Bytes(data),
                ..ShareWrite::default()
            },
        );
    }
    let id = format!(
        "share-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let chunks: Vec<&[u8]> = data.chunks(SHARE_WRITE_MAX).collect();
    let mut last = None;
    for (i, c) in chunks.iter().enumerate() {
        last = Some(call(
            socket,
            "share.write",
            &ShareWrite {
                target: target.into(),
                path: path.into(),
                data: Bytes(c.to_vec()),
                offset: Some((i * SHARE_WRITE_MAX) as u64),
                upload: Some(id.clone()),
                commit: i + 1 == chunks.len(),
                create: None,
            },
        )?);
    }
    last.ok_or_else(|| ErrorBody::invalid("nothing to write"))
}

fn info_line(i: &ShareInfo) -> String {
    match (&i.scope, i.permission) {
        (Some(scope), Some(p)) if i.enabled => format!(
            "{} shares {scope} ({p}, set by {})\n",
            i.target(),
            origin(i)
        ),
        _ => format!("{} does not share (set by {})\n", i.target(), origin(i)),
    }
}

fn origin(i: &ShareInfo) -> &'static str {
    match i.origin {
        allox_protocol::ShareOrigin::Default => "default",
        allox_protocol::ShareOrigin::Session => "the session",
        allox_protocol::ShareOrigin::Host => "the host",
        allox_protocol::ShareOrigin::Agent => "its agent's default",
        allox_protocol::ShareOrigin::AgentDenied => "the host, for its agent",
    }
}

fn entry_line(e: &FsEntry) -> String {
    let kind = match e.kind {
        FsKind::File => "file",
        FsKind::Dir => "dir",
        FsKind::Symlink => "link",
        FsKind::Other => "other",
    };
    match &e.link {
        Some(l) => format!("{kind:<5} {:>10} {} -> {l}\n", e.size, e.path),
        None => format!("{kind:<5} {:>10} {}\n", e.size, e.path),
    }
}

/// Answers printed as JSON whatever their type.
mod erased {
    pub trait Json {
        fn json(&self) -> String;
    }

    impl<T: serde::Serialize> Json for T {
        fn json(&self) -> String {
            serde_json::to_string(self).unwrap_or_default()
        }
    }
}
