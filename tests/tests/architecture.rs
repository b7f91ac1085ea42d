//! The crates' dependencies follow `docs/architecture.md`: protocol ←
//! store / sandbox ← supervisor ← init, protocol ← client ← gateway ← ctl;
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
        ("allox-ebpf-probes", &[]),
        (
            "allox-supervisor",
            &[
                "allox-protocol",
                "allox-store",
                "allox-sandbox",
                "allox-network",
                "allox-ebpf-probes",
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
        ("allox-gateway", &["allox-protocol", "allox-client"]),
        (
            "allox-ctl",
            &["allox-protocol", "allox-client", "allox-gateway"],
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
