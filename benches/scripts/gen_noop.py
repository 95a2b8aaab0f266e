#!/usr/bin/env python3
"""Write a pipeline of N no-op stages: each depends on the one before and on one of half its index."""
import sys
n = int(sys.argv[1])
out = ["name: noop-bench", "store: store", "stages:"]
for i in range(n):
    inputs = []
    if i > 0:
        inputs.append(f"s{i-1}.o")
    if i > 1:
        inputs.append(f"s{i//2}.o")
    inp = f", inputs: {{i: [{', '.join(inputs)}]}}" if inputs else ""
    out.append(f"  s{i}: {{kind: noop, params: {{value: {i}}}, outputs: [o]{inp}}}")
print("\n".join(out))
