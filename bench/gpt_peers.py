#!/usr/bin/env python3
"""The training step of lazyfuse_gpt_step (bench/gpt_step.cc) in PyTorch eager and torch.compile:
nanoGPT's model with attention written by hand as lazyfuse's is (no flash attention), the same
weights and token batches from the same closed-form formulas, AdamW in nanoGPT's two groups,
timed as lazyfuse_gpt_step times it (the wall time of each step, the loss read back every step,
the median after warm-up). Prints one JSON line per peer, with the first three losses, which
must agree with lazyfuse's. PyTorch comes from the CPU peers' virtual environment
(scripts/cpu-bench.sh makes it) or the GPU machine; it is not a dependency of lazyfuse.

usage: bench/gpt_peers.py [--device cpu] [--layers 2] [--width 128] [--heads 4] [--seq 64]
                          [--batch 4] [--vocab 65] [--steps 20] [--warmup 5]
                          [--peers eager,compile] [--threads N]
"""
import argparse
import json
import math
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F


def draw(tensor_id, shape, scale):
    i = np.arange(int(np.prod(shape)), dtype=np.float64)
    x = np.sin(i * 12.9898 + tensor_id * 78.233) * 43758.5453
    return torch.tensor(((2 * (x - np.floor(x)) - 1) * scale).reshape(shape), dtype=torch.float32)


def tokens(args, step, shift):
    i = np.arange(args.batch * args.seq, dtype=np.int64)
    return torch.tensor(((i + shift) * 7919 + step * 104729) % args.vocab).reshape(args.batch, args.seq)


def make_params(args):
    C, L = args.width, args.layers
    s, proj = 0.02, 0.02 / math.sqrt(2 * L)
    next_id = [0]

    def d(shape, scale):
        t = draw(next_id[0], shape, scale)
        next_id[0] += 1
        return t

    def ln(value):
        next_id[0] += 1
        return torch.full((C,), float(value))

    p = {"wte": d((args.vocab, C), s), "wpe": d((args.seq, C), s)}
    for l in range(L):
        p[f"{l}.ln1_w"], p[f"{l}.ln1_b"] = ln(1), ln(0)
        p[f"{l}.attn_w"], p[f"{l}.attn_b"] = d((3 * C, C), s), d((3 * C,), s)
        p[f"{l}.attn_proj_w"], p[f"{l}.attn_proj_b"] = d((C, C), proj), d((C,), s)
        p[f"{l}.ln2_w"], p[f"{l}.ln2_b"] = ln(1), ln(0)
        p[f"{l}.fc_w"], p[f"{l}.fc_b"] = d((4 * C, C), s), d((4 * C,), s)
        p[f"{l}.mlp_proj_w"], p[f"{l}.mlp_proj_b"] = d((C, 4 * C), proj), d((C,), s)
    p["lnf_w"], p["lnf_b"] = ln(1), ln(0)
    return {k: v.to(args.device).requires_grad_() for k, v in p.items()}


def loss_of(args, p, idx, targets, future):
    B, T, C, H = args.batch, args.seq, args.width, args.heads
    x = F.embedding(idx, p["wte"]) + p["wpe"]
    for l in range(args.layers):
        h = F.layer_norm(x, (C,), p[f"{l}.ln1_w"], p[f"{l}.ln1_b"])
        q, k, v = F.linear(h, p[f"{l}.attn_w"], p[f"{l}.attn_b"]).split(C, dim=2)
        q = q.reshape(B, T, H, C // H).transpose(1, 2)
        k = k.reshape(B, T, H, C // H).transpose(1, 2)
        v = v.reshape(B, T, H, C // H).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
        att = F.softmax(att.masked_fill(future, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().reshape(B, T, C)
        x = x + F.linear(y, p[f"{l}.attn_proj_w"], p[f"{l}.attn_proj_b"])
        h = F.layer_norm(x, (C,), p[f"{l}.ln2_w"], p[f"{l}.ln2_b"])
        h = F.gelu(F.linear(h, p[f"{l}.fc_w"], p[f"{l}.fc_b"]), approximate="tanh")
        x = x + F.linear(h, p[f"{l}.mlp_proj_w"], p[f"{l}.mlp_proj_b"])
    logits = F.linear(F.layer_norm(x, (C,), p["lnf_w"], p["lnf_b"]), p["wte"])
    return F.cross_entropy(logits.reshape(-1, args.vocab), targets.reshape(-1))


def run(args, mode):
    p = make_params(args)
    decayed = [v for k, v in p.items() if v.dim() >= 2]
    plain = [v for k, v in p.items() if v.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": 0.1},
                                   {"params": plain, "weight_decay": 0.0}],
                                  lr=6e-4, betas=(0.9, 0.95))
    positions = torch.arange(args.seq, device=args.device)
    future = positions.reshape(1, -1) > positions.reshape(-1, 1)

    def train(idx, targets):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(args, p, idx, targets, future)
        loss.backward()
        optimizer.step()
        return loss

    if mode == "compile":
        train = torch.compile(train)
    times, losses = [], []
    for s in range(args.warmup + args.steps):
        idx = tokens(args, s, 0).to(args.device)
        targets = tokens(args, s, 1).to(args.device)
        start = time.perf_counter()
        value = train(idx, targets).item()
        ms = (time.perf_counter() - start) * 1e3
        if len(losses) < 3:
            losses.append(value)
        if s >= args.warmup:
            times.append(ms)
    return {"impl": "pytorch " + mode, "device": args.device, "layers": args.layers,
            "width": args.width, "seq": args.seq, "batch": args.batch,
            "ms_per_step_median": round(statistics.median(times), 3),
            "ms_per_step_mean": round(statistics.fmean(times), 3),
            "losses": [round(x, 7) for x in losses], "torch": torch.__version__,
            "threads": torch.get_num_threads()}


def main():
    parser = argparse.ArgumentParser()
    for name, default in [("layers", 2), ("width", 128), ("heads", 4), ("seq", 64), ("batch", 4),
                          ("vocab", 65), ("steps", 20), ("warmup", 5), ("threads", 0)]:
        parser.add_argument("--" + name, type=int, default=default)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--peers", default="eager,compile")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for mode in args.peers.split(","):
        print(json.dumps(run(args, mode)), flush=True)


if __name__ == "__main__":
    main()
