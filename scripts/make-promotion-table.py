#!/usr/bin/env python3
"""Writes PyTorch's type promotion table for the test of lazyfuse's (tests/api_test.cc):
torch.result_type of two tensors of every pair of lazyfuse's dtypes, each with dims or 0-d, and
of a tensor with a Python bool, int and float. Run with a Python that has torch (the CPU peers'
virtual environment of scripts/cpu-bench.sh has it):

  ~/.cache/lazyfuse/cpu-peers/bin/python scripts/make-promotion-table.py \
      > tests/fixtures/promotion/result_type.txt

Each line: DTYPE_A RANK_A DTYPE_B RANK_B RESULT, or DTYPE_A RANK_A scalar:KIND RESULT.
"""
import torch

DTYPES = ["bool", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def operand(name, rank):
    dtype = getattr(torch, name)
    return torch.zeros((2,) * rank, dtype=dtype)


print(f"# torch.result_type, torch {torch.__version__}")
for a in DTYPES:
    for rank_a in (1, 0):
        for b in DTYPES:
            for rank_b in (1, 0):
                result = torch.result_type(operand(a, rank_a), operand(b, rank_b))
                print(a, rank_a, b, rank_b, str(result).removeprefix("torch."))
        for kind, value in (("bool", True), ("int", 2), ("float", 2.5)):
            result = torch.result_type(operand(a, rank_a), value)
            print(a, rank_a, f"scalar:{kind}", str(result).removeprefix("torch."))
