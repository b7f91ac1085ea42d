//! The relay of one forward of QEMU's user networking: QEMU runs it for
//! each connection the guest makes to a forwarded address, with a socket
//! pair as its stdin and stdout (`guestfwd=…-cmd:`); it connects to the
//! host's 127.0.0.1 (nothing else) and copies both ways until either side
//! ends. `alloxctl vm relay PORT` is this.

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;

/// Relays stdin/stdout to 127.0.0.1:`port`.
pub fn relay(port: u16) -> std::io::Result<()> {
    let server = TcpStream::connect(("127.0.0.1", port))?;
    server.set_nodelay(true)?;
    // The descriptors themselves, unbuffered: what comes goes on at once.
    let mut input = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    let mut output = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    let mut up = server.try_clone()?;
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut input, &mut up);
        let _ = up.shutdown(Shutdown::Write);
    });
    let mut down = &server;
    std::io::copy(&mut down, &mut output)?;
    output.flush()
}
