//! Code versions of the built-in kinds (see `fingerprint.rs`): a hash of the file that
//! implements each, so a change to it is a cache miss without anyone bumping a constant.

fn main() {
    for (var, file) in [("RAO_CODE_BUILTIN", "src/builtin.rs"), ("RAO_CODE_DATASET", "src/dataset.rs")] {
        println!("cargo:rerun-if-changed={file}");
        let text = std::fs::read(file).expect("the kind's source file");
        println!("cargo:rustc-env={var}={}", &blake3::hash(&text).to_hex()[..16]);
    }
}
