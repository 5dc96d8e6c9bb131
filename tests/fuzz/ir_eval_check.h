// What every input of the evaluation fuzzer must satisfy, shared by the libFuzzer target
// (ir_eval_fuzzer.cc) and the test that replays its corpus (tests/ir_corpus_test.cc).
#pragma once

#include <string>
#include <string_view>

namespace lazyfuse::fuzz {

// Bounds on the graphs evaluated, so that each input runs in milliseconds.
inline constexpr int kEvalMaxNodes = 64;
// Per value: enough for more than one CPU task (16 Ki elements) and reduction block (32 Ki).
inline constexpr long long kEvalMaxElements = 1 << 16;

// What `lazyfuse run --check-unfused` does with `text`: a graph that parses and verifies, lies
// wholly on the CPU and is within the bounds above is evaluated on seeded random inputs fused
// and unfused, through the runtime and the frontend, and the two must agree bit for bit.
// Evaluation may reject the graph only with a lazyfuse::Error: a crash, a sanitizer's report
// or another exception is a finding (and propagates). Returns what went wrong besides those,
// or "" when nothing did.
std::string check_ir_evaluation(std::string_view text);

}  // namespace lazyfuse::fuzz
