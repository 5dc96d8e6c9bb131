// Where the host time of an evaluation goes. First `(z + 2).exp() * y` on a few elements, split
// into writing the expression (frontend), building the graph from pending values, running the
// pass pipeline, and the whole evaluation; then whole graphs users run in a loop (an MLP's
// forward, a training step, a 64-op elementwise graph, 64 unfused kernels in a row), each
// iteration synchronized, with the evaluation's phases (runtime/host_profile.h) as counters in
// microseconds per iteration: frontend (writing the expressions, autograd and the optimizer
// included), walk, lookup, passes, run and within it allocate, library (cuBLAS), launch,
// transfer (reading a result back, which waits for the device), and finish; then wait (for the
// device, after the iteration's work was issued); with nodes, kernels and launches per
// iteration. Google Benchmark; runs on the CPU (no GPU needed), or on a GPU with --device=cuda:0.
//
//   build/bin/lazyfuse_host_bench [--benchmark_filter=...] [--device=cuda:0]
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "bench/launch_floor.h"
#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/ir/passes/passes.h"
#include "lazyfuse/lazyfuse.h"
#include "lazyfuse/runtime/cuda/cuda_driver.h"
#include "lazyfuse/runtime/cuda/cuda_graphs.h"
#include "lazyfuse/runtime/host_profile.h"
#include "lazyfuse/runtime/lazy.h"

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
// the legacy default stream, 2 on the per-thread one, -1 on the device's own stream, where
// lazyfuse launches.
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
  for (auto _ : state) {
    if (state.range(0) < 0)
      floor.launch();
    else
      floor.launch_on(stream);
  }
  cuda::check(cuda::driver()->cuCtxSynchronize(), "cuCtxSynchronize");
}
BENCHMARK(BM_DriverLaunch)->Arg(0)->Arg(2)->Arg(-1);

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

// Waits for the device's work, as a loop that reads its results would.
void synchronize() {
  const Device device(device_name);
  if (device.is_cuda()) cuda::check(cuda::driver()->cuCtxSynchronize(), "cuCtxSynchronize");
}

// Runs `iteration` under the host profile and reports each phase in microseconds per iteration,
// with the evaluations' nodes, kernels and launches, and the wall time per launch. Each
// iteration waits for the device unless `synchronize_each` is false (then wait_us is 0 and the
// device's work overlaps the next iterations' host work, as in BM_Evaluate).
template <typename Iteration>
void profile_iterations(benchmark::State& state, Iteration iteration,
                        bool synchronize_each = true) {
  // The first evaluations run the passes and compile the kernels (a training step's first two
  // differ: the first finds no gradients to accumulate into).
  for (int warmup = 0; warmup < 3; ++warmup) iteration();
  synchronize();
  reset_eval_stats();
  cuda::reset_graph_stats();
  reset_host_profile();
  set_host_profiling(true);
  int64_t wall_ns = 0, wait_ns = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    iteration();
    const auto issued = std::chrono::steady_clock::now();
    if (synchronize_each) synchronize();
    const auto end = std::chrono::steady_clock::now();
    wall_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count();
    wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(end - issued).count();
  }
  synchronize();
  set_host_profiling(false);
  const HostProfile profile = host_profile();
  const EvalStats stats = eval_stats();
  const cuda::GraphStats graphs = cuda::graph_stats();
  const double iterations = static_cast<double>(state.iterations());
  int64_t evaluation_ns = 0;
  for (HostPhase phase :
       {HostPhase::Walk, HostPhase::Lookup, HostPhase::Passes, HostPhase::Run, HostPhase::Finish})
    evaluation_ns += profile.nanoseconds[static_cast<int>(phase)];
  auto per_iteration_us = [&](int64_t ns) { return static_cast<double>(ns) / 1e3 / iterations; };
  state.counters["frontend_us"] = per_iteration_us(wall_ns - wait_ns - evaluation_ns);
  state.counters["wait_us"] = per_iteration_us(wait_ns);
  for (int p = 0; p < kHostPhases; ++p)
    state.counters[std::string(host_phase_name(static_cast<HostPhase>(p))) + "_us"] =
        per_iteration_us(profile.nanoseconds[p]);
  state.counters["evaluations"] = static_cast<double>(stats.evaluations) / iterations;
  state.counters["nodes"] = static_cast<double>(stats.nodes) / iterations;
  state.counters["kernels"] = static_cast<double>(stats.kernels) / iterations;
  state.counters["graph_captures"] = static_cast<double>(graphs.captures) / iterations;
  state.counters["graph_replays"] = static_cast<double>(graphs.replays) / iterations;
  state.counters["launches"] = static_cast<double>(stats.launches) / iterations;
  state.counters["us_per_launch"] =
      stats.launches > 0 ? per_iteration_us(wall_ns) * iterations / stats.launches : 0;
}

// BM_Evaluate under the host profile: where one fused evaluation's host time goes.
void BM_EvaluatePhases(benchmark::State& state) {
  Inputs in;
  profile_iterations(
      state, [&] { eval((in.z + 2).exp() * in.y); }, /*synchronize_each=*/false);
}
BENCHMARK(BM_EvaluatePhases);

// Kernels back to back: a chain of `count` negations of 4096 elements evaluated with fusion off,
// so one kernel each, synchronized once per evaluation. With CUDA graphs the whole chain is one
// cuGraphLaunch, and us_per_launch is then the time a kernel takes in a replayed graph, to set
// beside BM_DriverLaunch's bare cuLaunchKernel.
void BM_KernelChain(benchmark::State& state) {
  const int64_t count = state.range(0);
  Inputs in;
  profile_iterations(state, [&] {
    Tensor t = in.z;
    for (int64_t k = 0; k < count; ++k) t = t.neg();
    eval({t}, EvalOptions{.fusion = false});
  });
}
BENCHMARK(BM_KernelChain)->Arg(64)->Unit(benchmark::kMicrosecond);

// An MLP's forward (nn::Linear + relu layers), evaluated and synchronized once per pass.
// Arguments: layers, width, batch.
void BM_MlpForward(benchmark::State& state) {
  const int64_t layers = state.range(0), width = state.range(1), batch = state.range(2);
  manual_seed(0);
  nn::Sequential net;
  for (int64_t i = 0; i < layers; ++i) {
    net.push_back(std::make_shared<nn::Linear>(width, width));
    net.push_back(std::make_shared<nn::ReLU>());
  }
  net.to(Device(device_name));
  Tensor x = randn({batch, width}, TensorOptions().device(Device(device_name)));
  eval(x);
  NoGradGuard no_grad;
  profile_iterations(state, [&] { eval(net(x)); });
}
BENCHMARK(BM_MlpForward)
    ->Args({8, 512, 64})
    ->Args({4, 256, 64})
    ->Args({16, 1024, 32})
    ->Unit(benchmark::kMicrosecond);

// The training issue's step: 4 x (Linear 1024 + ReLU), a 10-class head, cross-entropy, Adam,
// the loss read back; and the same at width 16, where the host is nearly all of it. Arguments:
// batch, width.
void BM_TrainStep(benchmark::State& state) {
  const int64_t batch = state.range(0), width = state.range(1), classes = 10;
  manual_seed(0);
  nn::Sequential net;
  for (int64_t i = 0; i < 4; ++i) {
    net.push_back(std::make_shared<nn::Linear>(width, width));
    net.push_back(std::make_shared<nn::ReLU>());
  }
  net.push_back(std::make_shared<nn::Linear>(width, classes));
  net.to(Device(device_name));
  optim::Adam optimizer(net.parameters(), optim::AdamOptions(1e-3));
  Tensor x = randn({batch, width}, TensorOptions().device(Device(device_name)));
  Tensor y = (rand({batch}, TensorOptions().device(Device(device_name))) * classes)
                 .to(kInt64)
                 .clamp_max(classes - 1);
  eval({x, y});
  profile_iterations(state, [&] {
    optimizer.zero_grad();
    Tensor loss = nn::functional::cross_entropy(net(x), y);
    loss.backward();
    optimizer.step();
    benchmark::DoNotOptimize(loss.item<double>());
  });
}
BENCHMARK(BM_TrainStep)->Args({32, 1024})->Args({8, 16})->Unit(benchmark::kMicrosecond);

// 64 ops over 4096 elements in four stretches of 16, each ending in a sum over rows or columns
// (alternately) that the next one reads broadcast: four kernels, one evaluation.
void BM_Elementwise64(benchmark::State& state) {
  Tensor a = rand({64, 64}, Device(device_name)), b = rand({64, 64}, Device(device_name));
  eval({a, b});
  profile_iterations(state, [&] {
    Tensor t = a;
    for (int stretch = 0; stretch < 4; ++stretch) {
      for (int i = 0; i < 15; ++i) {
        switch (i % 5) {
          case 0:
            t = t * b;
            break;
          case 1:
            t = t + 0.5;
            break;
          case 2:
            t = t.tanh();
            break;
          case 3:
            t = t - b;
            break;
          default:
            t = t.sigmoid();
            break;
        }
      }
      t = t + t.sum({stretch % 2}, /*keepdim=*/true);
    }
    eval(t);
  });
}
BENCHMARK(BM_Elementwise64)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--device=", 9) == 0) device_name = argv[i] + 9;
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
