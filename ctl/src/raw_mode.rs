//! This terminal in raw mode, and what keys typed in it mean: the mode
//! saved and restored on every way out (the end, a signal, a panic), and
//! the detach keys (Ctrl-P Ctrl-Q). Used by `exec -t` and `attach`
//! (`tty`) and by the input a foreground run is sent (`foreground`).

use rustix::termios::{self, OptionalActions, Termios};
use std::sync::Mutex;

/// This terminal's mode before raw mode, restored on the way out (also
/// from the signal thread and the panic hook).
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);

/// Puts this terminal (alloxctl's stdin) back as it was, once.
pub(crate) fn restore() {
    let saved = SAVED.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(t) = saved {
        let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Now, &t);
    }
}

/// Raw mode for as long as it lives.
pub(crate) struct Raw;

impl Raw {
    /// Raw mode, when stdin is a terminal (otherwise its bytes are passed
    /// on as they are, and there is nothing to restore).
    pub(crate) fn enter() -> Option<Raw> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        *SAVED.lock().unwrap_or_else(|e| e.into_inner()) = Some(saved);
        if termios::tcsetattr(&stdin, OptionalActions::Now, &raw).is_err() {
            restore();
            return None;
        }
        // A panic restores the terminal before its message is printed.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info)
        }));
        Some(Raw)
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        restore();
    }
}

/// The detach keys, as Docker has them: Ctrl-P then Ctrl-Q.
const DETACH: [u8; 2] = [0x10, 0x11];

/// What typed bytes mean: the part to pass on, and whether the detach
/// keys followed it. A Ctrl-P at the end is held (`held`) until the next
/// byte says whether a Ctrl-Q follows; any other byte sends it on.
pub(crate) fn typed(held: &mut bool, input: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::with_capacity(input.len() + 1);
    let mut it = input.iter().copied().peekable();
    if std::mem::take(held) {
        if it.peek() == Some(&DETACH[1]) {
            return (out, true);
        }
        out.push(DETACH[0]);
    }
    while let Some(b) = it.next() {
        if b == DETACH[0] {
            match it.peek() {
                Some(&n) if n == DETACH[1] => return (out, true),
                None => {
                    *held = true;
                    break;
                }
                Some(_) => {}
            }
        }
        out.push(b);
    }
    (out, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctrl_p_ctrl_q_detaches_and_anything_else_is_typed() {
        let mut held = false;
        assert_eq!(typed(&mut held, b"ls\r"), (b"ls\r".to_vec(), false));
        assert_eq!(typed(&mut held, b"ab\x10\x11cd"), (b"ab".to_vec(), true));
        // Ctrl-P alone at the end waits for the next byte.
        assert_eq!(typed(&mut held, b"x\x10"), (b"x".to_vec(), false));
        assert!(held);
        assert_eq!(typed(&mut held, b"\x11"), (Vec::new(), true));
        held = false;
        assert_eq!(typed(&mut held, b"\x10"), (Vec::new(), false));
        assert_eq!(typed(&mut held, b"y"), (b"\x10y".to_vec(), false));
        assert!(!held);
        // Ctrl-P followed by another key is passed on as typed.
        assert_eq!(typed(&mut held, b"\x10a\x10"), (b"\x10a".to_vec(), false));
        assert!(held);
    }
}
