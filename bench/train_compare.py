#!/usr/bin/env python3
"""Trains in PyTorch the model that `lazyfuse_train_bench --dump=DIR` trained, from the same
initial parameters and the same batches (DIR/init.safetensors and DIR/data.safetensors, read
here with the format's own 20 lines rather than a package), with torch.optim.Adam at the same
learning rate, and compares the loss after every step with DIR/lazyfuse_losses.json.

Prints a Markdown summary and exits non-zero when a step's losses differ by more than the
tolerance for the dtype. Runs wherever torch is installed (the GPU machine); torch is never a
dependency of lazyfuse.

--blas chooses PyTorch's GPU matmul library (torch.backends.cuda.preferred_blas_library), to
compare with lazyfuse run with the same LAZYFUSE_BLAS.

usage: bench/train_compare.py DIR [--device cuda:0] [--lr 0.001] [--tolerance 1e-4]
                              [--blas cublas|cublaslt]
"""
import argparse
import json
import struct
import sys

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "BOOL": torch.bool}


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    base = 8 + length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = bytearray(data[base + begin:base + end])
        dtype = DTYPES[entry["dtype"]]
        tensors[name] = (torch.frombuffer(raw, dtype=dtype) if raw else
                         torch.empty(0, dtype=dtype)).reshape(entry["shape"])
    return tensors


def model_from(state):
    """torch.nn.Sequential with Linear layers where the state has them and ReLU between."""
    layers = sorted({int(name.split(".")[0]) for name in state})
    modules = []
    for position in range(layers[-1] + 1):
        if position in layers:
            weight = state[f"{position}.weight"]
            modules.append(torch.nn.Linear(weight.shape[1], weight.shape[0],
                                           bias=f"{position}.bias" in state))
        else:
            modules.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*modules)
    model.load_state_dict(state)
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--tolerance", type=float, default=None,
                        help="largest relative difference of a step's loss (default by dtype)")
    parser.add_argument("--blas", choices=["cublas", "cublaslt"], default=None,
                        help="PyTorch's preferred BLAS library on the GPU (default: PyTorch's)")
    args = parser.parse_args()
    if args.blas:
        torch.backends.cuda.preferred_blas_library(args.blas)

    state = load_safetensors(f"{args.dir}/init.safetensors")
    data = load_safetensors(f"{args.dir}/data.safetensors")
    with open(f"{args.dir}/lazyfuse_losses.json") as f:
        theirs = json.load(f)
    dtype = next(iter(state.values())).dtype
    model = model_from(state).to(args.device, dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    x, y = data["x"].to(args.device), data["y"].to(args.device)
    ours = []
    for step in range(len(theirs)):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[step]), y[step])
        loss.backward()
        optimizer.step()
        ours.append(loss.item())

    tolerance = args.tolerance or {torch.float64: 1e-10, torch.float32: 1e-4}.get(dtype, 2e-2)
    relative = [abs(a - b) / max(abs(b), 1e-30) for a, b in zip(theirs, ours)]
    worst = max(range(len(relative)), key=relative.__getitem__)
    blas = torch.backends.cuda.preferred_blas_library() if "cuda" in args.device else "cpu"
    print(f"PyTorch's BLAS: {blas}")
    print(f"| dtype | steps | first loss (lazyfuse / PyTorch) | last loss (lazyfuse / PyTorch) "
          f"| largest relative difference (step) | tolerance |")
    print("|---|---|---|---|---|---|")
    print(f"| {str(dtype).replace('torch.', '')} | {len(ours)} | {theirs[0]:.9g} / {ours[0]:.9g} "
          f"| {theirs[-1]:.9g} / {ours[-1]:.9g} | {relative[worst]:.3g} ({worst + 1}) "
          f"| {tolerance:g} |")
    sys.exit(0 if relative[worst] <= tolerance else 1)


if __name__ == "__main__":
    main()
