//! libFuzzer target: any bytes as a pipeline file, through parse, `--set` overrides, lowering,
//! checks and expansion with every kind rao ships (`rao_stages::registry()`), and the rendering
//! of the errors a user would see. Errors are fine; a panic, a hang or unbounded memory is a bug.
//!
//! Header lines `# set: PATH=VALUE` (the format of tests/bad-pipelines) become overrides, so
//! the fuzzer also mutates `--set` values. A file that mentions `extends` is also written into
//! a sandbox next to copies of the shipped pipelines and loaded with `rao_pipeline::load`, so
//! variants resolve against real base files.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rao_pipeline::Registry;

/// A folder with copies of the shipped pipelines and examples (what seeds refer to), so that
/// relative paths in inputs resolve here and never in the repository.
struct Sandbox {
    _dir: tempfile::TempDir,
    pipelines: PathBuf,
    registry: Registry,
}

fn sandbox() -> &'static Sandbox {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dir = tempfile::tempdir().expect("a temporary folder");
        for sub in ["pipelines", "examples/shell"] {
            let to = dir.path().join(sub);
            std::fs::create_dir_all(&to).expect("sandbox folder");
            for entry in std::fs::read_dir(repo.join(sub)).expect("the repository's pipelines") {
                let from = entry.expect("a folder entry").path();
                if from.is_file() {
                    std::fs::copy(&from, to.join(from.file_name().expect("a file name"))).expect("copy into the sandbox");
                }
            }
        }
        let pipelines = dir.path().join("pipelines");
        Sandbox { _dir: dir, pipelines, registry: rao_stages::registry() }
    })
}

/// `# set: PATH=VALUE` lines at the top, as in tests/bad-pipelines.
fn overrides(text: &str) -> Vec<String> {
    text.lines().take_while(|l| l.starts_with("# ")).filter_map(|l| l.strip_prefix("# set: ")).map(str::to_string).collect()
}

fn exercise(result: Result<rao_pipeline::compile::Compiled, rao_pipeline::Diagnostics>) {
    match result {
        // What `rao validate` prints for a rejected file.
        Err(diags) => drop(diags.to_string()),
        Ok(compiled) => assert_eq!(compiled.order.len(), compiled.instances.len(), "the order covers every instance"),
    }
}

fuzz_target!(|data: &[u8]| {
    let sb = sandbox();
    let Ok(text) = std::str::from_utf8(data) else {
        // Only a file can hold bytes that are not UTF-8: `load` must refuse them with an error.
        let file = sb.pipelines.join("fuzz-input.yaml");
        std::fs::write(&file, data).expect("write the input");
        exercise(rao_pipeline::load(&file, &[], &sb.registry));
        return;
    };
    let sets = overrides(text);
    exercise(rao_pipeline::compile_str("fuzz-input.yaml", text, &sb.pipelines, &sets, &sb.registry));
    if text.contains("extends") {
        let file = sb.pipelines.join("fuzz-input.yaml");
        std::fs::write(&file, data).expect("write the input");
        exercise(rao_pipeline::load(&file, &sets, &sb.registry));
    }
});
