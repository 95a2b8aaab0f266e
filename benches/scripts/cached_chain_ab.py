#!/usr/bin/env python3
"""A/B of two rao binaries on the 100-stage shell chain, cached: `rao validate` and a fully
cached `rao run`, medians of N runs each, the two binaries interleaved (noisy machines: compare
within a round), and GNU make on the same chain up to date as the floor.

    benches/scripts/cached_chain_ab.py OLD_RAO NEW_RAO [ROUNDS] [N]

OLD_ENV="NAME=VALUE ..." sets variables for OLD's runs only (e.g. the same binary twice with
OLD_ENV=RAO_PLAN_CACHE=off: the plan cache's own effect).
"""
import os, statistics, subprocess, sys, tempfile, time

old, new = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
n = int(sys.argv[4]) if len(sys.argv) > 4 else 60

work = tempfile.mkdtemp(prefix="rao-chain-")
lines = ["name: chain", "stages:", "  s0: {kind: shell, params: {command: 'echo 0 > ${outputs.out}/o.txt'}, outputs: [out]}"]
make = ["all: s99", "s0:\n\techo 0 > s0"]
for i in range(1, 100):
    lines.append(f"  s{i}: {{kind: shell, inputs: {{prev: s{i-1}.out}}, params: {{command: 'echo {i} > ${{outputs.out}}/o.txt'}}, outputs: [out]}}")
    make.append(f"s{i}: s{i-1}\n\techo {i} > s{i}")
with open(os.path.join(work, "p.yaml"), "w") as f:
    f.write("\n".join(lines) + "\n")
with open(os.path.join(work, "Makefile"), "w") as f:
    f.write("\n".join(make) + "\n")


old_env = dict(os.environ, **dict(kv.split("=", 1) for kv in os.environ.get("OLD_ENV", "").split()))


def median_ms(cmd, env=None):
    xs = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        xs.append(time.perf_counter() - t)
    return statistics.median(xs) * 1000


for b, env in ((old, old_env), (new, None)):
    subprocess.run([b, "run", "p.yaml"], cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
subprocess.run(["make", "-s"], cwd=work, stdout=subprocess.DEVNULL, check=True)
for r in range(rounds):
    v_old, v_new = median_ms([old, "validate", "p.yaml"], old_env), median_ms([new, "validate", "p.yaml"])
    c_old, c_new = median_ms([old, "run", "p.yaml"], old_env), median_ms([new, "run", "p.yaml"])
    m = median_ms(["make", "-s"])
    print(f"round {r + 1}: validate {v_old:.2f} → {v_new:.2f} ms ({v_old / v_new:.2f}×) · cached run {c_old:.2f} → {c_new:.2f} ms "
          f"({c_old / c_new:.2f}×) · make up to date {m:.2f} ms · new ÷ make {c_new / m:.1f}×")
