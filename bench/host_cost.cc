// Where the host time of one evaluation goes: `(z + 2).exp() * y` on a few elements, split into
// writing the expression (frontend), building the graph from pending values, running the pass
// pipeline, and the whole evaluation. Google Benchmark; runs on the CPU (no GPU needed), or on
// a GPU with --device=cuda:0 for the whole evaluation.
//
//   build/bin/lazyfuse_host_bench [--benchmark_filter=...] [--device=cuda:0]
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "bench/launch_floor.h"
#include "codegen/cuda_codegen.h"
#include "ir/passes/passes.h"
#include "lazyfuse/lazyfuse.h"
#include "runtime/cuda_driver.h"
#include "runtime/lazy.h"

// Every heap allocation through operator new is counted: allocations are much of the host cost,
// and each benchmark reports how many it makes per iteration.
std::atomic<int64_t> heap_allocations{0};

void* operator new(std::size_t size) {
  heap_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
// GCC cannot see that operator new above is the one these pair with.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace {

using namespace lazyfuse;

// Counts the allocations made from here to the end of the benchmark's loop.
struct AllocationCounter {
  benchmark::State& state;
  int64_t start = heap_allocations.load();
  explicit AllocationCounter(benchmark::State& s) : state(s) {}
  ~AllocationCounter() {
    state.counters["allocs"] = benchmark::Counter(
        static_cast<double>(heap_allocations.load() - start), benchmark::Counter::kAvgIterations);
  }
};

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
  AllocationCounter allocations(state);
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
  AllocationCounter allocations(state);
  for (auto _ : state) benchmark::DoNotOptimize(build_graph(outputs));
}
BENCHMARK(BM_BuildGraph);

void BM_Pipeline(benchmark::State& state) {
  Inputs in;
  Tensor t = (in.z + 2).exp() * in.y;
  std::vector<LazyRef> outputs = {t.value()};
  Graph graph = build_graph(outputs).graph;
  AllocationCounter allocations(state);
  for (auto _ : state) benchmark::DoNotOptimize(run_pipeline(graph, {}));
}
BENCHMARK(BM_Pipeline);

// What a GPU launch of the seed's kernel computes on the host before cuLaunchKernel: operand
// layouts, the variant plan, the kernel's cache key and the argument words.
void BM_CudaLaunchPlan(benchmark::State& state) {
  Schedule schedule =
      run_pipeline(parse_graph(R"(graph @seed(%0: f32[4096] @cuda:0, %1: f32[4096] @cuda:0) {
  %2 = const {value = 2.0} : f32[] @cuda:0
  %3 = add %0, %2 : f32[4096] @cuda:0
  %4 = exp %3 : f32[4096] @cuda:0
  %5 = mul %4, %1 : f32[4096] @cuda:0
  return %5
})"),
                   {});
  const Step& step = schedule.steps.at(0);
  AllocationCounter allocations(state);
  for (auto _ : state) {
    std::vector<OperandLayout> layouts;
    std::vector<uint64_t> addresses;
    for (ValueId v : step.inputs) {
      const Node& node = schedule.graph.nodes[v];
      layouts.push_back({4096, 4, node.shape, contiguous_strides(node.shape)});
      addresses.push_back(4096);
    }
    const std::vector<uint64_t> outputs = {8192};
    CudaElementwiseLaunch plan = plan_cuda_elementwise(step, layouts, outputs, {4});
    std::string key = cuda_kernel_cache_key(step, plan.spec, /*fast_math=*/false);
    KernelArgs args = pack_elementwise_args(plan, addresses, outputs);
    benchmark::DoNotOptimize(key);
    benchmark::DoNotOptimize(args);
  }
}
BENCHMARK(BM_CudaLaunchPlan);

// The floor under a GPU evaluation's host cost (bench/launch_floor.h). Argument 0 launches on
// the legacy default stream, as lazyfuse does; 2 on the per-thread one.
void BM_DriverLaunch(benchmark::State& state) {
  if (device_name == "cpu") {
    state.SkipWithError("needs --device=cuda:N");
    return;
  }
  Inputs in;
  Tensor out = zeros({kElements}, Device(device_name));
  eval(out);
  auto address = [](const Tensor& t) {
    return reinterpret_cast<uint64_t>(t.value()->buffer->data());
  };
  bench::LaunchFloor floor(Device(device_name).index(), address(in.y), address(in.z), address(out),
                           kElements);
  auto stream = reinterpret_cast<cuda::CUstream>(static_cast<uintptr_t>(state.range(0)));
  for (auto _ : state) floor.launch(stream);
  cuda::check(cuda::driver()->cuCtxSynchronize(), "cuCtxSynchronize");
}
BENCHMARK(BM_DriverLaunch)->Arg(0)->Arg(2);

void BM_Evaluate(benchmark::State& state) {
  Inputs in;
  AllocationCounter allocations(state);
  for (auto _ : state) {
    Tensor t = (in.z + 2).exp() * in.y;
    eval(t);
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_Evaluate);

// The same on one element: what an evaluation costs besides computing.
void BM_EvaluateOneElement(benchmark::State& state) {
  Tensor y = rand({1}, Device(device_name)), z = rand({1}, Device(device_name));
  eval({y, z});
  AllocationCounter allocations(state);
  for (auto _ : state) {
    Tensor t = (z + 2).exp() * y;
    eval(t);
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_EvaluateOneElement);

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--device=", 9) == 0) device_name = argv[i] + 9;
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
