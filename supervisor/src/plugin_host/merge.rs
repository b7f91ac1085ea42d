//! The merge of the plugins' contributions to a run, in the core: in load
//! order, refusing two plugins that contribute the same environment
//! variable, the same (or a nested) mount target, or a command prefix each.
//! Metadata keys are the plugin's name, a dot, and its own key, so they
//! never collide.

use super::PluginHostError;
use crate::plugin_api::Contribution;
use std::path::{Path, PathBuf};

/// Merges `parts` (each plugin's name and contribution, in load order);
/// each plugin's mount targets are checked against the sandbox's own
/// mounts and `system_dirs` as well.
pub fn merge(
    parts: &[(&'static str, Contribution)],
    system_dirs: &[PathBuf],
) -> Result<Contribution, PluginHostError> {
    let mut out = Contribution::default();
    let mut prefix_of: Option<&'static str> = None;
    let mut env_of: Vec<&'static str> = Vec::new();
    let mut bind_of: Vec<&'static str> = Vec::new();
    for (name, c) in parts {
        let name = *name;
        allox_sandbox::binds::check(&c.binds, system_dirs).map_err(|source| {
            PluginHostError::Bind {
                plugin: name,
                source,
            }
        })?;
        if !c.prefix.is_empty() {
            if let Some(first) = prefix_of {
                return Err(PluginHostError::Contributed {
                    first,
                    second: name,
                    what: "a command prefix".into(),
                });
            }
            prefix_of = Some(name);
            out.prefix = c.prefix.clone();
        }
        for (k, v) in &c.env {
            if let Some(i) = out.env.iter().position(|(ek, _)| ek == k) {
                if env_of[i] != name {
                    return Err(PluginHostError::Contributed {
                        first: env_of[i],
                        second: name,
                        what: format!("environment variable {k}"),
                    });
                }
                out.env[i].1 = v.clone();
                continue;
            }
            out.env.push((k.clone(), v.clone()));
            env_of.push(name);
        }
        for b in &c.binds {
            let p = Path::new(&b.dst);
            let clash = out.binds.iter().position(|e| {
                let q = Path::new(&e.dst);
                p.starts_with(q) || q.starts_with(p)
            });
            if let Some(i) = clash.filter(|&i| bind_of[i] != name) {
                let earlier = &out.binds[i].dst;
                let what = if *earlier == b.dst {
                    format!("mount target {}", b.dst)
                } else {
                    format!(
                        "mount targets {earlier} and {} (one inside the other)",
                        b.dst
                    )
                };
                return Err(PluginHostError::Contributed {
                    first: bind_of[i],
                    second: name,
                    what,
                });
            }
            out.binds.push(b.clone());
            bind_of.push(name);
        }
        for (k, v) in &c.metadata {
            let key = format!("{name}.{k}");
            out.metadata.retain(|(ek, _)| *ek != key);
            out.metadata.push((key, v.clone()));
        }
    }
    Ok(out)
}
