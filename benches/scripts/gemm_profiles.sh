#!/usr/bin/env bash
# gemm's throughput with the dev profile's old dependency settings (debug assertions and overflow
# checks on), without them, and with AVX-512 kernels too — one script, same machine.
set -euo pipefail
cd "$(dirname "$0")/../gemm-profile"
export CARGO_TARGET_DIR=../../target/gemm-profile
for variant in "checks:--profile checks" "no checks:--release" "no checks + x86-v4:--release --features x86-v4"; do
    name=${variant%%:*}; flags=${variant#*:}
    cargo build -q $flags
    dir=$([[ $flags == *checks* && $flags != *release* ]] && echo checks || echo release)
    echo "--- $name"
    "$CARGO_TARGET_DIR/$dir/gemm-profile"
done
