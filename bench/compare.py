#!/usr/bin/env python3
"""Compares two runs of `lazyfuse bench --json` taken in one session on one machine (a build
before a change and after it): per workload, dtype, size and mode, the time after over the time
before, as a markdown table, with the median and extremes of the ratios.

usage: bench/compare.py --before DIR_OR_FILES... --after DIR_OR_FILES... [--markdown out.md]
"""
import argparse
import glob
import json
import os


def load(paths):
    rows = {}
    for path in paths:
        files = sorted(glob.glob(os.path.join(path, "*.json"))) if os.path.isdir(path) else [path]
        for name in files:
            with open(name) as f:
                for r in json.load(f)["results"]:
                    rows[(r["workload"], r["dtype"], r["n"], r["mode"])] = r["us"]
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", nargs="+", required=True)
    parser.add_argument("--after", nargs="+", required=True)
    parser.add_argument("--markdown")
    args = parser.parse_args()
    before, after = load(args.before), load(args.after)
    keys = sorted(set(before) & set(after))
    lines = ["| workload | dtype | elements | mode | before (us) | after (us) | after / before |",
             "|---|---|---|---|---|---|---|"]
    ratios = []
    for key in keys:
        workload, dtype, n, mode = key
        ratio = after[key] / before[key] if before[key] > 0 else float("nan")
        if mode != "roof":
            ratios.append(ratio)
        lines.append(f"| {workload} | {dtype} | 2^{n.bit_length() - 1} | {mode} | "
                     f"{before[key]:.1f} | {after[key]:.1f} | {ratio:.3f} |")
    ratios.sort()
    if ratios:
        lines.append("")
        lines.append(f"{len(ratios)} cells (roof excluded): after/before median "
                     f"{ratios[len(ratios) // 2]:.3f}, min {ratios[0]:.3f}, max {ratios[-1]:.3f}")
    missing = sorted(set(before) ^ set(after))
    if missing:
        lines.append(f"in one run only: {len(missing)} cells")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
