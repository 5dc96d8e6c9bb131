#!/usr/bin/env python3
"""The training step of lazyfuse_train_bench in the peers: PyTorch eager, torch.compile,
torch.compile(mode="reduce-overhead") and JAX jit (jax.value_and_grad and a hand-written Adam),
timed as lazyfuse_train_bench times it: the wall time of each step, the loss read back on the
host every step, the median after warm-up. For PyTorch eager on the GPU it also counts the
kernels a step launches (torch.profiler). Prints one JSON line per peer, in
lazyfuse_train_bench's keys. Runs on the GPU machine, or with --device cpu on the CPU (PyTorch
from the CPU peers' virtual environment, scripts/cpu-train-bench.sh); none of these packages is
a dependency of lazyfuse.

usage: bench/train_peers.py [--device cuda|cpu] [--batch 32] [--width 1024] [--layers 4]
                            [--classes 10] [--dtype float32|bfloat16] [--steps 100]
                            [--warmup 20] [--peers eager,compile,reduce-overhead,jax]
"""
import argparse
import json
import statistics
import time


def timed(step, steps, warmup):
    for s in range(warmup):
        step(s)
    times = []
    for s in range(steps):
        start = time.perf_counter()
        step(s)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times), statistics.fmean(times)


def torch_peer(args, mode):
    import torch
    dtype = getattr(torch, args.dtype)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, args.classes))
    model = model.to(args.device, dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    xs = torch.randn(8, args.batch, args.width, device=args.device, dtype=dtype)
    ys = torch.randint(0, args.classes, (8, args.batch), device=args.device)

    def train(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    if mode == "compile":
        train = torch.compile(train)
    elif mode == "reduce-overhead":
        train = torch.compile(train, mode="reduce-overhead")

    def step(s):
        return train(xs[s % 8], ys[s % 8]).item()

    median, mean = timed(step, args.steps, args.warmup)
    result = {"peer": "pytorch " + mode, "us_per_step_median": round(median, 1),
              "us_per_step_mean": round(mean, 1)}
    if mode == "eager" and args.device == "cuda":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for s in range(10):
                step(s)
            torch.cuda.synchronize()
        kernels = sum(1 for e in prof.events() if e.device_type.name == "CUDA"
                      and "memcpy" not in e.name.lower() and "memset" not in e.name.lower())
        result["kernels_per_step"] = kernels / 10
    return result


def jax_peer(args):
    import jax
    import jax.numpy as jnp
    dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[args.dtype]
    key = jax.random.PRNGKey(0)
    sizes = [args.width] * (args.layers + 1) + [args.classes]
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        key, kw, kb = jax.random.split(key, 3)
        bound = 1 / fan_in ** 0.5
        params.append((jax.random.uniform(kw, (fan_out, fan_in), dtype, -bound, bound),
                       jax.random.uniform(kb, (fan_out,), dtype, -bound, bound)))

    def loss_fn(params, x, y):
        for w, b in params[:-1]:
            x = jax.nn.relu(x @ w.T + b)
        w, b = params[-1]
        logits = x @ w.T + b
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    @jax.jit
    def train(params, m, v, t, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        t = t + 1
        b1, b2, lr, eps = 0.9, 0.999, 1e-3, 1e-8
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        step_size = lr / (1 - b1 ** t)
        scale = 1 / jnp.sqrt(1 - b2 ** t)
        params = jax.tree_util.tree_map(
            lambda p, m, v: (p - step_size * m / (jnp.sqrt(v) * scale + eps)).astype(p.dtype),
            params, m, v)
        return params, m, v, t, loss

    m = jax.tree_util.tree_map(jnp.zeros_like, params)
    v = jax.tree_util.tree_map(jnp.zeros_like, params)
    state = [params, m, v, jnp.float32(0)]
    key, kx, ky = jax.random.split(key, 3)
    xs = jax.random.normal(kx, (8, args.batch, args.width), dtype)
    ys = jax.random.randint(ky, (8, args.batch), 0, args.classes)

    def step(s):
        *state[:], loss = train(*state, xs[s % 8], ys[s % 8])
        return float(loss)

    median, mean = timed(step, args.steps, args.warmup)
    return {"peer": "jax jit", "us_per_step_median": round(median, 1),
            "us_per_step_mean": round(mean, 1)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--peers", default="eager,compile,reduce-overhead,jax")
    args = parser.parse_args()
    for peer in args.peers.split(","):
        try:
            result = jax_peer(args) if peer == "jax" else torch_peer(args, peer)
        except Exception as error:  # a peer that cannot run here is reported, not fatal
            result = {"peer": peer, "error": f"{type(error).__name__}: {error}"[:300]}
        result.update(device=args.device, dtype=args.dtype, batch=args.batch, width=args.width,
                      layers=args.layers)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
