#!/usr/bin/env python3
"""The attention workloads of lazyfuse_attention_bench in PyTorch and JAX, timed the same way:
one JSON line per case with the median milliseconds, TFLOP/s as FlashAttention counts them
(forward 4 B H T S d, halved under a causal mask; forward+backward 3.5 times that) and the peak
memory. PyTorch's F.scaled_dot_product_attention with its default backend choice and with the
flash and cuDNN backends named, the same attention written by hand in eager and under
torch.compile; JAX's jax.nn.dot_product_attention where JAX is installed. Runs on the GPU machine
only; none of these packages is a dependency of lazyfuse.

usage: bench/attention_peers.py [--shapes gpt2,long,padded] [--dtypes bfloat16,float16]
                                [--iters 20] [--warmup 3] > peers.jsonl
"""
import argparse
import json
import math
import sys
import time

SHAPES = {
    # name: (B, H, T, d, causal, padded)
    "gpt2": (8, 12, 1024, 64, True, False),
    "long": (2, 16, 8192, 128, True, False),
    "padded": (8, 12, 1024, 64, False, True),
}


def flops(b, h, t, d, causal, backward):
    forward = 4.0 * b * h * t * t * d / (2 if causal else 1)
    return forward * (3.5 if backward else 1.0)


def torch_cases(args):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def by_hand(q, k, v, seen, causal):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            t = q.shape[-2]
            future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        if seen is not None:
            scores = scores.masked_fill(~seen, float("-inf"))
        return torch.softmax(scores, -1) @ v

    compiled = torch.compile(by_hand)
    for shape in args.shapes:
        b, h, t, d, causal, padded = SHAPES[shape]
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            torch.manual_seed(0)
            q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=dtype) for _ in range(3))
            g = torch.randn_like(q)
            seen = None
            if padded:
                seen = (torch.arange(t, device="cuda") < t - t // 8).view(1, 1, 1, t).expand(b, 1, 1, t)

            def sdpa(backend):
                def run(q, k, v):
                    if backend is None:
                        return F.scaled_dot_product_attention(q, k, v, attn_mask=seen, is_causal=causal)
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v, attn_mask=seen, is_causal=causal)
                return run

            forms = {
                "torch_sdpa": sdpa(None),
                "torch_sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
                "torch_sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
                "torch_hand_eager": lambda q, k, v: by_hand(q, k, v, seen, causal),
                "torch_hand_compile": lambda q, k, v: compiled(q, k, v, seen, causal),
            }
            # The long shape's scores do not fit by hand (8 GB a head group in float32).
            if shape == "long":
                forms.pop("torch_hand_eager")
                forms.pop("torch_hand_compile")
            for form, fn in forms.items():
                for backward in (False, True):
                    def once():
                        if backward:
                            qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
                            out = fn(qq, kk, vv)
                            out.backward(g)
                        else:
                            with torch.no_grad():
                                fn(q, k, v)
                    try:
                        for _ in range(args.warmup):
                            once()
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats()
                        ms = []
                        for _ in range(args.iters):
                            start = time.perf_counter()
                            once()
                            torch.cuda.synchronize()
                            ms.append((time.perf_counter() - start) * 1e3)
                        ms.sort()
                        median = ms[len(ms) // 2]
                        yield {"workload": "attention", "shape": shape, "b": b, "h": h, "t": t,
                               "d": d, "causal": causal, "padded": padded,
                               "dtype": f"torch.{dtype_name}", "device": "cuda:0", "form": form,
                               "pass": "forward+backward" if backward else "forward",
                               "ms_median": median,
                               "tflops": flops(b, h, t, d, causal, backward) / (median * 1e-3) / 1e12,
                               "peak_bytes": torch.cuda.max_memory_allocated()}
                    except Exception as e:  # a backend that does not take the case
                        yield {"workload": "attention", "shape": shape, "form": form,
                               "dtype": f"torch.{dtype_name}",
                               "pass": "forward+backward" if backward else "forward",
                               "error": str(e).splitlines()[0][:200]}


def jax_cases(args):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return
    for shape in args.shapes:
        b, h, t, d, causal, padded = SHAPES[shape]
        for dtype_name in args.dtypes:
            dtype = getattr(jnp, dtype_name)
            key = jax.random.PRNGKey(0)
            # jax.nn.dot_product_attention takes [B, T, H, d].
            q, k, v = (jax.random.normal(jax.random.fold_in(key, i), (b, t, h, d), dtype)
                       for i in range(3))
            mask = None
            if padded:
                mask = (jnp.arange(t) < t - t // 8).reshape(1, 1, 1, t)
            forward = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(
                q, k, v, mask=mask, is_causal=causal))
            grads = jax.jit(jax.grad(lambda q, k, v: jax.nn.dot_product_attention(
                q, k, v, mask=mask, is_causal=causal).astype(jnp.float32).sum(), argnums=(0, 1, 2)))
            for backward, fn in ((False, forward), (True, grads)):
                try:
                    for _ in range(args.warmup):
                        jax.block_until_ready(fn(q, k, v))
                    ms = []
                    for _ in range(args.iters):
                        start = time.perf_counter()
                        jax.block_until_ready(fn(q, k, v))
                        ms.append((time.perf_counter() - start) * 1e3)
                    ms.sort()
                    median = ms[len(ms) // 2]
                    yield {"workload": "attention", "shape": shape, "b": b, "h": h, "t": t, "d": d,
                           "causal": causal, "padded": padded, "dtype": f"jax.{dtype_name}",
                           "device": "cuda:0", "form": "jax_dot_product_attention",
                           "pass": "forward+backward" if backward else "forward",
                           "ms_median": median,
                           "tflops": flops(b, h, t, d, causal, backward) / (median * 1e-3) / 1e12}
                except Exception as e:
                    yield {"workload": "attention", "shape": shape, "form": "jax_dot_product_attention",
                           "error": str(e).splitlines()[0][:200]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="gpt2,long,padded")
    parser.add_argument("--dtypes", default="bfloat16,float16")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    args.shapes = args.shapes.split(",")
    args.dtypes = args.dtypes.split(",")
    for source in (torch_cases, jax_cases):
        try:
            for row in source(args):
                print(json.dumps(row), flush=True)
        except ImportError as e:
            print(json.dumps({"workload": "attention", "error": str(e)}), file=sys.stderr)


if __name__ == "__main__":
    main()
