//! Seeing from another network namespace: a scoped thread joins it
//! (`setns`), runs the capture and ends, so no other thread of the
//! observer ever changes namespace.

use super::Capture;
use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};
use std::os::fd::BorrowedFd;

/// Runs `f` on a thread inside the network namespace `netns`. A failed
/// `setns` or a panic is a gap (`what` names the collector), never a panic
/// here.
pub fn in_netns(netns: BorrowedFd<'_>, what: &str, f: impl FnOnce() -> Capture + Send) -> Capture {
    let joined = std::thread::scope(|s| {
        s.spawn(move || {
            move_into_link_name_space(netns, Some(LinkNameSpaceType::Network))
                .map_err(|e| format!("{what}: cannot join the network namespace: {e}"))
                .map(|()| f())
        })
        .join()
    });
    match joined {
        Ok(Ok(c)) => c,
        Ok(Err(why)) => gap_only(why),
        Err(_) => gap_only(format!(
            "{what}: the capture in the network namespace panicked"
        )),
    }
}

fn gap_only(why: String) -> Capture {
    let mut c = Capture::new();
    c.gap(why);
    c
}
