#!/usr/bin/env python3
"""A/B of rao binaries on orchestrator.sh's 100-stage shell chain, cold: each binary in a fresh
directory (and GNU make on the same commands), interleaved round by round, the order reversed
every other round; medians and ranges of wall time, and the CPU time of each command with its
children. Directories are made under $TMPDIR (TMPDIR=/dev/shm: tmpfs, without the disk's cost).

    benches/scripts/cold_chain_ab.py ROUNDS RAO [RAO...]
"""
import os, resource, shutil, statistics, subprocess, sys, tempfile, time

rounds, bins = int(sys.argv[1]), sys.argv[2:]
rao = ["name: chain", "stages:", "  s0: {kind: shell, params: {command: 'echo 0 > ${outputs.o}/v'}, outputs: [o]}"]
make = ["all: v99", "v0: ; echo 0 > v0"]
for i in range(1, 100):
    rao.append(f"  s{i}: {{kind: shell, params: {{command: 'cat ${{inputs.i}}/v > ${{outputs.o}}/v; echo {i} >> ${{outputs.o}}/v'}}, "
               f"inputs: {{i: s{i-1}.o}}, outputs: [o]}}")
    make.append(f"v{i}: v{i-1} ; cat v{i-1} > v{i}; echo {i} >> v{i}")

names = bins + ["make"]
wall, cpu = {b: [] for b in names}, {b: [] for b in names}
for r in range(rounds):
    for b in names if r % 2 == 0 else names[::-1]:
        d = tempfile.mkdtemp(prefix="rao-cold-")
        if b == "make":
            with open(os.path.join(d, "Makefile"), "w") as f:
                f.write("\n".join(make) + "\n")
            cmd = ["make", "-s", "-C", d]
        else:
            with open(os.path.join(d, "chain.yaml"), "w") as f:
                f.write("\n".join(rao) + "\n")
            cmd = [b, "run", os.path.join(d, "chain.yaml")]
        r0, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        wall[b].append(time.perf_counter() - t)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu[b].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        shutil.rmtree(d)
m = statistics.median(wall["make"])
for b in names:
    xs = wall[b]
    print(f"{b}: {statistics.median(xs) * 1000:.1f} ms (range {min(xs) * 1000:.0f}–{max(xs) * 1000:.0f}) · ÷ make "
          f"{statistics.median(xs) / m:.2f}× · CPU {statistics.median(cpu[b]) * 1000:.1f} ms")
