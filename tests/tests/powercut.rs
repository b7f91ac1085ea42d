//! Power cuts in the guest: mutations over the virtio-serial control port,
//! QEMU killed with SIGKILL at chosen moments (while a request is in flight,
//! or the instant its answer arrives), then a boot on the same store image.
//!
//! A model of the store follows every acknowledged request. After each
//! boot the state read back must be exactly the model, or, for the one
//! request that was in flight, exactly the model before or after it — never
//! a mix — and `store.check` must find the index equal to the subvolumes on
//! disk with nothing unfinished in the journal.

use allox_ctl::client::{Client, ClientError};
use allox_integration::vm::{require_vm, store_image, GuestImage, Vm};
use allox_protocol::*;
use std::collections::BTreeMap;
use std::time::Duration;

const BOOT: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
struct Ck {
    parent: Option<String>,
    /// The marker file's value in the checkpoint (not read back directly:
    /// a rollback shows it).
    marker: u64,
    pinned: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
struct Sess {
    cks: BTreeMap<String, Ck>,
    head: Option<String>,
    /// Content of `current/marker` (0: no file).
    marker: u64,
    auto: bool,
    /// The open turn, if any, and how many turns began.
    turn: Option<String>,
    turns: u64,
}

type Model = BTreeMap<String, BTreeMap<String, Sess>>;

/// What can be read back: everything but the marker values of checkpoints
/// and the turn state.
#[derive(Debug, PartialEq, Eq)]
struct SessView {
    cks: BTreeMap<String, (Option<String>, bool)>,
    head: Option<String>,
    marker: u64,
    auto: bool,
}

type View = BTreeMap<String, BTreeMap<String, SessView>>;

fn view(m: &Model) -> View {
    m.iter()
        .map(|(a, ss)| {
            let ss = ss
                .iter()
                .map(|(s, x)| {
                    let cks = x
                        .cks
                        .iter()
                        .map(|(c, k)| (c.clone(), (k.parent.clone(), k.pinned)))
                        .collect();
                    (
                        s.clone(),
                        SessView {
                            cks,
                            head: x.head.clone(),
                            marker: x.marker,
                            auto: x.auto,
                        },
                    )
                })
                .collect();
            (a.clone(), ss)
        })
        .collect()
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    AgentCreate(String),
    AgentDelete(String),
    SessionCreate(String, String),
    SessionDelete(String, String),
    /// A run writes the marker and syncs it.
    Write(String, String, u64),
    CheckpointCreate(String, String, String),
    CheckpointDelete(String, String, String),
    Pin(String, String, String, bool),
    Rollback(String, String, String),
    Policy(String, String, bool),
    TurnBegin(String, String, String),
    TurnEnd(String, String, String),
}

const KINDS: [&str; 12] = [
    "agent.create",
    "agent.delete",
    "session.create",
    "session.delete",
    "write",
    "checkpoint.create",
    "checkpoint.delete",
    "checkpoint.pin",
    "session.rollback",
    "policy.set",
    "turn.begin",
    "turn.end",
];

fn kind(op: &Op) -> &'static str {
    KINDS[match op {
        Op::AgentCreate(..) => 0,
        Op::AgentDelete(..) => 1,
        Op::SessionCreate(..) => 2,
        Op::SessionDelete(..) => 3,
        Op::Write(..) => 4,
        Op::CheckpointCreate(..) => 5,
        Op::CheckpointDelete(..) => 6,
        Op::Pin(..) => 7,
        Op::Rollback(..) => 8,
        Op::Policy(..) => 9,
        Op::TurnBegin(..) => 10,
        Op::TurnEnd(..) => 11,
    }]
}

fn add_checkpoint(x: &mut Sess, c: &str) {
    let ck = Ck {
        parent: x.head.clone(),
        marker: x.marker,
        pinned: false,
    };
    x.cks.insert(c.to_string(), ck);
    x.head = Some(c.to_string());
}

/// The model after `op` succeeded.
fn apply(m: &Model, op: &Op) -> Model {
    let mut m = m.clone();
    match op {
        Op::AgentCreate(a) => {
            m.insert(a.clone(), BTreeMap::new());
        }
        Op::AgentDelete(a) => {
            m.remove(a);
        }
        Op::SessionCreate(a, s) => {
            m.get_mut(a).unwrap().insert(s.clone(), Sess::default());
        }
        Op::SessionDelete(a, s) => {
            m.get_mut(a).unwrap().remove(s);
        }
        other => {
            let x = m
                .get_mut(other_agent(other))
                .and_then(|ss| ss.get_mut(other_session(other)))
                .expect("session in model");
            match other {
                Op::Write(_, _, v) => x.marker = *v,
                Op::CheckpointCreate(_, _, c) => add_checkpoint(x, c),
                Op::CheckpointDelete(_, _, c) => {
                    let gone = x.cks.remove(c).unwrap();
                    for k in x.cks.values_mut() {
                        if k.parent.as_deref() == Some(c) {
                            k.parent = gone.parent.clone();
                        }
                    }
                    if x.head.as_deref() == Some(c) {
                        x.head = gone.parent;
                    }
                }
                Op::Pin(_, _, c, p) => x.cks.get_mut(c).unwrap().pinned = *p,
                Op::Rollback(_, _, c) => {
                    x.marker = x.cks[c].marker;
                    x.head = Some(c.clone());
                }
                Op::Policy(_, _, on) => x.auto = *on,
                Op::TurnBegin(_, _, t) => {
                    x.turn = Some(t.clone());
                    x.turns += 1;
                }
                Op::TurnEnd(..) => {
                    x.turn = None;
                    if x.auto {
                        let c = format!("turn-{}", x.turns);
                        add_checkpoint(x, &c);
                    }
                }
                _ => unreachable!(),
            }
        }
    }
    m
}

fn other_agent(op: &Op) -> &str {
    match op {
        Op::Write(a, ..)
        | Op::CheckpointCreate(a, ..)
        | Op::CheckpointDelete(a, ..)
        | Op::Pin(a, ..)
        | Op::Rollback(a, ..)
        | Op::Policy(a, ..)
        | Op::TurnBegin(a, ..)
        | Op::TurnEnd(a, ..) => a,
        _ => unreachable!(),
    }
}

fn other_session(op: &Op) -> &str {
    match op {
        Op::Write(_, s, ..)
        | Op::CheckpointCreate(_, s, ..)
        | Op::CheckpointDelete(_, s, ..)
        | Op::Pin(_, s, ..)
        | Op::Rollback(_, s, ..)
        | Op::Policy(_, s, ..)
        | Op::TurnBegin(_, s, ..)
        | Op::TurnEnd(_, s, ..) => s,
        _ => unreachable!(),
    }
}

// ---------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------

fn sref(a: &str, s: &str) -> SessionRef {
    SessionRef {
        agent_id: a.into(),
        session_id: s.into(),
    }
}

fn run(a: &str, s: &str, script: &str) -> Request {
    Request::ProcessStart(ProcessStart {
        agent_id: a.into(),
        session_id: s.into(),
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: Default::default(),
        cwd: None,
        stdin: None,
        timeout_ms: None,
        wait: true,
        stream: false,
        pty: None,
        trace: None,
        on_disconnect: Default::default(),
        recovery: None,
    })
}

fn request(op: &Op) -> Request {
    match op {
        Op::AgentCreate(a) => Request::AgentCreate(AgentCreate::new(a.clone())),
        Op::AgentDelete(a) => Request::AgentDelete(AgentDelete {
            agent_id: a.clone(),
            force: true,
        }),
        Op::SessionCreate(a, s) => Request::SessionCreate(SessionCreate::new(a, s)),
        Op::SessionDelete(a, s) => Request::SessionDelete(SessionDelete {
            force: true,
            ..SessionDelete::new(a.clone(), s.clone())
        }),
        Op::Write(a, s, v) => run(a, s, &format!("echo {v} > marker && sync")),
        Op::CheckpointCreate(a, s, c) => Request::CheckpointCreate(CheckpointCreate {
            agent_id: a.clone(),
            session_id: s.clone(),
            checkpoint_id: c.clone(),
            pinned: false,
            label: None,
        }),
        Op::CheckpointDelete(a, s, c) => Request::CheckpointDelete(CheckpointRef {
            agent_id: a.clone(),
            session_id: s.clone(),
            checkpoint_id: c.clone(),
        }),
        Op::Pin(a, s, c, p) => Request::CheckpointPin(CheckpointPin {
            agent_id: a.clone(),
            session_id: s.clone(),
            checkpoint_id: c.clone(),
            pinned: *p,
        }),
        Op::Rollback(a, s, c) => Request::SessionRollback(SessionRollback {
            agent_id: a.clone(),
            session_id: s.clone(),
            checkpoint_id: c.clone(),
            kill_processes: None,
        }),
        Op::Policy(a, s, on) => Request::PolicySet(PolicySet {
            agent_id: a.clone(),
            session_id: Some(s.clone()),
            auto_checkpoint: Some(*on),
            keep_last: None,
        }),
        Op::TurnBegin(a, s, t) => Request::TurnBegin(TurnBegin {
            agent_id: a.clone(),
            session_id: s.clone(),
            turn_id: Some(t.clone()),
        }),
        Op::TurnEnd(a, s, t) => Request::TurnEnd(TurnEnd {
            agent_id: a.clone(),
            session_id: s.clone(),
            turn_id: t.clone(),
            status: TurnStatus::Ok,
            label: None,
        }),
    }
}

fn ok(c: &mut Client, r: Request) -> Response {
    let what = format!("{r:?}");
    match c.call(r) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => panic!("{what} failed: {e:?}"),
        Err(e) => panic!("{what}: transport: {e}"),
    }
}

/// Sends `op`; `Ok(true)` once it is acknowledged, `Ok(false)` if the
/// transport died first (the op is in flight).
fn send(c: &mut Client, op: &Op) -> bool {
    match c.call(request(op)) {
        Ok(Ok(Response::Exited(r))) => {
            assert_eq!(r.exit_code, Some(0), "{op:?}: {r:?}");
            true
        }
        Ok(Ok(_)) => true,
        Ok(Err(e)) if e.code == ErrorCode::Unavailable => false,
        Ok(Err(e)) => panic!("{op:?} refused: {e:?}"),
        Err(ClientError::Read(_) | ClientError::Closed | ClientError::Write(_)) => false,
        Err(e) => panic!("{op:?}: {e}"),
    }
}

/// Reads back everything the model predicts.
fn observe(c: &mut Client) -> View {
    let mut out = View::new();
    let Response::Agents(l) = ok(c, Request::AgentList(AgentList {})) else {
        panic!("agent.list")
    };
    for a in l.agents {
        let a = a.agent_id;
        let Response::Sessions(ss) = ok(
            c,
            Request::SessionList(AgentRef {
                agent_id: a.clone(),
            }),
        ) else {
            panic!("session.list")
        };
        let mut sv = BTreeMap::new();
        for s in ss.sessions {
            let s = s.session_id;
            let Response::Checkpoints(cl) = ok(c, Request::CheckpointList(sref(&a, &s))) else {
                panic!("checkpoint.list")
            };
            let cks = cl
                .checkpoints
                .iter()
                .map(|k| (k.checkpoint_id.clone(), (k.parent.clone(), k.pinned)))
                .collect();
            let Response::Exited(r) = ok(c, run(&a, &s, "cat marker 2>/dev/null || echo 0")) else {
                panic!("cat marker")
            };
            assert_eq!(r.exit_code, Some(0), "{r:?}");
            let marker = r.stdout.trim().parse().expect("marker is a number");
            // policy.set without changes answers the policy in force.
            let Response::Policy(p) = ok(
                c,
                Request::PolicySet(PolicySet {
                    agent_id: a.clone(),
                    session_id: Some(s.clone()),
                    auto_checkpoint: None,
                    keep_last: None,
                }),
            ) else {
                panic!("policy.set")
            };
            sv.insert(
                s,
                SessView {
                    cks,
                    head: cl.head,
                    marker,
                    auto: p.auto_checkpoint,
                },
            );
        }
        out.insert(a, sv);
    }
    out
}

fn check_store(c: &mut Client, round: usize) {
    let Response::StoreCheck(r) = ok(c, Request::StoreCheck(StoreCheckRequest {})) else {
        panic!("store.check")
    };
    assert!(
        r.is_consistent() && r.removing == 0 && r.read_only.is_none(),
        "round {round}: the store after recovery is not consistent: {r:?}"
    );
}

// ---------------------------------------------------------------------------
// Choosing operations
// ---------------------------------------------------------------------------

/// xorshift64*: reproducible from the seed the test prints.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

struct Names {
    next: u64,
}

impl Names {
    fn fresh(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next)
    }
}

/// Operations that make `kind` possible and then `kind` itself, chosen from
/// the model as it will be after the earlier ones.
fn plan(m: &Model, kind: &str, rng: &mut Rng, names: &mut Names) -> Vec<Op> {
    let mut ops = Vec::new();
    let mut m = m.clone();
    let push = |m: &mut Model, ops: &mut Vec<Op>, op: Op| {
        *m = apply(m, &op);
        ops.push(op);
    };
    if kind == "agent.create" {
        push(&mut m, &mut ops, Op::AgentCreate(names.fresh("a")));
        return ops;
    }
    // An agent and a session to work in.
    if m.is_empty() || (m.len() < 3 && rng.below(4) == 0) {
        push(&mut m, &mut ops, Op::AgentCreate(names.fresh("a")));
    }
    let agents: Vec<String> = m.keys().cloned().collect();
    let a = rng.pick(&agents).clone();
    if kind == "session.create" {
        push(&mut m, &mut ops, Op::SessionCreate(a, names.fresh("s")));
        return ops;
    }
    if m[&a].is_empty() || (m[&a].len() < 3 && rng.below(4) == 0) {
        push(
            &mut m,
            &mut ops,
            Op::SessionCreate(a.clone(), names.fresh("s")),
        );
    }
    let sessions: Vec<String> = m[&a].keys().cloned().collect();
    let s = rng.pick(&sessions).clone();
    let write =
        |names: &mut Names| Op::Write(a.clone(), s.clone(), names.fresh("").parse().unwrap());
    // Some content and history, so that deletes and rollbacks change much.
    if m[&a][&s].cks.is_empty() || rng.below(2) == 0 {
        push(&mut m, &mut ops, write(names));
        push(
            &mut m,
            &mut ops,
            Op::CheckpointCreate(a.clone(), s.clone(), names.fresh("c")),
        );
    }
    match kind {
        "agent.delete" => push(&mut m, &mut ops, Op::AgentDelete(a.clone())),
        "session.delete" => push(&mut m, &mut ops, Op::SessionDelete(a.clone(), s.clone())),
        "write" => push(&mut m, &mut ops, write(names)),
        "checkpoint.create" => {
            push(&mut m, &mut ops, write(names));
            let c = names.fresh("c");
            push(
                &mut m,
                &mut ops,
                Op::CheckpointCreate(a.clone(), s.clone(), c),
            );
        }
        "checkpoint.delete" => {
            let x = &m[&a][&s];
            let unpinned: Vec<String> = x
                .cks
                .iter()
                .filter(|(_, k)| !k.pinned)
                .map(|(c, _)| c.clone())
                .collect();
            let c = if unpinned.is_empty() {
                let c = names.fresh("c");
                push(
                    &mut m,
                    &mut ops,
                    Op::CheckpointCreate(a.clone(), s.clone(), c.clone()),
                );
                c
            } else {
                rng.pick(&unpinned).clone()
            };
            push(
                &mut m,
                &mut ops,
                Op::CheckpointDelete(a.clone(), s.clone(), c),
            );
        }
        "checkpoint.pin" => {
            let cks: Vec<(String, bool)> = m[&a][&s]
                .cks
                .iter()
                .map(|(c, k)| (c.clone(), k.pinned))
                .collect();
            let (c, p) = rng.pick(&cks).clone();
            push(&mut m, &mut ops, Op::Pin(a.clone(), s.clone(), c, !p));
        }
        "session.rollback" => {
            // Current differs from every checkpoint, so a half-done
            // rollback would show.
            push(&mut m, &mut ops, write(names));
            let cks: Vec<String> = m[&a][&s].cks.keys().cloned().collect();
            let c = rng.pick(&cks).clone();
            push(&mut m, &mut ops, Op::Rollback(a.clone(), s.clone(), c));
        }
        "policy.set" => {
            let on = !m[&a][&s].auto;
            push(&mut m, &mut ops, Op::Policy(a.clone(), s.clone(), on));
        }
        "turn.begin" | "turn.end" => {
            if let Some(t) = m[&a][&s].turn.clone() {
                push(&mut m, &mut ops, Op::TurnEnd(a.clone(), s.clone(), t));
            }
            if kind == "turn.end" && !m[&a][&s].auto && rng.below(3) != 0 {
                push(&mut m, &mut ops, Op::Policy(a.clone(), s.clone(), true));
            }
            let t = names.fresh("t");
            push(
                &mut m,
                &mut ops,
                Op::TurnBegin(a.clone(), s.clone(), t.clone()),
            );
            if kind == "turn.end" {
                push(&mut m, &mut ops, write(names));
                push(&mut m, &mut ops, Op::TurnEnd(a.clone(), s.clone(), t));
            }
        }
        other => unreachable!("{other}"),
    }
    ops
}

// ---------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------

/// After a boot: the state must be `model`, or `after` if the op in flight
/// was applied. Returns the model that holds.
fn settle(c: &mut Client, model: Model, in_flight: Option<(Op, Model)>, round: usize) -> Model {
    let seen = observe(c);
    let Some((op, after)) = in_flight else {
        assert_eq!(
            seen,
            view(&model),
            "round {round}: an acknowledged change is missing after the power cut"
        );
        return model;
    };
    let before_ok = seen == view(&model);
    let after_ok = seen == view(&after);
    assert!(
        before_ok || after_ok,
        "round {round}: {op:?} was in flight and is half there:\nseen   {seen:?}\nbefore {:?}\nafter  {:?}",
        view(&model),
        view(&after)
    );
    if before_ok && after_ok {
        // Only the turn state tells them apart: ask by ending the turn
        // (a failed turn takes no checkpoint).
        if let Op::TurnBegin(a, s, t) = &op {
            let r = c.call(Request::TurnEnd(TurnEnd {
                agent_id: a.clone(),
                session_id: s.clone(),
                turn_id: t.clone(),
                status: TurnStatus::Failed,
                label: None,
            }));
            let mut m = match r {
                Ok(Ok(_)) => after,
                Ok(Err(e)) if e.code == ErrorCode::NotFound => model,
                other => panic!("round {round}: probing turn {t}: {other:?}"),
            };
            m.get_mut(a).unwrap().get_mut(s).unwrap().turn = None;
            eprintln!("round {round}: in flight {op:?} resolved by probing the turn");
            return m;
        }
        // Two models that read back the same are the same for every later
        // step but the turn state of turn.end with auto off: it ended or not.
        if let Op::TurnEnd(a, s, t) = &op {
            let r = c.call(Request::TurnEnd(TurnEnd {
                agent_id: a.clone(),
                session_id: s.clone(),
                turn_id: t.clone(),
                status: TurnStatus::Failed,
                label: None,
            }));
            match r {
                Ok(Ok(_))
                | Ok(Err(ErrorBody {
                    code: ErrorCode::Conflict,
                    ..
                })) => {}
                other => panic!("round {round}: probing turn {t}: {other:?}"),
            }
            return after;
        }
        return after;
    }
    eprintln!(
        "round {round}: in flight {op:?} was {}",
        if after_ok { "applied" } else { "not applied" }
    );
    if after_ok {
        after
    } else {
        model
    }
}

fn boot(img: &GuestImage, store: &std::path::Path) -> (Vm, Client) {
    let mut vm = Vm::boot(img, Some(store), &[]);
    let (c, _) = vm.connect(BOOT);
    (vm, c)
}

#[test]
fn guest_power_cuts_keep_every_acknowledged_change_and_nothing_half_made() {
    let Some(img) = require_vm("powercut::power_cuts_keep_every_acknowledged_change") else {
        return;
    };
    let seed = std::env::var("ALLOX_POWERCUT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("power-cut test seed {seed} (ALLOX_POWERCUT_SEED={seed} repeats it)");
    let mut rng = Rng(seed);
    let mut names = Names { next: 0 };
    let rounds: usize = std::env::var("ALLOX_POWERCUT_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2 * KINDS.len());
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = store_image(dir.path(), true);
    let mut model = Model::new();
    let mut in_flight: Option<(Op, Model)> = None;
    let (mut applied, mut not_applied, mut after_answer) = (0, 0, 0);
    for round in 0..rounds {
        let (mut vm, mut c) = boot(&img, &store);
        let was = in_flight.as_ref().map(|(_, after)| after.clone());
        model = settle(&mut c, model, in_flight.take(), round);
        match was {
            Some(after) if after == model => applied += 1,
            Some(_) => not_applied += 1,
            None => {}
        }
        check_store(&mut c, round);
        let target = KINDS[round % KINDS.len()];
        // Even rounds cut the power while the last request is in flight,
        // odd ones the instant its answer arrives.
        let cut_after_answer = (round / KINDS.len()) % 2 == 1;
        let ops = plan(&model, target, &mut rng, &mut names);
        let (last, setup) = ops.split_last().unwrap();
        for op in setup {
            assert!(send(&mut c, op), "round {round}: {op:?} lost its answer");
            model = apply(&model, op);
        }
        if cut_after_answer {
            assert!(send(&mut c, last), "round {round}: {last:?}");
            vm.power_cut();
            model = apply(&model, last);
            after_answer += 1;
            eprintln!("round {round}: power cut right after the answer to {last:?}");
        } else {
            let delay = Duration::from_micros(rng.below(60_000));
            let pid = vm.pid() as i32;
            let killer = std::thread::spawn(move || {
                std::thread::sleep(delay);
                if let Some(p) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                }
            });
            let acked = send(&mut c, last);
            killer.join().unwrap();
            vm.power_cut();
            let after = apply(&model, last);
            if acked {
                eprintln!("round {round}: {last:?} answered before the cut at {delay:?}");
                model = after;
            } else {
                eprintln!(
                    "round {round}: power cut {delay:?} into {} ({last:?})",
                    kind(last)
                );
                in_flight = Some((last.clone(), after));
            }
        }
        drop(c);
        drop(vm);
    }
    // A last boot checks the last round, then an orderly stop; the store is
    // read once more on the host.
    let (mut vm, mut c) = boot(&img, &store);
    model = settle(&mut c, model, in_flight.take(), rounds);
    check_store(&mut c, rounds);
    let _ = c.call(Request::Shutdown(Shutdown {}));
    assert!(vm.wait_exit(Duration::from_secs(60)).is_some());
    eprintln!(
        "{rounds} power cuts: {after_answer} right after an answer, {applied} in-flight requests found applied, {not_applied} found not applied; {} agents at the end",
        model.len()
    );
}

/// The sessions of agent `a`, as `session.list` names them.
fn sessions(c: &mut Client, a: &str) -> Vec<String> {
    let Response::Sessions(ss) = ok(c, Request::SessionList(AgentRef { agent_id: a.into() }))
    else {
        panic!("session.list")
    };
    ss.sessions.into_iter().map(|s| s.session_id).collect()
}

/// A `session.delete` whose supervisor died right after the delete's
/// index commit (a failpoint kills it there) is finished by the next
/// supervisor's recovery, which moves the session's tree aside and
/// removes it. A power cut right after must not bring the session back:
/// recovery commits what it did on disk before it closes the journal
/// entry. (Closed first, the tree came back under its name at the next
/// boot, the index no longer knew of the delete, and the start-up adopted
/// the session as found on disk.)
#[test]
fn guest_a_delete_finished_by_recovery_stays_deleted_after_a_power_cut() {
    let Some(img) = require_vm("powercut::a_delete_finished_by_recovery_stays_deleted") else {
        return;
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = store_image(dir.path(), true);
    let mut vm = Vm::boot(
        &img,
        Some(&store),
        &["allox.failpoints=session_delete.after_commit"],
    );
    let (mut c, _) = vm.connect(BOOT);
    let (a, s) = ("a".to_string(), "s".to_string());
    for op in [
        Op::AgentCreate(a.clone()),
        Op::SessionCreate(a.clone(), s.clone()),
        Op::SessionCreate(a.clone(), "kept".into()),
        Op::Write(a.clone(), s.clone(), 7),
        Op::CheckpointCreate(a.clone(), s.clone(), "c1".into()),
    ] {
        assert!(send(&mut c, &op), "{op:?} lost its answer");
    }
    // A session's own limits (made with two, given a third later) are kept
    // with it: its cgroup, made again by the next boot, gets them back (it
    // got the daemon's defaults before).
    ok(
        &mut c,
        Request::SessionCreate(SessionCreate {
            pids_max: Some(40),
            memory_max: Some(64 << 20),
            ..SessionCreate::new(&a, "limited")
        }),
    );
    ok(
        &mut c,
        Request::SessionUpdate(SessionUpdate {
            agent_id: a.clone(),
            session_id: "limited".into(),
            cpu_max: Some("20000 100000".into()),
            ..SessionUpdate::default()
        }),
    );
    let limits = |c: &mut Client| {
        let Response::SessionStats(st) = ok(
            c,
            Request::SessionStats(SessionStatsRequest {
                agent_id: "a".into(),
                session_id: "limited".into(),
            }),
        ) else {
            panic!("session.stats")
        };
        st.limits
    };
    let given = limits(&mut c);
    assert_eq!(
        (given.pids_max, given.memory_max, given.cpu_max.as_deref()),
        (Some(40), Some(64 << 20), Some("20000 100000"))
    );
    assert!(
        !send(&mut c, &Op::SessionDelete(a.clone(), s.clone())),
        "the failpoint did not stop the supervisor in the middle of session.delete"
    );
    drop(c);
    let (mut c, _) = vm.connect(Duration::from_secs(30));
    assert_eq!(
        sessions(&mut c, &a),
        ["kept", "limited"],
        "recovery did not finish the delete"
    );
    vm.power_cut();
    let (mut vm, mut c) = boot(&img, &store);
    assert_eq!(
        sessions(&mut c, &a),
        ["kept", "limited"],
        "the deleted session came back after a power cut"
    );
    assert_eq!(limits(&mut c), given, "the session's limits after a boot");
    check_store(&mut c, 1);
    vm.power_cut();
}
