#!/usr/bin/env bash
# The policy's speed against the same model in PyTorch (CPU), in one script, printing ratios.
# Usage: benches/scripts/policy_vs_torch.sh [D_MODEL LAYERS]
# Needs a Python with torch; TORCH_PYTHON picks it (default: target/torch/bin/python, created with
# `pip install torch numpy` on first use).
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${1:-64}; L=${2:-2}
PY=${TORCH_PYTHON:-target/torch/bin/python}
if [ ! -x "$PY" ]; then
    python3 -m venv target/torch && target/torch/bin/pip install -q torch numpy
fi
cargo build -q --example bench_policy  # whole-workspace features: reuses the test build
rust=$(target/debug/examples/bench_policy "$D" "$L")
echo "$rust"
vocab=$(sed -n 's/.*vocab=\([0-9]*\).*/\1/p' <<<"$rust")
threads=$(nproc)
torch=$("$PY" benches/scripts/torch_policy.py "$vocab" "$D" "$L" "$threads")
echo "--- PyTorch $("$PY" -c 'import torch; print(torch.__version__)') (same model, $threads threads)"
echo "$torch"
r_b1=$(sed -n 's/generate  batch   1: *\([0-9.]*\) tokens.*/\1/p' <<<"$rust")
r_b64=$(sed -n 's/generate  batch  64: *\([0-9.]*\) tokens.*/\1/p' <<<"$rust")
r_up=$(sed -n 's/update .*: \([0-9.]*\) ms\/step.*/\1/p' <<<"$rust")
t_b1=$(awk '/generate_batch1_/ {print $2}' <<<"$torch")
t_b64=$(awk '/generate_batch64_/ {print $2}' <<<"$torch")
t_up=$(awk '/update_ms_per_step/ {print $2}' <<<"$torch")
echo "--- rao / PyTorch (above 1: rao is faster)"
awk -v a="$r_b1" -v b="$t_b1" 'BEGIN { printf "generate batch 1:  %.2f×\n", a / b }'
awk -v a="$r_b64" -v b="$t_b64" 'BEGIN { printf "generate batch 64: %.2f×\n", a / b }'
awk -v a="$r_up" -v b="$t_up" 'BEGIN { printf "update step:       %.2f× (rao %s ms, PyTorch %s ms)\n", b / a, a, b }'
