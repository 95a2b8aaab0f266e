//! The layers ARCHITECTURE.md states, checked on the crates' dependency lists (`cargo metadata`):
//! a dependency that points upward fails here instead of being found in review.

use serde_json::{Value, json};

/// What a crate's layer allows among its normal and build dependencies (its tests may use
/// anything).
struct Layer {
    /// The rao crates it may use; `None`: any.
    rao_crates: Option<&'static [&'static str]>,
    /// Outside crates it may not use: Burn lives in rao-policy alone; the plan and the
    /// environments have no runtime.
    never: &'static [&'static str],
}

fn layer(krate: &str) -> Layer {
    match krate {
        "rao-store" => Layer { rao_crates: Some(&[]), never: &["burn"] },
        "rao-plan" | "rao-envs" => Layer { rao_crates: Some(&[]), never: &["burn", "tokio"] },
        "rao-pipeline" => Layer { rao_crates: Some(&["rao-plan", "rao-store"]), never: &["burn"] },
        "rao-policy" => Layer { rao_crates: None, never: &[] },
        _ => Layer { rao_crates: None, never: &["burn"] },
    }
}

/// Every dependency of a workspace crate that its layer forbids, as `crate → dependency`.
fn violations(metadata: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        let name = package["name"].as_str().unwrap_or_default();
        let layer = layer(name);
        for dep in package["dependencies"].as_array().into_iter().flatten() {
            if dep["kind"].as_str() == Some("dev") {
                continue;
            }
            let dep_name = dep["name"].as_str().unwrap_or_default();
            let upward = dep_name.starts_with("rao-") && layer.rao_crates.is_some_and(|allowed| !allowed.contains(&dep_name));
            if upward || layer.never.contains(&dep_name) {
                out.push(format!("{name} → {dep_name}"));
            }
        }
    }
    out
}

#[test]
fn the_crates_depend_only_on_their_layers() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline", "--manifest-path"])
        .arg(root.join("Cargo.toml"))
        .output()
        .expect("cargo metadata");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let metadata: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = metadata["packages"].as_array().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    for layer in ["rao-store", "rao-plan", "rao-pipeline", "rao-envs", "rao-policy"] {
        assert!(names.contains(&layer), "no crate {layer} in the workspace: {names:?}");
    }
    assert_eq!(violations(&metadata), Vec::<String>::new(), "dependencies that point upward (ARCHITECTURE.md)");
}

#[test]
fn an_upward_dependency_is_found() {
    let metadata = json!({"packages": [
        {"name": "rao-store", "dependencies": [{"name": "tokio", "kind": null}, {"name": "rao-plan", "kind": null}]},
        {"name": "rao-pipeline", "dependencies": [{"name": "rao-plan", "kind": null}, {"name": "rao-stages", "kind": "dev"}, {"name": "rao-core", "kind": "build"}]},
        {"name": "rao-stages", "dependencies": [{"name": "burn", "kind": null}, {"name": "rao-policy", "kind": null}]},
        {"name": "rao-plan", "dependencies": [{"name": "tokio", "kind": null}]},
    ]});
    assert_eq!(violations(&metadata), ["rao-store → rao-plan", "rao-pipeline → rao-core", "rao-stages → burn", "rao-plan → tokio"]);
}
