//! Command lines parsed and mapped, end to end: every noun's arguments
//! and the request or action they make.

use super::*;
use allox_protocol::{AgentCreate, AuditList, CheckpointCreate};
use clap::CommandFactory;

/// The global flags and the action of a command line.
fn parse(args: &[&str]) -> (PathBuf, bool, Action) {
    let argv = std::iter::once("alloxctl").chain(args.iter().copied());
    let cli = Cli::try_parse_from(argv).unwrap();
    (cli.socket, cli.json, cli.command.action())
}

#[test]
fn every_argument_and_flag_says_what_it_is() {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if matches!(id, "help" | "version") || a.is_hide_set() {
                continue;
            }
            if a.get_help().is_none() && a.get_long_help().is_none() {
                missing.push(format!("{path} {id}"));
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }
    let mut missing = Vec::new();
    walk(&Cli::command(), "alloxctl", &mut missing);
    assert!(missing.is_empty(), "without help text: {missing:#?}");
}

#[test]
fn definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn commands_map_to_requests() {
    let (socket, json, action) =
        parse(&["--socket", "/tmp/x.sock", "--json", "agent", "create", "a"]);
    assert_eq!(socket, PathBuf::from("/tmp/x.sock"));
    assert!(json);
    assert_eq!(
        action,
        Action::Call(Request::AgentCreate(AgentCreate::new("a")))
    );

    let (_, _, action) = parse(&[
        "checkpoint",
        "create",
        "a",
        "s",
        "c",
        "--pin",
        "--label",
        "before",
    ]);
    assert_eq!(
        action,
        Action::Call(Request::CheckpointCreate(CheckpointCreate {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "c".into(),
            pinned: true,
            label: Some("before".into()),
        }))
    );

    let (_, _, action) = parse(&["checkpoint", "unpin", "a", "s", "c"]);
    assert!(matches!(action, Action::Call(Request::CheckpointPin(p)) if !p.pinned));

    let (_, _, action) = parse(&["rollback", "a", "s", "c"]);
    assert!(
        matches!(action, Action::Call(Request::SessionRollback(r)) if r.kill_processes.is_none())
    );
    let (_, _, action) = parse(&["rollback", "a", "s", "c", "--kill-processes"]);
    assert!(
        matches!(action, Action::Call(Request::SessionRollback(r)) if r.kill_processes == Some(true))
    );

    let (_, _, action) = parse(&["audit", "--after", "5", "--limit", "10"]);
    assert_eq!(
        action,
        Action::Call(Request::AuditList(AuditList {
            after_seq: Some(5),
            before_seq: None,
            limit: Some(10),
        }))
    );

    // Global flags may follow the subcommand too.
    let (_, json, action) = parse(&["rpc", "{}", "--json"]);
    assert!(json);
    assert_eq!(action, Action::Rpc("{}".into()));

    let (socket, _, action) = parse(&["gateway"]);
    let Action::Gateway(args) = action else {
        panic!("{action:?}")
    };
    let cfg = args.config(&socket);
    assert_eq!(cfg.listen, "127.0.0.1:8092");
    assert_eq!(cfg.token_file, PathBuf::from("/run/allox/gateway.token"));
    assert!(!cfg.allow_remote && cfg.allow_origins.is_empty());
    assert_eq!(cfg.daemon_timeout, allox_gateway::DAEMON_TIMEOUT);

    let (socket, _, action) = parse(&[
        "--socket",
        "/tmp/s/ctl.sock",
        "gateway",
        "--listen",
        "0.0.0.0:9000",
        "--allow-remote",
        "--allow-origin",
        "https://a.example",
        "--allow-origin",
        "https://b.example",
        "--daemon-timeout-ms",
        "500",
    ]);
    let Action::Gateway(args) = action else {
        panic!("{action:?}")
    };
    let cfg = args.config(&socket);
    assert_eq!(cfg.token_file, PathBuf::from("/tmp/s/gateway.token"));
    assert!(cfg.allow_remote);
    assert_eq!(
        cfg.allow_origins,
        ["https://a.example", "https://b.example"]
    );
    assert_eq!(cfg.daemon_timeout, std::time::Duration::from_millis(500));

    let (_, _, action) = parse(&["token", "--token-file", "/etc/t"]);
    assert_eq!(
        action,
        Action::Token(TokenFileArg {
            token_file: Some("/etc/t".into())
        })
    );

    let diff = |patch| {
        Action::Call(Request::CheckpointDiff(allox_protocol::CheckpointDiff {
            agent_id: "a".into(),
            session_id: "s".into(),
            from: "c".into(),
            to: "current".into(),
            patch,
        }))
    };
    assert_eq!(parse(&["diff", "a", "s", "c", "current"]).2, diff(false));
    assert_eq!(
        parse(&["diff", "a", "s", "c", "current", "--patch"]).2,
        diff(true)
    );
    assert_eq!(
        parse(&["diff", "-p", "a", "s", "c", "current"]).2,
        diff(true)
    );
}

#[test]
fn exec_and_start_build_process_start() {
    let (_, _, action) = parse(&[
        "exec",
        "--cwd",
        "src",
        "--env",
        "A=1",
        "--env",
        "B=x=y",
        "--env",
        "A=2",
        "--timeout-ms",
        "500",
        "a",
        "s",
        "--",
        "ls",
        "-la",
        "--json",
    ]);
    let Action::Exec(run) = action else {
        panic!("{action:?}")
    };
    assert_eq!(run.stdin_file, None);
    let r = run.into_request().unwrap();
    assert_eq!((r.agent_id.as_str(), r.session_id.as_str()), ("a", "s"));
    // Everything after `--` belongs to the program.
    assert_eq!(r.argv, ["ls", "-la", "--json"]);
    let env: Vec<_> = r
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(env, [("A", "2"), ("B", "x=y")]);
    assert_eq!(r.cwd.as_deref(), Some("src"));
    assert_eq!(r.timeout_ms, Some(500));
    assert_eq!(r.stdin.as_deref(), Some(&b""[..]));
    assert!(r.wait && r.stream);

    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    std::fs::write(&input, "data\n").unwrap();
    let input = input.to_str().unwrap();
    let (_, json, action) = parse(&[
        "start",
        "a",
        "s",
        "--stdin-file",
        input,
        "--json",
        "--",
        "cat",
    ]);
    assert!(json);
    let Action::Start(run) = action else {
        panic!("{action:?}")
    };
    let r = run.into_request().unwrap();
    assert_eq!(r.stdin.as_deref(), Some(&b"data\n"[..]));
    assert!(!r.wait && !r.stream);

    let (_, _, action) = parse(&["start", "a", "s", "--", "sleep", "9"]);
    let Action::Start(run) = action else {
        panic!("{action:?}")
    };
    assert_eq!(run.request.stdin, None);
}

#[test]
fn process_commands_map_to_requests() {
    let (_, _, action) = parse(&["ps", "a", "s"]);
    assert_eq!(
        action,
        Action::Call(Request::ProcessList(session_ref("a".into(), "s".into())))
    );

    let kill = |args: &[&str]| match parse(args).2 {
        Action::Call(Request::ProcessKill(k)) => (k.run_id, k.signal),
        other => panic!("{other:?}"),
    };
    assert_eq!(kill(&["kill", "a", "s"]), (None, None));
    assert_eq!(
        kill(&["kill", "a", "s", "r1", "--signal", "15"]),
        (Some("r1".into()), Some(15))
    );
    assert_eq!(
        kill(&["kill", "--signal", "SIGINT", "a", "s"]),
        (None, Some(2))
    );

    let (_, _, action) = parse(&["wait", "a", "s", "r1", "--timeout-ms", "10"]);
    assert_eq!(
        action,
        Action::Wait(ProcessWait {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: "r1".into(),
            timeout_ms: Some(10),
        })
    );
}

#[test]
fn usage_errors_are_refused() {
    for args in [
        &["session", "create", "a"][..],
        &["checkpoint", "list", "a"],
        &["audit", "--limit", "many"],
        &["exec", "a", "s"],
        &["exec", "a", "s", "--"],
        &["exec", "a", "s", "ls"],
        &["exec", "--env", "NOEQUALS", "a", "s", "--", "ls"],
        &["exec", "--env", "=v", "a", "s", "--", "ls"],
        &["start", "a", "--", "ls"],
        &["kill", "a", "s", "--signal", "FLY"],
        &["kill", "a", "s", "--signal", "0"],
        &["wait", "a", "s"],
        &["fly"],
    ] {
        let argv = std::iter::once("alloxctl").chain(args.iter().copied());
        assert!(Cli::try_parse_from(argv).is_err(), "{args:?}");
    }
}

#[test]
fn the_hot_commands_parse_alone_as_the_whole_parser_parses_them() {
    // Each line's words, split at spaces.
    let lines = [
        "exec a s -- /bin/true",
        "--json exec a s --env K=V --cwd d -- sh -c x",
        "--socket /tmp/x.sock exec -t a s -- bash",
        "--socket=/tmp/y.sock cp -v ./f a/s:f",
        "cp --checkpoint c1 a/s:f ./f --json",
        "cp --framed --shared ./f a/s:notes/f",
        // Read without a parser: `exec AGENT SESSION -- CMD...` alone.
        "--json --socket=/tmp/z.sock exec a s -- x -- -y",
        "--socket /tmp/x.sock exec a-1 s.2 -- sh -c true",
        "exec a s -- --",
        // The parser's: a global option after the command, an option.
        "exec a s --json -- x",
        "exec -i a s -- x",
    ];
    for args in lines {
        let argv: Vec<&str> = std::iter::once("alloxctl").chain(args.split(' ')).collect();
        let fast = Cli::fast_from(&argv).unwrap_or_else(|| panic!("{args:?}: not taken"));
        let whole = Cli::try_parse_from(&argv).unwrap();
        assert_eq!(format!("{fast:?}"), format!("{whole:?}"), "{args:?}");
    }
    // The plain line is read without a parser; anything else is not.
    let words = |w: &[&str]| w.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
    let plain = super::plain_exec(&words(&["a", "s", "--", "x", "--"])).unwrap();
    assert_eq!(
        format!("{plain:?}"),
        format!(
            "{:?}",
            super::RunArgs::plain("a".into(), "s".into(), vec!["x".into(), "--".into()])
        )
    );
    for w in [
        &["a", "s", "x"][..],
        &["a", "s", "--"],
        &["-i", "a", "s", "--", "x"],
        &["a", "--json", "--", "x"],
    ] {
        assert!(super::plain_exec(&words(w)).is_none(), "{w:?}");
    }
    // Help, mistakes and the other commands go to the whole parser.
    for args in [
        &["exec", "--help"][..],
        &["exec"],
        &["cp", "onlyone"],
        &["exec", "a", "s", "--bogus", "--", "x"],
        &["ping"],
        &["--socket"],
        &["session", "exec"],
        &["exec", "a", "s", "--"],
        &["exec", "a", "s", "x"],
        &["exec", "-a", "s", "--", "x"],
        &["--json", "--json", "exec", "a", "s", "--", "x"],
        &[
            "--socket", "/a", "--socket", "/b", "exec", "a", "s", "--", "x",
        ],
    ] {
        let argv: Vec<&str> = std::iter::once("alloxctl")
            .chain(args.iter().copied())
            .collect();
        assert!(Cli::fast_from(&argv).is_none(), "{args:?}");
    }
}
