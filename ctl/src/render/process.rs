//! Human output for process responses: run start and end, kill counts,
//! the process table and stdin writes.

use super::{clean, utc, Table};
use allox_protocol::{Killed, ProcessListing, RunResult, RunStarted, StdinWritten};

/// `started run R (pid P)`.
pub(super) fn started(s: &RunStarted) -> String {
    format!("started run {} (pid {})\n", clean(&s.run_id), s.pid)
}

/// The status line of a finished run, then its captured output, if any.
pub(super) fn exited(r: &RunResult) -> String {
    let mut out = format!("run {} {}\n", clean(&r.run_id), run_status(r));
    for (name, text) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
        if text.is_empty() {
            continue;
        }
        out.push_str(&format!("--- {name} ---\n"));
        out.push_str(&clean_output(text));
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    if r.truncated {
        out.push_str("note: output was truncated at the capture limit\n");
    }
    if r.output_dropped {
        out.push_str("note: output was dropped: the supervisor keeps only the newest finished runs' output\n");
    }
    if let Some(e) = &r.effects {
        out.push_str(&super::effects::effects(e));
    }
    out
}

/// How a run ended, as the end of `run R ...`.
pub fn run_status(r: &RunResult) -> String {
    if r.timed_out {
        return "timed out".to_owned();
    }
    match (r.exit_code, r.signal) {
        (_, Some(sig)) => format!("killed by {}", crate::signal::label(sig)),
        (Some(code), None) => format!("exited with code {code}"),
        (None, None) => "ended with unknown status".to_owned(),
    }
}

/// Captured output made safe for a terminal: line breaks and tabs stay,
/// other control characters are shown escaped.
pub(super) fn clean_output(text: &str) -> String {
    text.split_inclusive('\n')
        .map(|line| {
            let (body, end) = match line.strip_suffix('\n') {
                Some(body) => (body, "\n"),
                None => (line, ""),
            };
            let cleaned: String = body.split('\t').map(clean).collect::<Vec<_>>().join("\t");
            cleaned + end
        })
        .collect()
}

pub(super) fn killed(k: &Killed) -> String {
    match k.killed {
        0 => "no processes were signalled\n".to_owned(),
        1 => "signalled 1 process\n".to_owned(),
        n => format!("signalled {n} processes\n"),
    }
}

pub(super) fn processes(l: &ProcessListing) -> String {
    if l.processes.is_empty() {
        return "no processes\n".to_owned();
    }
    let mut t = Table::with_header(&["PID", "PPID", "RUN", "STARTED", "COMMAND"]);
    for p in &l.processes {
        t.row(vec![
            p.pid.to_string(),
            p.ppid.to_string(),
            p.run_id.as_deref().map(clean).unwrap_or_else(|| "-".into()),
            utc(p.started_ms),
            clean(&p.argv.join(" ")) + if p.argv_truncated { " …" } else { "" },
        ]);
    }
    let mut out = t.render();
    for (run, meta) in &l.run_metadata {
        let pairs: Vec<String> = meta
            .iter()
            .map(|(k, v)| format!("{}={}", clean(k), clean(v)))
            .collect();
        out.push_str(&format!("run {}: {}\n", clean(run), pairs.join(" ")));
    }
    if l.truncated {
        out.push_str("note: more processes are not listed (the answer's limit)\n");
    }
    out
}

pub(super) fn stdin_written(w: &StdinWritten) -> String {
    let bytes = if w.written == 1 { "byte" } else { "bytes" };
    if w.closed {
        format!("wrote {} {bytes} to stdin and closed it\n", w.written)
    } else {
        format!("wrote {} {bytes} to stdin\n", w.written)
    }
}

/// A run's kept output, as it was written (stdout, then stderr), and how
/// it ended if it has.
pub fn logs(l: &allox_protocol::RunLogs) -> String {
    let mut out = String::from_utf8_lossy(&l.stdout.0).into_owned();
    out.push_str(&String::from_utf8_lossy(&l.stderr.0));
    if l.truncated {
        out.push_str("(some of its output was not kept)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::render;
    use allox_protocol::{
        Killed, ProcessInfo, ProcessListing, Response, RunResult, RunStarted, StdinWritten,
    };

    const T0: u64 = 1_704_067_200_000; // 2024-01-01 00:00:00

    fn result(exit_code: Option<i32>, signal: Option<i32>) -> RunResult {
        RunResult {
            run_id: "r1".into(),
            exit_code,
            signal,
            stdout: String::new(),
            stderr: String::new(),
            truncated: false,
            timed_out: false,
            output_dropped: false,
            output_lossy: false,
            usage: None,
            oom_killed: None,
            effects: None,
        }
    }

    #[test]
    fn started_is_one_line() {
        let s = RunStarted {
            run_id: "r1".into(),
            pid: 42,
        };
        assert_eq!(render(&Response::Started(s)), "started run r1 (pid 42)\n");
    }

    #[test]
    fn exit_status_lines() {
        let exited = |r| render(&Response::Exited(r));
        assert_eq!(exited(result(Some(0), None)), "run r1 exited with code 0\n");
        assert_eq!(
            exited(result(None, Some(9))),
            "run r1 killed by signal 9 (SIGKILL)\n"
        );
        assert_eq!(
            exited(result(None, Some(40))),
            "run r1 killed by signal 40\n"
        );
        let timed_out = RunResult {
            timed_out: true,
            ..result(None, Some(9))
        };
        assert_eq!(exited(timed_out), "run r1 timed out\n");
        assert_eq!(
            exited(result(None, None)),
            "run r1 ended with unknown status\n"
        );
    }

    #[test]
    fn exit_shows_captured_output_escaped_and_truncation() {
        let r = RunResult {
            stdout: "line 1\n\tindented\x1b[31m red\nno newline".into(),
            stderr: "warn\n".into(),
            truncated: true,
            ..result(Some(3), None)
        };
        assert_eq!(
            render(&Response::Exited(r)),
            "\
run r1 exited with code 3
--- stdout ---
line 1
\tindented\\u{1b}[31m red
no newline
--- stderr ---
warn
note: output was truncated at the capture limit
"
        );
        let only_stderr = RunResult {
            stderr: "oops".into(),
            ..result(Some(1), None)
        };
        assert_eq!(
            render(&Response::Exited(only_stderr)),
            "run r1 exited with code 1\n--- stderr ---\noops\n"
        );
    }

    #[test]
    fn process_table_cleans_commands() {
        let l = ProcessListing {
            processes: vec![
                ProcessInfo {
                    pid: 7,
                    ppid: 1,
                    argv: vec!["sh".into(), "-c".into(), "echo hi\nrm -rf x".into()],
                    run_id: Some("r1".into()),
                    started_ms: T0,
                    argv_truncated: false,
                },
                ProcessInfo {
                    pid: 1234,
                    ppid: 7,
                    argv: vec!["sleep\x1b]0;pwned\x07".into(), "10".into()],
                    run_id: None,
                    started_ms: T0 + 5_000,
                    argv_truncated: true,
                },
            ],
            truncated: true,
            run_metadata: [(
                "r1".to_string(),
                [("process-tree.tracked".to_string(), "ebpf".to_string())].into(),
            )]
            .into(),
        };
        assert_eq!(
            render(&Response::Processes(l)),
            "\
PID   PPID  RUN  STARTED              COMMAND
7     1     r1   2024-01-01 00:00:00  sh -c echo hi\\nrm -rf x
1234  7     -    2024-01-01 00:00:05  sleep\\u{1b}]0;pwned\\u{7} 10 …
run r1: process-tree.tracked=ebpf
note: more processes are not listed (the answer's limit)
"
        );
        let empty = ProcessListing {
            processes: vec![],
            truncated: false,
            run_metadata: Default::default(),
        };
        assert_eq!(render(&Response::Processes(empty)), "no processes\n");
    }

    #[test]
    fn kill_and_stdin_lines() {
        let killed = |killed| render(&Response::Killed(Killed { killed }));
        assert_eq!(killed(0), "no processes were signalled\n");
        assert_eq!(killed(1), "signalled 1 process\n");
        assert_eq!(killed(3), "signalled 3 processes\n");
        let written =
            |written, closed| render(&Response::StdinWritten(StdinWritten { written, closed }));
        assert_eq!(written(1, false), "wrote 1 byte to stdin\n");
        assert_eq!(written(0, true), "wrote 0 bytes to stdin and closed it\n");
    }
}
