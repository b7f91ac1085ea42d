//! A check of a Btrfs send stream (version 1) before `btrfs receive`
//! applies it: the stream makes one subvolume of the expected name; every
//! other subvolume it refers to (its parent, the sources of its clones) is
//! one the archive brought earlier or its base, never another tree of the
//! receiving filesystem (which would copy another session's files into
//! this one); no path in it leaves its subvolume; it makes no device node
//! and no setuid or setgid file. The layout is the kernel's
//! (`fs/btrfs/send.h`): a header, then commands of a 10-byte head (length,
//! command, crc32c) and attributes of a 4-byte head (type, length).

const MAGIC: &[u8; 13] = b"btrfs-stream\0";
/// The most one command may carry in version 1 (the kernel's send buffer
/// is 64 KiB; a little room above it).
const MAX_COMMAND: usize = 128 << 10;

const C_SUBVOL: u16 = 1;
const C_SNAPSHOT: u16 = 2;
const C_MKNOD: u16 = 5;
const C_SYMLINK: u16 = 8;
const C_CLONE: u16 = 16;
const C_CHMOD: u16 = 18;
const C_END: u16 = 21;
const C_MAX_V1: u16 = 22;

const A_UUID: u16 = 1;
const A_MODE: u16 = 5;
const A_PATH: u16 = 15;
const A_PATH_TO: u16 = 16;
const A_PATH_LINK: u16 = 17;
const A_CLONE_UUID: u16 = 20;
const A_CLONE_PATH: u16 = 22;

/// What the stream said about itself once whole.
#[derive(Debug, Clone, PartialEq)]
pub struct Made {
    /// The UUID the sender gave the subvolume (its received UUID here).
    pub uuid: [u8; 16],
    /// The subvolume it is relative to, if any.
    pub parent: Option<[u8; 16]>,
}

/// Reads a send stream pushed in pieces.
pub struct Inspector {
    name: String,
    buf: Vec<u8>,
    header: bool,
    made: Option<Made>,
    ended: bool,
}

impl Inspector {
    /// For a stream that must make the subvolume `name`.
    pub fn new(name: &str) -> Inspector {
        Inspector {
            name: name.into(),
            buf: Vec::new(),
            header: false,
            made: None,
            ended: false,
        }
    }

    /// Checks the next bytes; `known` says whether a referenced UUID may
    /// be used (the stream's own is always allowed for clones).
    pub fn push(
        &mut self,
        mut bytes: &[u8],
        known: &dyn Fn(&[u8; 16]) -> bool,
    ) -> Result<(), String> {
        while !bytes.is_empty() {
            if self.ended {
                return Err("bytes follow the stream's end command".into());
            }
            if !self.header {
                let want = MAGIC.len() + 4;
                let n = (want - self.buf.len()).min(bytes.len());
                self.buf.extend_from_slice(&bytes[..n]);
                bytes = &bytes[n..];
                let m = self.buf.len().min(MAGIC.len());
                if self.buf[..m] != MAGIC[..m] {
                    return Err("not a Btrfs send stream".into());
                }
                if self.buf.len() == want {
                    let v = le32(&self.buf[13..17]);
                    if v != 1 {
                        return Err(format!("send stream version {v}; only version 1 is read"));
                    }
                    self.header = true;
                    self.buf.clear();
                }
                continue;
            }
            if self.buf.len() < 10 {
                let n = (10 - self.buf.len()).min(bytes.len());
                self.buf.extend_from_slice(&bytes[..n]);
                bytes = &bytes[n..];
                if self.buf.len() < 10 {
                    continue;
                }
                let len = le32(&self.buf[0..4]) as usize;
                if len > MAX_COMMAND {
                    return Err(format!(
                        "a command claims {len} bytes; the most is {MAX_COMMAND}"
                    ));
                }
            }
            let len = le32(&self.buf[0..4]) as usize;
            let n = (10 + len - self.buf.len()).min(bytes.len());
            self.buf.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.buf.len() == 10 + len {
                let cmd = std::mem::take(&mut self.buf);
                self.command(&cmd, known)?;
            }
        }
        Ok(())
    }

    fn command(&mut self, cmd: &[u8], known: &dyn Fn(&[u8; 16]) -> bool) -> Result<(), String> {
        let kind = u16::from_le_bytes([cmd[4], cmd[5]]);
        if kind == 0 || kind > C_MAX_V1 {
            return Err(format!("command {kind} is not one of version 1"));
        }
        let mut attrs: Vec<(u16, &[u8])> = Vec::new();
        let mut rest = &cmd[10..];
        while !rest.is_empty() {
            if rest.len() < 4 {
                return Err("an attribute is cut short".into());
            }
            let t = u16::from_le_bytes([rest[0], rest[1]]);
            let l = u16::from_le_bytes([rest[2], rest[3]]) as usize;
            if rest.len() < 4 + l {
                return Err("an attribute is cut short".into());
            }
            attrs.push((t, &rest[4..4 + l]));
            rest = &rest[4 + l..];
        }
        let attr = |t: u16| attrs.iter().find(|(k, _)| *k == t).map(|(_, v)| *v);
        let uuid = |t: u16| -> Result<[u8; 16], String> {
            attr(t)
                .and_then(|v| <[u8; 16]>::try_from(v).ok())
                .ok_or_else(|| format!("command {kind} lacks a UUID"))
        };
        let first = kind == C_SUBVOL || kind == C_SNAPSHOT;
        if self.made.is_none() != first {
            return Err(if first {
                "a second subvolume in one stream".into()
            } else {
                "the stream does not begin by making its subvolume".into()
            });
        }
        for t in [A_PATH, A_PATH_TO, A_CLONE_PATH]
            .into_iter()
            .chain((kind != C_SYMLINK).then_some(A_PATH_LINK))
        {
            if let Some(p) = attr(t) {
                if escapes(p) {
                    return Err(format!(
                        "the path {:?} leaves the subvolume",
                        String::from_utf8_lossy(p)
                    ));
                }
            }
        }
        match kind {
            C_SUBVOL | C_SNAPSHOT => {
                let name = attr(A_PATH).unwrap_or_default();
                if name != self.name.as_bytes() {
                    return Err(format!(
                        "it makes the subvolume {:?} where {:?} is expected",
                        String::from_utf8_lossy(name),
                        self.name
                    ));
                }
                let parent = if kind == C_SNAPSHOT {
                    let p = uuid(A_CLONE_UUID)?;
                    if !known(&p) {
                        return Err(
                            "it is relative to a subvolume the archive does not bring".into()
                        );
                    }
                    Some(p)
                } else {
                    None
                };
                self.made = Some(Made {
                    uuid: uuid(A_UUID)?,
                    parent,
                });
            }
            C_CLONE => {
                let src = uuid(A_CLONE_UUID)?;
                let own = self.made.as_ref().map(|m| m.uuid);
                if Some(src) != own && !known(&src) {
                    return Err("it clones from a subvolume the archive does not bring".into());
                }
            }
            C_MKNOD => {
                let p = attr(A_PATH).unwrap_or_default();
                return Err(format!(
                    "it makes a device node ({:?})",
                    String::from_utf8_lossy(p)
                ));
            }
            C_CHMOD => {
                let mode = attr(A_MODE)
                    .and_then(|v| <[u8; 8]>::try_from(v).ok())
                    .map(u64::from_le_bytes)
                    .unwrap_or(0);
                if mode & 0o6000 != 0 {
                    let p = attr(A_PATH).unwrap_or_default();
                    return Err(format!(
                        "it makes {:?} setuid or setgid (mode {mode:o})",
                        String::from_utf8_lossy(p)
                    ));
                }
            }
            C_END => self.ended = true,
            _ => {}
        }
        Ok(())
    }

    /// The stream ended where it should; what it made.
    pub fn finish(&self) -> Result<Made, String> {
        match (&self.made, self.ended) {
            (Some(m), true) => Ok(m.clone()),
            _ => Err("the send stream ends before its end command".into()),
        }
    }
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Whether a path in a stream is absolute or climbs out with `..`.
fn escapes(p: &[u8]) -> bool {
    p.first() == Some(&b'/') || p.split(|b| *b == b'/').any(|c| c == b"..")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(kind: u16, attrs: &[(u16, &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        for (t, v) in attrs {
            body.extend(t.to_le_bytes());
            body.extend((v.len() as u16).to_le_bytes());
            body.extend(*v);
        }
        let mut c = (body.len() as u32).to_le_bytes().to_vec();
        c.extend(kind.to_le_bytes());
        c.extend([0; 4]);
        c.extend(body);
        c
    }

    fn stream(cmds: &[Vec<u8>]) -> Vec<u8> {
        let mut s = MAGIC.to_vec();
        s.extend(1u32.to_le_bytes());
        for c in cmds {
            s.extend(c);
        }
        s
    }

    fn check(s: &[u8]) -> Result<Made, String> {
        let mut i = Inspector::new("c1");
        let parent = [7u8; 16];
        for piece in s.chunks(5) {
            i.push(piece, &|u| *u == parent)?;
        }
        i.finish()
    }

    const OWN: [u8; 16] = [1; 16];

    #[test]
    fn a_plain_stream_passes_and_says_what_it_made() {
        let s = stream(&[
            cmd(
                C_SNAPSHOT,
                &[(A_PATH, b"c1"), (A_UUID, &OWN), (A_CLONE_UUID, &[7; 16])],
            ),
            cmd(3, &[(A_PATH, b"dir/file")]),
            cmd(C_CLONE, &[(A_PATH, b"dir/file"), (A_CLONE_UUID, &OWN)]),
            cmd(
                C_SYMLINK,
                &[(A_PATH, b"l"), (A_PATH_LINK, b"../../anything")],
            ),
            cmd(
                C_CHMOD,
                &[(A_PATH, b"dir/file"), (A_MODE, &0o755u64.to_le_bytes())],
            ),
            cmd(C_END, &[]),
        ]);
        assert_eq!(
            check(&s),
            Ok(Made {
                uuid: OWN,
                parent: Some([7; 16])
            })
        );
    }

    #[test]
    fn what_would_reach_outside_the_session_is_refused() {
        let head = cmd(C_SUBVOL, &[(A_PATH, b"c1"), (A_UUID, &OWN)]);
        let refused = |c: Vec<u8>, want: &str| {
            let e = check(&stream(&[head.clone(), c, cmd(C_END, &[])])).unwrap_err();
            assert!(e.contains(want), "{e}");
        };
        refused(cmd(3, &[(A_PATH, b"../c0/x")]), "leaves the subvolume");
        refused(cmd(9, &[(A_PATH, b"a"), (A_PATH_TO, b"/etc/x")]), "leaves");
        refused(
            cmd(C_CLONE, &[(A_PATH, b"a"), (A_CLONE_UUID, &[9; 16])]),
            "clones from a subvolume the archive does not bring",
        );
        refused(cmd(C_MKNOD, &[(A_PATH, b"sda")]), "device node");
        refused(
            cmd(
                C_CHMOD,
                &[(A_PATH, b"sh"), (A_MODE, &0o4755u64.to_le_bytes())],
            ),
            "setuid",
        );
        let e = check(&stream(&[cmd(
            C_SNAPSHOT,
            &[(A_PATH, b"c1"), (A_UUID, &OWN), (A_CLONE_UUID, &[9; 16])],
        )]))
        .unwrap_err();
        assert!(e.contains("relative to a subvolume"), "{e}");
        let e = check(&stream(&[cmd(
            C_SUBVOL,
            &[(A_PATH, b"other"), (A_UUID, &OWN)],
        )]))
        .unwrap_err();
        assert!(e.contains("where \"c1\" is expected"), "{e}");
        let e = check(&stream(std::slice::from_ref(&head))).unwrap_err();
        assert!(e.contains("before its end"), "{e}");
        let mut huge = head.clone();
        huge.extend(u32::MAX.to_le_bytes());
        huge.extend([0; 6]);
        let e = check(&stream(&[huge])).unwrap_err();
        assert!(e.contains("claims"), "{e}");
    }
}
