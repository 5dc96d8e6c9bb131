// Where the host time of one evaluation goes: `(z + 2).exp() * y` on a few elements, split into
// writing the expression (frontend), building the graph from pending values, running the pass
// pipeline, and the whole evaluation. Google Benchmark; runs on the CPU (no GPU needed), or on
// a GPU with --device=cuda:0 for the whole evaluation.
//
//   build/bin/lazyfuse_host_bench [--benchmark_filter=...] [--device=cuda:0]
#include <benchmark/benchmark.h>

#include <cstring>
#include <string>

#include "ir/passes/passes.h"
#include "lazyfuse/lazyfuse.h"
#include "runtime/lazy.h"

namespace {

using namespace lazyfuse;

std::string device_name = "cpu";
constexpr int64_t kElements = 4096;

struct Inputs {
  Tensor y, z;
  Inputs() : y(rand({kElements}, Device(device_name))), z(rand({kElements}, Device(device_name))) {
    eval({y, z});
  }
};

void BM_Frontend(benchmark::State& state) {
  Inputs in;
  for (auto _ : state) {
    Tensor t = (in.z + 2).exp() * in.y;
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_Frontend);

void BM_BuildGraph(benchmark::State& state) {
  Inputs in;
  Tensor t = (in.z + 2).exp() * in.y;
  std::vector<LazyRef> outputs = {t.value()};
  for (auto _ : state) benchmark::DoNotOptimize(build_graph(outputs));
}
BENCHMARK(BM_BuildGraph);

void BM_Pipeline(benchmark::State& state) {
  Inputs in;
  Tensor t = (in.z + 2).exp() * in.y;
  std::vector<LazyRef> outputs = {t.value()};
  Graph graph = build_graph(outputs).graph;
  for (auto _ : state) benchmark::DoNotOptimize(run_pipeline(graph, {}));
}
BENCHMARK(BM_Pipeline);

void BM_Evaluate(benchmark::State& state) {
  Inputs in;
  for (auto _ : state) {
    Tensor t = (in.z + 2).exp() * in.y;
    eval(t);
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_Evaluate);

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--device=", 9) == 0) device_name = argv[i] + 9;
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
