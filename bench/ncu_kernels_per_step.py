#!/usr/bin/env python3
"""The kernels one training step runs as the GPU sees them (cuBLAS's own kernels counted one by
one): runs `COMMAND --steps=2` and `COMMAND --steps=4` under ncu (one cheap metric per kernel)
and halves the difference, so warm-up and one-off kernels cancel. Prints the count and each
kernel's name with its count per step. Runs on the GPU machine, where ncu is.

usage: bench/ncu_kernels_per_step.py COMMAND [ARGS...]
"""
import collections
import csv
import io
import subprocess
import sys


def kernel_names(command, steps):
    result = subprocess.run(
        ["ncu", "--clock-control", "none", "--metrics", "gpu__time_duration.sum", "--csv"] +
        command + [f"--steps={steps}", "--warmup=1"],
        capture_output=True, text=True, check=True)
    lines = [line for line in result.stdout.splitlines() if line.startswith('"')]
    names = collections.Counter()
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        if row.get("Metric Name") == "gpu__time_duration.sum":
            names[row["Kernel Name"]] += 1
    return names


def main():
    command = sys.argv[1:]
    two, four = kernel_names(command, 2), kernel_names(command, 4)
    per_step = {name: (four[name] - two[name]) / 2 for name in four}
    total = sum(per_step.values())
    print(f"ncu: {total:g} kernels a step: {' '.join(command)}")
    for name, count in sorted(per_step.items(), key=lambda item: -item[1]):
        if count:
            print(f"  {count:g} x {name[:110]}")


if __name__ == "__main__":
    main()
