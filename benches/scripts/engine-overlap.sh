#!/usr/bin/env bash
# The asynchronous loop's speed-up measured for real, generation and learning apart: vLLM's CPU
# build (started by rao) pinned to core 0, rao (the LoRA learner, and its rollouts' client side)
# pinned to core 1 — two devices of one core each. `pipelines/bring-your-own-model-engine.yaml`
# runs its loop with k = 0, then k = 1, in one store (everything before the loop is shared);
# prints each loop's wall clock (first loop stage started → last one finished), its rollouts' and
# updates' busy time, and the ratio. Needs two cores or more, scripts/python-tools, and a model
# that vLLM's CPU build serves (heads of 32 or more) and that solves some tasks: updates of a
# model that never succeeds are skipped (no signal), and then there is nothing to overlap.
#   benches/scripts/engine-overlap.sh --set params.model=DIR [--set …]
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(nproc)" -ge 2 ] || { echo "needs two cores: one for vLLM, one for rao" >&2; exit 1; }
store="${STORE:-$(mktemp -d)}"
rao="${RAO:-target/debug/rao}"
mkdir -p "$store"
wrapper="$store/vllm-on-core-0"
# vLLM's CPU build binds its OpenMP threads itself; tell it which core is its own.
cat > "$wrapper" <<EOF
#!/bin/sh
VLLM_CPU_OMP_THREADS_BIND=0 exec taskset -c 0 "$PWD/target/py/bin/python" "\$@"
EOF
chmod +x "$wrapper"
export RAO_VLLM_PYTHON="$wrapper"
for k in 0 1; do
  taskset -c 1 "$rao" run pipelines/bring-your-own-model-engine.yaml --store "$store" --jobs 2 \
    --set stages.train.loop.lag.behaviour.by=$k "$@" >"$store/k$k.log" 2>&1 || { tail -20 "$store/k$k.log"; exit 1; }
  cp "$store/runs/bring-your-own-model-engine/latest.json" "$store/k$k.json"
done
python3 - "$store" <<'PY'
import json, sys
# Iterations 2 on: rollout@1 samples with the initial policy at every lag, so the second run finds
# it cached; drawing tasks runs beside the warm start, not in the loop.
STAGES = ("rollout", "judge", "advantage", "update")
walls = {}
for k in (0, 1):
    rec = json.load(open(f"{sys.argv[1]}/k{k}.json"))
    loop = [i for i in rec["instances"] if i["name"].partition("@")[0] in STAGES and "@" in i["name"]
            and int(i["name"].partition("@")[2]) >= 2 and i.get("status") == "done"]
    if not loop:
        sys.exit(f"k = {k}: no loop stage ran (all cached?): use a fresh STORE")
    start, end = min(i["started_at"] for i in loop), max(i["finished_at"] for i in loop)
    rollouts = [i for i in loop if i["name"].startswith("rollout@")]
    busy = {s: sum(i["finished_at"] - i["started_at"] for i in loop if i["name"].startswith(s + "@")) for s in ("rollout", "update")}
    # The same in both runs when they sampled the same trees (equal work).
    tokens = round(sum((i.get("metrics") or {}).get("tokens_per_tree", 0) for i in rollouts))
    walls[k] = end - start
    print(f"k = {k}: iterations 2 on: {end - start:7.1f} s wall clock · {len(rollouts)} rollouts busy {busy['rollout']:6.1f} s "
          f"· updates {busy['update']:5.1f} s · context tokens per tree, summed {tokens}")
print(f"k = 1 against k = 0: {walls[0] / walls[1]:.2f}x (above 1: faster)")
PY
