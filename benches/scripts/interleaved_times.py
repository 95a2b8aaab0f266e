#!/usr/bin/env python3
"""Wall and CPU time of several commands run in turn, one run of each per round, N rounds
(a noisy machine drifts: interleaving gives every command the same conditions, where blocks of
runs give each its own). Prints min, 25th percentile and median per command.

    benches/scripts/interleaved_times.py DIR N CMD1 ';;' CMD2 ';;' ...

e.g. in a folder where `cached_chain_ab.py`'s chain and Makefile have run once:
    interleaved_times.py /dev/shm/chain 200 target/debug/rao run p.yaml ';;' make -s
"""
import resource, statistics, subprocess, sys, time

d, n = sys.argv[1], int(sys.argv[2])
cmds = [c.split() for c in " ".join(sys.argv[3:]).split(" ;; ")]
wall = [[] for _ in cmds]
cpu = [[] for _ in cmds]
for _ in range(n):
    for k, c in enumerate(cmds):
        r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run(c, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        wall[k].append((t1 - t0) * 1e3)
        cpu[k].append((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1e3)
for k, c in enumerate(cmds):
    w, u = sorted(wall[k]), sorted(cpu[k])
    print(f"{' '.join(c)[:48]:48s} wall min {w[0]:.2f} p25 {w[n // 4]:.2f} median {statistics.median(w):.2f} ms"
          f" | cpu p25 {u[n // 4]:.2f} median {statistics.median(u):.2f} ms")
