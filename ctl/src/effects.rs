//! `alloxctl effects export` and `effects verify`: a run's evidence set
//! fetched in pieces as one archive, and checked by the independent
//! verifier, in the daemon or here.

use allox_client::Client;
use allox_protocol::effects_report::Report;
use allox_protocol::{EffectsExport, EffectsVerified, EffectsVerify, Request, Response};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Fetches the export of `query`'s run piece by piece into `out`; the
/// archive's size. The archive's sha256 is checked once it is whole (the
/// set is closed: each piece comes from the same bytes).
pub fn export(c: &mut Client, query: &EffectsExport, out: &mut dyn Write) -> Result<u64, String> {
    use sha2::Digest;
    let mut offset = 0u64;
    let mut hash = sha2::Sha256::new();
    let mut whole: Option<String> = None;
    loop {
        let mut q = query.clone();
        q.offset = Some(offset);
        let chunk = match c.call(Request::EffectsExport(q)) {
            Ok(Ok(Response::EffectsExportChunk(x))) => x,
            Ok(Ok(other)) => return Err(format!("unexpected answer: {}", other.to_json())),
            Ok(Err(body)) => return Err(crate::render::refusal(&body)),
            Err(e) => return Err(allox_client::error_chain(&e)),
        };
        if chunk.offset != offset || whole.as_ref().is_some_and(|w| *w != chunk.sha256) {
            return Err("the export changed while it was read".into());
        }
        whole = Some(chunk.sha256.clone());
        hash.update(&chunk.data.0);
        out.write_all(&chunk.data.0)
            .map_err(|e| format!("write the export: {e}"))?;
        offset += chunk.data.0.len() as u64;
        if chunk.eof {
            let got = format!("{:x}", hash.finalize());
            if Some(&got) != whole.as_ref() {
                return Err(format!(
                    "the export's sha256 is {got}, the daemon says {}",
                    whole.unwrap_or_default()
                ));
            }
            return Ok(offset);
        }
        if chunk.data.0.is_empty() {
            return Err("the daemon sent an empty piece before the end".into());
        }
    }
}

/// `effects.verify` in the daemon.
pub fn verify_in_daemon(c: &mut Client, q: EffectsVerify) -> Result<EffectsVerified, String> {
    match c.call(Request::EffectsVerify(q)) {
        Ok(Ok(Response::EffectsVerified(v))) => Ok(v),
        Ok(Ok(other)) => Err(format!("unexpected answer: {}", other.to_json())),
        Ok(Err(body)) => Err(crate::render::refusal(&body)),
        Err(e) => Err(allox_client::error_chain(&e)),
    }
}

/// The verifier to run here: `given`, else `allox-system-effects-verify`
/// beside this executable, else the one on `PATH`.
pub fn verifier(given: Option<PathBuf>) -> PathBuf {
    const NAME: &str = "allox-system-effects-verify";
    given.unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .map(|e| e.with_file_name(NAME))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from(NAME))
    })
}

/// Runs `verifier` over the export `file` (checked against `root`): its
/// report as it wrote it, and its verdict as [`EffectsVerified`].
pub fn verify_export(
    verifier: &Path,
    file: &Path,
    root: Option<&str>,
) -> Result<EffectsVerified, String> {
    let mut cmd = std::process::Command::new(verifier);
    if let Some(r) = root {
        cmd.args(["--root", r]);
    }
    let out = cmd
        .arg("--export")
        .arg(file)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("run the verifier {}: {e}", verifier.display()))?;
    let report = String::from_utf8(out.stdout)
        .map_err(|_| "the verifier's report is not UTF-8".to_string())?
        .trim_end()
        .to_string();
    match out.status.code() {
        Some(0) | Some(1) => {
            let v: Report = serde_json::from_str(&report)
                .map_err(|e| format!("the verifier wrote no report: {e}"))?;
            Ok(EffectsVerified {
                ok: v.ok,
                first_bad: v.first_bad_line(),
                report,
            })
        }
        _ => Err(format!(
            "the verifier {} failed ({})",
            verifier.display(),
            out.status
        )),
    }
}
