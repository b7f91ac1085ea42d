//! The crates' dependencies follow `docs/architecture.md`: protocol ←
//! store / sandbox ← supervisor ← init, protocol ← client ← gateway / vmm ← ctl;
//! the store has no async runtime and no seccomp. Read from `cargo
//! metadata`, so a new dependency that breaks the layering fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Each workspace crate's dependencies (normal ones, not dev or build).
fn dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut deps = BTreeMap::new();
    for p in v["packages"].as_array().unwrap() {
        let names = p["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"].is_null())
            .map(|d| d["name"].as_str().unwrap().to_owned())
            .collect();
        deps.insert(p["name"].as_str().unwrap().to_owned(), names);
    }
    deps
}

fn ours(deps: &BTreeSet<String>) -> BTreeSet<&str> {
    deps.iter()
        .map(String::as_str)
        .filter(|d| d.starts_with("allox-"))
        .collect()
}

#[test]
fn each_crate_uses_only_the_crates_below_it() {
    let deps = dependencies();
    let allowed: &[(&str, &[&str])] = &[
        ("allox-protocol", &[]),
        ("allox-store", &["allox-protocol"]),
        ("allox-sandbox", &[]),
        ("allox-network", &[]),
        // SIGTERM and SIGINT, for the daemon and the gateway.
        ("allox-signals", &[]),
        // Its history's records in the protocol's form.
        ("allox-ebpf-probes", &["allox-protocol"]),
        // The observer: its history's programs, the store's snapshots and
        // diff.
        (
            "allox-effects",
            &["allox-protocol", "allox-store", "allox-ebpf-probes"],
        ),
        (
            "allox-supervisor",
            &[
                "allox-protocol",
                "allox-store",
                "allox-sandbox",
                "allox-network",
                "allox-ebpf-probes",
                "allox-effects",
                "allox-signals",
            ],
        ),
        (
            "allox-init",
            &[
                "allox-protocol",
                "allox-store",
                "allox-sandbox",
                "allox-supervisor",
            ],
        ),
        ("allox-client", &["allox-protocol"]),
        (
            "allox-gateway",
            &["allox-protocol", "allox-client", "allox-signals"],
        ),
        // The VM manager: QMP to QEMU, and the guest's control port as a
        // client (Hello, `system.resumed`).
        ("allox-vmm", &["allox-protocol", "allox-client"]),
        (
            "allox-ctl",
            &[
                "allox-protocol",
                "allox-client",
                "allox-gateway",
                "allox-vmm",
            ],
        ),
    ];
    for (krate, may) in allowed {
        let uses = ours(
            deps.get(*krate)
                .unwrap_or_else(|| panic!("no crate {krate}")),
        );
        let extra: Vec<_> = uses.iter().filter(|d| !may.contains(d)).collect();
        assert!(extra.is_empty(), "{krate} must not use {extra:?}");
    }
}

#[test]
fn the_store_has_no_async_runtime_and_no_seccomp() {
    let deps = dependencies();
    for krate in ["allox-store", "allox-protocol"] {
        for banned in ["tokio", "seccompiler", "caps"] {
            assert!(
                !deps[krate].contains(banned),
                "{krate} must not use {banned}"
            );
        }
    }
}

/// The supervisor's modules (`crate::X`, by the files under
/// `supervisor/src/X`) and the modules each one's code names, tests left
/// out (`tests.rs` files, and what follows `#[cfg(test)]` in a file) and
/// comments too.
fn supervisor_modules() -> BTreeMap<String, BTreeSet<String>> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let src = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../supervisor/src"));
    let mut files = Vec::new();
    walk(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        let first = rel.components().next().unwrap().as_os_str();
        let module = first.to_str().unwrap().trim_end_matches(".rs").to_string();
        if module == "lib" || rel.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        // Code only: tests and comments (doc links) left out.
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap()
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let code = code.as_str();
        let uses = graph.entry(module.clone()).or_default();
        for (i, _) in code.match_indices("crate::") {
            let name: String = code[i + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `use crate::{a, b}` names several.
            if name.is_empty() && code[i + "crate::".len()..].starts_with('{') {
                let group = &code[i + "crate::{".len()..];
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for part in group.split(',') {
                    let m = part.trim().split("::").next().unwrap_or("").to_string();
                    if !m.is_empty() && m != module {
                        uses.insert(m);
                    }
                }
            } else if !name.is_empty() && name != module {
                uses.insert(name);
            }
        }
    }
    graph
}

/// A cycle through the graph, if there is one.
fn a_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_supervisor_s_modules_form_no_cycle() {
    let graph = supervisor_modules();
    assert!(graph.contains_key("dispatch") && graph.contains_key("plugin_api"));
    if let Some(c) = a_cycle(&graph) {
        panic!(
            "the supervisor's modules import each other in a circle: {}",
            c.join(" -> ")
        );
    }
}

#[test]
fn plugins_import_only_the_plugin_api_and_it_imports_nothing() {
    let graph = supervisor_modules();
    let extra: Vec<_> = graph["plugins"]
        .iter()
        .filter(|m| *m != "plugin_api")
        .collect();
    assert!(
        extra.is_empty(),
        "plugins may import only crate::plugin_api of the supervisor, not {extra:?}"
    );
    assert!(
        graph["plugin_api"].is_empty(),
        "the plugin API must import nothing else of the supervisor: {:?}",
        graph["plugin_api"]
    );
}

#[test]
fn only_the_ways_in_import_the_supervisor_and_its_dispatch() {
    // What takes requests in (and the dispatch, the supervisor's other
    // half); everything below them is lent what it needs.
    let above = [
        "daemon",
        "serial",
        "server",
        "peer",
        "sandbox_api",
        "dispatch",
        "supervisor",
    ];
    let graph = supervisor_modules();
    for (module, uses) in &graph {
        if above.contains(&module.as_str()) {
            continue;
        }
        for top in ["supervisor", "dispatch"] {
            assert!(
                !uses.contains(top),
                "{module} is below the dispatch and must not import crate::{top}"
            );
        }
    }
}
