"""What the asynchronous loop's overlap yields when generation and learning have devices of their
own, from a run's own stage times.

    overlap.py RUN_RECORD.json [RUN_RECORD.json ...]

For each run of a pipeline shaped like the main job's loop (train_tasks → rollout → judge →
advantage → update, heldout every N), with lag K (read from the run's resolved pipeline): the loop's
makespan when rollouts and evaluations run on a generation device and updates on a learning
device (synthesize, judge and advantage on spare cores), scheduled greedily in order, with the
run's own stage durations — once with the synchronous edges (rollout i reads update i−1) and once
with the run's lag (rollout i reads update i−1−K). The ratio is the overlap's speed-up at equal
work; on one 2-core machine the same stages compete for the cores instead.
"""
import json
import sys

DEVICE = {"rollout": "generate", "evaluate": "generate", "update": "learn"}


def deps(name, lag, iterations):
    stage, _, it = name.partition("@")
    i = int(it)
    before = lambda j: [f"update@{j}"] if j >= 1 else []
    return {
        "train_tasks": [],
        "rollout": [f"train_tasks@{i}"] + before(i - 1 - lag),
        "judge": [f"rollout@{i}"],
        "advantage": [f"judge@{i}"],
        "update": [f"advantage@{i}"] + before(i - 1),
        "heldout": [f"update@{i}"],
    }[stage]


def makespan(durations, kinds, lag):
    iterations = max(int(n.partition("@")[2]) for n in durations)
    order = sorted(durations, key=lambda n: (int(n.partition("@")[2]), ["train_tasks", "rollout", "judge", "advantage", "update", "heldout"].index(n.partition("@")[0])))
    free = {"generate": 0.0, "learn": 0.0}
    end = {}
    # Ready time first: a lagged rollout waits for nothing newer, so it goes as soon as its device is free.
    pending = list(order)
    while pending:
        ready = [(max([end[d] for d in deps(n, lag, iterations) if d in durations] or [0.0]), n) for n in pending
                 if all(d in end or d not in durations for d in deps(n, lag, iterations))]
        at, n = min(ready, key=lambda r: (max(r[0], free.get(DEVICE.get(kinds[r[1]]), 0.0)), order.index(r[1])))
        device = DEVICE.get(kinds[n])
        start = max(at, free[device]) if device else at
        end[n] = start + durations[n]
        if device:
            free[device] = end[n]
        pending.remove(n)
    return max(end.values())


for path in sys.argv[1:]:
    rec = json.load(open(path))
    # The lag the run used: its resolved pipeline's (a file's own `lag`, or one set by --set).
    lag = int(((rec.get("resolved") or {}).get("stages", {}).get("train", {}).get("loop", {}).get("lag") or {}).get("behaviour", {}).get("by", 0))
    body = [i for i in rec["instances"] if "@" in i["name"] and i.get("started_at") and i.get("finished_at")]
    durations = {i["name"]: i["finished_at"] - i["started_at"] for i in body}
    kinds = {i["name"]: i["kind"] for i in body}
    sync, lagged = makespan(durations, kinds, 0), makespan(durations, kinds, lag)
    serial = sum(durations.values())
    print(f"{path}: lag {lag}: loop stages {serial:.0f} s in all; two devices: synchronous edges {sync:.0f} s, "
          f"lag {lag} edges {lagged:.0f} s: {sync / lagged:.2f}x")
