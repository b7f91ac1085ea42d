//! The session archive: what `session.export` writes and `session.import`
//! reads — a manifest, then one Btrfs send stream per subvolume, then an
//! end mark that seals everything before it.
//!
//! ```text
//! "ALLOXSES" version:u32le
//! frame*: kind:u8 len:u32le payload[len]
//!   1 Manifest   postcard(Manifest), first and once
//!   2 Data       the next bytes of the current send stream
//!   3 StreamEnd  postcard(StreamEnd): the current stream's length and sha256
//!   4 End        postcard(End): the sha256 of every byte before this frame
//!                but data frames' payloads, for which the sha256 in each
//!                stream's end stands (so each byte is hashed once)
//! ```
//!
//! Streams come in the manifest's order, each closed by its `StreamEnd`.
//! The reader is pushed bytes as they arrive and holds at most one frame:
//! a frame claiming more than [`MAX_FRAME`] (the manifest:
//! [`MAX_MANIFEST`]) is refused before anything is buffered.

use crate::rows::{
    CheckpointRecord, ClockRecord, ForkRecord, NetworkRecord, PolicyRecord, TurnRecord,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub const MAGIC: &[u8; 8] = b"ALLOXSES";
/// The archive version this build writes and reads.
pub const VERSION: u32 = 2;
/// The most a data frame may carry.
pub const MAX_FRAME: usize = 1 << 20;
/// The most the manifest may take.
pub const MAX_MANIFEST: usize = 64 << 20;

const MANIFEST: u8 = 1;
const DATA: u8 = 2;
const STREAM_END: u8 = 3;
const END: u8 = 4;

/// Everything about a session but its trees.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Manifest {
    pub agent: String,
    pub session: String,
    pub created_ms: u64,
    /// The checkpoint `current/` descends from.
    pub head: Option<String>,
    pub network: NetworkRecord,
    pub policy: Option<PolicyRecord>,
    pub clock: Option<ClockRecord>,
    pub fork: Option<ForkRecord>,
    /// The resource limits the session was given beyond its daemon's
    /// defaults (version 2).
    pub limits: Limits,
    /// Every checkpoint of the session (with `since`: those after it), in
    /// creation order.
    pub checkpoints: Vec<ArchivedCheckpoint>,
    pub turns: Vec<(String, TurnRecord)>,
    /// The checkpoint the export is relative to, which the importing
    /// store must hold (with the UUID given).
    pub since: Option<Base>,
    /// The send streams that follow, in order.
    pub streams: Vec<StreamInfo>,
}

/// A session's cgroup limits; `None` is the importing daemon's default.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    pub pids_max: Option<u64>,
    pub memory_max: Option<u64>,
    /// `cpu.max` as (quota µs, period µs); a quota of `u64::MAX` is "max".
    pub cpu_max: Option<(u64, u64)>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ArchivedCheckpoint {
    pub id: String,
    pub record: CheckpointRecord,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Base {
    pub id: String,
    /// The UUID its copies carry as their received UUID (its own UUID on
    /// the store that made it).
    pub uuid: [u8; 16],
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct StreamInfo {
    pub tree: Tree,
    /// The checkpoint the stream is relative to (an earlier stream's or
    /// the base), if any.
    pub parent: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash)]
pub enum Tree {
    Checkpoint(String),
    /// A read-only snapshot of `current/` taken when the export began.
    Current,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct StreamEnd {
    pub bytes: u64,
    pub sha256: [u8; 32],
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct End {
    pub sha256: [u8; 32],
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ArchiveError {
    #[error("not an Allox session archive (it does not begin with {:?})", std::str::from_utf8(MAGIC).unwrap_or_default())]
    NotAnArchive,
    #[error("archive version {0}; this daemon reads version {VERSION} (export the session again with this build)")]
    Version(u32),
    #[error("frame of unknown kind {0}")]
    UnknownFrame(u8),
    #[error("a frame claims {claimed} bytes; the most it may have is {max}")]
    TooLarge { claimed: usize, max: usize },
    #[error("the manifest does not read: {0}")]
    Manifest(String),
    #[error("{0}")]
    Order(&'static str),
    #[error("stream {index} ({tree}) does not check: {what}")]
    Stream {
        index: usize,
        tree: String,
        what: String,
    },
    #[error("the archive's end mark does not match what came before it (the archive was changed)")]
    Sealed,
    #[error("the archive ends early: {0}")]
    Truncated(&'static str),
}

impl std::fmt::Display for Tree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tree::Checkpoint(c) => write!(f, "checkpoint {c}"),
            Tree::Current => f.write_str("current"),
        }
    }
}

/// Writes an archive to `out`, hashing as it goes.
pub struct Writer<W: std::io::Write> {
    out: W,
    all: Sha256,
    stream: Sha256,
    stream_bytes: u64,
    written: u64,
}

impl<W: std::io::Write> Writer<W> {
    pub fn new(mut out: W, manifest: &Manifest) -> std::io::Result<Writer<W>> {
        let mut head = MAGIC.to_vec();
        head.extend(VERSION.to_le_bytes());
        out.write_all(&head)?;
        let mut w = Writer {
            out,
            all: Sha256::new(),
            stream: Sha256::new(),
            stream_bytes: 0,
            written: 0,
        };
        w.all.update(&head);
        w.written = head.len() as u64;
        let m = postcard::to_stdvec(manifest).map_err(std::io::Error::other)?;
        w.frame(MANIFEST, &m)?;
        Ok(w)
    }

    fn frame(&mut self, kind: u8, payload: &[u8]) -> std::io::Result<()> {
        let mut head = [0u8; 5];
        head[0] = kind;
        head[1..].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        self.out.write_all(&head)?;
        self.out.write_all(payload)?;
        self.all.update(head);
        if kind != DATA {
            self.all.update(payload);
        }
        self.written += 5 + payload.len() as u64;
        Ok(())
    }

    /// The next bytes of the current stream.
    pub fn data(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let n = bytes.len().min(MAX_FRAME);
            self.stream.update(&bytes[..n]);
            self.stream_bytes += n as u64;
            self.frame(DATA, &bytes[..n])?;
            bytes = &bytes[n..];
        }
        Ok(())
    }

    /// Closes the current stream.
    pub fn end_stream(&mut self) -> std::io::Result<StreamEnd> {
        let end = StreamEnd {
            bytes: std::mem::take(&mut self.stream_bytes),
            sha256: std::mem::take(&mut self.stream).finalize().into(),
        };
        let p = postcard::to_stdvec(&end).map_err(std::io::Error::other)?;
        self.frame(STREAM_END, &p)?;
        Ok(end)
    }

    /// Seals the archive; answers its length and the writer.
    pub fn finish(mut self) -> std::io::Result<(u64, W)> {
        let end = End {
            sha256: self.all.clone().finalize().into(),
        };
        let p = postcard::to_stdvec(&end).map_err(std::io::Error::other)?;
        self.frame(END, &p)?;
        self.out.flush()?;
        Ok((self.written, self.out))
    }
}

/// What the reader found, in order.
#[derive(Debug, PartialEq)]
pub enum Item<'a> {
    Manifest(Box<Manifest>),
    /// Bytes of stream `index` (which the manifest lists).
    Data {
        index: usize,
        bytes: &'a [u8],
    },
    /// Stream `index` is whole and its hash checks.
    StreamEnd {
        index: usize,
    },
    /// The archive is whole and its seal checks.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Header,
    Frames,
    Done,
}

/// Reads an archive pushed to it in pieces of any size.
pub struct Reader {
    /// The header, a frame's head, or a (non-data) frame's payload so far.
    buf: Vec<u8>,
    state: State,
    /// The frame being read: its kind and length.
    frame: Option<(u8, usize)>,
    /// Bytes of a data frame's payload handed on so far.
    got: usize,
    all: Sha256,
    stream: Sha256,
    stream_bytes: u64,
    streams: Option<Vec<String>>,
    index: usize,
    read: u64,
}

impl Default for Reader {
    fn default() -> Self {
        Reader {
            buf: Vec::new(),
            state: State::Header,
            frame: None,
            got: 0,
            all: Sha256::new(),
            stream: Sha256::new(),
            stream_bytes: 0,
            streams: None,
            index: 0,
            read: 0,
        }
    }
}

/// An error of the reader or of what it handed on.
#[derive(Debug)]
pub enum PushError<E> {
    Archive(ArchiveError),
    Handler(E),
}

impl<E> From<ArchiveError> for PushError<E> {
    fn from(e: ArchiveError) -> Self {
        PushError::Archive(e)
    }
}

impl Reader {
    /// Bytes pushed so far.
    pub fn read(&self) -> u64 {
        self.read
    }

    /// Whether the end mark was read and checked.
    pub fn done(&self) -> bool {
        self.state == State::Done
    }

    /// Reads `bytes`, handing each item to `each` as soon as it is whole
    /// (a data frame's bytes as they come).
    pub fn push<E>(
        &mut self,
        mut bytes: &[u8],
        each: &mut dyn FnMut(Item<'_>) -> Result<(), E>,
    ) -> Result<(), PushError<E>> {
        self.read += bytes.len() as u64;
        while !bytes.is_empty() {
            match (self.state, self.frame) {
                (State::Done, _) => {
                    return Err(ArchiveError::Order("bytes follow the archive's end mark").into())
                }
                (State::Header, _) => {
                    let want = MAGIC.len() + 4;
                    let n = (want - self.buf.len()).min(bytes.len());
                    self.buf.extend_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    let m = self.buf.len().min(MAGIC.len());
                    if self.buf[..m] != MAGIC[..m] {
                        return Err(ArchiveError::NotAnArchive.into());
                    }
                    if self.buf.len() == want {
                        let v = u32::from_le_bytes(self.buf[8..12].try_into().unwrap_or_default());
                        if v != VERSION {
                            return Err(ArchiveError::Version(v).into());
                        }
                        self.all.update(&self.buf);
                        self.buf.clear();
                        self.state = State::Frames;
                    }
                }
                (State::Frames, None) => {
                    let n = (5 - self.buf.len()).min(bytes.len());
                    self.buf.extend_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    if self.buf.len() < 5 {
                        continue;
                    }
                    let kind = self.buf[0];
                    let len =
                        u32::from_le_bytes(self.buf[1..5].try_into().unwrap_or_default()) as usize;
                    let max = match kind {
                        MANIFEST => MAX_MANIFEST,
                        DATA => MAX_FRAME,
                        STREAM_END | END => 64,
                        k => return Err(ArchiveError::UnknownFrame(k).into()),
                    };
                    if len > max {
                        return Err(ArchiveError::TooLarge { claimed: len, max }.into());
                    }
                    if kind == DATA {
                        self.data_index()?;
                    }
                    // The seal covers everything before the end mark's
                    // frame, its head included.
                    if kind != END {
                        self.all.update(&self.buf);
                    }
                    self.buf.clear();
                    self.frame = Some((kind, len));
                    self.got = 0;
                    if len == 0 {
                        self.whole(kind, each)?;
                    }
                }
                (State::Frames, Some((DATA, len))) => {
                    // Handed on as they come, never gathered.
                    let n = (len - self.got).min(bytes.len());
                    let piece = &bytes[..n];
                    bytes = &bytes[n..];
                    self.stream.update(piece);
                    self.stream_bytes += n as u64;
                    self.got += n;
                    let index = self.index;
                    each(Item::Data {
                        index,
                        bytes: piece,
                    })
                    .map_err(PushError::Handler)?;
                    if self.got == len {
                        self.frame = None;
                    }
                }
                (State::Frames, Some((kind, len))) => {
                    let n = (len - self.buf.len()).min(bytes.len());
                    self.buf.extend_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    if self.buf.len() == len {
                        self.whole(kind, each)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn data_index(&self) -> Result<usize, ArchiveError> {
        let Some(streams) = &self.streams else {
            return Err(ArchiveError::Order("stream data before the manifest"));
        };
        if self.index >= streams.len() {
            return Err(ArchiveError::Order("more streams than the manifest lists"));
        }
        Ok(self.index)
    }

    /// A whole frame other than data, its payload in `buf`.
    fn whole<E>(
        &mut self,
        kind: u8,
        each: &mut dyn FnMut(Item<'_>) -> Result<(), E>,
    ) -> Result<(), PushError<E>> {
        let payload = std::mem::take(&mut self.buf);
        self.frame = None;
        match kind {
            MANIFEST => {
                if self.streams.is_some() {
                    return Err(ArchiveError::Order("a second manifest").into());
                }
                let m: Manifest = postcard::from_bytes(&payload)
                    .map_err(|e| ArchiveError::Manifest(e.to_string()))?;
                self.all.update(&payload);
                self.streams = Some(m.streams.iter().map(|s| s.tree.to_string()).collect());
                each(Item::Manifest(Box::new(m))).map_err(PushError::Handler)?;
            }
            STREAM_END => {
                let index = self.data_index()?;
                let end: StreamEnd = postcard::from_bytes(&payload)
                    .map_err(|_| ArchiveError::Order("a stream end that does not read"))?;
                let sha: [u8; 32] = std::mem::take(&mut self.stream).finalize().into();
                let bytes = std::mem::take(&mut self.stream_bytes);
                if end.bytes != bytes || end.sha256 != sha {
                    let tree = self
                        .streams
                        .as_ref()
                        .map(|s| s[index].clone())
                        .unwrap_or_default();
                    return Err(ArchiveError::Stream {
                        index,
                        tree,
                        what: format!(
                            "{bytes} bytes came where {} were sent, or their sha256 differs",
                            end.bytes
                        ),
                    }
                    .into());
                }
                self.all.update(&payload);
                self.index += 1;
                each(Item::StreamEnd { index }).map_err(PushError::Handler)?;
            }
            END => {
                let Some(streams) = &self.streams else {
                    return Err(ArchiveError::Order("an end mark before the manifest").into());
                };
                if self.index != streams.len() {
                    return Err(ArchiveError::Truncated(
                        "the end mark comes before every stream the manifest lists",
                    )
                    .into());
                }
                let end: End = postcard::from_bytes(&payload)
                    .map_err(|_| ArchiveError::Order("an end mark that does not read"))?;
                let sha: [u8; 32] = self.all.clone().finalize().into();
                if end.sha256 != sha {
                    return Err(ArchiveError::Sealed.into());
                }
                self.state = State::Done;
                each(Item::End).map_err(PushError::Handler)?;
            }
            DATA => {}
            k => return Err(ArchiveError::UnknownFrame(k).into()),
        }
        Ok(())
    }

    /// Checks that the archive ended where it should.
    pub fn finish(&self) -> Result<(), ArchiveError> {
        match self.state {
            State::Done => Ok(()),
            State::Header => Err(ArchiveError::Truncated("no header")),
            State::Frames if self.streams.is_none() => Err(ArchiveError::Truncated("no manifest")),
            State::Frames => Err(ArchiveError::Truncated("no end mark")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(streams: usize) -> Manifest {
        Manifest {
            agent: "a".into(),
            session: "s".into(),
            created_ms: 1,
            head: None,
            network: NetworkRecord::default(),
            policy: None,
            clock: None,
            fork: None,
            limits: Limits {
                pids_max: Some(64),
                memory_max: None,
                cpu_max: Some((u64::MAX, 50_000)),
            },
            checkpoints: vec![],
            turns: vec![],
            since: None,
            streams: (0..streams)
                .map(|i| StreamInfo {
                    tree: Tree::Checkpoint(format!("c{i}")),
                    parent: None,
                })
                .collect(),
        }
    }

    fn archive(streams: &[&[u8]]) -> Vec<u8> {
        let mut w = Writer::new(Vec::new(), &manifest(streams.len())).unwrap();
        for s in streams {
            // In pieces, as a send stream comes.
            for piece in s.chunks(3) {
                w.data(piece).unwrap();
            }
            w.end_stream().unwrap();
        }
        w.finish().unwrap().1
    }

    /// What the reader hands on, pushed in pieces of `step` bytes.
    fn read(bytes: &[u8], step: usize) -> Result<(Vec<Vec<u8>>, bool), ArchiveError> {
        let mut r = Reader::default();
        let mut streams: Vec<Vec<u8>> = Vec::new();
        let mut ended = false;
        for piece in bytes.chunks(step) {
            r.push::<()>(piece, &mut |item| {
                match item {
                    Item::Manifest(m) => streams = vec![Vec::new(); m.streams.len()],
                    Item::Data { index, bytes } => streams[index].extend_from_slice(bytes),
                    Item::StreamEnd { .. } => {}
                    Item::End => ended = true,
                }
                Ok(())
            })
            .map_err(|e| match e {
                PushError::Archive(e) => e,
                PushError::Handler(()) => unreachable!(),
            })?;
        }
        r.finish()?;
        Ok((streams, ended))
    }

    #[test]
    fn an_archive_reads_back_whatever_the_pieces_it_comes_in() {
        let a = archive(&[b"first stream", b"", b"third"]);
        for step in [1, 2, 5, 7, 64, a.len()] {
            let (streams, ended) = read(&a, step).unwrap();
            assert!(ended);
            assert_eq!(
                streams,
                [b"first stream".to_vec(), vec![], b"third".to_vec()]
            );
        }
    }

    #[test]
    fn every_cut_and_every_flipped_byte_is_refused() {
        let a = archive(&[b"first stream", b"third"]);
        for cut in 0..a.len() {
            assert!(
                read(&a[..cut], 4).is_err(),
                "cut at {cut} was read as whole"
            );
        }
        for i in 0..a.len() {
            let mut b = a.clone();
            b[i] ^= 0x20;
            assert!(read(&b, 4).is_err(), "byte {i} flipped was read as whole");
        }
    }

    #[test]
    fn a_huge_claim_an_unknown_version_and_a_stranger_are_refused_before_buffering() {
        let mut a = archive(&[b"x"]);
        // The manifest frame's length: claimed far past the limit.
        a[13..17].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            read(&a[..17], 17).unwrap_err(),
            ArchiveError::TooLarge {
                claimed: u32::MAX as usize,
                max: MAX_MANIFEST
            }
        );
        let mut v = archive(&[]);
        v[8] = 9;
        assert_eq!(read(&v, 64).unwrap_err(), ArchiveError::Version(9));
        assert_eq!(
            read(b"PK\x03\x04 a zip file", 64).unwrap_err(),
            ArchiveError::NotAnArchive
        );
        let mut extra = archive(&[b"x"]);
        extra.push(0);
        assert!(matches!(read(&extra, 64), Err(ArchiveError::Order(_))));
    }
}
