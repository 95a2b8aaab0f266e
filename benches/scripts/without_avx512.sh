#!/usr/bin/env bash
# Builds rao with every AVX-512 code path turned off, as it runs on a CPU without AVX-512 (the
# slower kind of x86-64 machine), so that one with AVX-512 can measure both. Nothing in the
# checkout changes: a git worktree of HEAD gets the edits and its own target folder.
#
#   benches/scripts/without_avx512.sh [DIR]      (default DIR: ../rao-without-avx512)
#   DIR/target/debug/rao run pipelines/textcraft-synth.yaml --store /tmp/store-avx2
#
# What picks AVX-512 at run time, and what the script does to each (the dispatch code stays;
# the test of the CPU answers "no" for every `avx512*` feature, so the compiler drops those paths):
# - rao-policy's fused kernels (`kernels::simd::has_avx512`);
# - gemm's microkernels (`gemm-common`'s `feature_detected!`, on through Burn's `x86-v4`);
# - Burn Flex's element-wise SIMD (`macerator`'s `feature_detected!`) and `pulp`'s.
# The three crates are copied from cargo's registry beside DIR and patched in
# (`[patch.crates-io]`). The machine profile in every fingerprint then says `x86_64-avx2`, so a
# store shared with normal runs never mixes their results.
set -euo pipefail

root=$(git rev-parse --show-toplevel)
dir=${1:-$root/../rao-without-avx512}
deps="$dir-deps"
if [ -e "$dir" ] || [ -e "$deps" ]; then
    echo "error: $dir or $deps exists: remove it (git worktree remove --force $dir) or name another folder" >&2
    exit 2
fi

cd "$root"
cargo fetch --locked >/dev/null
# Where cargo keeps each crate's source, from the lock file's versions.
source_of() {
    cargo metadata --format-version 1 --locked |
        grep -o "\"manifest_path\":\"[^\"]*/$1-[0-9][^\"/]*/Cargo.toml\"" | head -1 |
        sed -e 's/^"manifest_path":"//' -e 's|/Cargo.toml"$||'
}
git worktree add --detach "$dir" HEAD >/dev/null
mkdir -p "$deps"
for crate in pulp gemm-common macerator; do
    src=$(source_of "$crate")
    [ -n "$src" ] || { echo "error: no source of $crate in cargo's registry" >&2; exit 1; }
    cp -r "$src" "$deps/"
    echo "$crate = { path = \"$deps/$(basename "$src")\" }" >>"$deps/patch.toml"
done

# Each crate's test of the CPU: `avx512*` features read as absent.
sed -i 's|::std::is_x86_feature_detected!(\$feature)|(::std::is_x86_feature_detected!($feature) \&\& !$feature.starts_with("avx512"))|' \
    "$deps"/pulp-*/src/core_arch/mod.rs "$deps"/macerator-*/src/backend/arch.rs
sed -i 's|::std::arch::is_x86_feature_detected!(\$tt)|(::std::arch::is_x86_feature_detected!($tt) \&\& !$tt.starts_with("avx512"))|' \
    "$deps"/gemm-common-*/src/lib.rs
sed -i 's|std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vl") && has_avx2()|false \&\& has_avx2()|' \
    "$dir/crates/rao-policy/src/kernels/simd.rs"
for f in "$deps"/pulp-*/src/core_arch/mod.rs "$deps"/macerator-*/src/backend/arch.rs "$deps"/gemm-common-*/src/lib.rs \
    "$dir/crates/rao-policy/src/kernels/simd.rs"; do
    grep -q 'starts_with("avx512")\|false && has_avx2()' "$f" || { echo "error: $f did not take the edit (another version?)" >&2; exit 1; }
done
{ echo; echo "[patch.crates-io]"; cat "$deps/patch.toml"; } >>"$dir/Cargo.toml"

cd "$dir"
cargo build --offline -p rao-cli
echo "built: $dir/target/debug/rao"
