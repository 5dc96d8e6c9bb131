// What every input of the pipeline fuzzer must satisfy, shared by the libFuzzer target
// (ir_pipeline_fuzzer.cc) and the test that replays its corpus (tests/ir_corpus_test.cc).
#pragma once

#include <string>
#include <string_view>

namespace lazyfuse::fuzz {

// What `lazyfuse opt` and `lazyfuse codegen` do with `text`, past the parser: a graph that
// parses and verifies goes through the pass pipeline (verified between passes in the fuzzer's
// build), then every step with generated code through the CUDA source generator and the CPU
// block program's compiler. Any stage may reject the graph only with a lazyfuse::Error: a
// crash, a sanitizer's report or another exception is a finding (and propagates). Returns
// what went wrong besides those, or "" when nothing did.
std::string check_ir_pipeline(std::string_view text);

}  // namespace lazyfuse::fuzz
