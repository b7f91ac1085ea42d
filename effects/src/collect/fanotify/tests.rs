use super::*;

/// A `DFID_NAME` (or other fid) record, padded to 4 bytes.
fn fid_rec(
    info_type: u8,
    fsid: [i32; 2],
    htype: i32,
    handle: &[u8],
    name: Option<&[u8]>,
) -> Vec<u8> {
    let mut r = vec![info_type, 0, 0, 0];
    r.extend_from_slice(&fsid[0].to_ne_bytes());
    r.extend_from_slice(&fsid[1].to_ne_bytes());
    r.extend_from_slice(&(handle.len() as u32).to_ne_bytes());
    r.extend_from_slice(&htype.to_ne_bytes());
    r.extend_from_slice(handle);
    if let Some(n) = name {
        r.extend_from_slice(n);
        r.push(0);
    }
    while r.len() % 4 != 0 {
        r.push(0);
    }
    let len = r.len() as u16;
    r[2..4].copy_from_slice(&len.to_ne_bytes());
    r
}

fn event(mask: u64, pid: i32, infos: &[Vec<u8>]) -> Vec<u8> {
    let mut e = Vec::new();
    let body: usize = infos.iter().map(Vec::len).sum();
    e.extend_from_slice(&((24 + body) as u32).to_ne_bytes());
    e.push(libc::FANOTIFY_METADATA_VERSION);
    e.push(0);
    e.extend_from_slice(&24u16.to_ne_bytes());
    e.extend_from_slice(&mask.to_ne_bytes());
    e.extend_from_slice(&(-1i32).to_ne_bytes());
    e.extend_from_slice(&pid.to_ne_bytes());
    for i in infos {
        e.extend_from_slice(i);
    }
    e
}

#[test]
fn events_with_a_directory_handle_and_a_name_are_read() {
    let h = [1u8, 2, 3, 4, 5, 6, 7, 8];
    let mut buf = event(
        libc::FAN_CREATE,
        42,
        &[fid_rec(
            libc::FAN_EVENT_INFO_TYPE_DFID_NAME,
            [7, 9],
            0x4d,
            &h,
            Some(b"x.txt"),
        )],
    );
    buf.extend(event(libc::FAN_Q_OVERFLOW, -1, &[]));
    buf.extend(event(
        libc::FAN_ATTRIB | libc::FAN_ONDIR,
        43,
        &[fid_rec(
            libc::FAN_EVENT_INFO_TYPE_DFID,
            [7, 9],
            1,
            &h[..4],
            None,
        )],
    ));
    let evs: Vec<_> = parse(&buf).collect::<Result<_, _>>().unwrap();
    assert_eq!(evs.len(), 3);
    assert_eq!(evs[0].mask, libc::FAN_CREATE);
    assert_eq!(evs[0].pid, 42);
    assert_eq!(evs[0].fd, -1);
    assert_eq!(evs[0].name, Some(&b"x.txt"[..]));
    let d = evs[0].dir.unwrap();
    assert_eq!((d.fsid, d.handle_type, d.handle), ([7, 9], 0x4d, &h[..]));
    assert_eq!(evs[1].mask, libc::FAN_Q_OVERFLOW);
    assert!(evs[1].dir.is_none());
    assert_eq!(evs[2].name, None);
    assert_eq!(evs[2].dir.unwrap().handle, &h[..4]);
}

#[test]
fn unknown_records_are_skipped_and_an_object_fid_is_kept_apart() {
    let h = [9u8; 12];
    let pidfd = {
        let mut r = vec![libc::FAN_EVENT_INFO_TYPE_PIDFD, 0, 8, 0];
        r[2..4].copy_from_slice(&8u16.to_ne_bytes());
        r.extend_from_slice(&5i32.to_ne_bytes());
        r
    };
    let buf = event(
        libc::FAN_MODIFY,
        1,
        &[
            fid_rec(
                libc::FAN_EVENT_INFO_TYPE_DFID_NAME,
                [1, 1],
                1,
                &h,
                Some(b"n"),
            ),
            pidfd,
            fid_rec(libc::FAN_EVENT_INFO_TYPE_FID, [1, 1], 1, &h[..8], None),
        ],
    );
    let evs: Vec<_> = parse(&buf).collect::<Result<_, _>>().unwrap();
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].name, Some(&b"n"[..]));
    assert_eq!(evs[0].object.unwrap().handle, &h[..8]);
    assert_eq!(evs[0].dir.unwrap().handle, &h[..]);
}

#[test]
fn malformed_buffers_give_an_error_and_never_panic() {
    let h = [1u8; 8];
    let good = event(
        libc::FAN_CREATE,
        42,
        &[fid_rec(
            libc::FAN_EVENT_INFO_TYPE_DFID_NAME,
            [7, 9],
            1,
            &h,
            Some(b"x"),
        )],
    );
    // Every truncation of a good event, and of two in a row.
    let mut two = good.clone();
    two.extend_from_slice(&good);
    for cut in 1..two.len() {
        let r: Vec<_> = parse(&two[..cut]).collect();
        if cut == good.len() {
            assert!(r.iter().all(Result::is_ok) && r.len() == 1);
        } else {
            assert!(r.last().unwrap().is_err(), "cut {cut}: {r:?}");
        }
    }
    // Corrupt each byte of the good one in turn: no panic, whatever comes.
    for i in 0..good.len() {
        for v in [0u8, 1, 0x7f, 0xff] {
            let mut b = good.clone();
            b[i] = v;
            let _ = parse(&b).count();
        }
    }
    // Specific lies.
    let mut b = good.clone();
    b[4] = 2; // version
    assert_eq!(
        parse(&b).next().unwrap().unwrap_err().why,
        "unknown metadata version"
    );
    let mut b = good.clone();
    b[0..4].copy_from_slice(&10_000u32.to_ne_bytes()); // event_len past the buffer
    assert!(parse(&b).next().unwrap().is_err());
    let mut b = good.clone();
    b[24 + 12..24 + 16].copy_from_slice(&4096u32.to_ne_bytes()); // handle_bytes too big
    assert!(parse(&b).next().unwrap().is_err());
    let mut b = good.clone();
    let last = b.len() - 1;
    for x in &mut b[24 + 20 + 8..=last] {
        *x = b'a'; // the name loses its NUL
    }
    assert_eq!(
        parse(&b).next().unwrap().unwrap_err().why,
        "a name without its NUL"
    );
    let mut b = good.clone();
    b[24 + 2..24 + 4].copy_from_slice(&2u16.to_ne_bytes()); // record shorter than its header
    assert!(parse(&b).next().unwrap().is_err());
    // Zero-length event: would loop forever if accepted.
    let mut b = good.clone();
    b[0..4].copy_from_slice(&0u32.to_ne_bytes());
    assert!(parse(&b).next().unwrap().is_err());
    assert_eq!(parse(&[]).count(), 0);
}

fn map() -> CgroupMap {
    CgroupMap::with_mounts(
        Path::new("/nonexistent-cg/unified/allox-test-1"),
        vec![(PathBuf::from("/"), PathBuf::from("/nonexistent-cg/unified"))],
    )
}

#[test]
fn cgroup_paths_map_to_agent_session_and_run() {
    let m = map();
    let o = m.owner("/allox-test-1/allox/a1/s1/run-r7");
    assert_eq!(
        o,
        Owner {
            agent: Some("a1".into()),
            session: Some("s1".into()),
            run: Some("r7".into())
        }
    );
    // A cgroup the run made below its own is still the run's.
    assert_eq!(
        m.owner("/allox-test-1/allox/a1/s1/run-r7/sub")
            .run
            .as_deref(),
        Some("r7")
    );
    let c = m.owner("/allox-test-1/allox/a1/.context-s2");
    assert_eq!((c.session.as_deref(), c.run), (Some("s2"), None));
    assert_eq!(m.owner("/allox-test-1/allox/a1").session, None);
    assert!(m.owner("/allox-test-1/allox/a1").is_known());
    for other in [
        "/",
        "/user.slice/x",
        "/allox-test-2/allox/a1/s1/run-r",
        "/allox-test-1/alloxx/a/s/run-r",
        "/allox-test-1/allox",
    ] {
        assert!(!m.owner(other).is_known(), "{other}");
    }
}

#[test]
fn a_mount_showing_a_cgroup_below_the_root_is_followed() {
    // A cgroup namespace's or a bind mount's view: the mount shows
    // /machine and the process sees /machine/allox-test-1/... .
    let m = CgroupMap::with_mounts(
        Path::new("/cg/allox-test-1"),
        vec![(PathBuf::from("/machine"), PathBuf::from("/cg"))],
    );
    assert_eq!(
        m.owner("/machine/allox-test-1/allox/a/s/run-1")
            .run
            .as_deref(),
        Some("1")
    );
    assert!(!m.owner("/allox-test-1/allox/a/s/run-1").is_known());
}

#[test]
fn who_of_this_process_is_nobody_known() {
    let o = who(std::process::id(), Path::new("/nonexistent-cg/root"));
    assert!(!o.is_known());
    assert!(read_cgroup(std::process::id() as i32).is_some());
}

#[test]
fn a_btrfs_handle_names_its_subvolume_and_no_other_handle_does() {
    let mut h = Vec::new();
    h.extend_from_slice(&257u64.to_ne_bytes());
    h.extend_from_slice(&261u64.to_ne_bytes());
    h.extend_from_slice(&7u32.to_ne_bytes());
    let fid = |handle_type: i32, handle: &[u8]| {
        btrfs_subvolume(&Fid {
            fsid: [1, 2],
            handle_type,
            handle,
        })
    };
    for t in [0x4d, 0x4e, 0x4f] {
        assert_eq!(fid(t, &h), Some(261));
    }
    // Another filesystem's handle (ext4's `FILEID_INO32_GEN`), and one
    // too short to hold a subvolume.
    assert_eq!(fid(1, &h), None);
    assert_eq!(fid(0x4d, &h[..12]), None);
}
