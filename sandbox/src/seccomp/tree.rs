//! The filter as one classic BPF program that finds a system call's answer
//! by binary search over ranges of system call numbers.
//!
//! seccompiler compiles a rule set as a chain with one test per system call,
//! so an allowlist of ~330 calls becomes ~1,500 instructions. The kernel
//! pays for every instruction three times per program start: it checks and
//! translates the program, JIT-compiles it, and, to build its cache of
//! calls that are always allowed, runs it once for every system call
//! number. A chain costs that times the chain's length; a search over the
//! 80 ranges of equal answers costs a few hundred instructions in all and
//! seven comparisons per call. One program instead of three also pays the
//! kernel's fixed cost per filter once.
//!
//! The calls whose answer depends on an argument get a small block of
//! their own at their leaf; everything else is decided by the number alone,
//! so the kernel's cache covers every allowed call without an argument rule.

use seccompiler::sock_filter;

/// Where the answer for one system call number comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Leaf {
    Allow,
    Errno(u32),
    /// Refused (`deny`) when any of its bits are set in the low 32 bits
    /// of argument `arg`.
    DenyAnyBits {
        arg: u8,
        bits: u32,
        deny: u32,
    },
    /// Refused when the low 32 bits of argument `arg` are one of `values`.
    DenyIn {
        arg: u8,
        values: &'static [u64],
        deny: u32,
    },
    /// Refused when the low 32 bits of argument `arg` are none of `values`.
    DenyNotIn {
        arg: u8,
        values: &'static [u64],
        deny: u32,
    },
}

/// `seccomp_data`: `nr` at 0, `arch` at 4, `args[i]` at 16 + 8 i; the low
/// half of a 64-bit argument comes first on a little-endian machine.
const NR: u32 = 0;
const ARCH: u32 = 4;
#[cfg(target_endian = "little")]
const fn arg_low(i: u8) -> u32 {
    16 + 8 * i as u32
}

/// `AUDIT_ARCH_*` of linux/audit.h: the ELF machine, 64-bit, little-endian.
#[cfg(target_arch = "x86_64")]
pub(crate) const AUDIT_ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000;
#[cfg(target_arch = "aarch64")]
pub(crate) const AUDIT_ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000;

const LD_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JGE: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const JSET: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

fn ret(action: u32) -> sock_filter {
    stmt(RET, action)
}

fn errno(e: u32) -> u32 {
    libc::SECCOMP_RET_ERRNO | (e & libc::SECCOMP_RET_DATA)
}

/// A run of consecutive numbers with one answer: `start` up to the next
/// range's start.
#[derive(Clone, Copy, Debug)]
struct Range {
    start: u32,
    leaf: Leaf,
}

/// The program: `leaf_of` gives the answer of numbers `0..=max`; numbers
/// above `max` (x32 calls, with bit 30 set, among them) get `above`, and
/// any architecture but this build's is killed, as seccompiler does.
pub(crate) fn compile(max: u32, leaf_of: impl Fn(u32) -> Leaf, above: Leaf) -> Vec<sock_filter> {
    let mut ranges: Vec<Range> = Vec::new();
    for nr in 0..=max {
        let leaf = leaf_of(nr);
        // A leaf that reads arguments stays its own range: it is one call.
        let joins = matches!(ranges.last(), Some(r) if r.leaf == leaf)
            && matches!(leaf, Leaf::Allow | Leaf::Errno(_));
        if !joins {
            ranges.push(Range { start: nr, leaf });
        }
    }
    ranges.push(Range {
        start: max + 1,
        leaf: above,
    });
    let mut prog = vec![
        stmt(LD_ABS, ARCH),
        jump(JEQ, AUDIT_ARCH, 1, 0),
        ret(libc::SECCOMP_RET_KILL_PROCESS),
        stmt(LD_ABS, NR),
    ];
    prog.extend(search(&ranges));
    prog
}

/// The search over `ranges`, the system call number in the accumulator:
/// `nr >= start of the middle range` goes right, else left.
fn search(ranges: &[Range]) -> Vec<sock_filter> {
    if let [only] = ranges {
        return leaf(only.leaf);
    }
    let mid = ranges.len() / 2;
    let left = search(&ranges[..mid]);
    let right = search(&ranges[mid..]);
    let mut prog = Vec::with_capacity(left.len() + right.len() + 2);
    match u8::try_from(left.len()) {
        // Conditional jumps reach 255 instructions ahead at most.
        Ok(n) => prog.push(jump(JGE, ranges[mid].start, n, 0)),
        Err(_) => {
            prog.push(jump(JGE, ranges[mid].start, 0, 1));
            prog.push(stmt(JA, left.len() as u32));
        }
    }
    prog.extend(left);
    prog.extend(right);
    prog
}

/// Answers `listed` when the low 32 bits of argument `arg` are one of
/// `values`, `other` when not: each test jumps to the last instruction,
/// the fall-through of the last test is the one before it.
fn one_of(arg: u8, values: &[u64], listed: u32, other: u32) -> Vec<sock_filter> {
    assert!(values.len() < 255, "one jump over every test");
    let n = values.len();
    let mut prog = vec![stmt(LD_ABS, arg_low(arg))];
    for (i, &v) in values.iter().enumerate() {
        prog.push(jump(JEQ, v as u32, (n - i) as u8, 0));
    }
    prog.push(ret(other));
    prog.push(ret(listed));
    prog
}

/// A leaf's instructions, each path ending in a return (so a leaf that
/// loads an argument never needs the number again).
fn leaf(l: Leaf) -> Vec<sock_filter> {
    let allow = libc::SECCOMP_RET_ALLOW;
    match l {
        Leaf::Allow => vec![ret(allow)],
        Leaf::Errno(e) => vec![ret(errno(e))],
        Leaf::DenyAnyBits { arg, bits, deny } => vec![
            stmt(LD_ABS, arg_low(arg)),
            jump(JSET, bits, 0, 1),
            ret(errno(deny)),
            ret(allow),
        ],
        Leaf::DenyIn { arg, values, deny } => one_of(arg, values, errno(deny), allow),
        Leaf::DenyNotIn { arg, values, deny } => one_of(arg, values, allow, errno(deny)),
    }
}
