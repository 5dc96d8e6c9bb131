#!/usr/bin/env python3
"""Merges `lazyfuse bench --json` output with bench/peers.py's, prints the comparison as a
markdown table (time per evaluation, GB/s over the unique bytes, % of the copy roof measured in
the same run, speed-up over each peer) and a table of the issue's bars (met, missed, or not
measured in the run; docs/benchmarks.md explains the misses), and draws GB/s
against size (one line per mode and peer) to a PNG when matplotlib is there.

usage: bench/report.py lazyfuse.json [peer.json ...] [--png plot.png] [--markdown out.md] [--cpu]

With --cpu, the CPU peers (bench/cpu_peers.py) and the CPU backend issue's bars instead.
"""
import argparse
import json
import math
import sys
from collections import defaultdict


def median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else None


def load(paths):
    """Rows from every file; from several lazyfuse files (one process per workload), the median
    of their host-cost and compile figures. Where files repeat a measurement (rounds of
    scripts/cpu-bench.sh), each mode keeps its best; every tool's host cost per call is kept
    the same way, in meta["peer_host_cost_us"]."""
    metas, rows = [], defaultdict(dict)  # (workload, dtype, n) -> mode -> (us, bytes)
    peer_host = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        if data.get("tool") == "lazyfuse":
            metas.append(data)
        elif "host_cost_us" in data:
            peer_host[data["tool"]] = min(peer_host.get(data["tool"], math.inf), data["host_cost_us"])
        for r in data["results"]:
            modes = rows[(r["workload"], r["dtype"], r["n"])]
            if r["mode"] not in modes or r["us"] < modes[r["mode"]][0]:
                modes[r["mode"]] = (r["us"], r["bytes"])
    meta = dict(metas[0]) if metas else {}
    meta["peer_host_cost_us"] = peer_host
    if len(metas) > 1 and meta.get("device") == "cpu":
        meta["host_cost_us"] = min(m["host_cost_us"] for m in metas if "host_cost_us" in m)
    elif len(metas) > 1:
        for key in ("host_cost_us", "launch_floor_us"):
            values = [m[key] for m in metas if key in m]
            if values:
                meta[key] = median(values)
        meta["compile_ms"] = {k: median([m["compile_ms"][k] for m in metas if "compile_ms" in m])
                              for k in ("cold", "warm", "hot")}
    return meta, rows


def bars(meta, rows):
    """The bars of the fusion benchmark issue (float32), each as a table row: met, missed, or
    not measured in this run."""
    def fused(workload, log2):
        return rows.get((workload, "f32", 1 << log2), {})

    def ratio(workload, log2, mode):  # mode's time over ours: above 1, we are faster
        modes = fused(workload, log2)
        return modes[mode][0] / modes["fused"][0] if mode in modes and "fused" in modes else None

    def roof(workload, log2):
        modes = fused(workload, log2)
        return 100 * modes["roof"][0] / modes["fused"][0] if "roof" in modes and "fused" in modes else None

    out = ["| bar (float32) | measured | met |", "|---|---|---|"]

    def row(name, values, good):
        # Two decimals, or three where two would round a miss up to the bar (or a pass down).
        def show(v):
            return "-" if v is None else f"{v:.2f}" if good(round(v, 2)) == good(v) else f"{v:.3f}"
        shown = ", ".join(show(v) for v in values)
        verdict = "not measured" if any(v is None for v in values) else (
            "yes" if all(good(v) for v in values) else "no")
        out.append(f"| {name} | {shown} | {verdict} |")

    for w in ["exp_mul", "gelu", "bias_relu", "chain16", "adam"]:
        row(f"{w} at 2^26, 2^28: % of the copy roof >= 95", [roof(w, 26), roof(w, 28)], lambda v: v >= 95)
        row(f"{w} at 2^26, 2^28: torch.compile time / ours >= 1.00",
            [ratio(w, 26, "torch.compile"), ratio(w, 28, "torch.compile")], lambda v: v >= 1.0)
    row("exp_mul at 2^26, 2^28: torch eager / ours >= 2.2",
        [ratio("exp_mul", 26, "torch eager"), ratio("exp_mul", 28, "torch eager")], lambda v: v >= 2.2)
    row("exp_mul at 2^20: torch.compile / ours >= 2", [ratio("exp_mul", 20, "torch.compile")], lambda v: v >= 2)
    cupy = "cupy.fuse" if "cupy.fuse" in fused("exp_mul", 20) else "cupy.ElementwiseKernel"
    row(f"exp_mul at 2^20: {cupy} / ours >= 1.5", [ratio("exp_mul", 20, cupy)], lambda v: v >= 1.5)
    for w in ["softmax", "sum_squares"]:
        row(f"{w} at 2^26, 2^28: % of the copy roof >= 90", [roof(w, 26), roof(w, 28)], lambda v: v >= 90)
        # PyTorch eager's own kernel where it has one (torch.softmax), else its ops.
        eager = "torch.softmax" if w == "softmax" else "torch eager"
        row(f"{w} at 2^26, 2^28: {eager} / ours >= 1.00", [ratio(w, 26, eager), ratio(w, 28, eager)],
            lambda v: v >= 1.0)
    # The normalization issue's bars: the norms and log-softmax in both dtypes, and bfloat16.
    def at(workload, dtype, log2, mode):
        modes = rows.get((workload, dtype, 1 << log2), {})
        return modes.get(mode, (None,))[0], modes.get("fused", (None,))[0]

    def half_roof(workload, dtype, log2):
        roof_us, us = at(workload, dtype, log2, "roof")
        return None if roof_us is None or us is None else 100 * roof_us / us

    def half_ratio(workload, dtype, log2, mode):
        theirs, us = at(workload, dtype, log2, mode)
        return None if theirs is None or us is None else theirs / us

    norms = ["layernorm", "layernorm4k", "rmsnorm", "rmsnorm4k", "log_softmax"]
    for dtype in ["f32", "bf16"]:
        for w in norms:
            row(f"{w} {dtype} at 2^26, 2^28: % of the copy roof >= 90",
                [half_roof(w, dtype, 26), half_roof(w, dtype, 28)], lambda v: v >= 90)
            row(f"{w} {dtype} at 2^26, 2^28: torch.compile / ours >= 1.00",
                [half_ratio(w, dtype, 26, "torch.compile"), half_ratio(w, dtype, 28, "torch.compile")],
                lambda v: v >= 1.0)
    for w in ["exp_mul", "gelu", "bias_relu", "softmax", "sum_squares", "chain16", "adam"]:
        row(f"{w} bf16 at 2^26, 2^28: torch.compile / ours >= 1.00",
            [half_ratio(w, "bf16", 26, "torch.compile"), half_ratio(w, "bf16", 28, "torch.compile")],
            lambda v: v >= 1.0)
        if w != "chain16":
            row(f"{w} bf16 at 2^26, 2^28: % of the copy roof >= 90",
                [half_roof(w, "bf16", 26), half_roof(w, "bf16", 28)], lambda v: v >= 90)
    host = meta.get("host_cost_us")
    row("host cost per evaluation on 4096 elements <= 6 us", [host], lambda v: v <= 6)
    floor = meta.get("launch_floor_us")
    row("own share of that over a bare cuLaunchKernel <= 1.5 us",
        [host - floor if host is not None and floor is not None else None], lambda v: v <= 1.5)
    compile_ms = meta.get("compile_ms", {})
    row("new kernel cold <= 50 ms", [compile_ms.get("cold")], lambda v: v <= 50)
    row("new kernel from the disk cache <= 2 ms", [compile_ms.get("warm")], lambda v: v <= 2)
    return out


CPU_PEERS = ["numpy", "numexpr", "torch eager", "torch.compile"]


def cpu_bars(meta, rows):
    """The bars of the CPU backend issue (float32, 2^20 and 2^24), each as a table row."""
    out = ["| bar (float32, CPU) | measured | met |", "|---|---|---|"]

    def row(name, value, good):
        verdict = "not measured" if value is None else "yes" if good(value) else "no"
        out.append(f"| {name} | {'-' if value is None else f'{value:.2f}'} | {verdict} |")

    def ratio(workload, log2, mode):  # mode's time over ours: above 1, we are faster
        modes = rows.get((workload, "f32", 1 << log2), {})
        return modes[mode][0] / modes["fused"][0] if mode in modes and "fused" in modes else None

    workloads = sorted({w for (w, d, n) in rows if d == "f32"})
    for w in workloads:
        for log2 in (20, 24):
            row(f"{w} at 2^{log2}: torch.compile / ours >= 1.00", ratio(w, log2, "torch.compile"),
                lambda v: v >= 1)
            row(f"{w} at 2^{log2}: torch eager / ours >= 1.00", ratio(w, log2, "torch eager"), lambda v: v >= 1)
    # softmax_fn is lazyfuse's softmax() against torch.softmax (its torch eager form), each a
    # library's own softmax; softmax is the same rows written in primitive ops in both.
    for log2 in (20, 24):
        row(f"softmax at 2^{log2}: torch.softmax / our softmax() >= 1.00",
            ratio("softmax_fn", log2, "torch eager"), lambda v: v >= 1)
    # Memory-bound: all but chain16, whose sixteen ops with four exponentials are compute-bound.
    for w in workloads:
        if w != "chain16":
            row(f"{w} at 2^24: % of the two-thread copy roof >= 60", None if ratio(w, 24, "roof") is None
                else 100 * ratio(w, 24, "roof"), lambda v: v >= 60)
    numpy_us = meta.get("peer_host_cost_us", {}).get("numpy")
    host = meta.get("host_cost_us")
    row("per call, (z + 2).exp() * y on 4096 elements: NumPy's us / ours >= 1.00",
        None if numpy_us is None or host is None else numpy_us / host, lambda v: v >= 1)
    return out


def cpu_report(meta, rows):
    lines = [f"Measured {meta.get('date', '?')} on the CPU, each mode's best round.", "",
             "| workload | n | fused us | unfused us | two-thread copy us | % roof | "
             + " | ".join(f"vs {p}" for p in CPU_PEERS) + " |", "|" + "---|" * (6 + len(CPU_PEERS))]
    for (workload, dtype, n), modes in sorted(rows.items()):
        if "fused" not in modes or dtype != "f32":
            continue
        us = modes["fused"][0]
        roof = modes.get("roof", (float("nan"),))[0]
        unfused = modes.get("unfused", (float("nan"),))[0]
        ratios = [f"{modes[p][0] / us:.2f}x" if p in modes else "-" for p in CPU_PEERS]
        lines.append(f"| {workload} | 2^{n.bit_length() - 1} | {us:.1f} | {unfused:.1f} | {roof:.1f} | "
                     f"{100 * roof / us:.1f}% | " + " | ".join(ratios) + " |")
    host = ", ".join(f"{tool} {us:.2f}" for tool, us in sorted(meta.get("peer_host_cost_us", {}).items()))
    lines += ["", f"Per call, (z + 2).exp() * y on 4096 elements: lazyfuse {meta.get('host_cost_us', 0):.2f} us; "
              f"{host} us.", ""] + cpu_bars(meta, rows)
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="+")
    parser.add_argument("--png")
    parser.add_argument("--markdown")
    parser.add_argument("--cpu", action="store_true", help="the CPU peers and the CPU issue's bars")
    args = parser.parse_args()
    meta, rows = load(args.files)
    if args.cpu:
        text = cpu_report(meta, rows)
        print(text)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(text + "\n")
        return
    peers = ["torch eager", "torch.compile", "cupy.fuse", "jax.jit"]
    # Where cupy.fuse cannot compile a workload, peers.py measures a cupy.ElementwiseKernel of the
    # same expression instead: its ratio goes in the CuPy column, marked with a dagger.
    stand_ins = {"cupy.fuse": "cupy.ElementwiseKernel"}
    lines = [f"Measured {meta.get('date', '?')} on {meta.get('device', '?')}.", "",
             "| workload | dtype | n | fused us | unfused us | roof us | GB/s | % roof | "
             + " | ".join(f"vs {p}" for p in peers) + " |",
             "|" + "---|" * (8 + len(peers))]
    any_stand_in = False
    for (workload, dtype, n), modes in sorted(rows.items()):
        if "fused" not in modes:
            continue
        us, nbytes = modes["fused"]
        roof = modes.get("roof", (float("nan"), 0))[0]
        unfused = modes.get("unfused", (float("nan"), 0))[0]
        ratios = []
        for p in peers:
            if p in modes:
                ratios.append(f"{modes[p][0] / us:.2f}x")
            elif stand_ins.get(p) in modes:
                ratios.append(f"{modes[stand_ins[p]][0] / us:.2f}x \u2020")
                any_stand_in = True
            else:
                ratios.append("-")
        lines.append(f"| {workload} | {dtype} | 2^{n.bit_length() - 1} | {us:.1f} | {unfused:.1f} | {roof:.1f} | "
                     f"{nbytes / us / 1e3:.0f} | {100 * roof / us:.1f}% | " + " | ".join(ratios) + " |")
    if any_stand_in:
        lines += ["", "\u2020 against a cupy.ElementwiseKernel of the same expression: cupy.fuse did not "
                  "compile it on this machine."]
    host = f"Host cost per evaluation, (z + 2).exp() * y on 4096 elements: {meta.get('host_cost_us', 0):.2f} us"
    if "launch_floor_us" in meta:
        host += (f"; a bare cuLaunchKernel of the same computation, in alternating batches: "
                 f"{meta['launch_floor_us']:.2f} us, so lazyfuse's own share is "
                 f"{meta['host_cost_us'] - meta['launch_floor_us']:.2f} us")
    lines += ["", host + ".",
              "New fused kernel: cold {cold:.2f} ms, warm {warm:.3f} ms, hot {hot:.3f} ms.".format(
                  **meta.get("compile_ms", {"cold": 0, "warm": 0, "hot": 0}))]
    lines += [""] + bars(meta, rows)
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
        # A panel per workload and dtype measured (float32, then bfloat16).
        panels = sorted({(w, d) for (w, d, n) in rows}, key=lambda p: (p[1] != "f32", p))
        columns = 4
        fig, axes = plt.subplots((len(panels) + columns - 1) // columns, columns,
                                 figsize=(5 * columns, 4 * ((len(panels) + columns - 1) // columns)),
                                 squeeze=False)
        for ax, (name, dtype) in zip(axes.flat, panels):
            for mode in ["fused", "unfused", "roof"] + peers + list(stand_ins.values()):
                points = sorted((n, nbytes / us / 1e3) for (w, d, n), modes in rows.items()
                                if w == name and d == dtype and mode in modes for us, nbytes in [modes[mode]])
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=mode)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{name} ({'bfloat16' if dtype == 'bf16' else 'float32' if dtype == 'f32' else dtype})")
            ax.set_xlabel("elements")
            ax.set_ylabel("GB/s over unique bytes")
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        # One legend for every mode drawn in any panel.
        handles = {}
        for ax in axes.flat:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, handle)
        axes.flat[0].legend(handles.values(), handles.keys(), fontsize=7)
        fig.tight_layout()
        fig.savefig(args.png, dpi=80)


if __name__ == "__main__":
    main()
