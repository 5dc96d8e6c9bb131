// The backend boundary (runtime/backend.h), through a backend of the tests' own put in place of
// the CPU's: a float64 interpreter that knows four ops and nothing of lazyfuse's code
// generators. What it computes, what it allocates and what it keeps between evaluations show
// that the executor hands every compute step and every allocation to the device's backend and
// gives each step its own cache back on a repeat.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <lazyfuse/lazyfuse.h>

#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cpu/cpu_kernels.h"
#include "lazyfuse/codegen/cpu/cpu_reduction.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/backend.h"
#include "lazyfuse/runtime/devices.h"
#include "lazyfuse/runtime/executor.h"

namespace lazyfuse {
namespace {

struct CountingCache : StepCache {
  int runs = 0;
};

// Computes float64 add, mul, exp, constants and whole sums, element by element, from dense
// buffers; refuses anything else.
class InterpretingBackend : public Backend {
 public:
  void run_step(const Graph& graph, const Step& step, ValueBuffers& values,
                std::unique_ptr<StepCache>* cache) override {
    if (fail_next_step) {
      fail_next_step = false;
      throw std::runtime_error("a try that fails part way");
    }
    ++steps_run;
    if (cache != nullptr) {
      if (*cache == nullptr) {
        *cache = std::make_unique<CountingCache>();
        ++caches_made;
      }
      ++static_cast<CountingCache&>(**cache).runs;
    }
    // Every member's value, element by element over the step's space.
    const int64_t n = numel(step.shape);
    std::map<ValueId, std::vector<double>> computed;
    auto read = [&](ValueId v, int64_t i) {
      auto it = computed.find(v);
      if (it != computed.end()) return it->second.size() == 1 ? it->second[0] : it->second[i];
      const BufferView& in = *values[v];
      return static_cast<const double*>(in.data())[numel(in.shape) == 1 ? 0 : i];
    };
    for (ValueId v : step.nodes) {
      const Node& node = graph.nodes[v];
      if (node.dtype != DType::Float64) throw UnsupportedError("the test backend knows float64");
      std::vector<double>& out = computed[v];
      if (node.op == Op::Sum) {
        double total = 0;
        for (int64_t i = 0; i < n; ++i) total += read(node.inputs[0], i);
        out = {total};
        continue;
      }
      const int64_t size = numel(node.shape);
      out.resize(size);
      for (int64_t i = 0; i < size; ++i) {
        switch (node.op) {
          case Op::Const:
            out[i] = node.attrs.get_float("value");
            break;
          case Op::Add:
            out[i] = read(node.inputs[0], i) + read(node.inputs[1], i);
            break;
          case Op::Mul:
            out[i] = read(node.inputs[0], i) * read(node.inputs[1], i);
            break;
          case Op::Exp:
            out[i] = std::exp(read(node.inputs[0], i));
            break;
          default:
            throw UnsupportedError(absl::StrCat("the test backend has no ", op_name(node.op)));
        }
      }
    }
    for (ValueId v : step.outputs) {
      const Node& node = graph.nodes[v];
      values[v] = allocate_buffer(node.device, node.dtype, node.shape);
      std::memcpy(values[v]->data(), computed[v].data(), computed[v].size() * sizeof(double));
    }
  }

  void* allocate(const Device&, int64_t nbytes) override {
    ++allocations;
    return std::aligned_alloc(64, static_cast<size_t>((nbytes + 63) / 64 * 64));
  }
  void release(const Device&, void* data, int64_t) override {
    ++releases;
    std::free(data);
  }
  BufferView contiguous(const BufferView&) override {
    throw UnsupportedError("the test backend makes no copies");
  }
  bool can_copy(const Device& from, const Device& to) const override {
    return from.is_cpu() && to.is_cpu();
  }
  void copy(const void* source, const Device&, void* target, const Device&, size_t bytes) override {
    std::memcpy(target, source, bytes);
  }
  void synchronize(const Device&) override {}

  Device resolve(const Device& requested) override {
    ++resolved;
    return requested;
  }
  int device_count() override { return 1; }
  AllocatorStats memory_stats(int) override {
    AllocatorStats held;
    held.allocated_bytes = 64 * (allocations - releases);
    held.peak_bytes = peak_reset_to;
    return held;
  }
  void reset_peak_memory_stats(int) override { peak_reset_to = 64 * (allocations - releases); }
  void add_counters(Stats& stats) override { stats.cpu_programs_compiled = steps_run; }
  void reset_counters() override { steps_run = 0; }
  int dlpack_device_type() const override { return 1; }

  int steps_run = 0, caches_made = 0, allocations = 0, releases = 0, resolved = 0;
  int64_t peak_reset_to = -1;
  bool fail_next_step = false;
};

struct ReplayCount : ReplayCache {
  int evaluations = 0;
};

// Runs each evaluation as a backend that replays runs may (the CUDA graphs of
// runtime/cuda/cuda_graphs.cc): a try it does not keep, a try that fails part way, then the run it
// keeps. With `ones_for_param_0`, the kept run reads a buffer of ones of its own in place of
// param 0 where the evaluator allows it.
class RetryingBackend final : public InterpretingBackend {
 public:
  void run_replayable(const Device& device, std::unique_ptr<ReplayCache>* cache,
                      std::span<const BufferView* const> params,
                      std::span<const bool> substitutable, ReplayRun run) override {
    EXPECT_TRUE(device.is_cpu());
    EXPECT_EQ(params.size(), substitutable.size());
    last_substitutable.assign(substitutable.begin(), substitutable.end());
    if (*cache == nullptr) {
      *cache = std::make_unique<ReplayCount>();
      ++replay_caches_made;
    }
    replayed_evaluations = ++static_cast<ReplayCount&>(**cache).evaluations;
    run({});
    fail_next_step = true;
    EXPECT_THROW(run({}), std::runtime_error);
    std::vector<std::optional<BufferView>> substitutes(params.size());
    if (ones_for_param_0 && substitutable[0]) {
      substitutes[0] =
          allocate_buffer(params[0]->storage->device(), params[0]->dtype, params[0]->shape);
      for (int64_t i = 0; i < numel(params[0]->shape); ++i)
        static_cast<double*>(substitutes[0]->data())[i] = 1.0;
    }
    run(substitutes);
  }
  bool ones_for_param_0 = false;
  std::vector<bool> last_substitutable;
  int replay_caches_made = 0, replayed_evaluations = 0;
};

TEST(Backend, ExecutorHandsEveryStepAndAllocationToTheDevicesBackend) {
  InterpretingBackend backend;
  {
    ScopedBackend scoped(DeviceType::CPU, backend);
    const TensorOptions f64(DType::Float64);
    const std::vector<double> zs = {0.5, -1.0, 2.0}, ys = {3.0, 4.0, -0.25};
    Tensor z = from_vector(zs, {3}, f64), y = from_vector(ys, {3}, f64);
    const int allocated_inputs = backend.allocations;
    EXPECT_EQ(allocated_inputs, 2);

    // Two evaluations of one expression: the second finds the cached schedule, and the backend
    // gets its own step caches back.
    for (int repeat = 0; repeat < 2; ++repeat) {
      Tensor r = (z + 2).exp() * y;
      Tensor total = r.sum();
      const std::vector<double> got = r.to_vector<double>();
      ASSERT_EQ(got.size(), 3u);
      double want_total = 0;
      for (size_t i = 0; i < 3; ++i) {
        const double want = std::exp(zs[i] + 2) * ys[i];
        EXPECT_DOUBLE_EQ(got[i], want);
        want_total += want;
      }
      EXPECT_DOUBLE_EQ(total.item<double>(), want_total);
    }
    // r: one fused step; total: one reduction step, a graph of its own once r is computed. Each
    // made its cache once and ran twice.
    EXPECT_EQ(backend.steps_run, 4);
    EXPECT_EQ(backend.caches_made, 2);
    EXPECT_GE(backend.allocations, allocated_inputs + 4);
  }
  // Every buffer the backend allocated went back to it when its tensors went.
  EXPECT_EQ(backend.releases, backend.allocations);
  // Back to the CPU backend: the same expression computes there.
  Tensor x = tensor({1.0, 2.0}, TensorOptions(DType::Float64));
  EXPECT_DOUBLE_EQ((x * x).sum().item<double>(), 5.0);
}

// A backend may run a cached schedule several times for one evaluation (Backend::run_replayable):
// each run starts from the params, what a discarded or failed try made is freed, and the
// evaluation's results are those of the run kept. The backend keeps one entry per schedule.
TEST(Backend, ReplayableRunsStartAfreshAndLeaveNothingBehind) {
  RetryingBackend backend;
  {
    ScopedBackend scoped(DeviceType::CPU, backend);
    const TensorOptions f64(DType::Float64);
    const std::vector<double> zs = {0.5, -1.0, 2.0}, ys = {3.0, 4.0, -0.25};
    Tensor z = from_vector(zs, {3}, f64), y = from_vector(ys, {3}, f64);
    for (int repeat = 0; repeat < 3; ++repeat) {
      Tensor r = (z + 2).exp() * y;
      Tensor total = r.sum();
      // A result fed back: the next evaluation reads what this one kept.
      Tensor next_z = r * 0.0 + z * 2.0;
      eval({r, total, next_z});
      double want_total = 0;
      for (size_t i = 0; i < 3; ++i) {
        const double z_now = zs[i] * std::exp2(repeat);
        const double want = std::exp(z_now + 2) * ys[i];
        EXPECT_DOUBLE_EQ(r.to_vector<double>()[i], want);
        want_total += want;
      }
      EXPECT_DOUBLE_EQ(total.item<double>(), want_total);
      z = next_z;
    }
    // One schedule, kept once; each evaluation ran it three times, two of them thrown away.
    EXPECT_EQ(backend.replay_caches_made, 1);
    EXPECT_EQ(backend.replayed_evaluations, 3);
    EXPECT_EQ(backend.last_substitutable, (std::vector<bool>{true, true}));

    // A substitute is what the run reads: z's ones in place of z.
    backend.ones_for_param_0 = true;
    Tensor r = (z + 2).exp() * y;
    const std::vector<double> got = r.to_vector<double>();
    for (size_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(got[i], std::exp(3.0) * ys[i]);
    // An output that is a view of a param is the param's own buffer: not to be substituted.
    Tensor view = z.reshape({3, 1});
    Tensor again = (z + 2).exp() * y;
    eval({again, view});
    EXPECT_EQ(backend.last_substitutable, (std::vector<bool>{false, true}));
    EXPECT_EQ(view.to_vector<double>(), z.to_vector<double>());
  }
  EXPECT_EQ(backend.releases, backend.allocations);
}

TEST(Backend, AnOpTheBackendRefusesLeavesEveryTensorUsable) {
  InterpretingBackend backend;
  ScopedBackend scoped(DeviceType::CPU, backend);
  Tensor a = from_vector({1.0, 4.0}, {2}, TensorOptions(DType::Float64));
  Tensor r = a.sqrt();
  EXPECT_THROW(r.to_vector<double>(), UnsupportedError);
  EXPECT_EQ((a + a).to_vector<double>(), (std::vector<double>{2.0, 8.0}));
}

// stats(), reset_stats() and device resolution ask the registered backends, whichever they are.
TEST(Backend, StatsAndDevicesComeFromTheRegisteredBackends) {
  const std::vector<DeviceType> types = registered_device_types();
  ASSERT_GE(types.size(), 2u);
  EXPECT_EQ(types[0], DeviceType::CPU);
  EXPECT_EQ(types[1], DeviceType::CUDA);
  InterpretingBackend backend;
  {
    ScopedBackend scoped(DeviceType::CPU, backend);
    Tensor a = from_vector({1.0, 2.0}, {2}, TensorOptions(DType::Float64));
    Tensor b = (a + a).exp();
    eval(b);
    EXPECT_EQ(stats().cpu_programs_compiled, backend.steps_run);
    EXPECT_GE(backend.steps_run, 1);
    const DeviceMemoryStats host = stats().memory.at(0);
    EXPECT_EQ(host.device, Device::cpu());
    EXPECT_EQ(host.allocated_bytes, 64 * (backend.allocations - backend.releases));
    reset_stats();
    EXPECT_EQ(backend.steps_run, 0);
    EXPECT_EQ(stats().memory.at(0).peak_bytes, 64 * (backend.allocations - backend.releases));
    const int resolved = backend.resolved;
    EXPECT_EQ(resolve_device(Device::cpu()), Device::cpu());
    EXPECT_EQ(backend.resolved, resolved + 1);
  }
  // Back to the CPU's own.
  const int resolved = backend.resolved;
  EXPECT_EQ(resolve_device(Device::cpu()), Device::cpu());
  EXPECT_EQ(backend.resolved, resolved);
}

// Every instruction set's kernel table this CPU can run (codegen/cpu/cpu_kernels.h), against the
// baseline's scalar loops and libm: each floating op within two units in the last place (both
// are within one of the true value), conversions exact; and each reduction's inner loop the
// same bits, since its accumulators are fixed in number, not the vector width, wherever a run
// starts among them. The suite runs on whichever table the machine picks; this keeps the
// others tested on it too.
TEST(Backend, EveryCpuInstructionSetAgreesWithTheBaseline) {
  const std::vector<const CpuKernelTable*> tables = cpu_vector_kernel_tables();
  if (tables.empty()) GTEST_SKIP() << "no vector instruction set on this CPU";
  const CpuKernelTable& baseline = cpu_baseline::kernel_table();
  constexpr int64_t n = 1000;  // not a whole number of vectors: the padding is read
  std::mt19937 rng(41);
  auto values = [&](double lo, double hi) {
    std::uniform_real_distribution<double> pick(lo, hi);
    std::vector<double> v(n + kCpuVectorPad);
    for (double& x : v) x = pick(rng);
    return v;
  };
  // Within two units in the last place of T, NaN meeting NaN.
  auto close = [](auto a, auto b) {
    using T = decltype(a);
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    if (a == b) return true;
    const T ulp = std::nextafter(std::abs(b), std::numeric_limits<T>::infinity()) - std::abs(b);
    return std::abs(a - b) <= 2 * std::max(ulp, std::numeric_limits<T>::denorm_min());
  };
  for (const CpuKernelTable* table : tables) {
    SCOPED_TRACE(table->isa);
    int checked = 0;
    for (int op = 0; op < kNumOps; ++op) {
      for (int slot : {3, 4}) {
        if (table->apply[op][slot] == nullptr || baseline.apply[op][slot] == nullptr) continue;
        const bool compares = op_dtype_rule(static_cast<Op>(op)) == DTypeRule::Compare;
        auto run = [&]<typename T>() {
          // Mixed signs, then positive operands (the domain of log, sqrt and pow).
          for (auto [lo, hi] : {std::pair{-3.0, 3.0}, std::pair{0.05, 3.0}}) {
            std::vector<std::vector<T>> in;
            for (int k = 0; k < 3; ++k) {
              std::vector<double> v = values(lo, hi);
              in.emplace_back(v.begin(), v.end());
            }
            const void* args[3] = {in[0].data(), in[1].data(), in[2].data()};
            std::vector<T> got(n + kCpuVectorPad), want(n + kCpuVectorPad);
            table->apply[op][slot](args, got.data(), n);
            baseline.apply[op][slot](args, want.data(), n);
            for (int64_t i = 0; i < n; ++i) {
              if (compares) {  // results are bools
                ASSERT_EQ(reinterpret_cast<bool*>(got.data())[i],
                          reinterpret_cast<bool*>(want.data())[i])
                    << op_name(static_cast<Op>(op)) << " element " << i;
              } else {
                ASSERT_TRUE(close(got[i], want[i]))
                    << op_name(static_cast<Op>(op)) << " " << (slot == 3 ? "f32" : "f64")
                    << " element " << i << ": " << got[i] << " against " << want[i];
              }
            }
          }
          ++checked;
        };
        if (slot == 3)
          run.template operator()<float>();
        else
          run.template operator()<double>();
      }
    }
    EXPECT_GT(checked, 40);
    // Reductions: the same bits, from any position in a part (a sum's stretches begin every
    // 256 positions).
    std::vector<double> v = values(-1e3, 1e3);
    std::vector<float> floats(v.begin(), v.end());
    for (Op op : {Op::Sum, Op::Mean, Op::Max, Op::Min}) {
      for (int64_t first_lane : {0, 5, 250}) {
        // The state: lanes of doubles for sums and means, floats for max and min, then the
        // stretches' floats; zero to start.
        alignas(64) unsigned char got[sizeof(CpuReduceState<double>)] = {},
                                  want[sizeof(CpuReduceState<double>)] = {};
        table->reduce_run[static_cast<int>(op)][storage_slot(DType::Float32)](floats.data(), n, got,
                                                                              first_lane);
        baseline.reduce_run[static_cast<int>(op)][storage_slot(DType::Float32)](floats.data(), n,
                                                                                want, first_lane);
        EXPECT_EQ(std::memcmp(got, want, sizeof(got)), 0)
            << op_name(op) << " from lane " << first_lane;
      }
    }
  }
}

}  // namespace
}  // namespace lazyfuse

namespace lazyfuse {
namespace {

template <typename T>
DType dtype_of_compute_type() {
  if constexpr (std::is_same_v<T, double>) return DType::Float64;
  if constexpr (std::is_same_v<T, float>) return DType::Float32;
  if constexpr (std::is_same_v<T, int64_t>) return DType::Int64;
  if constexpr (std::is_same_v<T, int32_t>) return DType::Int32;
  return DType::Bool;
}

// The documented order of a float32 sum on the CPU (ir/ops.def, codegen/cpu/cpu_kernels.h), written
// out plainly: rows in parts of 32768; in a part, position p into lane p % 16, each lane adding
// its values in float32 from zero over stretches of 16 of them (positions [256k, 256k + 256))
// and each stretch's sum into a float64 accumulator; the 16 lanes in a tree (width 8, 4, 2, 1);
// the parts in order onto zero; a mean then divided by the count, in float64.
double documented_float32_sum(const float* row, int64_t n) {
  double total = 0.0;
  for (int64_t begin = 0; begin < n || begin == 0; begin += 32768) {
    const int64_t end = std::min<int64_t>(n, begin + 32768);
    double lanes[16] = {};
    for (int64_t stretch = begin; stretch < end; stretch += 256) {
      for (int l = 0; l < 16; ++l) {
        float sum = 0.0f;
        for (int64_t p = stretch + l; p < std::min<int64_t>(end, stretch + 256); p += 16)
          sum += row[p];
        lanes[l] += static_cast<double>(sum);
      }
    }
    for (int width = 8; width >= 1; width /= 2)
      for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
    total += lanes[0];
    if (end == n) break;
  }
  return total;
}

TEST(Backend, CpuFloat32SumsAddInTheDocumentedOrder) {
  std::mt19937 rng(7);
  // Magnitudes over many binades, so that the order of additions shows in the last bits.
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  for (int64_t n : {1, 15, 250, 256, 1000, 4096, 40000, 70000}) {
    std::vector<float> values(static_cast<size_t>(2 * n));
    for (float& v : values) v = std::ldexp(mantissa(rng), exponent(rng));
    const Tensor x = from_vector(std::vector<double>(values.begin(), values.end()), {2, n});
    // Whole rows (a fused prologue computes x * 1 in chunks), and a strided view: the rows of
    // a stored transpose.
    const Tensor sums = (x * 1.0f).sum({1}), means = x.mean({1});
    Tensor transposed = x.t().contiguous();
    eval(transposed);
    const Tensor strided_sums = transposed.t().sum({1});
    const std::vector<float> got = sums.to_vector<float>(), got_means = means.to_vector<float>();
    const std::vector<float> got_strided = strided_sums.to_vector<float>();
    for (int64_t r = 0; r < 2; ++r) {
      const double want = documented_float32_sum(values.data() + r * n, n);
      EXPECT_EQ(got[r], static_cast<float>(want)) << "sum of row " << r << " of " << n;
      EXPECT_EQ(got_strided[r], static_cast<float>(want)) << "strided row " << r << " of " << n;
      EXPECT_EQ(got_means[r], static_cast<float>(want / static_cast<double>(n)))
          << "mean of row " << r << " of " << n;
    }
  }
}

// The CPU's compile-time accumulator (codegen/cpu/cpu_reduction.h) is the one the op table gives
// every backend (reduction_accumulator, ir/op.h), for every reduction and operand dtype.
TEST(Backend, CpuReductionAccumulatorsAreTheOpTables) {
  for (Op op : {Op::Sum, Op::Mean, Op::Max, Op::Min}) {
    dispatch_reduction(op, [&]<Op kOp>() {
      for (DType dtype : {DType::Bool, DType::Int32, DType::Int64, DType::Float16, DType::BFloat16,
                          DType::Float32, DType::Float64}) {
        dispatch_storage(dtype, [&]<typename S>() {
          using Acc = CpuAccumulator<kOp, S>;
          EXPECT_EQ(dtype_of_compute_type<Acc>(), reduction_accumulator(op, dtype))
              << op_name(op) << " of " << dtype_torch_name(dtype);
        });
      }
    });
  }
}

}  // namespace
}  // namespace lazyfuse
