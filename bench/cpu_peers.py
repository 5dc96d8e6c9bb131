#!/usr/bin/env python3
"""The fusion benchmark's workloads on the CPU in NumPy, numexpr, PyTorch eager (and its own
softmax, layer_norm, rms_norm and log_softmax) and torch.compile, measured the way
`lazyfuse bench --device=cpu` measures: wall clock around batches of back-to-back calls, the
median over batches after warm-up, inputs rotated among sets that together outrun the caches.
Then the per-call cost of `(z + 2).exp() * y` on 4096 elements in each. Writes one JSON file per
peer in lazyfuse bench's format. None of these packages is a dependency of lazyfuse:
scripts/cpu-bench.sh installs them from PyPI into a virtual environment of its own.

usage: bench/cpu_peers.py --out DIR [--sizes 20,24] [--workloads exp_mul,...] [--threads N]
"""
import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import torch_form, workloads  # noqa: E402  (the workloads' one definition)


def measure(call, sets, batches, per_batch):
    for i in range(3):
        call(sets[i % len(sets)])
    times = []
    for _ in range(batches):
        start = time.perf_counter()
        for i in range(per_batch):
            call(sets[i % len(sets)])
        times.append((time.perf_counter() - start) / per_batch)
    return statistics.median(times)


def input_sets(shapes, n, make, nbytes):
    # As lazyfuse bench: enough sets that together they are 240 MB, at most 8.
    return [[make(s) for s in shapes(n)] for _ in range(max(1, min(8, math.ceil(240e6 / nbytes))))]


def host_cost(call, make):
    """Seconds per call of `(z + 2).exp() * y` on 4096 elements, 1000 calls back to back."""
    z, y = make((4096,)), make((4096,))
    for _ in range(100):
        call(z, y)
    start = time.perf_counter()
    for _ in range(1000):
        call(z, y)
    return (time.perf_counter() - start) / 1000


def numexpr_forms(ne, np):
    """Each workload with its elementwise parts as numexpr expressions. Constants are passed as
    float32 values: numexpr reads Python float literals as float64."""
    c = {k: np.float32(v) for k, v in dict(two=2, half=0.5, one=1, k0=0.7978845608, k1=0.044715, a=1.0001,
                                          b=0.001, b1=0.9, g1=0.1, b2=0.999, g2=0.001, lr=1e-3, eps8=1e-8,
                                          eps5=1e-5, eps6=1e-6, zero=0).items()}

    def ev(expr, **arrays):
        return ne.evaluate(expr, local_dict={**c, **arrays})

    def chain16(x):
        for _ in range(4):
            x = ev("abs(one / (one + exp(-(x * a + b))) - half)", x=x)
        return x

    def adam(p, g, m, v):
        m2 = ev("m * b1 + g * g1", m=m, g=g)
        v2 = ev("v * b2 + g * g * g2", v=v, g=g)
        return ev("p - m2 * lr / (sqrt(v2) + eps8)", p=p, m2=m2, v2=v2), m2, v2

    def softmax(x):
        e = ev("exp(x - mx)", x=x, mx=x.max(axis=1, keepdims=True))
        return ev("e / s", e=e, s=e.sum(axis=1, keepdims=True))

    def softmax_cols(x):
        e = ev("exp(x - mx)", x=x, mx=x.max(axis=0, keepdims=True))
        return ev("e / s", e=e, s=e.sum(axis=0, keepdims=True))

    def layer_norm(x, w, bias):
        centered = ev("x - mu", x=x, mu=x.mean(axis=1, keepdims=True))
        var = ev("centered * centered", centered=centered).mean(axis=1, keepdims=True)
        return ev("centered / sqrt(var + eps5) * w + bias", centered=centered, var=var, w=w, bias=bias)

    def rms_norm(x, w):
        ms = ev("x * x", x=x).mean(axis=1, keepdims=True)
        return ev("x / sqrt(ms + eps6) * w", x=x, ms=ms, w=w)

    def log_softmax(x):
        shifted = ev("x - mx", x=x, mx=x.max(axis=1, keepdims=True))
        return ev("shifted - log(s)", shifted=shifted, s=ev("exp(shifted)", shifted=shifted).sum(
            axis=1, keepdims=True))

    return {
        "exp_mul": lambda z, y: ev("exp(z + two) * y", z=z, y=y),
        "gelu": lambda x: ev("x * half * (one + tanh(k0 * (x + k1 * x * x * x)))", x=x),
        "bias_relu": lambda x, bias: ev("where(x + bias > zero, x + bias, zero) * half", x=x, bias=bias),
        "softmax": softmax,
        "softmax_fn": softmax,
        "softmax_cols": softmax_cols,
        "sum_squares": lambda x: ev("sum(x * x)", x=x),
        "chain16": chain16,
        "adam": adam,
        "layernorm": layer_norm,
        "layernorm4k": layer_norm,
        "rmsnorm": rms_norm,
        "rmsnorm4k": rms_norm,
        "log_softmax": log_softmax,
    }


def run_numpy(args, use_numexpr):
    import numpy as np
    mode = "numexpr" if use_numexpr else "numpy"
    if use_numexpr:
        import numexpr as ne
        ne.set_num_threads(args.threads)
        forms = numexpr_forms(ne, np)
    rng = np.random.default_rng(0)
    make = lambda s: (rng.random(s, dtype=np.float32) + np.float32(0.5))
    results = []
    for name, (shapes, fn, nbytes) in workloads(np, "numpy").items():
        if args.workloads and name not in args.workloads:
            continue
        call = forms[name] if use_numexpr else fn
        for log2 in args.sizes:
            n = 1 << log2
            b = nbytes(n, 4)
            sets = input_sets(shapes, n, make, b)
            per_batch = max(1, min(100, (1 << 26) // n))
            t = measure(lambda inputs: call(*inputs), sets, args.batches, per_batch)
            results.append({"workload": name, "dtype": "f32", "n": n, "mode": mode, "us": t * 1e6, "bytes": b})
            print(f"{mode:14s} {name:12s} f32 2^{log2}: {t * 1e6:9.1f} us", file=sys.stderr)
    cost = host_cost(forms["exp_mul"] if use_numexpr else (lambda z, y: np.exp(z + np.float32(2)) * y), make)
    return results, cost


def run_torch(args, compiled):
    import torch
    torch.set_num_threads(args.threads)
    mode = "torch.compile" if compiled else "torch eager"

    class XP:  # the numpy-like names the workloads use
        tanh, exp, sqrt, maximum, log = torch.tanh, torch.exp, torch.sqrt, torch.clamp_min, torch.log

    make = lambda s: torch.rand(s, dtype=torch.float32) + 0.5
    results = []
    for name, (shapes, fn, nbytes) in workloads(XP, "torch").items():
        if args.workloads and name not in args.workloads:
            continue
        fn = torch_form(torch, name, fn)
        call = torch.compile(fn) if compiled else fn
        for log2 in args.sizes:
            n = 1 << log2
            b = nbytes(n, 4)
            sets = input_sets(shapes, n, make, b)
            per_batch = max(1, min(100, (1 << 26) // n))
            with torch.no_grad():
                t = measure(lambda inputs: call(*inputs), sets, args.batches, per_batch)
            results.append({"workload": name, "dtype": "f32", "n": n, "mode": mode, "us": t * 1e6, "bytes": b})
            print(f"{mode:14s} {name:12s} f32 2^{log2}: {t * 1e6:9.1f} us", file=sys.stderr)
    exp_mul = lambda z, y: torch.exp(z + 2) * y
    with torch.no_grad():
        cost = host_cost(torch.compile(exp_mul) if compiled else exp_mul, make)
    return results, cost


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", default="20,24")
    parser.add_argument("--workloads", default="")
    parser.add_argument("--peers", default="numpy,numexpr,torch,torch.compile")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--tag", default="", help="appended to each JSON file's name")
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.workloads = [w for w in args.workloads.split(",") if w]
    os.makedirs(args.out, exist_ok=True)
    runners = {"numpy": lambda: run_numpy(args, False), "numexpr": lambda: run_numpy(args, True),
               "torch": lambda: run_torch(args, False), "torch.compile": lambda: run_torch(args, True)}
    for peer in args.peers.split(","):
        try:
            results, cost = runners[peer]()
        except Exception as error:  # a missing or failing peer is reported, the rest still run
            print(f"{peer}: {error}", file=sys.stderr)
            continue
        print(f"{peer:14s} (z + 2).exp() * y on 4096 elements: {cost * 1e6:.2f} us per call", file=sys.stderr)
        with open(os.path.join(args.out, f"{peer}{args.tag}.json"), "w") as f:
            json.dump({"tool": peer, "device": "cpu", "threads": args.threads,
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                       "host_cost_us": cost * 1e6, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
