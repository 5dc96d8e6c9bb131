// Evaluating an IR graph on seeded random inputs, and checking its results against a reference:
// the graph in float64 on the CPU (`lazyfuse run --check`), the same graph unfused on its own
// devices (`--check-unfused`), or unfused on the CPU (`--check-cpu`). `lazyfuse fuzz` tests
// every random graph through check_graph with these references, and prints with each failure
// the `lazyfuse run` command that replays it from the printed IR and seed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lazyfuse/frontend/tensor.h"
#include "lazyfuse/ir/graph.h"

namespace lazyfuse::tools {

// One tensor per node: for a param, an input drawn after manual_seed(seed) in param order
// (floats in [0.5, 1.5), so log and sqrt stay finite; integers in [0, 10); bools half true),
// already computed, so that it enters the graph as a param and nothing else fuses with the
// graph; an undefined tensor for every other node.
std::vector<Tensor> random_inputs(const Graph& graph, uint64_t seed);

// Builds the pending values of `graph` over `inputs` and evaluates its outputs.
std::vector<Tensor> evaluate_graph(const Graph& graph, const std::vector<Tensor>& inputs,
                                   const EvalOptions& options = {});

enum class Reference {
  Float64,  // every floating value in float64, on the CPU; per-dtype tolerance, widened by each
            // result's conditioning (Note [Conditioning] in replay.cc)
  Unfused,  // the same graph, one kernel per op, on its own devices: bit for bit
  Cpu,      // the same graph, one kernel per op, on the CPU: bit for bit when the graph is on
            // the CPU; per-dtype tolerance, widened by conditioning, when any of it is on a GPU
};

struct OutputCheck {
  ValueId value = 0;  // the output's value in the graph
  int64_t bad = 0;    // elements outside the tolerance
  int64_t total = 0;  // elements
  double tolerance = 0;
  double worst = 0;          // largest relative error of a judged element (infinity: one side NaN)
  std::string line() const;  // "check %5: ok (0 of 3 elements outside 0.0001; ...)"
};

struct CheckResult {
  std::vector<Tensor> outputs;
  std::vector<OutputCheck> checks;
  bool failed() const;
};

// Evaluates `graph` (fused, on its own devices) on random_inputs(graph, seed) and compares each
// output with the reference. Throws what evaluation throws.
//
// LAZYFUSE_TEST_FAULT=OP, for tests only: with the unfused reference, the graph under test
// gets 1 added to the result of every OP node (bools excepted), so that a test can give the
// fuzzer and its shrinker a failure to find. warn_about_test_fault() says so on stderr.
CheckResult check_graph(const Graph& graph, uint64_t seed, Reference reference);

// The op LAZYFUSE_TEST_FAULT names, or "" when it is unset; throws Error for an unknown op.
std::string test_fault();
// Prints a warning to stderr when LAZYFUSE_TEST_FAULT is set.
void warn_about_test_fault();

}  // namespace lazyfuse::tools
