#!/usr/bin/env bash
# Fuzz the pipeline parser and compiler (rao_pipeline::compile_str / load with every shipped
# kind) with libFuzzer for SECONDS (default 600), each input limited to FUZZ_TIMEOUT seconds
# (default 30: the slowest bounded input seen, a YAML alias bomb stopped by the parser's 4M-node
# budget, takes ~3 s in a dev build and 11 s instrumented on a loaded machine) and the process to
# 2 GiB. Prints executions, coverage and what was found; exits non-zero on a crash, hang or OOM.
#
#   benches/scripts/fuzz.sh [SECONDS]
#
# Seeds: the shipped pipelines, examples/ and tests/bad-pipelines. The growing corpus and any
# crash/timeout/oom inputs stay in benches/fuzz/target/ (ignored by git). A finding goes into
# tests/bad-pipelines (or a unit test) once minimised:
#   benches/fuzz/target/<host>/release/compile -minimize_crash=1 -runs=10000 CRASH_FILE
# Instrumented like `cargo fuzz build` (sancov, no sanitizer: rao has no unsafe code on this
# path), with plain cargo on the stable toolchain, so cargo-fuzz need not be installed.
set -euo pipefail
seconds=${1:-600}
root=$(cd "$(dirname "$0")/../.." && pwd)
fuzz=$root/benches/fuzz
host=$(rustc -vV | sed -n 's/^host: //p')

# --target keeps the instrumentation out of build scripts and proc macros (as cargo-fuzz does).
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing" \
  cargo build --release --locked --target "$host" --manifest-path "$fuzz/Cargo.toml" --bin compile

corpus=$fuzz/target/corpus
dict=$fuzz/target/pipeline.dict
python3 "$fuzz/make_dict.py" "$root/schemas/pipeline.schema.json" "$dict"
artifacts=$fuzz/target/artifacts
mkdir -p "$corpus" "$artifacts"
log=$fuzz/target/fuzz.log
start=$(date +%s)
touch "$fuzz/target/.started"
set +e
"$fuzz/target/$host/release/compile" "$corpus" "$root/pipelines" "$root/examples/shell" "$root/tests/bad-pipelines" \
  -dict="$dict" -max_total_time="$seconds" -timeout="${FUZZ_TIMEOUT:-30}" -rss_limit_mb=2048 -max_len=4096 \
  -artifact_prefix="$artifacts/" -print_final_stats=1 2>&1 | tee "$log" | grep -E '^#[0-9]+[[:space:]]+(INITED|pulse|DONE)|^==|ERROR|deadly|panicked|Test unit written'
status=${PIPESTATUS[0]}
set -e
elapsed=$(( $(date +%s) - start ))

echo "--- rao fuzz summary"
echo "duration_s: $elapsed"
grep -E '^stat::number_of_executed_units' "$log" | sed 's/stat::number_of_executed_units: */executions: /' || true
grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE)' "$log" | tail -1 | sed -E 's/.*cov: ([0-9]+) ft: ([0-9]+) corp: ([0-9]+)\/([^ ]+).*/edges: \1, features: \2, corpus: \3 inputs (\4)/'
found=$(find "$artifacts" -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) -newer "$fuzz/target/.started" 2>/dev/null | wc -l) || found=0
echo "crashes/hangs/ooms: $found (in $artifacts)"
exit "$status"
