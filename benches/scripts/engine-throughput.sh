#!/usr/bin/env bash
# Rollouts through vLLM (PyPI's CPU build, started by rao) against rao's in-process text policy:
# the same LoRA checkpoint of a 25M-parameter random Qwen3, the same 16 Medium TextCraft tasks,
# temperature 1, one stage at a time (--jobs 1). Prints trees/s and tokens/s of each and the
# ratio. Needs scripts/python-tools (the README's test command runs it).
set -euo pipefail
cd "$(dirname "$0")/../.."
export RAO_VLLM_PYTHON="$PWD/target/py/bin/python"
[ -d target/bench-qwen3 ] || target/py/bin/python scripts/make_tiny_qwen3_vllm.py target/bench-qwen3 --bench
store="${STORE:-$(mktemp -d)}"
rao="${RAO:-target/debug/rao}"
"$rao" run benches/engine/throughput.yaml --store "$store" --jobs 1 "$@"
python3 - "$store" <<'PY'
import glob, json, sys
rec = json.load(open(glob.glob(sys.argv[1] + "/runs/engine-throughput/latest.json")[0]))
rows = {}
for i in rec["instances"]:
    if i["name"] in ("in_process", "through_engine"):
        m = i["metrics"]
        seconds = i["finished_at"] - i["started_at"] - m.get("engine_wait_s", 0.0)
        trees = 16
        tokens = m["tokens_per_tree"] * trees
        rows[i["name"]] = (seconds, trees / seconds, tokens / seconds, m.get("engine_wait_s"), m["nodes_per_tree"])
for name, (s, tps, toks, wait, nodes) in rows.items():
    print(f"{name:15s} {s:8.1f} s  {tps:6.3f} trees/s  {toks:8.0f} context tokens/s  {nodes:4.1f} nodes/tree" + (f"  (servers started in {wait:.0f} s, not counted)" if wait else ""))
a, b = rows["in_process"], rows["through_engine"]
print(f"vLLM / in process: {b[1] / a[1]:.2f}x trees/s, {b[2] / a[2]:.2f}x context tokens/s")
PY
