#!/usr/bin/env python3
"""Writes tools/bench/traces/c4_demand.csv, the committed demand trace of
cxlpool-bench's C4 (docs/benchmarks.md): shared-slice demand of 4 hosts over
96 steps (a day in 15-minute steps), in slices. Skewed (peak amplitudes
24/12/8/4) and time-shifting (each host peaks at another time), with a
little seeded noise. Deterministic: rerunning it rewrites the same file.

    scripts/gen-c4-trace.py > tools/bench/traces/c4_demand.csv
"""
import math
import random

STEPS = 96
BASE = [3, 2, 2, 1]
AMP = [24, 12, 8, 4]
CENTER = [20, 44, 68, 88]
WIDTH = 12.0


def main():
    rng = random.Random(39)
    print("# step,host0,host1,host2,host3 (slices); scripts/gen-c4-trace.py")
    for t in range(STEPS):
        row = []
        for h in range(4):
            bump = AMP[h] * math.exp(-(((t - CENTER[h]) / WIDTH) ** 2) / 2)
            row.append(max(0, BASE[h] + round(bump) + rng.choice([-1, 0, 0, 1])))
        print(",".join([str(t)] + [str(v) for v in row]))


if __name__ == "__main__":
    main()
