//! The `modules` domain: the loaded kernel modules (`/proc/modules`) and
//! the taint flags (`/proc/sys/kernel/tainted`).
//!
//! Key `module NAME`, value its size and state (`Live`, `Loading`,
//! `Unloading`). Left out: the reference count and the users column,
//! which change on their own (an open device, a module that uses this
//! one, itself listed), and the load address (hidden from non-root, and
//! the same for the module's life). Key `taint`, value the mask and its
//! letters as the kernel documents them (`P`, `O`, `E`, ...).
//!
//! A kernel built without module support has no `/proc/modules`: that is
//! an observation (`modules` = `unsupported`), not a gap — nothing can be
//! loaded.

use super::Capture;

const PROC_MODULES: &str = "/proc/modules";
const TAINTED: &str = "/proc/sys/kernel/tainted";

/// Captures the loaded modules and the taint flags.
pub fn capture() -> Capture {
    let mut c = Capture::new();
    match std::fs::read_to_string(PROC_MODULES) {
        Ok(text) => parse_modules(&text, &mut c),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            c.insert("modules", "unsupported (no /proc/modules)");
        }
        Err(e) => c.gap(format!("modules: {PROC_MODULES}: {e}")),
    }
    match std::fs::read_to_string(TAINTED) {
        Ok(text) => parse_tainted(&text, &mut c),
        Err(e) => c.gap(format!("modules: {TAINTED}: {e}")),
    }
    c
}

/// `NAME SIZE REFCOUNT USERS STATE ADDRESS [(TAINTS)]` per line.
pub fn parse_modules(text: &str, c: &mut Capture) {
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 5 {
            c.gap(format!(
                "modules: a /proc/modules line does not parse: {line:?}"
            ));
            continue;
        }
        let taints = f
            .get(6)
            .filter(|t| t.starts_with('('))
            .map(|t| format!(" {t}"))
            .unwrap_or_default();
        c.insert(
            format!("module {}", f[0]),
            format!("size {} {}{taints}", f[1], f[4]),
        );
    }
}

/// The kernel's taint letters, bit by bit (Documentation/admin-guide/
/// tainted-kernels.rst).
const TAINT_LETTERS: &[u8; 20] = b"PFSRMBUDAWCIOELKXTNJ";

/// `/proc/sys/kernel/tainted`: a decimal mask.
pub fn parse_tainted(text: &str, c: &mut Capture) {
    let t = text.trim();
    match t.parse::<u64>() {
        Ok(mask) => {
            let letters: String = TAINT_LETTERS
                .iter()
                .enumerate()
                .filter(|(bit, _)| mask & (1 << bit) != 0)
                .map(|(_, l)| *l as char)
                .collect();
            let high = mask >> TAINT_LETTERS.len();
            let extra = if high != 0 {
                format!(" +bits {:#x}", high << TAINT_LETTERS.len())
            } else {
                String::new()
            };
            c.insert(
                "taint",
                format!("{mask} {letters}{extra}").trim_end().to_string(),
            );
        }
        Err(_) => c.gap(format!("modules: kernel.tainted is not a number: {t:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODULES: &str = "\
dummy 12288 0 - Live 0x0000000000000000
nf_tables 356352 3 nft_chain_nat,nft_compat, Live 0xffffffffc0a00000
vboxdrv 581632 2 vboxnetadp, Live 0xffffffffc0100000 (OE)
gone 4096 0 - Unloading 0x0
";

    #[test]
    fn modules_keep_size_and_state_not_refcount_users_or_address() {
        let mut c = Capture::new();
        parse_modules(MODULES, &mut c);
        assert!(c.is_complete(), "{:?}", c.gaps);
        let got: Vec<_> = c
            .items
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("module dummy", "size 12288 Live"),
                ("module gone", "size 4096 Unloading"),
                ("module nf_tables", "size 356352 Live"),
                ("module vboxdrv", "size 581632 Live (OE)"),
            ]
        );
        let busier = MODULES.replace(
            "nf_tables 356352 3 nft_chain_nat,nft_compat,",
            "nf_tables 356352 9 nft_nat,",
        );
        let mut b = Capture::new();
        parse_modules(&busier, &mut b);
        assert_eq!(c, b, "a refcount or users change is not a difference");
    }

    #[test]
    fn a_short_line_is_a_gap() {
        let mut c = Capture::new();
        parse_modules("dummy 12288\n", &mut c);
        assert_eq!(c.gaps.len(), 1);
    }

    #[test]
    fn taint_is_the_mask_and_its_letters() {
        let mut c = Capture::new();
        parse_tainted("0\n", &mut c);
        assert_eq!(c.items["taint"], "0");
        let mut c = Capture::new();
        // P (bit 0), O (bit 12), E (bit 13).
        parse_tainted(&format!("{}\n", 1 | (1 << 12) | (1 << 13)), &mut c);
        assert_eq!(c.items["taint"], "12289 POE");
        let mut c = Capture::new();
        parse_tainted("x", &mut c);
        assert_eq!(c.gaps.len(), 1);
    }
}
