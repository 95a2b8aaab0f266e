#!/usr/bin/env bash
# rao's CPU backend next to transformers (PyTorch, f32) on the same Hugging Face models with
# random weights, the same threads, in one script printing ratios and the update steps' share of
# the machine's measured f32 matmul peak (PyTorch's n×n×n sgemm).
#
#   benches/scripts/hf_vs_transformers.sh [SHAPE...]     default: qwen3-20m smollm2-135m
#
# Shapes are those of benches/scripts/hf_torch.py (`qwen3-20m`: a Qwen3 of 19M parameters;
# `smollm2-135m`: SmolLM2-135M's published config). Measured per shape: sampled generation with
# the KV cache at batch 1 and 32 (64 prompt + 64 new tokens), the full fine-tuning update step and
# the LoRA update step (rank 16 on every projection), batch 8 × 128 tokens, CISPO + AdamW.
# Needs a Python with torch, transformers and peft: RAO_PYTHON, else target/py (scripts/test
# creates it). Models are made once under target/hf-bench/; results go to target/hf-bench/*.jsonl
# and *.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${RAO_PYTHON:-target/py/bin/python}
"$PY" -c 'import torch, transformers, peft' 2>/dev/null \
    || { echo "hf_vs_transformers: $PY lacks torch/transformers/peft (run scripts/test once, or set RAO_PYTHON)" >&2; exit 2; }
shapes=("$@"); [ ${#shapes[@]} -gt 0 ] || shapes=(qwen3-20m smollm2-135m)
cargo build -q --example hf_bench  # whole-workspace features: reuses the test build
bin=${CARGO_TARGET_DIR:-target}/debug/examples/hf_bench
threads=$(nproc)
work=target/hf-bench
mkdir -p "$work"
sizes=(--prompt 64 --new 64 --batches 1,32 --greedy-batch none --train-batch 8 --train-steps 2 --updates full,lora)
echo "PyTorch $("$PY" -c 'import torch; print(torch.__version__)'), transformers $("$PY" -c 'import transformers; print(transformers.__version__)'), $threads threads for both"
for shape in "${shapes[@]}"; do
    model=$work/$shape
    [ -f "$model/config.json" ] || "$PY" benches/scripts/hf_torch.py make "$model" --shape "$shape" >/dev/null
    echo "--- $shape: rao (CPU backend)"
    RAYON_NUM_THREADS=$threads "$bin" "$model" --backend cpu "${sizes[@]}" | tee "$work/$shape-rao.jsonl"
    echo "--- $shape: transformers (f32)"
    : >"$work/$shape-torch.jsonl"
    "$PY" benches/scripts/hf_torch.py bench "$model" --dtypes f32 --threads "$threads" --peak-n 2048 "${sizes[@]}" \
        --out "$work/$shape-torch.jsonl"
    echo "--- $shape: rao ÷ transformers (above 1: rao is faster)"
    "$PY" benches/scripts/hf_torch.py table "$model" "$work/$shape-rao.jsonl" "$work/$shape-torch.jsonl" --out "$work/$shape.md"
done
