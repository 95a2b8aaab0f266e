#!/usr/bin/env bash
# The policy's speed against the same model in PyTorch (CPU), in one script, printing ratios.
# Usage: benches/scripts/policy_vs_torch.sh [D_MODEL LAYERS [ROUNDS]]
# Rounds alternate rao and PyTorch (the machine's speed drifts over tens of seconds); each round
# prints its ratios and the last lines give the median over rounds.
# Needs a Python with torch; TORCH_PYTHON picks it (default: target/torch/bin/python, created with
# `pip install torch numpy` on first use).
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${1:-64}; L=${2:-2}; ROUNDS=${3:-3}
PY=${TORCH_PYTHON:-target/torch/bin/python}
if [ ! -x "$PY" ]; then
    python3 -m venv target/torch && target/torch/bin/pip install -q torch numpy
fi
cargo build -q --example bench_policy  # whole-workspace features: reuses the test build
threads=$(nproc)
echo "PyTorch $("$PY" -c 'import torch; print(torch.__version__)'), $threads threads for both"
ratios=$(mktemp)
for round in $(seq "$ROUNDS"); do
    rust=$(target/debug/examples/bench_policy "$D" "$L")
    vocab=$(sed -n 's/.*vocab=\([0-9]*\).*/\1/p' <<<"$rust")
    torch=$("$PY" benches/scripts/torch_policy.py "$vocab" "$D" "$L" "$threads")
    echo "--- round $round: rao"
    echo "$rust"
    echo "--- round $round: PyTorch"
    echo "$torch"
    r_b1=$(sed -n 's/generate  batch   1: *\([0-9.]*\) tokens.*/\1/p' <<<"$rust")
    r_b64=$(sed -n 's/generate  batch  64: *\([0-9.]*\) tokens.*/\1/p' <<<"$rust")
    r_up=$(sed -n 's/^update .*: \([0-9.]*\) ms\/step.*/\1/p' <<<"$rust")
    t_b1=$(awk '/generate_batch1_/ {print $2}' <<<"$torch")
    t_b64=$(awk '/generate_batch64_/ {print $2}' <<<"$torch")
    t_up=$(awk '/update_ms_per_step/ {print $2}' <<<"$torch")
    awk -v a="$r_b1" -v b="$t_b1" -v c="$r_b64" -v d="$t_b64" -v e="$r_up" -v f="$t_up" \
        'BEGIN { printf "%.3f %.3f %.3f\n", a / b, c / d, f / e }' | tee -a "$ratios" \
        | awk -v r="$round" '{ printf "--- round %s, rao / PyTorch (above 1: rao is faster): generate batch 1 %.2f×, batch 64 %.2f×, update step %.2f×\n", r, $1, $2, $3 }'
done
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "--- median of $ROUNDS rounds, rao / PyTorch (above 1: rao is faster)"
echo "generate batch 1:  $(cut -d' ' -f1 "$ratios" | median)×"
echo "generate batch 64: $(cut -d' ' -f2 "$ratios" | median)×"
echo "update step:       $(cut -d' ' -f3 "$ratios" | median)×"
rm -f "$ratios"
