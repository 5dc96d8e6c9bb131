#!/usr/bin/env python3
# Writes the safetensors files that PyTorch wrote, which the test suite loads
# (tests/serialize_test.cc, suite SafetensorsFromPyTorch): tests/fixtures/safetensors/*.
#
# Usage: scripts/make-safetensors-fixtures.py [--venv DIR]
#        scripts/make-safetensors-fixtures.py --check DIR [--venv DIR]
#
# Run with the system python3, it makes a virtual environment (default build-fixtures/venv,
# ignored by git), installs torch and safetensors into it from pip, and runs itself again inside
# it to write the files. Torch comes from PyTorch's CPU wheel index when that is reachable, from
# PyPI otherwise. Without torch the script stops: the point of the fixtures is that PyTorch's
# own writer made them (safetensors.torch.save_file), and numpy cannot make bfloat16.
#
# --check DIR is the other direction: PyTorch reading what lazyfuse wrote. Write the files with
#   LAZYFUSE_SAFETENSORS_EXPORT_DIR=DIR build/bin/lazyfuse_tests \
#       --gtest_filter=SafetensorsForPyTorch.*
# and this loads them with safetensors.torch.load_file, compares every value bit for bit with
# the test's, and checks that safetensors writes the loaded tensors back to the same bytes.
#
# The values are simple formulas (aranges scaled by exact or correctly rounded steps) so that
# the C++ test computes them again on its own and compares every byte. Keep them in step with
# the test when changing anything here.
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "safetensors")


def make_venv(venv):
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        subprocess.check_call([sys.executable, "-m", "venv", venv])
    # Already set up: nothing to fetch (and no network needed).
    if subprocess.call([python, "-c", "import torch, safetensors, numpy"],
                       stderr=subprocess.DEVNULL) == 0:
        return python
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    # The CPU wheel is a tenth of the size of PyPI's CUDA build; PyPI is the fallback.
    attempts = [
        pip + ["torch", "--index-url", "https://download.pytorch.org/whl/cpu", "--retries", "1"],
        pip + ["torch"],
    ]
    for command in attempts:
        if subprocess.call(command) == 0:
            break
    else:
        sys.exit("could not install torch from pip; the fixtures need PyTorch's writer")
    subprocess.check_call(pip + ["safetensors", "numpy"])
    return python


def write_fixtures():
    import safetensors
    import torch
    from safetensors.torch import save_file

    os.makedirs(OUT_DIR, exist_ok=True)
    i = lambda n, dtype: torch.arange(n, dtype=dtype)  # noqa: E731

    # One tensor per dtype lazyfuse has, a 0-d and an empty one. The test's formulas:
    #   bool[2,3]  (k % 3 == 0)              i32[3,4]  (k - 6) * 300000007
    #   i64[6]     (k - 3) * 2^61 + (k - 3)   f16[8]    (k - 4) * 0.375      (exact)
    #   bf16[8]    (k - 4) * 0.5 (exact)      f32[2,2,3] k / 3 (float32 division)
    #   f64[5]     k / 7 (float64 division)   scalar    2.5, 0-d float32
    #   empty[0,3] float32                    specials  [nan, inf, -inf, -0.0, 1e-45] float32
    dtypes = {
        "bool": (i(6, torch.int64) % 3 == 0).reshape(2, 3),
        "i32": (i(12, torch.int32) - 6) * 300000007,
        "i64": (i(6, torch.int64) - 3) * 2**61 + (i(6, torch.int64) - 3),
        "f16": (i(8, torch.float16) - 4) * 0.375,
        "bf16": (i(8, torch.bfloat16) - 4) * 0.5,
        "f32": (i(12, torch.float32) / 3).reshape(2, 2, 3),
        "f64": i(5, torch.float64) / 7,
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "specials": torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 1e-45]),
    }
    dtypes["i32"] = dtypes["i32"].reshape(3, 4)
    save_file(dtypes, os.path.join(OUT_DIR, "dtypes.safetensors"))

    # nn.Linear(2, 3)'s state dict with set values, and the metadata transformers writes.
    linear = {
        "weight": (i(6, torch.float32) / 10 - 0.25).reshape(3, 2),
        "bias": i(3, torch.float32) - 1,
    }
    save_file(linear, os.path.join(OUT_DIR, "linear.safetensors"), metadata={"format": "pt"})

    # A dtype lazyfuse does not have, for the typed error.
    save_file({"pixels": i(4, torch.uint8)}, os.path.join(OUT_DIR, "uint8.safetensors"))

    with open(os.path.join(OUT_DIR, "README"), "w") as f:
        f.write(
            "Written by scripts/make-safetensors-fixtures.py with torch %s and safetensors %s\n"
            "(safetensors.torch.save_file); tests/serialize_test.cc checks them.\n"
            % (torch.__version__, safetensors.__version__)
        )
    for name in sorted(os.listdir(OUT_DIR)):
        print("%6d  %s" % (os.path.getsize(os.path.join(OUT_DIR, name)), name))


def check_lazyfuse_files(directory):
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save

    def bits(t, as_dtype):
        return t.contiguous().view(as_dtype).flatten().tolist()

    def unsigned(values, width):
        return [v & ((1 << width) - 1) for v in values]

    failures = []

    def expect(what, got, want):
        if got != want:
            failures.append("%s: got %r, want %r" % (what, got, want))

    # tests/serialize_test.cc, every_dtype().
    path = os.path.join(directory, "every_dtype.safetensors")
    t = load_file(path)
    expect("bool", t["bool"].tolist(), [[True, False, True], [True, False, False]])
    expect("i32", t["i32"].tolist(), [-(2**31), -1, 0, 1, 2**31 - 1])
    expect("i64", t["i64"].flatten().tolist(),
           [2**62 + 1, 2**62 - 1, -(2**62) - 3, -(2**63), 2**63 - 1, 9007199254740993])
    expect("i64 shape", list(t["i64"].shape), [2, 3])
    expect("f16", unsigned(bits(t["f16"], torch.int16), 16),
           [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E01, 0x0001, 0x3C00, 0x7BFF])
    expect("bf16", unsigned(bits(t["bf16"], torch.int16), 16),
           [0x8000, 0x7F80, 0xFF80, 0x7FC1, 0xFFA0, 0x0001, 0x3F80, 0x7F7F])
    expect("f32", unsigned(bits(t["f32"], torch.int32), 32),
           [0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFC00000, 0x00000001, 0x3F800000])
    expect("f64", unsigned(bits(t["f64"], torch.int64), 64),
           [0x8000000000000000, 0x7FF0000000000000, 0x7FF8000000000123, 1, 0x3FB999999999999A])
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    expect("metadata", metadata, {"writer": "lazyfuse"})
    with open(path, "rb") as f:
        expect("every_dtype bytes written again by safetensors", save(t, metadata), f.read())

    path = os.path.join(directory, "views.safetensors")
    t = load_file(path)
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    expect("transposed", t["transposed"].tolist(), base.t().tolist())
    expect("narrowed", t["narrowed"].tolist(), base.narrow(1, 1, 2).tolist())
    expect("expanded", t["expanded"].tolist(), torch.arange(3).unsqueeze(1).expand(3, 4).tolist())
    expect("scalar", (t["scalar"].dim(), t["scalar"].item()), (0, 7.5))
    expect("empty", (list(t["empty"].shape), t["empty"].dtype), ([2, 0], torch.bfloat16))
    with open(path, "rb") as f:
        expect("views bytes written again by safetensors", save(t), f.read())

    for failure in failures:
        print("FAIL", failure)
    if failures:
        sys.exit(1)
    print("PyTorch %s read lazyfuse's files in %s: every value as written" % (torch.__version__,
                                                                             directory))


def main():
    parser = argparse.ArgumentParser(description="Writes tests/fixtures/safetensors with PyTorch.")
    parser.add_argument("--venv", default=os.path.join(ROOT, "build-fixtures", "venv"))
    parser.add_argument("--check", metavar="DIR",
                        help="check lazyfuse's files in DIR with PyTorch instead")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        if args.check:
            check_lazyfuse_files(args.check)
        else:
            write_fixtures()
        return
    python = make_venv(args.venv)
    command = [python, os.path.abspath(__file__), "--inside"]
    if args.check:
        command += ["--check", os.path.abspath(args.check)]
    subprocess.check_call(command)


if __name__ == "__main__":
    main()
