//! A hung test fails, and says where it hangs, instead of holding the test
//! command until its time runs out.
//!
//! Every test that checks what it needs ([`crate::needs`]) is watched from
//! then on; one still running after [`LIMIT_ENV`] seconds (default
//! [`DEFAULT_LIMIT`]) makes the watchdog print what the test binary and
//! each process below it are doing — every thread's state, kernel wait
//! channel and kernel stack, and its user-space stack when `gdb` is
//! there — and abort the binary. A daemon that does not stop when the
//! test stops it is shown the same way ([`crate::Daemon`]).

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Seconds a test may run before the watchdog takes it as hung.
pub const LIMIT_ENV: &str = "ALLOX_TEST_HANG_SECS";
/// Ten times the slowest test of the suite (docs/benchmarks.md lists them).
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(15 * 60);

struct Watched {
    test: String,
    since: Instant,
}

#[derive(Default)]
struct State {
    /// By the id of the thread running it: a thread runs one test at a
    /// time, so a new test on it replaces the one before.
    tests: Mutex<HashMap<i32, Watched>>,
    wake: Condvar,
}

fn state() -> &'static State {
    static STATE: OnceLock<State> = OnceLock::new();
    STATE.get_or_init(|| {
        let limit = secs_from_env(LIMIT_ENV, DEFAULT_LIMIT);
        std::thread::Builder::new()
            .name("test-watchdog".into())
            .spawn(move || watch(limit))
            .expect("start the test watchdog");
        State::default()
    })
}

/// The whole seconds the environment variable `name` gives, or `default`.
pub fn secs_from_env(name: &str, default: Duration) -> Duration {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(default)
}

/// Watches the test running on this thread from now on.
pub fn watch_this_test(test: &str) {
    let tid = rustix::thread::gettid().as_raw_nonzero().get();
    let st = state();
    st.tests.lock().unwrap_or_else(|e| e.into_inner()).insert(
        tid,
        Watched {
            test: test.to_owned(),
            since: Instant::now(),
        },
    );
    st.wake.notify_all();
}

fn watch(limit: Duration) {
    let st = state();
    let mut tests = st.tests.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        // Tests whose thread has ended are over.
        tests.retain(|tid, _| Path::new(&format!("/proc/self/task/{tid}")).exists());
        let now = Instant::now();
        if let Some(w) = tests.values().find(|w| now - w.since > limit) {
            let msg = format!(
                "HUNG: test {} has run for {} s (the limit, {LIMIT_ENV}, is {} s); what this test binary and every process below it are doing:",
                w.test,
                (now - w.since).as_secs(),
                limit.as_secs()
            );
            drop(tests);
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{msg}");
            let _ = err.write_all(describe_tree(std::process::id() as i32).as_bytes());
            let _ = writeln!(err, "HUNG: aborting the test binary");
            drop(err);
            std::process::abort();
        }
        // The next test to reach the limit, or a look now and then for one
        // that starts meanwhile.
        let next = tests
            .values()
            .map(|w| (w.since + limit).saturating_duration_since(now))
            .min()
            .unwrap_or(limit)
            .max(Duration::from_secs(1));
        tests = st
            .wake
            .wait_timeout(tests, next)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// `pid` and every process below it: each thread's state, wait channel
/// and kernel stack, then the user-space stacks from `gdb` if it is there.
pub fn describe_tree(pid: i32) -> String {
    let mut out = String::new();
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        all.extend(children(all[i]));
        i += 1;
    }
    for p in &all {
        out.push_str(&describe_process(*p));
    }
    out
}

fn children(pid: i32) -> Vec<i32> {
    let mut v = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let c = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        v.extend(c.split_whitespace().filter_map(|s| s.parse::<i32>().ok()));
    }
    v
}

/// One process as [`describe_tree`] shows it.
pub fn describe_process(pid: i32) -> String {
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let base = Path::new("/proc").join(pid.to_string());
    let cmdline = read(&base.join("cmdline")).replace('\0', " ");
    let mut out = format!("== process {pid}: {}\n", cmdline.trim());
    for t in std::fs::read_dir(base.join("task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let p = t.path();
        let stat = read(&p.join("stat"));
        // The state follows the command's closing parenthesis.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("?");
        out.push_str(&format!(
            "-- thread {} ({}) state {state} wchan {}\n",
            t.file_name().to_string_lossy(),
            read(&p.join("comm")).trim(),
            read(&p.join("wchan")).trim(),
        ));
        for l in read(&p.join("stack")).lines() {
            out.push_str(&format!("   {l}\n"));
        }
    }
    if pid != std::process::id() as i32 {
        out.push_str(&user_stacks(pid));
    }
    out
}

/// Every thread's user-space stack as `gdb` prints it, bounded in time;
/// a line saying so when there is no `gdb`.
fn user_stacks(pid: i32) -> String {
    if crate::which("gdb").is_none() || crate::which("timeout").is_none() {
        return "   (no gdb: no user-space stacks)\n".into();
    }
    match Command::new("timeout")
        .args(["60", "gdb", "-p", &pid.to_string(), "-batch", "-nx"])
        .args(["-ex", "set pagination off", "-ex", "thread apply all bt"])
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => format!("   (gdb: {e})\n"),
    }
}
