#!/usr/bin/env python3
"""Wall time (median) and CPU time (user, system) and minor page faults (means, from getrusage)
of `rao --version`, `rao validate p.yaml` and a fully cached `rao run p.yaml`, 100 runs each,
with the default worker threads and with TOKIO_WORKER_THREADS=1, next to `make -s` when the
folder has a Makefile.

Run it in a folder holding `p.yaml` (already run once, so every stage is cached):

    benches/scripts/cached_run_rusage.py RAO
"""
import os, resource, statistics, subprocess, sys, time

N = 100


def m(c, env=None):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    ws = []
    for _ in range(N):
        t1 = time.perf_counter()
        subprocess.run(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        ws.append(time.perf_counter() - t1)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (f"wall {statistics.median(ws) * 1000:.2f} user {(r1.ru_utime - r0.ru_utime) / N * 1000:.2f} "
            f"sys {(r1.ru_stime - r0.ru_stime) / N * 1000:.2f} minflt {(r1.ru_minflt - r0.ru_minflt) / N:.0f}")


b = sys.argv[1]
for args in (["--version"], ["validate", "p.yaml"], ["run", "p.yaml"]):
    print(args[0], "| default:", m([b] + args), "| 1 worker:", m([b] + args, dict(os.environ, TOKIO_WORKER_THREADS="1")))
if os.path.exists("Makefile"):
    print("make", m(["make", "-s"]))
