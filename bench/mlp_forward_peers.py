#!/usr/bin/env python3
"""The MLP forward of lazyfuse_host_bench's BM_MlpForward in the peers: LAYERS x (Linear WIDTH +
ReLU) on a [BATCH, WIDTH] input, float32, without gradients, each pass synchronized, timed as
BM_MlpForward times it (wall time of a pass and its synchronization, after warm-up) in PyTorch
eager, torch.compile and torch.compile(mode="reduce-overhead") (CUDA graphs). Prints one JSON
line per peer and shape. Runs on the GPU machine only; none of these packages is a dependency
of lazyfuse.

usage: bench/mlp_forward_peers.py [--shapes 8x512x64,4x256x64,16x1024x32] [--passes 2000]
                                  [--warmup 50] [--peers eager,compile,reduce-overhead]
"""
import argparse
import json
import statistics
import time


def run(layers, width, batch, mode, passes, warmup):
    import torch
    torch.manual_seed(0)
    modules = []
    for _ in range(layers):
        modules += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*modules).to("cuda")
    x = torch.randn(batch, width, device="cuda")

    def forward(x):
        with torch.no_grad():
            return model(x)

    if mode == "compile":
        forward = torch.compile(forward)
    elif mode == "reduce-overhead":
        forward = torch.compile(forward, mode="reduce-overhead")
    for _ in range(warmup):
        forward(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(passes):
        start = time.perf_counter()
        forward(x)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times), statistics.fmean(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="8x512x64,4x256x64,16x1024x32",
                        help="LAYERSxWIDTHxBATCH, comma-separated")
    parser.add_argument("--passes", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--peers", default="eager,compile,reduce-overhead")
    args = parser.parse_args()
    for shape in args.shapes.split(","):
        layers, width, batch = (int(part) for part in shape.split("x"))
        for peer in args.peers.split(","):
            result = {"peer": "pytorch " + peer, "layers": layers, "width": width,
                      "batch": batch}
            try:
                median, mean = run(layers, width, batch, peer, args.passes, args.warmup)
                result.update(us_per_pass_median=round(median, 1), us_per_pass_mean=round(mean, 1))
            except Exception as error:  # a peer that cannot run here is reported, not fatal
                result["error"] = f"{type(error).__name__}: {error}"[:300]
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
