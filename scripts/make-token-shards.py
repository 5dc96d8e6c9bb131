#!/usr/bin/env python3
# Writes the token shards the test suite reads (tests/data_test.cc): tests/fixtures/tokens/*.bin,
# laid out as llm.c's dev/data/data_common.py write_datafile lays them out — a header of 256
# little-endian int32 (magic, version, token count), then the tokens: magic 20240520 and
# version 1 with uint16 tokens (GPT-2's), magic 20240801 and version 7 with uint32 (Llama 3's).
#
# Usage: scripts/make-token-shards.py
#
# Token i of shard s is (s * 1000003 + i * 7919) % vocab, a formula the C++ test computes again
# on its own. Keep the two in step when changing anything here.
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "tokens")

# name: (shard index s, magic, version, tokens, vocab)
SHARDS = {
    "gpt2_train_000.bin": (0, 20240520, 1, 1000, 50257),
    "gpt2_train_001.bin": (1, 20240520, 1, 517, 50257),
    "llama_train_000.bin": (2, 20240801, 7, 300, 128256),
}


def token(s, i, vocab):
    return (s * 1000003 + i * 7919) % vocab


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    for name, (s, magic, version, count, vocab) in SHARDS.items():
        header = [0] * 256
        header[0], header[1], header[2] = magic, version, count
        form = "<%d%s" % (count, "H" if version == 1 else "I")
        with open(os.path.join(OUT_DIR, name), "wb") as f:
            f.write(struct.pack("<256i", *header))
            f.write(struct.pack(form, *(token(s, i, vocab) for i in range(count))))
        print("wrote", name)


if __name__ == "__main__":
    main()
