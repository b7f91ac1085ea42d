//! `alloxctl`: parses the command line and wires the library together.
//!
//! alloxctl starts without std's runtime start (`no_main`): on glibc that
//! start reads `/proc/self/maps` for the main thread's stack guard, maps
//! an alternate signal stack and installs `SIGSEGV`/`SIGBUS` handlers
//! before `main`, about 50 µs of a 2.5 ms `alloxctl exec` on a hypervisor
//! that charges for every mapping and fault. What alloxctl relies on from
//! it is done in [`main`]: `SIGPIPE` ignored (a closed pipe is an error
//! alloxctl reports, not its death), descriptors 0 to 2 open (on
//! `/dev/null` if they were not, so that no socket takes their place), and
//! standard output flushed at the end. A stack overflow is then a plain
//! `SIGSEGV`, without std's message.

#![no_main]

use allox_client::files::Output;
use allox_client::{error_chain, Client, ReconnectingClient};
use allox_ctl::cli::{Action, Cli, GatewayArgs, Run};
use allox_ctl::process;
use allox_ctl::render::render;
use allox_ctl::rpc_json;
use allox_gateway::{token, Gateway};
use allox_protocol::{ProcessStart, Request};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// The C entry point (see the module's description): the parts of
/// std's start alloxctl relies on, [`run`], and its status.
#[allow(unsafe_code)]
#[no_mangle]
extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    // SAFETY: setting SIGPIPE's disposition to ignore installs no code
    // and happens before any other thread exists.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigIgn,
        )
    };
    standard_fds_open();
    let code = run();
    // `exit` flushes standard output, as std's start does after `main`.
    std::process::exit(status_number(code))
}

/// Opens `/dev/null` on whichever of descriptors 0, 1 and 2 is closed, as
/// std's start does.
fn standard_fds_open() {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    use std::os::fd::AsFd;
    let (i, o, e) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let mut fds = [
        PollFd::from_borrowed_fd(i.as_fd(), PollFlags::empty()),
        PollFd::from_borrowed_fd(o.as_fd(), PollFlags::empty()),
        PollFd::from_borrowed_fd(e.as_fd(), PollFlags::empty()),
    ];
    if poll(&mut fds, Some(&Timespec::default())).is_err() {
        return;
    }
    let closed = fds
        .iter()
        .filter(|f| f.revents().contains(PollFlags::NVAL))
        .count();
    // Each open takes the lowest free descriptor: the closed ones, in order.
    for _ in 0..closed {
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        {
            Ok(f) => std::mem::forget(f),
            Err(_) => std::process::exit(1),
        }
    }
}

/// The number of an exit code (std keeps it to itself).
fn status_number(code: ExitCode) -> i32 {
    (0..=u8::MAX)
        .find(|n| ExitCode::from(*n) == code)
        .map_or(1, i32::from)
}

fn run() -> ExitCode {
    // Usage errors exit with 2, as clap does.
    let mut cli = Cli::parse_fast();
    if let Some(vm) = &cli.vm {
        match allox_ctl::vm::socket_of(&cli.vm_dir, vm, cli.if_running) {
            Ok(s) => cli.socket = s,
            Err(e) => {
                eprintln!("error: {}: {e}", e.code());
                return ExitCode::FAILURE;
            }
        }
    }
    match cli.command.action() {
        Action::Vm(cmd) => {
            let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
            ExitCode::from(allox_ctl::vm::run(
                cmd,
                &cli.vm_dir,
                cli.json,
                &mut out,
                &mut err,
            ))
        }
        Action::Call(request) => call(cli.socket, cli.json, request),
        Action::Exec(run) if run.tty => match request_of(run) {
            Ok(request) => {
                let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
                ExitCode::from(allox_ctl::tty::exec(
                    cli.socket, request, cli.json, &mut out, &mut err,
                ))
            }
            Err(code) => code,
        },
        Action::Exec(run) => {
            let how = allox_ctl::foreground::Foreground {
                detach: run.detach,
                interactive: run.interactive,
            };
            match request_of(run) {
                Ok(request) => {
                    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
                    ExitCode::from(allox_ctl::foreground::exec(
                        &cli.socket,
                        request,
                        cli.json,
                        how,
                        &mut out,
                        &mut err,
                    ))
                }
                Err(code) => code,
            }
        }
        Action::Attach(request) => {
            let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
            ExitCode::from(allox_ctl::tty::attach(
                cli.socket, request, &mut out, &mut err,
            ))
        }
        Action::Start(mut run) => {
            if run.tty {
                run.request.pty = Some(allox_ctl::tty::like_this_one());
            }
            start_run(cli.socket, cli.json, run, process::start)
        }
        Action::Shutdown(wait) => {
            let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
            ExitCode::from(allox_ctl::shutdown::shutdown(
                &cli.socket,
                cli.json,
                wait,
                &mut out,
                &mut err,
            ))
        }
        Action::Logs(request) => {
            let mut daemon = ReconnectingClient::new(cli.socket);
            let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
            ExitCode::from(process::logs(
                &mut daemon,
                request,
                cli.json,
                &mut out,
                &mut err,
            ))
        }
        Action::Wait(request) => {
            let mut daemon = ReconnectingClient::new(cli.socket);
            let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
            ExitCode::from(process::wait(
                &mut daemon,
                request,
                cli.json,
                &mut out,
                &mut err,
            ))
        }
        Action::Rpc(text) => {
            let (ok, answer) = rpc_json(&mut ReconnectingClient::new(cli.socket), &text);
            print(&format!("{answer}\n"));
            status(ok)
        }
        Action::Gateway(args) => gateway(&args, cli.socket),
        Action::Token(file) => match token::load_or_create(&file.resolve(&cli.socket)) {
            Ok((token, _)) => {
                print(&format!("{}\n", token.as_str()));
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("error: {}", error_chain(&err));
                ExitCode::FAILURE
            }
        },
        Action::Openapi => {
            let doc = allox_protocol::openapi::document();
            print(&format!("{doc:#}\n"));
            ExitCode::SUCCESS
        }
        Action::Follow(q) => follow(cli.socket, cli.json, q),
        Action::Cat(r) => {
            let out = Client::connect(&cli.socket)
                .map_err(allox_client::files::CopyError::from)
                .and_then(|mut c| {
                    let mut stdout = std::io::stdout().lock();
                    let n = allox_client::files::read_to(&mut c, &r, &mut stdout)?;
                    let _ = stdout.flush();
                    Ok(n)
                });
            match out {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {}", error_chain(&e));
                    ExitCode::FAILURE
                }
            }
        }
        Action::Top { interval, once } => top(cli.socket, cli.json, interval, once),
        Action::PortForward {
            agent,
            session,
            port,
            listen,
        } => report_status(allox_ctl::forward::forward(
            &cli.socket,
            &agent,
            &session,
            port,
            listen,
        )),
        Action::SecretSet { mut request, from } => match from.read() {
            Ok(v) => {
                request.value = allox_protocol::SecretValue(v);
                call(cli.socket, cli.json, Request::SecretSet(request))
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Action::MonitorIngest {
            agent,
            session,
            file,
        } => match read_spans(&file) {
            Ok(spans) => call(
                cli.socket,
                cli.json,
                Request::MonitorIngest(allox_protocol::MonitorIngest {
                    agent_id: agent,
                    session_id: session,
                    spans,
                }),
            ),
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Action::MonitorExport { query, out } => {
            let done = Client::connect(&cli.socket)
                .map_err(|e| error_chain(&e))
                .and_then(|mut c| {
                    allox_ctl::monitor::records(&mut c, query).map_err(|e| error_chain(&e))
                })
                .and_then(|recs| {
                    let text = format!("{}\n", allox_ctl::monitor::otlp(&recs));
                    match &out {
                        Some(p) => std::fs::write(p, text)
                            .map_err(|e| format!("write {}: {e}", p.display())),
                        None => {
                            print(&text);
                            Ok(())
                        }
                    }
                });
            report_status(done)
        }
        Action::MonitorReport {
            agent,
            session,
            out,
        } => {
            let done = Client::connect(&cli.socket)
                .map_err(|e| error_chain(&e))
                .and_then(|mut c| {
                    allox_ctl::monitor::gather(&mut c, &agent, &session)
                        .map_err(|e| error_chain(&e))
                })
                .and_then(|d| {
                    let html = allox_ctl::monitor::report_html(&d);
                    std::fs::write(&out, html)
                        .map_err(|e| format!("write {}: {e}", out.display()))?;
                    print(&format!(
                        "report of {agent}/{session} written to {} ({} records, {} turns, {} checkpoints, {} rollbacks)\n",
                        out.display(),
                        d.records.len(),
                        d.timeline.turns.len(),
                        d.timeline.checkpoints.len(),
                        d.rollbacks.len()
                    ));
                    Ok(())
                });
            report_status(done)
        }
        Action::Copy {
            from,
            to,
            shared,
            checkpoint,
            framed,
            verbose,
        } => copy(
            cli.socket,
            cli.json,
            &from,
            &to,
            CopyHow {
                shared,
                checkpoint,
                framed,
                verbose,
            },
        ),
        Action::EffectsVerify {
            query,
            export,
            root,
            verifier,
        } => {
            let answer = match (query, export) {
                (Some(q), _) => Client::connect(&cli.socket)
                    .map_err(|e| error_chain(&e))
                    .and_then(|mut c| allox_ctl::effects::verify_in_daemon(&mut c, q)),
                (None, Some(f)) => allox_ctl::effects::verify_export(
                    &allox_ctl::effects::verifier(verifier),
                    &f,
                    root.as_deref(),
                ),
                (None, None) => Err("give AGENT SESSION RUN, or --export FILE".into()),
            };
            match answer {
                Ok(v) => {
                    if cli.json {
                        print(&format!("{}\n", v.report));
                    } else {
                        print(&render(&allox_protocol::Response::EffectsVerified(
                            v.clone(),
                        )));
                    }
                    status(v.ok)
                }
                Err(e) => report_status(Err(e)),
            }
        }
        Action::EffectsExport { query, out } => {
            use std::io::IsTerminal;
            let done = if out.is_none() && std::io::stdout().is_terminal() {
                Err("the export is a tar archive: redirect it to a file, or give -o FILE".into())
            } else {
                Client::connect(&cli.socket)
                    .map_err(|e| error_chain(&e))
                    .and_then(|mut c| match &out {
                        Some(p) => {
                            // Written aside and renamed: no half export
                            // under the name asked for.
                            let mut f = Output::open(p)
                                .map_err(|e| format!("open {}: {e}", p.display()))?;
                            let n = allox_ctl::effects::export(&mut c, &query, f.file())?;
                            f.finish()
                                .map_err(|e| format!("write {}: {e}", p.display()))?;
                            eprintln!("{n} bytes written to {}", p.display());
                            Ok(())
                        }
                        None => {
                            let mut so = std::io::stdout().lock();
                            allox_ctl::effects::export(&mut c, &query, &mut so)?;
                            so.flush().map_err(|e| format!("write the export: {e}"))
                        }
                    })
            };
            report_status(done)
        }
        Action::SessionExport { query, out } => {
            report_status(session_export(&cli.socket, query, out, cli.json))
        }
        Action::SessionImport {
            agent,
            session,
            input,
        } => {
            let done = Client::connect(&cli.socket)
                .map_err(|e| error_chain(&e))
                .and_then(|mut c| {
                    let mut src: Box<dyn std::io::Read> = match &input {
                        Some(p) => Box::new(
                            std::fs::File::open(p)
                                .map_err(|e| format!("open {}: {e}", p.display()))?,
                        ),
                        None => Box::new(std::io::stdin().lock()),
                    };
                    allox_ctl::transfer::import(
                        &mut c,
                        &agent,
                        session.as_deref(),
                        &mut src,
                        Some(&cli.socket),
                    )
                });
            show_imported(done, cli.json)
        }
        Action::SessionMove {
            agent,
            session,
            to,
            new_session,
            since,
        } => {
            let done = Client::connect(&cli.socket)
                .map_err(|e| error_chain(&e))
                .and_then(|mut from| {
                    let mut to_client = Client::connect(&to)
                        .map_err(|e| format!("{}: {}", to.display(), error_chain(&e)))?;
                    allox_ctl::transfer::move_session(
                        &mut from,
                        &mut to_client,
                        &agent,
                        &session,
                        new_session.as_deref(),
                        since.as_deref(),
                        Some(&to),
                    )
                });
            show_imported(done, cli.json)
        }
    }
}

/// `alloxctl session export`: to a file (written aside and renamed) or to
/// standard output (not a terminal).
fn session_export(
    socket: &std::path::Path,
    query: allox_protocol::SessionExport,
    out: Option<PathBuf>,
    json: bool,
) -> Result<(), String> {
    use std::io::IsTerminal;
    if out.is_none() && std::io::stdout().is_terminal() {
        return Err(
            "the export is a binary archive: redirect it to a file, or give -o FILE".into(),
        );
    }
    let mut c = Client::connect(socket).map_err(|e| error_chain(&e))?;
    let done = match &out {
        Some(p) => {
            // Written aside and renamed (a device such as /dev/null
            // written to as it is): no half export under the name asked
            // for, and no other file touched.
            let mut f = Output::open(p).map_err(|e| format!("open {}: {e}", p.display()))?;
            let done = allox_ctl::transfer::export(&mut c, query, f.file())?;
            f.finish()
                .map_err(|e| format!("write {}: {e}", p.display()))?;
            done
        }
        None => allox_ctl::transfer::export(&mut c, query, &mut std::io::stdout().lock())?,
    };
    let shown = allox_protocol::Response::SessionExported(done);
    if json {
        eprintln!("{}", shown.to_json());
    } else {
        eprint!("{}", render(&shown));
    }
    Ok(())
}

fn show_imported(done: Result<allox_protocol::SessionImported, String>, json: bool) -> ExitCode {
    match done {
        Ok(i) => {
            let shown = allox_protocol::Response::SessionImported(i);
            if json {
                print(&format!("{}\n", shown.to_json()));
            } else {
                print(&render(&shown));
            }
            ExitCode::SUCCESS
        }
        Err(e) => report_status(Err(e)),
    }
}

fn report_status(done: Result<(), String>) -> ExitCode {
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Spans from a file ('-': stdin): a JSON array, or `{"spans": [...]}`.
fn read_spans(file: &std::path::Path) -> Result<Vec<allox_protocol::Span>, String> {
    let text = if file == std::path::Path::new("-") {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
            .map_err(|e| format!("read stdin: {e}"))?;
        s
    } else {
        std::fs::read_to_string(file).map_err(|e| format!("read {}: {e}", file.display()))?
    };
    let what = |e: String| {
        format!(
            "{}: not spans (a JSON array of spans, or {{\"spans\": [...]}}): {e}",
            file.display()
        )
    };
    let mut v: serde_json::Value = serde_json::from_str(&text).map_err(|e| what(e.to_string()))?;
    if let Some(list) = v.get_mut("spans") {
        v = list.take();
    }
    serde_json::from_value(v).map_err(|e| what(e.to_string()))
}

/// `top`: a screen every `interval` seconds (or one, after two samples).
/// With `--json`: each sample as one line, `{"sessions": [session.stats
/// answers]}` (the CPU used in µs, not as a share), the first at once.
fn top(socket: PathBuf, json: bool, interval: f64, once: bool) -> ExitCode {
    let pause = std::time::Duration::from_secs_f64(interval.clamp(0.1, 3600.0));
    let mut seen = allox_ctl::top::Seen::default();
    let mut first = true;
    loop {
        let screen = Client::connect(&socket)
            .map_err(|e| error_chain(&e))
            .and_then(|mut c| allox_ctl::top::sample(&mut c))
            .map(|stats| {
                if json {
                    let v = serde_json::json!({ "sessions": stats });
                    format!("{v}\n")
                } else {
                    allox_ctl::top::frame(&stats, &mut seen)
                }
            });
        match screen {
            Ok(text) if json => {
                print(&text);
                if once {
                    return ExitCode::SUCCESS;
                }
            }
            Ok(_) if once && first => {}
            Ok(text) if once => {
                print(&text);
                return ExitCode::SUCCESS;
            }
            Ok(text) => print(&format!("\x1b[H\x1b[2J{text}")),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
        first = false;
        std::thread::sleep(pause);
    }
}

/// `cp`'s options.
struct CopyHow {
    shared: bool,
    checkpoint: Option<String>,
    framed: bool,
    verbose: bool,
}

/// `cp`: one side local, the other AGENT/SESSION:PATH.
fn copy(socket: PathBuf, json: bool, from: &str, to: &str, how: CopyHow) -> ExitCode {
    use allox_client::files::{download_via, upload_via, CopyError, Remote, Via};
    let CopyHow {
        shared,
        checkpoint,
        framed,
        verbose,
    } = how;
    let via = if framed { Via::Frames } else { Via::Auto };
    let scope = if shared {
        allox_protocol::FsScope::Shared
    } else {
        allox_protocol::FsScope::Session
    };
    let side = |s: &str| {
        Remote::parse(s).map(|r| Remote {
            scope,
            checkpoint: checkpoint.clone(),
            ..r
        })
    };
    let out = match (side(from), side(to)) {
        (Some(_), Some(_)) | (None, None) => Err(CopyError::Other(
            "one side must be AGENT/SESSION:PATH and the other a local path".into(),
        )),
        (None, Some(_)) if checkpoint.is_some() => Err(CopyError::Other(
            "--checkpoint reads from a checkpoint; a copy into a session writes its files".into(),
        )),
        (None, Some(r)) => Client::connect(&socket)
            .map_err(CopyError::from)
            .and_then(|mut c| upload_via(&mut c, std::path::Path::new(from), &r, via)),
        (Some(r), None) => Client::connect(&socket)
            .map_err(CopyError::from)
            .and_then(|mut c| download_via(&mut c, &r, std::path::Path::new(to), via)),
    };
    match out {
        Ok(done) => {
            let by = serde_json::json!({
                "reflink": done.reflink,
                "copy_file_range": done.copy_file_range,
                "sendfile": done.sendfile,
                "frames": done.framed,
            });
            if json {
                print(&format!(
                    "{}\n",
                    serde_json::json!({"files": done.files, "bytes": done.bytes, "by": by})
                ));
            } else {
                print(&format!("{} files, {} bytes\n", done.files, done.bytes));
            }
            if verbose && !json {
                let ways: Vec<String> = [
                    ("by reflink", done.reflink),
                    ("by copy_file_range", done.copy_file_range),
                    ("by sendfile", done.sendfile),
                    ("in frames", done.framed),
                ]
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(w, n)| format!("{n} {w}"))
                .collect();
                if !ways.is_empty() {
                    eprintln!("files moved: {}", ways.join(", "));
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// `events --follow`, `net audit --follow`: the backlog, then every new
/// event, until interrupted.
fn follow(socket: PathBuf, json: bool, q: Request) -> ExitCode {
    use allox_protocol::Event;
    let answer = Client::connect(&socket).and_then(|mut client| {
        client.call_with_events(q, |e| {
            let (value, text) = match &e {
                Event::Process(ev) => (
                    serde_json::to_value(ev),
                    allox_ctl::render::process_event(ev),
                ),
                Event::Network(r) => (
                    serde_json::to_value(r),
                    allox_ctl::render::network::audit_record(r),
                ),
                Event::Fs(e) => (serde_json::to_value(e), allox_ctl::render::fs_event(e)),
                Event::Monitor(r) => (
                    serde_json::to_value(r),
                    allox_ctl::render::monitor::record(r),
                ),
                _ => return,
            };
            if json {
                print(&format!("{}\n", value.unwrap_or_default()));
            } else {
                print(&text);
            }
        })
    });
    match answer {
        Ok(Ok(_)) => ExitCode::SUCCESS,
        Ok(Err(body)) => {
            eprintln!("error: {}", allox_ctl::render::refusal(&body));
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("error: {}", allox_ctl::render::refusal(&err.to_body()));
            ExitCode::FAILURE
        }
    }
}

fn call(socket: PathBuf, json: bool, request: Request) -> ExitCode {
    // One call: its Hello goes out with it.
    let answer = Client::connect_pipelined(&socket, None)
        .and_then(|mut client| client.call(request))
        .unwrap_or_else(|err| Err(err.to_body()));
    match &answer {
        Ok(response) if json => print(&format!("{:#}\n", response.to_json())),
        Ok(response) => print(&render(response)),
        Err(body) => eprintln!("error: {}", allox_ctl::render::refusal(body)),
    }
    // `check` fails when the store is not consistent.
    let consistent = match &answer {
        Ok(allox_protocol::Response::StoreCheck(r)) => r.is_consistent(),
        _ => true,
    };
    status(answer.is_ok() && consistent)
}

/// The signature of [`process::start`].
type Launch = fn(&mut ReconnectingClient, ProcessStart, bool, &mut dyn Write, &mut dyn Write) -> u8;

/// The run's request, its stdin file read; or the error, said.
fn request_of(run: Run) -> Result<ProcessStart, ExitCode> {
    run.into_request().map_err(|err| {
        eprintln!("error: {}", error_chain(&err));
        ExitCode::FAILURE
    })
}

fn start_run(socket: PathBuf, json: bool, run: Run, launch: Launch) -> ExitCode {
    let request = match request_of(run) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let mut daemon = ReconnectingClient::new(socket);
    ExitCode::from(launch(&mut daemon, request, json, &mut out, &mut err))
}

fn gateway(args: &GatewayArgs, socket: PathBuf) -> ExitCode {
    let json = args.log_format == allox_ctl::cli::LogFormat::Json;
    let logs = tracing_subscriber::fmt()
        .log_internal_errors(false)
        .with_env_filter(
            std::env::var("ALLOX_LOG")
                .ok()
                .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
                .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr);
    if json {
        logs.json().flatten_event(true).init();
    } else {
        logs.with_ansi(false).init();
    }
    // What the gateway says of itself: plain lines, or (--log-format json)
    // log events like the rest.
    let say = move |msg: String| {
        if json {
            tracing::info!("{msg}");
        } else {
            eprintln!("alloxctl gateway: {msg}");
        }
    };
    let cfg = args.config(&socket);
    let gateway = match Gateway::bind(&cfg) {
        Ok(g) => g,
        Err(err) => {
            eprintln!("error: {}", error_chain(&err));
            return ExitCode::FAILURE;
        }
    };
    // Scripts read the address from the first line, said once a stop
    // signal is caught (a script that stops the gateway as soon as it
    // has read it does stop it).
    let mut lines = vec![format!(
        "POST http://{}/v1/rpc -> {}",
        gateway.local_addr(),
        socket.display()
    )];
    lines.push(match &cfg.token_env {
        Some(name) => format!("bearer token from ${name}"),
        None => format!(
            "bearer token in {} ({}); `alloxctl token` prints it",
            cfg.token_file.display(),
            if gateway.token_created() {
                "new"
            } else {
                "existing"
            }
        ),
    });
    if let Some(m) = gateway.metrics_addr() {
        lines.push(format!("GET http://{m}/metrics (no token)"));
    } else if cfg.metrics_token_file.is_some() || cfg.metrics_token_env.is_some() {
        lines.push(format!(
            "GET http://{}/metrics with the metrics token",
            gateway.local_addr()
        ));
    }
    match gateway.run_ready(move || lines.into_iter().for_each(say)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", error_chain(&err));
            ExitCode::FAILURE
        }
    }
}

/// Writes to stdout; a reader that went away (`| head`) is not an error.
fn print(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn status(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
