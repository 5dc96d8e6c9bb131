// The fusion benchmark (lazyfuse bench): each workload at each size, fused, unfused (one kernel
// per op) and the roof (a device copy of the same bytes, or memcpy on the host), measured as a
// user sees it: back-to-back evaluations, graph building included.
#pragma once

#include <string>
#include <vector>

namespace lazyfuse::bench {

struct BenchOptions {
  std::string device = "cuda:0";  // or "cpu"
  std::vector<int> log2_sizes = {12, 16, 20, 24, 26, 28};
  std::vector<std::string> dtypes = {"f32", "bf16"};
  std::vector<std::string> workloads;  // empty: all
  std::string json_path;               // where to write results; empty: nowhere
  int batches = 7;                     // timed batches; the median is reported
};

// Runs the suite, prints a table (a progress line on stderr while it runs), writes JSON.
// Returns 0, or 1 when a result did not match its check.
int run_bench(const BenchOptions& options);

}  // namespace lazyfuse::bench
