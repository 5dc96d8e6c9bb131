#!/usr/bin/env python3
"""The fusion benchmark's workloads in PyTorch eager, torch.compile, CuPy (cupy.fuse) and JAX jit,
measured the way `lazyfuse bench` measures: CUDA events around batches of back-to-back calls,
the median over batches after warm-up, inputs rotated among sets that together outrun the L2.
Writes one JSON file per peer in lazyfuse bench's format. Runs on the GPU machine only; none
of these packages is a dependency of lazyfuse.

usage: bench/peers.py --out DIR [--sizes 12,16,20,24,26,28] [--dtypes f32,bf16] [--peers ...]
"""
import argparse
import datetime
import json
import math
import os
import statistics
import sys


def workloads(xp, where, fuse=lambda f: f):
    """Each workload as (input shapes for n, function of the inputs, unique bytes)."""
    tanh, exp, sqrt = xp.tanh, xp.exp, xp.sqrt

    def relu(x):
        return xp.maximum(x, 0)

    def softmax(x):
        e = exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def chain16(x):
        for _ in range(4):
            x = abs(1 / (1 + exp(-(x * 1.0001 + 0.001))) - 0.5)
        return x

    def adam(p, g, m, v):
        m2 = m * 0.9 + g * 0.1
        v2 = v * 0.999 + g * g * 0.001
        return p - m2 * 1e-3 / (sqrt(v2) + 1e-8), m2, v2

    def layer_norm(x, w, b):
        mean = x.mean(axis=1, keepdims=True)
        centered = x - mean
        return centered / sqrt((centered * centered).mean(axis=1, keepdims=True) + 1e-5) * w + b

    def rms_norm(x, w):
        return x / sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * w

    def softmax_cols(x):
        e = exp(x - x.max(axis=0, keepdims=True))
        return e / e.sum(axis=0, keepdims=True)

    def log_softmax(x):
        shifted = x - x.max(axis=1, keepdims=True)
        return shifted - xp.log(exp(shifted).sum(axis=1, keepdims=True))

    return {
        "layernorm": (lambda n: [(n // 1024, 1024), (1024,), (1024,)], layer_norm,
                      lambda n, s: (2 * n + 2048) * s),
        "layernorm4k": (lambda n: [(n // 4096, 4096), (4096,), (4096,)], layer_norm,
                        lambda n, s: (2 * n + 8192) * s),
        "rmsnorm": (lambda n: [(n // 1024, 1024), (1024,)], rms_norm, lambda n, s: (2 * n + 1024) * s),
        "rmsnorm4k": (lambda n: [(n // 4096, 4096), (4096,)], rms_norm, lambda n, s: (2 * n + 4096) * s),
        "log_softmax": (lambda n: [(n // 1024, 1024)], log_softmax, lambda n, s: 2 * n * s),
        "exp_mul": (lambda n: [(n,), (n,)], fuse(lambda z, y: exp(z + 2) * y), lambda n, s: 3 * n * s),
        "gelu": (lambda n: [(n,)], fuse(lambda x: x * 0.5 * (1 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)))),
                 lambda n, s: 2 * n * s),
        "bias_relu": (lambda n: [(n // 1024, 1024), (1024,)], fuse(lambda x, b: relu(x + b) * 0.5),
                      lambda n, s: (2 * n + 1024) * s),
        "softmax": (lambda n: [(n // 1024, 1024)], softmax, lambda n, s: 2 * n * s),
        "softmax_fn": (lambda n: [(n // 1024, 1024)], softmax, lambda n, s: 2 * n * s),
        "softmax_cols": (lambda n: [(1024, n // 1024)], softmax_cols, lambda n, s: 2 * n * s),
        "sum_squares": (lambda n: [(n,)], lambda x: (x * x).sum(), lambda n, s: n * s),
        "chain16": (lambda n: [(n,)], fuse(chain16), lambda n, s: 2 * n * s),
        "adam": (lambda n: [(n,), (n,), (n,), (n,)], adam, lambda n, s: 7 * n * s),
    }


def torch_form(torch, name, fn):
    """A workload as PyTorch users write it: softmax's primitive ops in torch's spelling, and the
    normalizations as a model calls them, through PyTorch's own functions."""
    F = torch.nn.functional
    if name == "softmax":
        def fn(x):
            e = torch.exp(x - x.amax(dim=1, keepdim=True))
            return e / e.sum(dim=1, keepdim=True)
    if name.startswith("layernorm"):
        def fn(x, w, b):
            return F.layer_norm(x, (x.shape[1],), w, b, 1e-5)
    if name.startswith("rmsnorm"):
        def fn(x, w):
            return F.rms_norm(x, (x.shape[1],), w, 1e-6)
    if name == "log_softmax":
        def fn(x):
            return F.log_softmax(x, dim=1)
    if name == "softmax_fn":
        def fn(x):
            return torch.softmax(x, dim=1)
    if name == "softmax_cols":
        def fn(x):
            return torch.softmax(x, dim=0)
    return fn


def measure(call, sets, sync, event_pair, batches, per_batch):
    for i in range(3):
        call(sets[i % len(sets)])
    sync()
    times = []
    for _ in range(batches):
        start, stop, elapsed = event_pair()
        start()
        for i in range(per_batch):
            call(sets[i % len(sets)])
        stop()
        times.append(elapsed() / per_batch)
    return statistics.median(times)


def run_torch(args, compiled):
    import torch
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16}

    class XP:  # the numpy-like names the workloads use
        tanh, exp, sqrt, maximum, log = torch.tanh, torch.exp, torch.sqrt, torch.clamp_min, torch.log

    def event_pair():
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        return (lambda: a.record(), lambda: b.record(), lambda: (b.synchronize(), a.elapsed_time(b) * 1e-3)[1])

    results = []
    for name, (shapes, fn, nbytes) in workloads(XP, "torch").items():
        if args.workloads and name not in args.workloads:
            continue
        fn = torch_form(torch, name, fn)
        call = torch.compile(fn) if compiled else fn
        for dtype in args.dtypes:
            for log2 in args.sizes:
                n = 1 << log2
                b = nbytes(n, 2 if dtype == "bf16" else 4)
                sets = [[torch.rand(s, device="cuda", dtype=dtypes[dtype]) + 0.5 for s in shapes(n)]
                        for _ in range(max(1, min(8, math.ceil(240e6 / b))))]
                f = lambda inputs: call(*inputs)
                per_batch = max(1, min(100, (1 << 26) // n))
                t = measure(f, sets, torch.cuda.synchronize, event_pair, args.batches, per_batch)
                results.append({"workload": name, "dtype": dtype, "n": n,
                                "mode": "torch.compile" if compiled else "torch eager", "us": t * 1e6, "bytes": b})
                print(f"{results[-1]['mode']:14s} {name:12s} {dtype} 2^{log2}: {t * 1e6:9.1f} us", file=sys.stderr)
                if name == "softmax" and not compiled:  # PyTorch eager's own softmax kernel
                    t = measure(lambda inputs: torch.softmax(inputs[0], dim=1), sets, torch.cuda.synchronize,
                                event_pair, args.batches, per_batch)
                    results.append({"workload": name, "dtype": dtype, "n": n, "mode": "torch.softmax",
                                    "us": t * 1e6, "bytes": b})
                    print(f"torch.softmax  {name:12s} {dtype} 2^{log2}: {t * 1e6:9.1f} us", file=sys.stderr)
    return results


def exp_mul_kernel(cp):
    """(z + 2).exp() * y as a cupy.ElementwiseKernel."""
    kernel = cp.ElementwiseKernel("float32 z, float32 y", "float32 out", "out = expf(z + 2.0f) * y", "lf_exp_mul")
    return lambda z, y: kernel(z, y)


def run_cupy(args):
    import cupy as cp
    dtypes = {"f32": cp.float32}  # CuPy has no bfloat16

    def event_pair():
        a, b = cp.cuda.Event(), cp.cuda.Event()
        return (lambda: a.record(), lambda: b.record(),
                lambda: (b.synchronize(), cp.cuda.get_elapsed_time(a, b) * 1e-3)[1])

    results = []
    for name, (shapes, fn, nbytes) in workloads(cp, "cupy", fuse=cp.fuse).items():
        if (args.workloads and name not in args.workloads) or name not in (
                "exp_mul", "gelu", "bias_relu", "chain16"):
            continue  # cupy.fuse covers elementwise workloads only
        for dtype in [d for d in args.dtypes if d in dtypes]:
            for log2 in args.sizes:
                n = 1 << log2
                b = nbytes(n, 4)
                sets = [[(cp.random.rand(*s, dtype=cp.float32) + 0.5) for s in shapes(n)]
                        for _ in range(max(1, min(8, math.ceil(240e6 / b))))]
                per_batch = max(1, min(100, (1 << 26) // n))
                mode, call = "cupy.fuse", fn
                try:
                    t = measure(lambda inputs: call(*inputs), sets, cp.cuda.Device().synchronize, event_pair,
                                args.batches, per_batch)
                except Exception as error:  # cupy.fuse rejects some Python (e.g. abs); skip that one
                    print(f"cupy.fuse      {name:12s}: {error}".splitlines()[0], file=sys.stderr)
                    if name != "exp_mul":
                        break
                    # The seed expression as CuPy's own one-kernel form, labelled as such: what
                    # CuPy offers where cupy.fuse cannot compile.
                    mode, call = "cupy.ElementwiseKernel", exp_mul_kernel(cp)
                    t = measure(lambda inputs: call(*inputs), sets, cp.cuda.Device().synchronize, event_pair,
                                args.batches, per_batch)
                results.append({"workload": name, "dtype": dtype, "n": n, "mode": mode, "us": t * 1e6,
                                "bytes": b})
                print(f"{mode:14s} {name:12s} {dtype} 2^{log2}: {t * 1e6:9.1f} us", file=sys.stderr)
    return results


def run_jax(args):
    import jax
    import jax.numpy as jnp
    import time
    dtypes = {"f32": jnp.float32, "bf16": jnp.bfloat16}
    results = []
    for name, (shapes, fn, nbytes) in workloads(jnp, "jax").items():
        if args.workloads and name not in args.workloads:
            continue
        call = jax.jit(fn)
        for dtype in args.dtypes:
            for log2 in args.sizes:
                n = 1 << log2
                b = nbytes(n, 2 if dtype == "bf16" else 4)
                key = jax.random.PRNGKey(0)
                sets = [[jax.random.uniform(key, s, dtype=dtypes[dtype]) + 0.5 for s in shapes(n)]
                        for _ in range(max(1, min(8, math.ceil(240e6 / b))))]
                per_batch = max(1, min(100, (1 << 26) // n))
                # JAX exposes no CUDA events: wall clock around a batch, blocking at its end.
                last = []

                def event_pair():
                    t = {}
                    return (lambda: t.__setitem__("a", time.perf_counter()),
                            lambda: None,
                            lambda: (jax.block_until_ready(last[-1]) if last else None,
                                     time.perf_counter() - t["a"])[1])

                def f(inputs):
                    last.append(call(*inputs))
                    if len(last) > 2:
                        last.pop(0)
                t = measure(f, sets, lambda: jax.block_until_ready(last[-1]), event_pair, args.batches, per_batch)
                results.append({"workload": name, "dtype": dtype, "n": n, "mode": "jax.jit", "us": t * 1e6,
                                "bytes": b})
                print(f"jax.jit        {name:12s} {dtype} 2^{log2}: {t * 1e6:9.1f} us", file=sys.stderr)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", default="12,16,20,24,26,28")
    parser.add_argument("--dtypes", default="f32,bf16")
    parser.add_argument("--workloads", default="")
    parser.add_argument("--peers", default="torch,torch.compile,cupy,jax")
    parser.add_argument("--batches", type=int, default=7)
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.dtypes = args.dtypes.split(",")
    args.workloads = [w for w in args.workloads.split(",") if w]
    os.makedirs(args.out, exist_ok=True)
    runners = {"torch": lambda: run_torch(args, False), "torch.compile": lambda: run_torch(args, True),
               "cupy": lambda: run_cupy(args), "jax": lambda: run_jax(args)}
    for peer in args.peers.split(","):
        try:
            results = runners[peer]()
        except Exception as error:  # a missing or failing peer is reported, the rest still run
            print(f"{peer}: {error}", file=sys.stderr)
            continue
        with open(os.path.join(args.out, f"{peer}.json"), "w") as f:
            json.dump({"tool": peer, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "results": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
