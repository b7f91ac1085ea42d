//! A check of a Btrfs send stream (version 1) before `btrfs receive`
//! applies it: the stream makes one subvolume of the expected name; every
//! other subvolume it refers to (its parent, the sources of its clones) is
//! one the archive brought earlier or its base, never another tree of the
//! receiving filesystem (which would copy another session's files into
//! this one), and is named to receive by its own UUID on this filesystem,
//! not the sender's (which another tree here may carry too); no path in
//! it leaves its subvolume; it makes no device node; every command's
//! checksum holds; no command names an attribute twice
//! (receive would act on the last, the check on the first) or one
//! version 1 has not. What passes on to `btrfs receive` is the stream as
//! checked, a whole command at a time, with three changes: a reference
//! to another tree names it by its UUID here (above); a mode with a
//! setuid or setgid bit (an agent's `chmod g+s` in its own session) loses
//! those bits, and the command its checksum anew; an extended attribute
//! only a privileged process sets (`security.*`, file capabilities among
//! them, and `trusted.*`) is left out — no file of a session holds a
//! privilege, and an archive that had one still imports
//! ([`Inspector::dropped`] counts them). The layout is the
//! kernel's (`fs/btrfs/send.h`): a header, then commands of a 10-byte head
//! (length, command, crc32c of the command with that field zero) and
//! attributes of a 4-byte head (type, length).

const MAGIC: &[u8; 13] = b"btrfs-stream\0";
/// The most one command may carry in version 1 (the kernel's send buffer
/// is 64 KiB; a little room above it).
const MAX_COMMAND: usize = 128 << 10;

const C_SUBVOL: u16 = 1;
const C_SNAPSHOT: u16 = 2;
const C_MKNOD: u16 = 5;
const C_SYMLINK: u16 = 8;
const C_CLONE: u16 = 16;
const C_SET_XATTR: u16 = 13;
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
const A_XATTR_NAME: u16 = 13;
/// The last attribute type of version 1.
const A_MAX_V1: u16 = 24;

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
    dropped: u64,
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
            dropped: 0,
        }
    }

    /// Checks the next bytes; `local` gives, for a UUID the stream may
    /// refer to (a tree the archive brought, or its base), the UUID of
    /// that tree on this filesystem, and `None` for any other (the
    /// stream's own is always allowed for clones). A reference is
    /// rewritten to the local tree's own UUID: `btrfs receive` looks a
    /// parent or a clone source up by received UUID first, on the whole
    /// filesystem, and takes the first it finds, which may be another
    /// session's copy of the same archive (or one made to collide), while
    /// a subvolume's own UUID is its alone. Answers
    /// what may go on to `btrfs receive`: the header, and the commands
    /// completed and checked so far (a command cut by the end of `bytes`
    /// waits for the rest).
    pub fn push(
        &mut self,
        mut bytes: &[u8],
        local: &dyn Fn(&[u8; 16]) -> Option<[u8; 16]>,
    ) -> Result<Vec<u8>, String> {
        let mut out = Vec::with_capacity(bytes.len());
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
                    out.append(&mut self.buf);
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
                let mut cmd = std::mem::take(&mut self.buf);
                if self.command(&mut cmd, local)? {
                    out.extend_from_slice(&cmd);
                }
            }
        }
        Ok(out)
    }

    /// How many privileges were dropped: setuid or setgid bits of a
    /// mode, privileged extended attributes (`security.*`, file
    /// capabilities among them, and `trusted.*`).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Checks one whole command (and rewrites a set-id mode or a
    /// reference to another tree in it); whether it goes on to receive (a
    /// privileged attribute does not).
    fn command(
        &mut self,
        cmd: &mut [u8],
        local: &dyn Fn(&[u8; 16]) -> Option<[u8; 16]>,
    ) -> Result<bool, String> {
        let kind = u16::from_le_bytes([cmd[4], cmd[5]]);
        if kind == 0 || kind > C_MAX_V1 {
            return Err(format!("command {kind} is not one of version 1"));
        }
        let sum = le32(&cmd[6..10]);
        if checksum(cmd) != sum {
            return Err(format!("the checksum of a command {kind} does not match"));
        }
        // Each attribute: its type, and where its value is in `cmd`.
        let mut attrs: Vec<(u16, std::ops::Range<usize>)> = Vec::new();
        let mut at = 10;
        while at < cmd.len() {
            let rest = &cmd[at..];
            if rest.len() < 4 {
                return Err("an attribute is cut short".into());
            }
            let t = u16::from_le_bytes([rest[0], rest[1]]);
            let l = u16::from_le_bytes([rest[2], rest[3]]) as usize;
            if rest.len() < 4 + l {
                return Err("an attribute is cut short".into());
            }
            // Receive keeps the last of a type given twice, the check
            // would read the first: the kernel gives each once.
            if t == 0 || t > A_MAX_V1 {
                return Err(format!(
                    "a command {kind} has attribute {t}, not one of version 1"
                ));
            }
            if attrs.iter().any(|(k, _)| *k == t) {
                return Err(format!("a command {kind} has attribute {t} twice"));
            }
            attrs.push((t, at + 4..at + 4 + l));
            at += 4 + l;
        }
        let value = |t: u16| attrs.iter().find(|(k, _)| *k == t).map(|(_, r)| r.clone());
        let whole: &[u8] = cmd;
        let attr = |t: u16| value(t).map(|r| &whole[r]);
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
                let own = uuid(A_UUID)?;
                let parent = if kind == C_SNAPSHOT {
                    let p = uuid(A_CLONE_UUID)?;
                    let Some(l) = local(&p) else {
                        return Err(
                            "it is relative to a subvolume the archive does not bring".into()
                        );
                    };
                    refer(cmd, value(A_CLONE_UUID), &l);
                    Some(p)
                } else {
                    None
                };
                self.made = Some(Made { uuid: own, parent });
            }
            C_CLONE => {
                let src = uuid(A_CLONE_UUID)?;
                let own = self.made.as_ref().map(|m| m.uuid);
                if Some(src) != own {
                    let Some(l) = local(&src) else {
                        return Err("it clones from a subvolume the archive does not bring".into());
                    };
                    refer(cmd, value(A_CLONE_UUID), &l);
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
                let Some(r) = value(A_MODE).filter(|r| r.len() == 8) else {
                    return Err("a chmod command lacks its mode".into());
                };
                let mode = u64::from_le_bytes(cmd[r.clone()].try_into().expect("8 bytes"));
                if mode & 0o6000 != 0 {
                    cmd[r].copy_from_slice(&(mode & !0o6000).to_le_bytes());
                    reseal(cmd);
                    self.dropped += 1;
                }
            }
            C_SET_XATTR => {
                // File capabilities, and what only a privileged process
                // sets (`trusted.*`, `security.*`): not kept.
                let name = attr(A_XATTR_NAME).unwrap_or_default();
                if name.starts_with(b"security.") || name.starts_with(b"trusted.") {
                    self.dropped += 1;
                    return Ok(false);
                }
            }
            C_END => self.ended = true,
            _ => {}
        }
        Ok(true)
    }

    /// The stream ended where it should; what it made.
    pub fn finish(&self) -> Result<Made, String> {
        match (&self.made, self.ended) {
            (Some(m), true) => Ok(m.clone()),
            _ => Err("the send stream ends before its end command".into()),
        }
    }
}

/// Writes `uuid` over the attribute at `at` (a UUID, checked before) of
/// `cmd`, with the command's checksum made anew.
fn refer(cmd: &mut [u8], at: Option<std::ops::Range<usize>>, uuid: &[u8; 16]) {
    let at = at.expect("the attribute was read");
    if cmd[at.clone()] != uuid[..] {
        cmd[at].copy_from_slice(uuid);
        reseal(cmd);
    }
}

/// Makes a changed command's checksum anew.
fn reseal(cmd: &mut [u8]) {
    cmd[6..10].copy_from_slice(&[0; 4]);
    let sum = checksum(cmd);
    cmd[6..10].copy_from_slice(&sum.to_le_bytes());
}

/// A command's checksum as the kernel makes it: crc32c from 0, with no
/// final inversion, over the command with its checksum field zero.
fn checksum(cmd: &[u8]) -> u32 {
    let mut c = crc32c::crc32c_append(!0, &cmd[..6]);
    c = crc32c::crc32c_append(c, &[0; 4]);
    !crc32c::crc32c_append(c, &cmd[10..])
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
        let sum = checksum(&c);
        c[6..10].copy_from_slice(&sum.to_le_bytes());
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

    /// What the stream made, and what passed on to receive.
    fn checked(s: &[u8]) -> Result<(Made, Vec<u8>, u64), String> {
        let mut i = Inspector::new("c1");
        let parent = [7u8; 16];
        let mut out = Vec::new();
        for piece in s.chunks(5) {
            out.extend(i.push(piece, &|u| (*u == parent).then_some(parent))?);
        }
        Ok((i.finish()?, out, i.dropped()))
    }

    #[test]
    fn a_reference_to_another_tree_names_that_tree_s_own_uuid_here() {
        // The sender's parent [7; 16] is, on this filesystem, the
        // subvolume whose own UUID is [8; 16].
        let s = stream(&[
            cmd(
                C_SNAPSHOT,
                &[(A_PATH, b"c1"), (A_UUID, &OWN), (A_CLONE_UUID, &[7; 16])],
            ),
            cmd(C_CLONE, &[(A_PATH, b"a"), (A_CLONE_UUID, &[7; 16])]),
            cmd(C_CLONE, &[(A_PATH, b"b"), (A_CLONE_UUID, &OWN)]),
            cmd(C_END, &[]),
        ]);
        let mut i = Inspector::new("c1");
        let out = i.push(&s, &|u| (*u == [7; 16]).then_some([8; 16])).unwrap();
        // What it made is said in the sender's terms.
        assert_eq!(
            i.finish().unwrap(),
            Made {
                uuid: OWN,
                parent: Some([7; 16])
            }
        );
        assert_eq!(
            out,
            stream(&[
                cmd(
                    C_SNAPSHOT,
                    &[(A_PATH, b"c1"), (A_UUID, &OWN), (A_CLONE_UUID, &[8; 16])],
                ),
                cmd(C_CLONE, &[(A_PATH, b"a"), (A_CLONE_UUID, &[8; 16])]),
                cmd(C_CLONE, &[(A_PATH, b"b"), (A_CLONE_UUID, &OWN)]),
                cmd(C_END, &[]),
            ])
        );
    }

    fn check(s: &[u8]) -> Result<Made, String> {
        checked(s).map(|(m, _, _)| m)
    }

    #[test]
    fn the_checksum_is_the_kernel_s() {
        // Chmod commands as `btrfs send` (Linux 6.18) wrote them: the
        // subvolume's root to 0755 and "f" to 0644, their checksums as the
        // kernel made them.
        for (hex, mode) in [
            (
                "100000001200595575350f00000005000800ed01000000000000",
                0o755,
            ),
            (
                "110000001200b7cb58630f0001006605000800a401000000000000",
                0o644,
            ),
        ] {
            let c: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            assert_eq!(checksum(&c), le32(&c[6..10]), "{hex}");
            assert_eq!(c[c.len() - 8..], (mode as u64).to_le_bytes());
        }
        let mut c = cmd(
            C_CHMOD,
            &[(A_PATH, b"f"), (A_MODE, &0o644u64.to_le_bytes())],
        );
        c[12] ^= 1;
        let e = check(&stream(&[
            cmd(C_SUBVOL, &[(A_PATH, b"c1"), (A_UUID, &OWN)]),
            c,
            cmd(C_END, &[]),
        ]))
        .unwrap_err();
        assert!(e.contains("checksum"), "{e}");
    }

    #[test]
    fn a_setuid_or_setgid_bit_is_dropped_and_the_rest_passes_as_it_came() {
        let s = stream(&[
            cmd(C_SUBVOL, &[(A_PATH, b"c1"), (A_UUID, &OWN)]),
            cmd(
                C_CHMOD,
                &[(A_PATH, b"dir"), (A_MODE, &0o2775u64.to_le_bytes())],
            ),
            cmd(
                C_CHMOD,
                &[(A_PATH, b"tool"), (A_MODE, &0o4755u64.to_le_bytes())],
            ),
            cmd(
                C_CHMOD,
                &[(A_PATH, b"tmp"), (A_MODE, &0o1777u64.to_le_bytes())],
            ),
            cmd(C_END, &[]),
        ]);
        let (_, out, dropped) = checked(&s).unwrap();
        assert_eq!(dropped, 2);
        let want = stream(&[
            cmd(C_SUBVOL, &[(A_PATH, b"c1"), (A_UUID, &OWN)]),
            cmd(
                C_CHMOD,
                &[(A_PATH, b"dir"), (A_MODE, &0o775u64.to_le_bytes())],
            ),
            cmd(
                C_CHMOD,
                &[(A_PATH, b"tool"), (A_MODE, &0o755u64.to_le_bytes())],
            ),
            cmd(
                C_CHMOD,
                &[(A_PATH, b"tmp"), (A_MODE, &0o1777u64.to_le_bytes())],
            ),
            cmd(C_END, &[]),
        ]);
        assert_eq!(out, want);
        // What passed is a stream that checks again, as it is.
        let (_, again, none) = checked(&out).unwrap();
        assert_eq!((again, none), (want, 0));
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
    fn an_attribute_given_twice_or_unknown_is_refused() {
        let head = cmd(C_SUBVOL, &[(A_PATH, b"c1"), (A_UUID, &OWN)]);
        for (c, want) in [
            (
                cmd(
                    C_CHMOD,
                    &[
                        (A_PATH, b"tool"),
                        (A_MODE, &0o755u64.to_le_bytes()),
                        (A_MODE, &0o4755u64.to_le_bytes()),
                    ],
                ),
                "attribute 5 twice",
            ),
            (
                cmd(
                    9,
                    &[(A_PATH, b"a"), (A_PATH_TO, b"b"), (A_PATH_TO, b"../x")],
                ),
                "attribute 16 twice",
            ),
            (cmd(3, &[(A_PATH, b"a"), (25, b"x")]), "attribute 25"),
        ] {
            let e = check(&stream(&[head.clone(), c, cmd(C_END, &[])])).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        // A snapshot relative to a tree the archive brought, then, as
        // receive would take it, to another of the filesystem.
        let e = check(&stream(&[
            cmd(
                C_SNAPSHOT,
                &[
                    (A_PATH, b"c1"),
                    (A_UUID, &OWN),
                    (A_CLONE_UUID, &[7; 16]),
                    (A_CLONE_UUID, &[9; 16]),
                ],
            ),
            cmd(C_END, &[]),
        ]))
        .unwrap_err();
        assert!(e.contains("attribute 20 twice"), "{e}");
    }

    #[test]
    fn privileged_extended_attributes_are_left_out() {
        let xattr = |name: &[u8]| {
            cmd(
                C_SET_XATTR,
                &[(A_PATH, b"f"), (A_XATTR_NAME, name), (14, b"v")],
            )
        };
        let head = cmd(C_SUBVOL, &[(A_PATH, b"c1"), (A_UUID, &OWN)]);
        let (_, out, dropped) = checked(&stream(&[
            head.clone(),
            xattr(b"security.capability"),
            xattr(b"user.note"),
            xattr(b"trusted.overlay.opaque"),
            xattr(b"security.selinux"),
            xattr(b"system.posix_acl_access"),
            cmd(C_END, &[]),
        ]))
        .unwrap();
        assert_eq!(dropped, 3);
        assert_eq!(
            out,
            stream(&[
                head,
                xattr(b"user.note"),
                xattr(b"system.posix_acl_access"),
                cmd(C_END, &[])
            ])
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
